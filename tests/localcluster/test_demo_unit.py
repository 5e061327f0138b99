"""``make demo``'s decisions (hack/demo.py), table-tested: when the unwarned node loss fires, how a restart's
restore source reads in the comparison table, and the comparison's first start (its phases from a recorded run's
log lines, goodput after it beside the whole run's). The demo itself runs by hand (``make demo``); its goodput and
restore-source arithmetic is tested in test_goodput_unit.py and test_restores_unit.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from demo import (
    STARTUP,
    FirstStart,
    first_start,
    hard_kill_due,
    log_mark,
    side_by_side,
    source_at,
    stockout_due,
)
from localcluster.goodput import GoodputReport, analyse, read_step_log
from localcluster.restores import Restore

pytestmark = pytest.mark.unit

READY = {"after_checkpoint": 50, "notice_node_deleted": True, "phase": "Running", "attempt": 2, "notice_attempt": 1,
         "step": 650, "checkpoint_step": 600}


@pytest.mark.parametrize(("change", "due"), [
    ({}, True),                                   # the preemption's restart done, 50 steps past the checkpoint
    ({"step": 649}, False),                       # not yet 50 steps past it
    ({"step": 700, "checkpoint_step": 700}, False),  # a newer periodic checkpoint: count again from it
    ({"notice_node_deleted": False}, False),      # the noticed node still stands (its restart is not done)
    ({"attempt": 1}, False),                      # still the attempt the notice hit
    ({"phase": "Restarting"}, False),             # the gang is not running yet
    ({"checkpoint_step": None}, False),           # no checkpoint reported yet
    ({"after_checkpoint": 0}, False),             # --hard-kill-after-checkpoint 0: no unwarned loss
    ({"spares": "1/1"}, True),                    # in place: the used spare's replacement is ready
    ({"spares": "0/1"}, False),                   # ... not yet: the lost worker would wait for its pod
])
def test_hard_kill_due(change: dict, due: bool) -> None:
    assert hard_kill_due(**{**READY, **change}) is due


@pytest.mark.parametrize(("sources", "i", "cell"), [
    ([Restore(600, {0: "memory", 1: "peer"})], 0, "own+peer memory"),
    ([Restore(600, {0: "peer", 1: "peer"})], 0, "peer memory"),
    ([Restore(600, {})], 0, "storage"),
    ([Restore(600, {0: "storage", 1: "peer"})], 0, "mixed"),
    ([None], 0, "?"),
    ([], 1, "-"),
])
def test_source_at(sources: list, i: int, cell: str) -> None:
    assert source_at(sources, i) == cell


# -- the side-by-side's first start, from a recorded run -------------------------------------------------------
# `hack/demo.py --process-nodes`, 2026-11-28 19:29 UTC (lines shortened): the trainers' start lines of each job's
# first attempt, the pods as the demo's poll saw them (epoch seconds), the apply, the first step record and the
# restarts of each step log (steps of 0.07 s here, evenly spaced). In place paid the emulated 20 s
# image pull (its nodes were fresh; recreate-all's second run found the image on the same nodes).
LOGS = {
    "lm-0": ["2026-11-28 19:30:29,191 reprieve-supervisor[5014] INFO memory replica server on 127.144.85.163:8477, ...",
             "2026-11-28 19:30:33,719 INFO reprieve.bootstrap: reprieve: process 0/2, attempt 1, checkpoints /t/c, ...",
             "2026-11-28 19:30:33,879 INFO reprieve.job: no checkpoint under /t/c: starting at step 0",
             "2026-11-28 19:30:51,067 INFO train: process 0/2 starting at step 0 of 1500 (attempt 1)"],
    "lm-1": ["2026-11-28 19:30:33,739 INFO reprieve.bootstrap: reprieve: process 1/2, attempt 1, checkpoints /t/c, ...",
             "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3",
             "2026-11-28 19:30:54,684 INFO train: process 1/2 starting at step 0 of 1500 (attempt 1)"],
    "lm-recreate-0": ["2026-11-28 19:33:38,001 INFO reprieve.bootstrap: reprieve: process 0/2, attempt 1, ...",
                      "2026-11-28 19:34:02,069 INFO train: process 0/2 starting at step 0 of 1500 (attempt 1)"],
    "lm-recreate-1": ["2026-11-28 19:33:38,027 INFO reprieve.bootstrap: reprieve: process 1/2, attempt 1, ...",
                      "2026-11-28 19:34:03,388 INFO train: process 1/2 starting at step 0 of 1500 (attempt 1)"],
}
POLLED = {"lm-0": {"created": 1795894207.1, "scheduled": 1795894207.1, "running": 1795894228.9},
          "lm-1": {"created": 1795894207.1, "scheduled": 1795894207.4, "running": 1795894228.9},
          "lm-recreate-0": {"created": 1795894412.3, "scheduled": 1795894412.3, "running": 1795894413.9},
          "lm-recreate-1": {"created": 1795894412.3, "scheduled": 1795894412.3, "running": 1795894413.9}}
# job -> (applied, first step record, [(attempt, first step, last step, gap before it)])
RUNS = {"lm": (1795894206.6, 1795894271.891, [(1, 0, 282, 0.0), (2, 283, 501, 4.1), (3, 501, 1499, 8.9)]),
        "lm-recreate": (1795894412.0, 1795894464.418, [(1, 0, 275, 0.0), (2, 276, 352, 29.2), (3, 300, 1499, 25.7)])}


@pytest.fixture
def recorded_zone() -> Iterator[None]:
    """The recorded run's machine kept UTC: its process nodes' trainers wrote their ``%(asctime)s`` in UTC."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def recorded(tmp_path: Path, job: str) -> tuple[GoodputReport, FirstStart]:
    """``job``'s step log written as the trainer writes it, read and analysed as the demo does; its first start from
    its pods' polled times and its trainers' log lines."""
    applied, t, attempts = RUNS[job]
    lines = []
    for attempt, first, last, gap in attempts:
        t += gap
        for step in range(first, last + 1):
            lines.append(json.dumps({"attempt": attempt, "step": step, "t": t}))
            t += 0.07
    path = tmp_path / f"{job}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = analyse(read_step_log(path), start=applied, end=t + 1.0)  # the job Succeeded 1 s after its last step
    marks = {pod: dict(times) for pod, times in POLLED.items()}
    for pod, log in LOGS.items():
        for line in log:
            mark = log_mark(line)
            if mark is not None:
                marks[pod].setdefault(*mark)
    beside = {"spare ready": applied + 27.3} if job == "lm" else {}
    return report, first_start(applied, report, marks, [f"{job}-0", f"{job}-1"], beside)


def test_log_mark_reads_the_start_lines_and_their_time() -> None:
    assert log_mark(LOGS["lm-0"][1]) == ("joined", datetime(2026, 11, 28, 19, 30, 33, 719000).timestamp())
    assert log_mark(LOGS["lm-0"][3]) == ("ready", datetime(2026, 11, 28, 19, 30, 51, 67000).timestamp())
    assert log_mark(LOGS["lm-0"][2]) is None  # reprieve's "no checkpoint ...: starting at step 0" is not it
    assert log_mark(LOGS["lm-0"][0]) is None
    assert log_mark(LOGS["lm-1"][1]) is None
    # a real node's log file: containerd's UTC time first, whatever the container's clock says
    real = "2026-11-28T20:05:01.123456789Z stderr F 2026-11-28 21:05:01,000 INFO train: process 1/2 starting at step 0"
    assert log_mark(real) == ("ready", datetime(2026, 11, 28, 20, 5, 1, 123456, UTC).timestamp())


@pytest.mark.usefixtures("recorded_zone")
def test_first_start_splits_apply_to_first_step_at_the_slowest_worker(tmp_path: Path) -> None:
    report, start = recorded(tmp_path, "lm")
    assert report.first_start_seconds == pytest.approx(65.22, abs=0.01)  # 19:30:06.6 -> 19:31:11.891 - 0.07
    assert start.seconds == pytest.approx(report.first_start_seconds)
    assert [(name, round(s, 1)) for name, s in start.phases] == [
        ("pods created", 0.5), ("scheduling", 0.3), ("image + container start", 21.5),
        ("imports + jax.distributed", 4.8),  # lm-1 joined last: 19:30:33.739
        ("initial state", 20.9),  # lm-1 ready last: 19:30:54.684
        ("step compile + first step", 17.1)]  # -> 19:31:11.821, the first record less a step
    assert start.beside == {"spare ready": pytest.approx(27.3)}


@pytest.mark.usefixtures("recorded_zone")
def test_side_by_side_prints_goodput_after_the_first_start_and_what_the_start_is(tmp_path: Path) -> None:
    (a, start_a), (b, start_b) = recorded(tmp_path, "lm"), recorded(tmp_path, "lm-recreate")
    lines = side_by_side((a, b), ([], []), (start_a, start_b), "emulated")
    row = next(line for line in lines if line.lstrip().startswith("goodput after the first start"))
    assert row.split()[-3:] == [f"{a.goodput_after_start:.1%}", f"{b.goodput_after_start:.1%}",
                                f"{a.goodput_after_start / b.goodput_after_start:.2f}x"]
    whole = next(line for line in lines if line.lstrip().startswith("goodput, whole run"))
    assert whole.split()[-3:] == [f"{a.goodput:.1%}", f"{b.goodput:.1%}", f"{a.goodput / b.goodput:.2f}x"]
    # the first start, in place's the longer here, hides part of the difference in the whole-run figure
    assert a.goodput / b.goodput < a.goodput_after_start / b.goodput_after_start
    assert lines.index(row) == lines.index(whole) - 1
    assert next(line for line in lines if "first start (apply -> first step)" in line).split()[-2:] == ["65.2s", "52.3s"]
    assert f"  {STARTUP}" in lines
    assert lines[-1] == ("  in place's first start: 65.2s vs 52.3s (+12.9s): image + container start +19.9s, "
                         "initial state -4.4s, step compile + first step -3.8s, imports + jax.distributed +0.7s; "
                         "beside its gang: spare ready at 27.3s")


@pytest.mark.parametrize(("case", "kw", "due"), [
    ("the unwarned loss's restart done, 30 steps on", {}, True),
    ("no stockout asked for", {"stockout_seconds": 0}, False),
    ("before the unwarned loss", {"hard_killed": False}, False),
    ("its restart not running yet", {"attempt": 3}, False),
    ("... restarting", {"phase": "Restarting"}, False),
    ("too few steps since", {"step": 529}, False),
])
def test_stockout_due(case: str, kw: dict, due: bool) -> None:
    args = {"stockout_seconds": 40.0, "hard_killed": True, "phase": "Running", "attempt": 4, "hard_kill_attempt": 3,
            "step": 530, "hard_kill_step": 500} | kw
    assert stockout_due(**args) is due, case


def test_the_side_by_side_says_the_steps_trained_while_out_of_capacity() -> None:
    report = GoodputReport(steps=10, wall_seconds=10.0, productive_seconds=9.0)
    start = FirstStart([("pods created", 1.0)])
    lines = side_by_side((report, report), ([], []), (start, start), "emulated", (212, 0))
    row = next(line for line in lines if "steps trained while out of capacity" in line)
    assert row.split()[-2:] == ["212", "0"]
    assert any(line.lstrip().startswith("lost steps, stockout") for line in lines)
    assert not any("out of capacity" in line for line in side_by_side((report, report), ([], []), (start, start),
                                                                       "emulated"))
