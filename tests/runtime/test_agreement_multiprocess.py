"""Real multi-process jobs (``jax.distributed`` on 127.0.0.1, CPU): notice -> one agreed step -> exit 42.

Each test starts 2 or 4 worker processes (``workers/train_worker.py``) that train ``x += 1`` per step and save
through :class:`helpers_agreement.FileCheckpointer` (real fsynced files, a real barrier). A checkpoint of step
S holds ``x == S + 1`` in every process's file, which proves all processes saved the same step.

Four processes once, where the behaviour needs more than one peer to ack (two notices at once, 3 peers); the
other tests run 2 (a process start costs 2-3 CPU-s on a CPU-bound suite). A 4-process save and restore of the
default checkpointer is tests/runtime/test_checkpoint_multiprocess.py's.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.runtime.helpers_agreement import Gang, launch, node_notice, write_notice_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RESTART = 42


def assert_one_agreed_save(gang: Gang, codes: list[int], n: int) -> int:
    """All exited 42 and the last committed step is one step, saved by all ``n`` processes at that step."""
    assert codes == [RESTART] * n, gang.tail()
    saved = gang.saved()
    assert saved, f"no committed checkpoint\n{gang.tail()}"
    final = max(saved)
    assert saved[final] == {p: float(final + 1) for p in range(n)}, (saved, gang.tail())
    agreed = {p: re.findall(r"agreed save step (\d+)", path.read_text()) for p, path in enumerate(gang.logs)}
    assert {p: int(steps[-1]) for p, steps in agreed.items()} == {p: final for p in range(n)}, agreed
    return final


def assert_committed_before_the_deadline(gang: Gang) -> None:
    """Every process's own verdict on the agreed checkpoint: committed on all, a positive margin left before the
    deadline by the runtime's clock (the deadline the runtime planned with, not the test's estimate of it)."""
    for p, path in enumerate(gang.logs):
        margins = re.findall(r"committed on all \d+ process\(es\), [0-9.]+s after the notice, (-?[0-9.]+)s before "
                             r"the deadline", path.read_text())
        assert margins and float(margins[-1]) > 0, (p, margins, gang.tail())


def wait_warm(gang: Gang, n: int) -> None:
    for i in range(n):
        gang.wait_for_file(f"running-{i}", 60)


def test_sigterm_to_one_process_all_save_the_same_step(tmp_path: Path) -> None:
    n = 2
    gang = launch(tmp_path, n, steps=5000, grace_seconds=5)
    try:
        wait_warm(gang, n)
        sent = time.time()
        gang.signal(n - 1, signal.SIGTERM)
        codes = gang.wait(60)
    finally:
        gang.kill()
    final = assert_one_agreed_save(gang, codes, n)
    assert gang.committed_at(final) < sent + 5, "commit landed after the SIGTERM deadline"
    assert_committed_before_the_deadline(gang)
    assert len(gang.saved()) == 1  # short grace: no early save, no periodic saves


def test_notice_through_the_annotations_file(tmp_path: Path) -> None:
    n = 2
    gang = launch(tmp_path, n, steps=5000, notice_file=True)
    try:
        wait_warm(gang, n)
        deadline = time.time() + 5
        # only process 0's pod file gets it: process 1 must learn it through the agreement
        write_notice_file(tmp_path / "annotations-0", node_notice("gke-spot", "node-a", deadline))
        codes = gang.wait(60)
    finally:
        gang.kill()
    final = assert_one_agreed_save(gang, codes, n)
    assert gang.committed_at(final) < deadline
    assert_committed_before_the_deadline(gang)
    assert "via notice-file" in gang.logs[0].read_text()


def test_simultaneous_notices_give_one_agreed_step(tmp_path: Path) -> None:
    n = 4
    gang = launch(tmp_path, n, steps=5000, grace_seconds=5)
    try:
        wait_warm(gang, n)
        gang.signal(1, signal.SIGTERM)
        gang.signal(3, signal.SIGTERM)
        codes = gang.wait(60)
    finally:
        gang.kill()
    assert_one_agreed_save(gang, codes, n)
    assert len(gang.saved()) == 1
    leaders = [p for p, path in enumerate(gang.logs) if "leads agreement round 0" in path.read_text()]
    assert len(leaders) == 1 and leaders[0] in (1, 3), leaders


def test_notice_during_a_save(tmp_path: Path) -> None:
    n = 2
    gang = launch(tmp_path, n, steps=5000, interval=5, save_delay=0.8, grace_seconds=4)
    try:
        gang.wait_for_file("ckpt/saving-0-4", 60)  # process 0 is inside save(4) for the next 0.8 s
        gang.signal(0, signal.SIGTERM)
        codes = gang.wait(60)
    finally:
        gang.kill()
    final = assert_one_agreed_save(gang, codes, n)
    saved = gang.saved()
    assert final > 4 and 4 in saved and saved[4] == {0: 5.0, 1: 5.0}, saved
    assert "acked round 0" in gang.logs[0].read_text()


def test_long_deadline_keeps_training_and_saves_before_it(tmp_path: Path) -> None:
    n = 2
    gang = launch(tmp_path, n, steps=5000, notice_file=True)
    try:
        wait_warm(gang, n)
        noticed = time.time()
        deadline = noticed + 14  # margin 5 s + 2 x 1 s save estimate -> ~7 s of extra training
        write_notice_file(tmp_path / "annotations-1", node_notice("maintenance", "node-b", deadline, noticed))
        codes = gang.wait(60)
    finally:
        gang.kill()
    final = assert_one_agreed_save(gang, codes, n)
    saved = sorted(gang.saved())
    assert len(saved) == 2, f"expected a first save at once and the final save, got {saved}\n{gang.tail()}"
    early = saved[0]
    assert final - early >= 5, f"training did not continue: early {early}, final {final}\n{gang.tail()}"
    # How long the extra training lasts depends on the step time the plan measured (a slow step under load plans
    # fewer steps, which then run fast): the steps trained after the first save prove it, not the clock.
    committed = gang.committed_at(final)
    assert noticed < committed < deadline, (committed - noticed, deadline - noticed)
    assert_committed_before_the_deadline(gang)


def test_second_notice_brings_the_save_earlier(tmp_path: Path) -> None:
    n = 2
    gang = launch(tmp_path, n, steps=5000, notice_file=True, grace_seconds=3)
    try:
        wait_warm(gang, n)
        far = time.time() + 60
        write_notice_file(tmp_path / "annotations-0", node_notice("maintenance", "node-a", far))
        first = _wait_for_log(gang, 0, r"agreed save step (\d+) \(first save at (\d+)\)", 30)
        planned_final, early = int(first.group(1)), int(first.group(2))
        _wait_for_log(gang, 0, r"round 0 plan|acked round 0", 5)
        sent = time.time()
        gang.signal(1, signal.SIGTERM)  # deadline in 3 s: much earlier than the planned final save
        codes = gang.wait(60)
    finally:
        gang.kill()
    final = assert_one_agreed_save(gang, codes, n)
    # The new final step may coincide with the first save when the second notice lands before it.
    assert early <= final < planned_final, (early, final, planned_final)
    assert gang.committed_at(final) < sent + 3
    assert_committed_before_the_deadline(gang)
    assert "acked round 1" in gang.logs[0].read_text()


def test_leaving_the_loop_early_exits_cleanly(tmp_path: Path) -> None:
    """break out of job.steps() without finishing: the watcher threads must not abort the interpreter. The heartbeat
    timeout is long: the two processes end independently and meet in JAX's shutdown barrier, and one stalled for the
    default 10 s on a loaded machine has JAX abort the other (suite run L: the barrier ended at the heartbeat
    timeout; not reproduced in 20 runs beside two busy loops), which is not what this proves."""
    gang = launch(tmp_path, 2, steps=1000, step_seconds=0.0, heartbeat_s=60, extra_env={"WORKER_BREAK_AT": "20"})
    codes = gang.wait(60)
    assert codes == [0, 0], gang.tail()
    assert all("without finishing job.steps()" in p.read_text() for p in gang.logs)


@pytest.mark.parametrize("victim", [1, 0], ids=["worker", "coordinator-host"])
def test_sigkill_of_one_process_fails_the_rest_fast(tmp_path: Path, victim: int) -> None:
    n = 2
    gang = launch(tmp_path, n, steps=100_000, heartbeat_s=3)
    try:
        wait_warm(gang, n)
        gang.signal(victim, signal.SIGKILL)
        killed = time.monotonic()
        survivor = gang.procs[1 - victim]
        code = survivor.wait(60)
        elapsed = time.monotonic() - killed
    finally:
        gang.kill()
    print(f"\nSIGKILL of process {victim}: process {1 - victim} exited {code} after {elapsed:.1f}s")
    (tmp_path / "sigkill.json").write_text(json.dumps({"victim": victim, "code": code, "seconds": elapsed}))
    assert code not in (0, RESTART), gang.tail()
    log = gang.logs[1 - victim].read_text()
    if victim == 1:  # process 0 named it from its pulse (reprieve.pulse), or the coordination service (in process
        # 0) saw its heartbeats stop first and said so
        assert re.search(r"stopped sending heartbeats\):\s*1\b", log) or re.search(
            r"ending process \d+ now: process 1 of 2 has ended without leaving the job", log), gang.tail()
    else:  # the service went with process 0: the survivor's next call to it failed (JAX's UNAVAILABLE), or its
        # tether's knock found the service gone, or its link to process 0's pulse closed and a connect was refused
        # (reprieve.pulse; suite run Z): whichever came first
        assert "UNAVAILABLE" in log or re.search(r"the coordination service is gone \(a knock at \S+ found no "
                                                 r"service: \[Errno 111\] Connection refused\)", log) or \
            re.search(r"ending process \d+ now: process 0 of 2 has ended without leaving the job", log), gang.tail()
    # and that, not a timeout of its own: well before the agreement's 30 s (launch()) would have failed it
    assert elapsed < 30, f"survivor took {elapsed:.1f}s to fail"
    assert gang.saved() == {}


def _wait_for_log(gang: Gang, index: int, pattern: str, timeout_s: float) -> re.Match[str]:
    limit = time.monotonic() + timeout_s
    while time.monotonic() < limit:
        match = re.search(pattern, gang.logs[index].read_text())
        if match:
            return match
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not in process {index}'s log within {timeout_s}s\n{gang.tail()}")


def test_with_the_checkpoint_manager_sigterm_then_restart_resumes_every_process(tmp_path: Path) -> None:
    """reprieve.init()'s default checkpointer (reprieve.checkpoint.CheckpointManager), a global array
    sharded over the processes: SIGTERM -> all exit 42 -> attempt 2 restores the agreed step and finishes."""
    n = 2
    pytest.importorskip("reprieve.checkpoint")
    total = 5000
    env = {"WORKER_CHECKPOINTER": "manager"}
    gang = launch(tmp_path, n, steps=total, grace_seconds=5, extra_env=env)
    try:
        wait_warm(gang, n)
        gang.signal(0, signal.SIGTERM)
        codes = gang.wait(60)
    finally:
        gang.kill()
    assert codes == [RESTART] * n, gang.tail()
    agreed = {int(re.findall(r"agreed save step (\d+)", p.read_text())[-1]) for p in gang.logs}
    assert len(agreed) == 1, agreed
    (step,) = agreed
    total = step + 1 + 20
    again = launch(tmp_path, n, steps=total, step_seconds=0.0, extra_env={**env, "REPRIEVE_ATTEMPT": "2"})
    again.assert_resumed(step, 90)
    for p in range(n):
        assert (tmp_path / f"done-{p}").read_text() == f"{float(total)}"  # every step counted exactly once


def test_a_time_based_interval_saves_the_same_step_on_every_process(tmp_path: Path) -> None:
    """REPRIEVE_CHECKPOINT_INTERVAL_SECONDS: process 0's clock says when, a save round says which step; the
    processes' loops run at different speeds, yet every save is of one step on all (a disagreement would hang
    the checkpointer's commit barrier)."""
    n = 2
    gang = launch(tmp_path, n, steps=120, step_seconds=0.01, extra_env={
        "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS": "0.3", "WORKER_STEP_JITTER": "1"})
    codes = gang.wait(90)
    assert codes == [0] * n, gang.tail()
    saved = gang.saved()
    interval_steps = sorted(s for s in saved if s != 119)
    assert len(interval_steps) >= 2, (saved, gang.tail())
    for step in saved:
        assert saved[step] == {p: step + 1.0 for p in range(n)}, saved
    for p in range(n):
        # The last step is saved anyway; on a slow machine an interval save may fall on it as well.
        agreed = [int(s) for s in re.findall(r"agreed save at step (\d+)", gang.logs[p].read_text())
                  if int(s) != 119]
        assert agreed == interval_steps, (p, agreed, interval_steps)
