"""One real process, no Kubernetes: finish normally (exit 0), or SIGTERM -> exit 42 -> restart resumes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.runtime.helpers_agreement import launch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_plain_run_without_any_contract_variable_finishes_and_saves_the_last_step(tmp_path: Path) -> None:
    gang = launch(tmp_path, 1, steps=30, step_seconds=0.0, bare=True)
    codes = gang.wait(60)
    assert codes == [0], gang.tail()
    assert (tmp_path / "done-0").read_text() == "30.0"
    assert gang.saved() == {29: {0: 30.0}}


def test_sigterm_saves_exits_42_and_the_restart_resumes_from_it(tmp_path: Path) -> None:
    gang = launch(tmp_path, 1, steps=400, step_seconds=0.02, grace_seconds=3)
    codes = gang.signal_when_running(0, signal.SIGTERM, 60)
    assert codes == [42], gang.tail()
    (saved_step,) = gang.saved()
    assert gang.saved()[saved_step] == {0: saved_step + 1.0}
    again = launch(tmp_path, 1, steps=400, step_seconds=0.0, extra_env={"REPRIEVE_ATTEMPT": "2"})
    assert again.wait(60) == [0], again.tail()
    log = again.logs[0].read_text()
    assert f"restored step {saved_step} " in log and f"resuming at step {saved_step + 1}" in log
    assert (tmp_path / "done-0").read_text() == "400.0"  # x counts every step exactly once across the restart


def _doomed_restart(tmp_path: Path, *, deadline_in: float, steps: int, step_seconds: float) -> object:
    """Restart the gang (attempt 2) onto a node that is already doomed: the notice is there before the loop
    starts, ``deadline_in`` seconds away."""
    import time

    from tests.runtime.helpers_agreement import rfc3339, write_notice_file

    now = time.time()  # to the microsecond: whole seconds took up to 1 s off the deadline
    write_notice_file(tmp_path / "annotations-0", {"id": "n1", "reason": "gke-spot", "node": "x",
                                                    "deadline": rfc3339(now + deadline_in), "observedAt": rfc3339(now)})
    return launch(tmp_path, 1, steps=steps, step_seconds=step_seconds, notice_file=True,
                  extra_env={"REPRIEVE_ATTEMPT": "2", "REPRIEVE_SAVE_SECONDS_ESTIMATE": "30"})


def test_a_notice_present_at_start_up_saves_at_the_first_step_when_no_step_time_is_known(tmp_path: Path) -> None:
    first = launch(tmp_path, 1, steps=1, step_seconds=0.0)
    assert first.wait(60) == [0], first.tail()  # step 0 committed; one step: none was timed
    again = _doomed_restart(tmp_path, deadline_in=25, steps=400, step_seconds=0.02)
    assert again.wait(60) == [42], again.tail()
    log = again.logs[0].read_text()
    assert "resuming at step 1" in log
    assert "estimates from the checkpoint" not in log
    assert "step time unknown: save at the earliest step" in log, again.tail()
    assert "saving agreed step 1 " in log, again.tail()


def test_a_notice_at_start_up_trains_to_its_deadline_with_the_step_time_the_checkpoint_recorded(
        tmp_path: Path) -> None:
    """The restored checkpoint carries the step and save times its attempt measured, so a notice that comes
    before the new attempt timed a step plans with them: first save at once, then train until shortly before
    the deadline, instead of exiting at once (and waiting for a replacement pod) with most of the notice left."""
    import json
    import re

    first = launch(tmp_path, 1, steps=40, step_seconds=0.05, interval=10)
    assert first.wait(60) == [0], first.tail()  # steps timed at ~0.05 s, saves measured
    recorded = json.loads((first.ckpt / "step_39" / "COMMITTED").read_text())["extra"]["reprieve"]
    # 30 s: the plan keeps a 5 s margin, and a process's start under the suite's load took 7 s on one VM and 24 s
    # on a slower one (with 18 s its notice's deadline had passed before it started: ignored as a leftover)
    again = _doomed_restart(tmp_path, deadline_in=30, steps=4000, step_seconds=0.05)
    assert again.wait(60) == [42], again.tail()
    log = again.logs[0].read_text()
    assert "resuming at step 40" in log
    seeded = re.search(r"estimates from the checkpoint's attempt: step ([0-9.]+) s, save ([0-9.]+) s", log)
    assert seeded, again.tail()
    # what attempt 1 measured and recorded in the checkpoint it restored (its steps sleep 0.05 s), not the
    # defaults (save 30 s here)
    assert recorded["stepSeconds"] >= 0.05, recorded
    assert float(seeded.group(1)) == pytest.approx(recorded["stepSeconds"], abs=0.0006), (seeded, recorded)
    assert float(seeded.group(2)) == pytest.approx(recorded["saveSeconds"], abs=0.0006), (seeded, recorded)
    assert "first save at once" in log, again.tail()
    final = int(re.search(r"saving agreed step (\d+) ", log).group(1))  # type: ignore[union-attr]
    assert final > 40, again.tail()  # trained on (with the default estimates it would save step 40 and exit)
    assert 40 in again.saved() and final in again.saved()
    margin = re.search(r"committed on all 1 process\(es\), [0-9.]+s after the notice, ([0-9.]+)s before the "
                       r"deadline", log)
    assert margin and float(margin.group(1)) > 0, again.tail()  # the runtime's own clock: before the deadline


def test_a_sigterm_after_the_restart_code_is_decided_still_exits_with_it(tmp_path: Path) -> None:
    """Regression: closing the job put back SIG_DFL, so a SIGTERM in the last moments (after "exiting with
    code 42" was logged, before the process ended) killed the committed run with 143."""
    import time

    gang = launch(tmp_path, 1, steps=400, step_seconds=0.02, grace_seconds=5, extra_env={"WORKER_SLOW_EXIT": "2"})
    try:
        gang.wait_for_file("running-0", 60)
        gang.signal(0, signal.SIGTERM)
        limit = time.monotonic() + 30
        while "exiting with code 42" not in gang.logs[0].read_text():
            assert time.monotonic() < limit and gang.procs[0].poll() is None, gang.tail()
            time.sleep(0.02)
        gang.signal(0, signal.SIGTERM)  # the kubelet's second SIGTERM, or the node going down
        gang.signal(0, signal.SIGINT)
        codes = gang.wait(30)
    finally:
        gang.kill()
    assert codes == [42], gang.tail()
    assert len(gang.saved()) == 1


def test_a_notice_file_left_by_an_earlier_run_neither_stops_nor_fails_the_next(tmp_path: Path) -> None:
    """Defect (issue 23): a notice file whose deadline had passed before the process started (a leftover; the
    attempt is always 1 on a laptop) made every restart save one step and exit 1. It is logged as stale and the
    run trains to its end."""
    from tests.runtime.helpers_agreement import write_notice_file

    write_notice_file(tmp_path / "annotations-0", {"id": "old", "reason": "test", "node": "x",
                                                    "deadline": "2020-01-01T00:00:00Z"})
    gang = launch(tmp_path, 1, steps=20, step_seconds=0.0, notice_file=True)
    assert gang.wait(60) == [0], gang.tail()
    log = gang.logs[0].read_text()
    assert "before this process started" in log and "AFTER the deadline" not in log, gang.tail()
    assert (tmp_path / "done-0").read_text() == "20.0"


def test_a_second_sigterm_during_the_countdown_is_said_to_be_in_force(tmp_path: Path) -> None:
    import re
    import time

    gang = launch(tmp_path, 1, steps=4000, step_seconds=0.02, grace_seconds=12,
                  extra_env={"REPRIEVE_SAVE_SECONDS_ESTIMATE": "0.5"})
    try:
        gang.wait_for_file("running-0", 60)
        gang.signal(0, signal.SIGTERM)
        limit = time.monotonic() + 30
        while not re.search(r"agreed save step (\d+)", gang.logs[0].read_text()):
            assert time.monotonic() < limit and gang.procs[0].poll() is None, gang.tail()
            time.sleep(0.02)
        gang.signal(0, signal.SIGTERM)  # Ctrl-C's cousin on a laptop: `kill` again while it counts down
        codes = gang.wait(60)
    finally:
        gang.kill()
    assert codes == [42], gang.tail()
    log = gang.logs[0].read_text()
    final = re.search(r"agreed save step (\d+)", log).group(1)  # type: ignore[union-attr]
    assert re.search(rf"via sigterm again: notice already in force \(agreed save at step {final}, deadline in "
                     r"[0-9.]+s\); nothing changes", log), gang.tail()


def test_a_notice_the_restored_checkpoint_saved_for_does_not_stop_the_next_attempt(tmp_path: Path) -> None:
    """On a laptop nobody clears the notice file: the restarted attempt found the same notice, its deadline still
    to come, saved again at once and exited 42 again, until the deadline passed. The restored checkpoint records
    which notice it was the agreed save of; that notice, delivered again, is ignored."""
    import time

    from tests.runtime.helpers_agreement import write_notice_file

    deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 45))
    write_notice_file(tmp_path / "annotations-0", {"id": "maint-7", "reason": "maintenance", "deadline": deadline})
    slow_save = {"REPRIEVE_SAVE_SECONDS_ESTIMATE": "25"}  # no time to train on: save at the earliest step
    first = launch(tmp_path, 1, steps=4000, step_seconds=0.01, notice_file=True, extra_env=slow_save)
    assert first.wait(60) == [42], first.tail()
    (saved,) = first.saved()
    again = launch(tmp_path, 1, steps=saved + 30, step_seconds=0.0, notice_file=True,
                   extra_env={**slow_save, "REPRIEVE_ATTEMPT": "2"})
    assert again.wait(60) == [0], again.tail()
    log = again.logs[0].read_text()
    assert f"notice maint-7 (notice-file) was already saved for: the restored checkpoint, step {saved}" in log, \
        again.tail()
