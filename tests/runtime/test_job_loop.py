"""The Job loop in one process (LocalCoordinator, real files): stop/save/exit decisions and their exit codes."""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import pytest
import reprieve
from reprieve.coordination import LocalCoordinator
from reprieve.job import Job
from reprieve.targets import MemoryTarget

from tests.runtime.helpers_agreement import FileCheckpointer
from tests.runtime.helpers_memtier import FakeTier

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit(code: int) -> None:
    raise Exited(code)


@pytest.fixture
def make_job(tmp_path: Path) -> Iterator[Any]:
    jobs: list[Job] = []

    def make(save_delay: float = 0.0, env_extra: dict[str, str] | None = None, **kwargs: Any) -> Job:
        env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_NOTICE_POLL_SECONDS": "0.05",
               "REPRIEVE_SAVE_SECONDS_ESTIMATE": "1", **(env_extra or {})}
        job = reprieve.init(env=env, install_sigterm=False, exit_fn=_exit,
                            checkpointer=lambda cfg, coord: FileCheckpointer(cfg.checkpoint_uri, coord,
                                                                           save_delay_s=save_delay), **kwargs)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.close()


def train(job: Job, total: int = 10_000, *, use_save: bool = True, notify_at: int | None = None,
          deadline_in: float = 0.5) -> tuple[int, int]:
    """Run the loop; returns (exit code, last step entered)."""
    state, start = job.restore_or(lambda: {"x": jnp.zeros((2,))})
    step = start
    try:
        for step in job.steps(start, total):
            state = {"x": state["x"] + 1}
            if step == notify_at:
                job.notify("maintenance", time.time() + deadline_in)
            time.sleep(0.002)
            if use_save:
                job.save(step, state)
    except Exited as exited:
        return exited.code, step
    return 0, step


def test_notify_then_save_at_the_agreed_step_exits_42_with_a_checkpoint(make_job: Any, tmp_path: Path) -> None:
    job = make_job()
    code, step = train(job, notify_at=5)
    assert code == 42
    target = job.agreement.target
    assert target is not None and step == target.plan.final_step >= 5  # notified in step 5's body
    assert FileCheckpointer(str(tmp_path / "ckpt"), LocalCoordinator()).latest_step() == step
    m = job.metrics
    assert m.get("reprieve_notices_total", source="user", reason="maintenance") == 1
    assert m.get("reprieve_agreed_step") == step and m.get("reprieve_notice_to_commit_seconds") > 0


def test_should_stop_loop(make_job: Any) -> None:
    job = make_job()
    state = {"x": jnp.zeros(2)}
    stopped = None
    try:
        for step in job.steps(0, 10_000):
            if step == 3:
                job.notify("maintenance", time.time() + 3)
            time.sleep(0.002)
            if job.should_stop(step):
                stopped = step
                job.save(step, state)
    except Exited as exited:
        assert exited.code == 42 and stopped is not None and stopped >= 3
    else:
        raise AssertionError("the loop ran to the end")


def test_a_commit_after_the_deadline_still_exits_as_saved_and_warns(make_job: Any, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The process outlived the deadline and the agreed checkpoint is committed: nothing was lost, so the exit is
    the restart code (a 1 would spend one of the job's maxFailures); the lateness is a warning naming the fix."""
    job = make_job(save_delay=0.6)  # a slow device-to-host copy: the commit misses a 0.3 s deadline
    with caplog.at_level(logging.INFO, logger="reprieve.job"):
        code, step = train(job, notify_at=2, deadline_in=0.3)
    assert code == 42
    assert FileCheckpointer(str(tmp_path / "ckpt"), LocalCoordinator()).latest_step() == step
    late = [r for r in caplog.records if "AFTER the deadline" in r.getMessage()]
    assert late and late[0].levelno == logging.WARNING and "noticeSeconds" in late[0].getMessage(), caplog.text
    assert "deadline passed before" in caplog.text


def test_malformed_notice_saves_at_once_and_is_not_a_late_commit(make_job: Any) -> None:
    answers = iter([None, None, {"reason": "spot", "deadline": "soon"}])
    job = make_job(save_delay=0.2, notice_fn=lambda: next(answers, None))
    code, _ = train(job)
    assert code == 42  # deadline unknown: no "late" failure even though "now" has passed
    target = job.agreement.target
    assert target is not None and not target.deadline_known


def test_agreed_step_passed_without_save_exits_1(make_job: Any, caplog: pytest.LogCaptureFixture) -> None:
    job = make_job()
    with caplog.at_level(logging.CRITICAL, logger="reprieve.job"):
        code, _ = train(job, use_save=False, notify_at=3)
    assert code == 1 and "passed without job.save" in caplog.text


def test_the_save_before_a_restart_leaves_retention_to_the_next_attempt(tmp_path: Path) -> None:
    """With the default checkpointer: the agreed save runs no retention pass (exiting would wait for it); the
    next attempt's first commit deletes what is owed. A normal finish does retention as always."""
    from reprieve.checkpoint import CheckpointManager

    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_NOTICE_POLL_SECONDS": "0.05",
           "REPRIEVE_SAVE_SECONDS_ESTIMATE": "1", "REPRIEVE_CHECKPOINT_KEEP": "1",
           "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "3"}
    job = reprieve.init(env=env, install_sigterm=False, exit_fn=_exit)
    try:
        code, step = train(job, notify_at=7)
    finally:
        job.close()
    assert code == 42 and step >= 7
    steps = CheckpointManager(str(tmp_path / "ckpt")).all_steps()
    assert steps[-1] == step and len(steps) >= 2, steps  # more than keep: the last commits deleted nothing
    again = reprieve.init(env={**env, "REPRIEVE_ATTEMPT": "2"}, install_sigterm=False, exit_fn=_exit)
    try:
        code, last = train(again, total=step + 4)
    finally:
        again.close()
    assert (code, last) == (0, step + 3)
    assert CheckpointManager(str(tmp_path / "ckpt"), attempt=2).all_steps() == [step + 3]


def test_finishing_normally_saves_the_last_step(make_job: Any, tmp_path: Path) -> None:
    job = make_job()
    code, step = train(job, total=7)
    assert (code, step) == (0, 6)
    assert FileCheckpointer(str(tmp_path / "ckpt"), LocalCoordinator()).latest_step() == 6
    again = make_job()
    state, start = again.restore_or(lambda: {"x": jnp.zeros((2,))})
    assert start == 7 and float(state["x"][0]) == 7.0


def test_should_stop_without_save_exits_1(make_job: Any, caplog: pytest.LogCaptureFixture) -> None:
    job = make_job()
    with caplog.at_level(logging.CRITICAL, logger="reprieve.job"), pytest.raises(Exited) as exited:
        for step in job.steps(0, 10_000):
            if step == 3:
                job.notify("maintenance", time.time() + 3)
            time.sleep(0.002)
            job.should_stop(step)  # ...and ignores it
    assert exited.value.code == 1 and "passed without job.save" in caplog.text


def test_metrics_port_serves_the_job_metrics(make_job: Any) -> None:
    import urllib.request

    from tests.runtime.helpers_agreement import free_port

    port = free_port()
    job = make_job(env_extra={"REPRIEVE_METRICS_PORT": str(port), "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "10"})
    body = ""
    began: list[float] = []  # when each step began, by the test's own clock
    for step in job.steps(0, 40):
        began.append(time.perf_counter())
        time.sleep(0.001)
        job.save(step, {"x": jnp.zeros(1)})
        if step == 35:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            scraped = len(began)
    began.append(time.perf_counter())  # the last step's end (with the loop's own ending: a looser bound)
    steps = [b - a for a, b in itertools.pairwise(began)]  # step 0 (compiling) too: the average may start there

    def like_the_steps(seconds: float, upto: int) -> bool:
        """A moving average of the step times lies between the shortest and the longest step (x2 either way:
        the runtime times a step from slightly other points than the test)."""
        return min(steps[:upto]) / 2 <= seconds <= 2 * max(steps[:upto])

    average = float(re.search(r"^reprieve_step_average_seconds (\S+)$", body, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert average >= 0.001 and like_the_steps(average, scraped - 2), (average, steps)
    assert "reprieve_step_seconds_count 35.0" in body  # every step so far, in the histogram
    assert "reprieve_save_blocking_seconds_count" in body and "reprieve_save_to_commit_seconds_count" in body
    assert "reprieve_last_committed_step 19.0" in body  # step 29's commit is confirmed at the next save
    assert 'reprieve_saves_total{kind="periodic"} 3.0' in body
    live = job.loop.fields()  # what the progress reporter sends: the loop's last step, its first, save waits
    assert (live["step"], live["firstStep"]) == (39, 0) and live["firstStepAt"] < live["stepAt"] <= time.time()
    assert live["stepSeconds"] >= 0.001 and like_the_steps(live["stepSeconds"], len(steps)), (live, steps)
    assert live["saveBlockingSeconds"] > 0 and live["restoreSeconds"] == 0


def test_with_block_finishes_after_break_and_abandons_on_error(make_job: Any, tmp_path: Path) -> None:
    with make_job() as job:
        for step in job.steps(0, 100):
            job.save(step, {"x": jnp.zeros(1)})
            if step == 9:
                break
    assert job.phase.terminal
    with pytest.raises(ZeroDivisionError), make_job() as job2:
        for step in job2.steps(0, 100):
            if step == 3:
                raise ZeroDivisionError
    assert job2.phase.terminal


class Numbers:
    """A data iterator with grain's checkpoint interface (``get_state`` / ``set_state``), ``n`` items."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __iter__(self) -> Numbers:
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def get_state(self) -> bytes:
        return json.dumps({"i": self.i}).encode()

    def set_state(self, state: bytes) -> None:
        self.i = json.loads(state)["i"]


def test_a_loop_over_a_loader_without_a_total_resumes_where_its_data_was(tmp_path: Path) -> None:
    """``for step, batch in zip(job.steps(start), loader)`` (no total): periodic saves carry the loader's
    position; the loop ends with its data; ``save(force=True)`` keeps the final state."""
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ck"), "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "4"}
    seen: list[int] = []

    def run(stop_after: int | None) -> tuple[int, float]:
        data = Numbers(10)
        with reprieve.init(env=env, install_sigterm=False) as job:
            state, start = job.restore_or(lambda: {"sum": jnp.zeros(())}, data=data)
            step = start - 1
            for step, item in zip(job.steps(start), data):
                seen.append(item)
                state = {"sum": state["sum"] + item}
                job.save(step, state, data=data)
                if step == stop_after:
                    return step, float(state["sum"])  # stops early: nothing saved after step 3
            job.save(step, state, data=data, force=True)
        return step, float(state["sum"])

    assert run(stop_after=5) == (5, 15.0)  # saves at steps 3 (items 0..3) and 5 is not saved
    assert run(stop_after=None) == (9, 45.0)  # resumed after step 3: items 4..9, each once more
    assert seen == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9]
    with reprieve.init(env=env, install_sigterm=False) as job:
        restored = job.restore_or(lambda: {"sum": jnp.zeros(())}, data=Numbers(10))
        assert restored.step == 9 and float(restored[0]["sum"]) == 45.0
        assert restored.data == json.dumps({"i": 10}).encode()


def test_time_based_interval_in_one_process(make_job: Any) -> None:
    job = make_job(env_extra={"REPRIEVE_CHECKPOINT_INTERVAL_SECONDS": "0.1"})
    for step in job.steps(0, 80):
        time.sleep(0.005)
        job.save(step, {"x": jnp.zeros(1)})
    interval = job.metrics.get("reprieve_saves_total", kind="interval")
    assert interval >= 2
    # The last step is always saved, as "last", also when the interval falls due on it (slow machine).
    assert job.metrics.get("reprieve_saves_total", kind="last") == 1
    assert not job.metrics.get("reprieve_saves_total", kind="periodic")
    assert job.checkpointer.latest_step() == 79


def test_data_with_a_checkpointer_that_cannot_store_it_is_refused_at_save(make_job: Any) -> None:
    job = make_job()
    with pytest.raises(TypeError, match="FileCheckpointer does not store per-process data positions"):
        for step in job.steps(0, 3):
            job.save(step, {"x": jnp.zeros(1)}, data={"i": step}, force=True)


def test_a_data_position_that_is_not_json_names_the_process_and_key(tmp_path: Path) -> None:
    with reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}, install_sigterm=False) as job:
        with pytest.raises(TypeError, match=r"job.save\(step 0, data=...\): process 0's data position must be "
                                            r"JSON-serialisable: \['files'\]\[0\] is a PosixPath"):
            for step in job.steps(0, 1):
                job.save(step, {"x": jnp.zeros(1)}, data={"files": [tmp_path]}, force=True)
        job.abandon()


def test_the_step_time_average_leaves_out_the_first_step_and_saves_carry_their_steps_finish(make_job: Any) -> None:
    """The first step of an attempt holds its compilation (here a 1 s stall): in the average it would inflate
    the countdown's plan and the operator's loop start for tens of steps (docs/contract.md, "Progress")."""
    job = make_job(env_extra={"REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "5"})
    state, start = job.restore_or(lambda: {"x": jnp.zeros((2,))})
    for step in job.steps(start, 12):
        time.sleep(1.0 if step == start else 0.01)
        state = {"x": state["x"] + 1}
        job.save(step, state)
    fields = job.loop.fields()
    assert fields["stepSeconds"] < 0.2, fields
    saved = dict(fields["savedStepsAt"])
    assert set(saved) == {9, 11}, saved  # the newest two: the interval's save and the last step's
    assert fields["firstStepAt"] < saved[9] < saved[11] <= fields["stepAt"] + 0.001, fields


def train_with_memory_tier(tmp_path: Path, caplog: pytest.LogCaptureFixture, tier: FakeTier, *,
                           deadline_in: float) -> tuple[int, int, FileCheckpointer]:
    """One process notified at step 3 (the deadline ``deadline_in`` s away) with ``tier`` beside the file
    checkpointer; (exit code, last step, the checkpointer), the log captured at the root's INFO (reprieve's console
    handler passes records on only to a configured root)."""
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_NOTICE_POLL_SECONDS": "0.05",
           "REPRIEVE_SAVE_SECONDS_ESTIMATE": "0.1"}
    ckpt = FileCheckpointer(str(tmp_path / "ckpt"), LocalCoordinator())
    job = reprieve.init(env=env, install_sigterm=False, exit_fn=_exit, checkpointer=lambda cfg, coord: ckpt)
    job.memory = MemoryTarget(tier, metrics=job.metrics, on_blocked=lambda seconds: None)  # the tier, faked
    try:
        with caplog.at_level(logging.INFO):
            return (*train(job, notify_at=3, deadline_in=deadline_in), ckpt)
    finally:
        job.close()


@pytest.mark.parametrize(("deadline_in", "busy", "copied"), [
    (6.5, False, True),   # room before the deadline: the agreed step is copied to memory too, then waited for
    (1.0, False, False),  # the deadline too close for a second host copy: storage only
    (6.5, True, False),   # a periodic copy still in the background: storage only
])
def test_the_agreed_save_before_a_restart_also_copies_the_step_to_memory_when_there_is_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, deadline_in: float, busy: bool, copied: bool) -> None:
    tier = FakeTier(busy=busy)
    code, step, ckpt = train_with_memory_tier(tmp_path, caplog, tier, deadline_in=deadline_in)
    assert code == 42
    assert tier.saves == ([(step, "memory")] if copied else [])
    assert ckpt.latest_step() == step  # the storage save is the guarantee either way
    if copied:
        assert len(tier.waits) == 2 and tier.waits[1] is not None and tier.waits[1] <= 1.0  # before the copy (busy?), after the commit (bounded)
        assert f"agreed step {step}: memory copy committed" in caplog.text
        assert tier.notices[step], tier.notices  # the agreed step's copy records its notice, as storage's does
    else:
        assert f"agreed step {step}: no memory copy beside the storage save" in caplog.text


def test_a_failing_agreed_memory_copy_never_fails_the_agreed_save(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The memory copy beside the agreed save raises (a full /dev/shm): the storage save commits and the process
    exits with the restart code, as without the tier."""
    tier = FakeTier(broken=True)
    code, step, ckpt = train_with_memory_tier(tmp_path, caplog, tier, deadline_in=6.5)
    assert code == 42 and ckpt.latest_step() == step and tier.saves == []
    assert f"agreed step {step}: the memory copy beside the storage save failed (OSError" in caplog.text
