"""Per-process data positions with real grain on every process of a real multi-process job: a restart (after
a SIGTERM-driven preemption) gives every process exactly the batches an uninterrupted run gives it, also on a
different process count where the position is global; where it is per process, the restart says why not."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.helpers_agreement import Gang, launch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORKER = Path(__file__).resolve().parent / "workers" / "grain_worker.py"
STEPS = 30


def _run(workdir: Path, n: int, mode: str, *, attempt: int = 1, steps: int = STEPS, step_seconds: float = 0.0,
         grace: float = 30.0) -> Gang:
    return launch(workdir, n, steps=steps, step_seconds=step_seconds, grace_seconds=grace, worker=WORKER,
                  extra_env={"GRAIN_MODE": mode, "REPRIEVE_ATTEMPT": str(attempt)})


def _batches(workdir: Path, n: int) -> dict[int, dict[int, list[int]]]:
    """``{step: {process: records}}``; a later attempt's record of a step replaces an earlier one."""
    out: dict[int, dict[int, list[int]]] = {}
    for p in range(n):
        path = workdir / f"batches-{p}.jsonl"
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["step"], {})[p] = rec["records"]
    return out


def _preempted(workdir: Path, n: int, mode: str) -> int:
    """Run until warm, SIGTERM process 0: every process exits 42 after the agreed save. Returns that step, which
    lies before the resumed runs' last one. (At 0.02 s a step, a loaded machine agreed at step 30 of 30 once: there
    was nothing left to resume. At 0.1 s a step the agreement has 3 s.)"""
    gang = _run(workdir, n, mode, steps=10_000, step_seconds=0.1, grace=3)
    assert gang.signal_when_running(0, signal.SIGTERM, 90) == [42] * n, gang.tail()
    log = gang.logs[0].read_text()
    step = int(log.split("agreed checkpoint at step ")[1].split()[0])
    assert step < STEPS - 1, f"the preemption agreed on step {step}: no step of {STEPS} is left to resume\n{gang.tail()}"
    return step


@pytest.fixture(scope="module")
def preempted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Path], int]:
    """``preempted(mode, work)``: a copy, at ``work``, of the module's one preempted 2-process gang of ``mode``
    (its checkpoints and batch logs; made by the first test that asks); returns its agreed step. Two tests resume
    each gang (on 2 processes, and on 1), so each preemption runs once, not twice; the module is one pytest-xdist
    work unit (tests/budget.py) so its tests share it."""
    made: dict[str, tuple[Path, int]] = {}

    def copy(mode: str, work: Path) -> int:
        if mode not in made:
            src = tmp_path_factory.mktemp(f"preempted-{mode}")
            made[mode] = (src, _preempted(src, 2, mode))
        src, saved = made[mode]
        shutil.copytree(src, work)
        return saved

    return copy


@pytest.mark.parametrize("mode", ["loader", "global"])
def test_every_process_resumes_its_grain_pipeline_exactly(tmp_path: Path, mode: str,
                                                          preempted: Callable[[str, Path], int]) -> None:
    ref = _run(tmp_path / "ref", 2, mode)
    assert ref.wait(120) == [0, 0], ref.tail()
    expected = _batches(tmp_path / "ref", 2)

    work = tmp_path / "preempted"
    saved = preempted(mode, work)
    again = _run(work, 2, mode, attempt=2)
    assert again.wait(120) == [0, 0], again.tail()
    assert f"resuming at step {saved + 1}" in again.logs[1].read_text()
    got = _batches(work, 2)
    assert [got[s] for s in range(STEPS)] == [expected[s] for s in range(STEPS)]
    # the processes read different records: each one resumed its own position
    assert got[saved + 1][0] != got[saved + 1][1]


def test_a_global_position_moves_to_another_process_count(tmp_path: Path,
                                                         preempted: Callable[[str, Path], int]) -> None:
    ref = _run(tmp_path / "ref", 1, "global")
    assert ref.wait(120) == [0], ref.tail()
    expected = {s: b[0] for s, b in _batches(tmp_path / "ref", 1).items()}  # the whole global batch

    work = tmp_path / "moved"
    saved = preempted("global", work)
    again = _run(work, 1, "global", attempt=2)  # half the processes: each global batch on one process
    assert again.wait(120) == [0], again.tail()
    two = _batches(work, 2)
    for s in range(saved + 1):
        assert two[s][0] + two[s][1] == expected[s]
    one = {json.loads(line)["step"]: json.loads(line)["records"]
           for line in (work / "batches-0.jsonl").read_text().splitlines() if json.loads(line)["attempt"] == 2}
    assert sorted(one) == list(range(saved + 1, STEPS))
    assert all(one[s] == expected[s] for s in one)


def test_per_process_positions_refuse_another_process_count_with_the_fix(
        tmp_path: Path, preempted: Callable[[str, Path], int]) -> None:
    work = tmp_path / "refused"
    saved = preempted("loader", work)
    again = _run(work, 1, "loader", attempt=2)
    assert again.wait(120) == [1], again.tail()
    log = again.logs[0].read_text()
    assert "DataPositionError" in log and "data positions of 2 processes and this job has 1" in log, again.tail()
    assert "reshard_data" in log and saved >= 0
