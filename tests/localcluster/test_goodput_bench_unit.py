"""benchmarks/goodput.py's decisions about nodes and pulls, table-tested: which flags go together, how many worker
nodes a variant starts with, and when a real variant adds a fresh node. The benchmark itself runs by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_module import load_benchmark

pytestmark = pytest.mark.unit

goodput = load_benchmark("goodput")


@pytest.mark.parametrize(("real_nodes", "real_pulls", "pull_seconds", "wrong"), [
    (False, False, None, None),             # process nodes, the default emulated pull
    (False, False, 5.0, None),              # process nodes, a chosen emulated pull
    (True, False, None, None),              # real nodes, images imported
    (True, True, None, None),               # real nodes, real pulls
    (False, True, None, "--real-pulls needs --real-nodes"),
    (True, False, 20.0, "--pull-seconds emulates a pull on process nodes"),
    (True, True, 0.0, "--pull-seconds emulates a pull on process nodes"),
])
def test_check_modes(real_nodes: bool, real_pulls: bool, pull_seconds: float | None, wrong: str | None) -> None:
    got = goodput.check_modes(real_nodes=real_nodes, real_pulls=real_pulls, pull_seconds=pull_seconds)
    assert (got is None) if wrong is None else (got is not None and got.startswith(wrong))


@pytest.mark.parametrize(("spares", "events", "real", "nodes"), [
    (0, 4, False, 6),    # 2 workers + one per replacement
    (1, 4, False, 11),   # 2 workers + spare + two per event (the worker's and the used spare's replacement)
    (0, 4, True, 3),     # real: 2 workers + one free node
    (1, 4, True, 4),     # real: 2 workers + spare + one free node
])
def test_nodes_up_front(spares: int, events: int, real: bool, nodes: int) -> None:
    assert goodput.nodes_up_front(spares=spares, events=events, real=real) == nodes


@pytest.mark.parametrize(("live", "up_front", "real", "due"), [
    (3, 4, True, 1),     # one deleted: one fresh node
    (4, 4, True, 0),     # the pool is whole
    (2, 4, True, 2),
    (5, 6, False, 0),    # process nodes: all created up front, none added
])
def test_replacements_due(live: int, up_front: int, real: bool, due: int) -> None:
    assert goodput.replacements_due(live=live, up_front=up_front, real=real) == due


def _steps(attempt: int, first: int, last: int, t0: float, dt: float) -> list:
    from localcluster.goodput import StepRecord
    return [StepRecord(attempt, s, t0 + (s - first) * dt) for s in range(first, last + 1)]


def test_stockout_figures_of_an_elastic_run() -> None:
    """Full size at 2 steps/s to step 49 (t 124.5), the kill at t 125, the shrunk attempt from step 46 (4 lost) at
    t 131 at 1.5 steps/s until capacity returns at t 245, then the grown attempt."""
    shrunk_dt = 1 / 1.5
    records = (_steps(1, 0, 49, 100.0, 0.5) + _steps(2, 46, 215, 131.0, shrunk_dt)
               + _steps(3, 216, 300, 250.0, 0.5))
    f = goodput.stockout_figures(records, kill_t=125.0, return_t=245.0, window_seconds=150.0)
    assert f.lost_steps == 4
    assert f.first_step_after == pytest.approx(6.0)
    assert f.full_rate == pytest.approx(2.0)
    assert f.degraded_rate == pytest.approx(1.5)
    # in [125, 275]: attempt 2's steps 46..215 (170 distinct) and attempt 3's 216..266 (t <= 275)
    assert f.window_steps == 170 + 51


def test_stockout_figures_of_a_run_that_waits() -> None:
    """The waiting job: no attempt begins before capacity returns, so nothing is degraded and the window holds only
    the steps after the return."""
    records = _steps(1, 0, 49, 100.0, 0.5) + _steps(2, 46, 100, 260.0, 0.5)
    f = goodput.stockout_figures(records, kill_t=125.0, return_t=245.0, window_seconds=150.0)
    assert (f.lost_steps, f.degraded_rate, f.first_step_after) == (4, None, pytest.approx(135.0))
    assert f.window_steps == 31  # steps 46..76 (t 260..275)


@pytest.mark.parametrize(("n", "skip", "rate"), [(10, 3, 2.0), (4, 3, None), (5, 3, 2.0), (3, 0, 2.0)])
def test_attempt_rate_leaves_out_the_first_steps(n: int, skip: int, rate: float | None) -> None:
    records = _steps(1, 0, n - 1, 0.0, 0.5)
    records[0] = type(records[0])(1, 0, -30.0)  # the first step waited on compilation
    got = goodput.attempt_rate(records, skip=skip)
    if skip == 0:
        assert got is not None and got < 1.0  # the compile's wait drags an unskipped rate down
    else:
        assert got == (pytest.approx(rate) if rate is not None else None)


def test_the_assignment_to_first_step_seconds_are_the_slowest_process_s_per_attempt() -> None:
    line = "{pid} INFO attempt {a}: first step done {w}s after the warm start, {s}s after the assignment arrived"
    lines = [line.format(pid=1, a=1, w=23.22, s=23.22), line.format(pid=2, a=2, w=7.14, s=7.14),
             line.format(pid=3, a=2, w=6.97, s=6.97), line.format(pid=3, a=3, w=2.55, s=3.56),
             "2026-11-29 02:15:03,160 INFO reprieve.job: the first step lowered 4 program(s) in 0.18s"]
    assert goodput.assigned_to_first_step(lines) == {1: 23.22, 2: 7.14, 3: 3.56}
    records = _steps(1, 0, 49, 100.0, 0.5) + _steps(2, 46, 215, 131.0, 0.5) + _steps(3, 216, 300, 250.0, 0.5)
    f = goodput.stockout_figures(records, kill_t=125.0, return_t=245.0, window_seconds=150.0,
                                 assigned=goodput.assigned_to_first_step(lines))
    assert (f.assigned_first_step, f.grown_first_step) == (7.14, 3.56)
    waited = goodput.stockout_figures(records[:50] + records[-85:], kill_t=125.0, return_t=245.0,
                                      window_seconds=150.0, assigned={1: 23.22, 3: 40.0})
    assert (waited.assigned_first_step, waited.grown_first_step) == (40.0, None)


def test_a_finished_run_drops_its_checkpoints_and_volumes_and_keeps_its_logs(tmp_path: Path) -> None:
    ckpt = tmp_path / "inplace-spare-memory" / "checkpoints" / "step_0000000010_a1"
    volume = tmp_path / "cluster/nodes/n-0/pods/ns/pod-uid/volumes/reprieve-memory/own/s1"
    logs = tmp_path / "cluster/nodes/n-0/pods/ns/pod-uid/logs"
    steps = tmp_path / "inplace-spare-memory" / "steps.jsonl"
    for d in (ckpt, volume, logs):
        d.mkdir(parents=True)
    (ckpt / "data").write_bytes(b"x" * 1000)
    (volume / "data.bin").write_bytes(b"y" * 500)
    (logs / "trainer.log").write_text("a line\n")
    steps.write_text("{}\n")
    assert goodput.drop_bulk(tmp_path) == 1500
    assert not ckpt.parent.exists() and not (tmp_path / "cluster/nodes/n-0/pods/ns/pod-uid/volumes").exists()
    assert (logs / "trainer.log").read_text() == "a line\n" and steps.exists()
