"""Goodput arithmetic (hack/localcluster/goodput.py), table-tested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localcluster.goodput import StepRecord, analyse, read_step_log

pytestmark = pytest.mark.unit


def run(attempt: int, steps: range, t0: float, dt: float = 1.0) -> list[StepRecord]:
    return [StepRecord(attempt, s, t0 + i * dt) for i, s in enumerate(steps)]


def test_uninterrupted_run_counts_every_step_once() -> None:
    report = analyse(run(1, range(10), 5.0), start=0.0, end=20.0)
    assert report.steps == 10
    assert report.productive_seconds == pytest.approx(10.0)  # first step at the median (1 s)
    assert report.goodput == pytest.approx(0.5)
    assert report.interruptions == [] and report.mean_gap == 0.0


def test_noticed_preemption_loses_nothing_and_the_gap_is_badput() -> None:
    records = run(1, range(5), 0.0) + run(2, range(5, 10), 30.0)
    report = analyse(records, start=0.0, end=35.0)
    (i,) = report.interruptions
    assert (i.from_attempt, i.last_step, i.resumed_at, i.lost_steps) == (1, 4, 5, 0)
    # 30 - 4 = 26 s between the records, less attempt 2's typical step (1 s, counted as productive)
    assert i.gap_seconds == pytest.approx(25.0) and report.mean_gap == pytest.approx(25.0)
    assert report.productive_seconds == pytest.approx(10.0)


def test_steps_redone_after_a_lost_checkpoint_count_once() -> None:
    # Attempt 1 reached step 7, the checkpoint was at step 4: steps 5-7 are lost and redone.
    records = run(1, range(8), 0.0) + run(2, range(5, 10), 20.0, dt=2.0)
    report = analyse(records, start=0.0, end=30.0)
    (i,) = report.interruptions
    assert (i.last_step, i.resumed_at, i.lost_steps) == (7, 5, 3)
    assert report.steps == 10
    # preserved: steps 0-4 of attempt 1 (5 x 1 s) and 5-9 of attempt 2 (5 x 2 s)
    assert report.productive_seconds == pytest.approx(15.0)
    assert report.lost_steps == 3


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps({"attempt": 1, "step": 0, "t": 1.0}) + "\n" + '{"attempt": 1, "st')
    assert read_step_log(path) == [StepRecord(1, 0, 1.0)]


def test_mean_gap_averages_every_interruption() -> None:
    records = run(1, range(5), 0.0) + run(2, range(5, 10), 30.0) + run(3, range(10, 15), 50.0)
    report = analyse(records, start=0.0, end=60.0)
    assert len(report.interruptions) == 2
    assert report.mean_gap == pytest.approx(sum(i.gap_seconds for i in report.interruptions) / 2)


def test_goodput_after_the_first_start_leaves_out_the_time_before_the_first_step_only() -> None:
    # job applied at 0; the first step (typical 1 s) ends at 41: 40 s of first start (pull, imports, compile)
    records = run(1, range(20), 41.0) + run(2, range(20, 40), 64.0)  # a 4 s gap (60 -> 64) between attempts
    report = analyse(records, start=0.0, end=84.0)
    assert report.first_start_seconds == pytest.approx(40.0)
    assert report.productive_seconds == pytest.approx(40.0)
    assert report.goodput == pytest.approx(40.0 / 84.0)
    assert report.goodput_after_start == pytest.approx(40.0 / 44.0)  # the restart's gap still counts
    assert analyse([], start=0.0, end=10.0).goodput_after_start == 0.0


def test_goodput_until_counts_only_the_window_and_a_step_lost_after_it_still_counts_as_lost() -> None:
    # attempt 1: steps 0-19 at t 1..20; its checkpoint at 14, so 15-19 are lost; attempt 2 redoes 15-39 from t 30.
    records = run(1, range(20), 1.0) + run(2, range(15, 40), 30.0)
    whole = analyse(records, start=0.0, end=55.0)
    window = analyse(records, start=0.0, end=55.0, until=25.0)
    assert window.wall_seconds == pytest.approx(25.0)
    # in the window: attempt 1's steps 0-14 (15 x 1 s) are preserved; 15-19 were redone after it, so lost
    assert window.productive_seconds == pytest.approx(15.0)
    assert window.goodput == pytest.approx(15.0 / 25.0)
    assert window.goodput < whole.goodput  # 40 s productive in 55 s
    assert window.interruptions == whole.interruptions and window.steps == whole.steps == 40
    # a window past the job's end is the whole run
    assert analyse(records, start=0.0, end=55.0, until=99.0) == whole


def test_without_until_every_preserved_step_counts_whatever_clock_the_records_use() -> None:
    """Callers pass ``start``/``end`` as offsets (0 and the job's wall) while the records carry the wall clock: the
    window's filter must not apply without ``until`` (it did once: productive 0 in the real-node e2e's check)."""
    records = run(1, range(10), 1_795_781_334.0)
    assert analyse(records, start=0.0, end=20.0).productive_seconds == pytest.approx(10.0)
