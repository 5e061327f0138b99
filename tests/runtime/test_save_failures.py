"""A failed storage save is not fatal (issue #25): the pure decisions (which failure, how many in a row, what
retention removes after one), and the Job's answer to each with a stub checkpointer whose wait() fails."""

from __future__ import annotations

import errno
import re
from typing import Any

import pytest
import reprieve
from reprieve.checkpoint import CheckpointSaveError, FencedError
from reprieve.checkpoint.layout import CheckpointName
from reprieve.checkpoint.retention import select_abandoned
from reprieve.policy import FENCED, OTHER, STORAGE, classify_save_error, save_failure_verdict
from reprieve.targets import StorageTarget

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("err", "kind"), [
    (CheckpointSaveError("not committed: error: processes failed", storage=True), STORAGE),
    (CheckpointSaveError("not committed: barrier", storage=False), OTHER),
    (OSError(errno.ENOSPC, "No space left on device"), STORAGE),  # a checkpointer without the attribute
    (PermissionError(errno.EROFS, "Read-only file system"), STORAGE),
    (FencedError("attempt 3 is stale"), FENCED),
    (RuntimeError("coordination service: deadline exceeded"), OTHER),
    (TypeError("leaf ['x']: not an array"), OTHER),
])
def test_which_failure_a_save_error_is(err: BaseException, kind: str) -> None:
    assert classify_save_error(err) == kind


@pytest.mark.parametrize(("kind", "consecutive", "max_failed", "seconds", "agreed_next", "fatal"), [
    (STORAGE, 1, 3, 600, False, None),  # retried at the next due save
    (STORAGE, 2, 3, 600, False, None),
    (STORAGE, 3, 3, 600, False, "3 consecutive checkpoint saves failed over 600 s (REPRIEVE_MAX_FAILED_SAVES=3)"),
    (STORAGE, 3, 3, 60, False, "over 60 s"),
    (STORAGE, 9, 3, 59, False, None),  # frequent saves within one short outage: not yet
    (STORAGE, 1, 1, 600, False, "1 consecutive"),  # REPRIEVE_MAX_FAILED_SAVES=1: the first failure, once long
    (STORAGE, 5, 3, 600, True, None),  # the agreed save of a notice comes next: it is the last chance, let it try
    (FENCED, 1, 3, 0, False, "a newer attempt owns the checkpoint storage"),
    (FENCED, 1, 3, 0, True, "a newer attempt owns"),
    (OTHER, 1, 3, 0, False, "outside the storage"),
])
def test_whether_a_failed_save_is_fatal(kind: str, consecutive: int, max_failed: int, seconds: float,
                                         agreed_next: bool, fatal: str | None) -> None:
    got = save_failure_verdict(kind, consecutive, max_failed, failing_seconds=seconds, min_failing_seconds=60,
                               agreed_next=agreed_next)
    assert got == fatal if fatal is None else (got is not None and fatal in got)


def _n(step: int, attempt: int, state: str = "committed") -> CheckpointName:
    return CheckpointName(step, attempt, state)  # type: ignore[arg-type]


@pytest.mark.parametrize(("entries", "committed_step", "doomed"), [
    ([_n(5, 2, "tmp"), _n(7, 2)], 7, [_n(5, 2, "tmp")]),  # a failed save's leftover, older than the commit
    ([_n(9, 2, "tmp"), _n(7, 2)], 7, []),  # a later step's save may be writing now
    ([_n(3, 3, "tmp")], 7, []),  # a newer attempt's
    ([_n(30, 1, "tmp")], 7, [_n(30, 1, "tmp")]),  # an older attempt's, whatever its step
    ([_n(4, 2, "deleting"), _n(5, 2, "corrupt")], 7, [_n(4, 2, "deleting")]),  # quarantine has its own rule
    ([_n(5, 2, "tmp")], None, []),  # nothing committed by this manager yet: none of this attempt's
    ([_n(30, 1, "tmp"), _n(4, 2, "deleting"), _n(6, 2, "tmp")], None,  # but an older attempt's, and deletions
     [_n(4, 2, "deleting"), _n(30, 1, "tmp")]),
])
def test_what_retention_removes_besides_old_checkpoints(entries: list[CheckpointName], committed_step: int | None,
                                                        doomed: list[CheckpointName]) -> None:
    assert select_abandoned(entries, attempt=2, committed_step=committed_step) == doomed


class FailingCheckpointer:
    """Saves nothing; ``wait()`` raises the next queued error (None: the save committed)."""

    def __init__(self, errors: list[BaseException | None]) -> None:
        self.errors = errors
        self.last_save_seconds: float | None = None
        self.saved: list[int] = []

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None:
        self.saved.append(step)

    def wait(self) -> None:
        err = self.errors.pop(0) if self.errors else None
        if err is not None:
            raise err

    def latest_step(self) -> None:
        return None

    def restore(self, abstract_state: Any, *, step: int | None = None) -> Any:
        raise FileNotFoundError("none")

    def close(self) -> None:
        pass


def _train(errors: list[BaseException | None], total: int, env: dict[str, str] | None = None,
           ) -> tuple[reprieve.Job, FailingCheckpointer, BaseException | None]:
    ckpt = FailingCheckpointer(errors)
    job = reprieve.init(env={"REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "1", **(env or {})}, install_sigterm=False,
                        checkpointer=ckpt)
    raised = None
    try:
        with job:
            for step in job.steps(0, total):
                job.save(step, {"x": step})
    except Exception as err:  # noqa: BLE001 - what the user's loop would see
        raised = err
    return job, ckpt, raised


def _storage_error(step: int) -> CheckpointSaveError:
    return CheckpointSaveError(f"checkpoint step {step} not committed: error: processes failed", storage=True)


def test_failed_saves_below_the_bound_train_on_and_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    job, ckpt, raised = _train([_storage_error(0), _storage_error(1), None, _storage_error(3)], total=6)
    assert raised is None and ckpt.saved == [0, 1, 2, 3, 4, 5]
    assert job.metrics.get("reprieve_save_failures_total") == 3
    assert job.committed_step == 5
    fields = job.loop.fields()
    assert fields["failedSaves"] == 0 and fields["lastSaveError"].startswith("step 3: CheckpointSaveError")
    assert "checkpoint save of step 1 failed (2 in a row, fatal at REPRIEVE_MAX_FAILED_SAVES=3 over 60 s" in caplog.text


def test_the_bound_is_fatal_and_says_how_many_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[BaseException | None] = [_storage_error(0), _storage_error(1)]
    _, _, raised = _train(list(errors), total=6, env={"REPRIEVE_MAX_FAILED_SAVES": "2"})
    assert raised is None  # two failures within a second: no storage outage yet (StorageTarget.min_failing_seconds)
    monkeypatch.setattr(StorageTarget, "min_failing_seconds", 0.0)
    _, ckpt, raised = _train(list(errors), total=6, env={"REPRIEVE_MAX_FAILED_SAVES": "2"})
    assert isinstance(raised, RuntimeError) and ckpt.saved == [0, 1]
    assert "checkpoint save of step 1 failed" in str(raised)
    assert re.search(r"2 consecutive checkpoint saves failed over \d+ s \(REPRIEVE_MAX_FAILED_SAVES=2\)", str(raised))
    assert isinstance(raised.__cause__, CheckpointSaveError)


@pytest.mark.parametrize("err", [FencedError("attempt 1 is stale"), RuntimeError("barrier timed out")])
def test_a_fenced_or_non_storage_failure_stays_fatal_at_once(err: BaseException) -> None:
    _, ckpt, raised = _train([err], total=6)
    assert raised is err and ckpt.saved == [0]


def test_the_last_save_failing_stays_fatal() -> None:
    _, ckpt, raised = _train([None, _storage_error(1)], total=2)
    assert isinstance(raised, CheckpointSaveError) and ckpt.saved == [0, 1]
