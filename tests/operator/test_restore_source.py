"""Where each attempt restored from (the memory tier's restoredFrom and memoryStep in process 0's report): the
status fields, the Restored Event naming each process's source, and the goodput accounting's restores by tier."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.events import Event, for_status_change, restored_message
from reprieve_operator.policy.goodput import Accounting, attempt_created, fold, progress, report_of, status
from reprieve_operator.policy.restart import RestartPlan
from reprieve_operator.policy.status import last_restore, status_patch

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC)


def prog(attempt: int, first: int, t: float, restore: float = 0.0, restored: dict[str, Any] | None = None,
         **more: Any) -> dict[str, Any]:
    out = {"attempt": attempt, "step": first + 9, "stepAt": t + 9.0, "firstStep": first, "firstStepAt": t,
           "stepSeconds": 1.0, "restoreSeconds": restore, "committedStep": -1, **more}
    if restored is not None:
        out["restoredFrom"] = restored
    return out


MEM = {"step": 14, "tier": "memory", "sources": ["memory", "peer"]}

REPORT_ROWS: list[tuple[str, dict[str, Any], str | None]] = [
    # (what, report, where the accounting says it restored from)
    ("the memory tier: own and a peer's memory", prog(2, 15, 100.0, 0.2, MEM), "memory"),
    ("the memory tier, some processes from storage", prog(2, 15, 100.0, 1.0, {**MEM, "tier": "mixed"}), "mixed"),
    ("the memory tier fell back to storage", prog(2, 15, 100.0, 3.0, {**MEM, "tier": "storage"}), "storage"),
    ("no memory tier, a restore took time: storage", prog(2, 15, 100.0, 3.0), "storage"),
    ("no restore at all (a fresh start)", prog(1, 0, 10.0), None),
    ("an unknown tier is not trusted", prog(2, 15, 100.0, 3.0, {**MEM, "tier": "tape"}), "storage"),
]


@pytest.mark.parametrize(("what", "raw", "tier"), REPORT_ROWS, ids=[r[0] for r in REPORT_ROWS])
def test_where_a_report_says_it_restored_from(what: str, raw: dict[str, Any], tier: str | None) -> None:
    report = report_of(raw)
    assert report is not None and report.restored_from == tier


def test_restores_are_counted_by_tier_across_attempts_and_an_operator_restart() -> None:
    """Attempt 1 starts fresh; 2 restores from memory (0.2 s), 3 from storage (3 s), 4 from memory (0.4 s) and is
    still open: closed attempts are tallied in the stored accounting, the open one counts in the figures."""
    acc = attempt_created(Accounting(), 1, 0.0)
    acc = progress(acc, report_of(prog(1, 0, 10.0)))  # type: ignore[arg-type]
    for attempt, t, restore, restored in ((2, 100.0, 0.2, MEM), (3, 200.0, 3.0, None), (4, 300.0, 0.4, MEM)):
        acc = attempt_created(acc, attempt, t - 5.0)
        acc = progress(acc, report_of(prog(attempt, 15, t, restore, restored)))  # type: ignore[arg-type]
    stored = acc.to_status()
    assert stored["restores"] == {"memory": {"count": 1, "seconds": 0.2}, "storage": {"count": 1, "seconds": 3.0}}
    again = Accounting.from_status(stored)  # what a restarted operator reads back
    assert again == acc
    assert status(again, 400.0)["restores"] == {"memory": {"count": 2, "seconds": 0.6},
                                                "storage": {"count": 1, "seconds": 3.0}}


def test_a_job_that_never_restored_counts_no_restores() -> None:
    acc = fold(None, now=20.0, new_attempt=1, created_at=0.0, report=report_of(prog(1, 0, 10.0)))
    assert acc is not None and status(acc, 20.0)["restores"] == {} and "restores" not in acc.to_status()


LAST_RESTORE_ROWS: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("the memory tier", prog(2, 15, 1.0, 0.2, MEM), {"attempt": 2, "step": 14, "tier": "memory",
                                                     "sources": ["memory", "peer"]}),
    ("no memory tier", prog(2, 15, 1.0, 3.0), None),
    # a name this operator does not know (a newer runtime): the restore is kept, the name as "unknown" (was: dropped)
    ("a source nobody defined: kept as unknown", prog(2, 15, 1.0, 0.2, {**MEM, "sources": ["memory", "disk"]}),
     {"attempt": 2, "step": 14, "tier": "memory", "sources": ["memory", "unknown"]}),
    ("a tier nobody defined: kept as unknown", prog(2, 15, 1.0, 0.2, {**MEM, "tier": "tape"}),
     {"attempt": 2, "step": 14, "tier": "unknown", "sources": ["memory", "peer"]}),
    ("no step", prog(2, 15, 1.0, 0.2, {"tier": "memory", "sources": []}), None),
    ("not an object", prog(2, 15, 1.0, 0.2, "memory"), None),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("what", "raw", "want"), LAST_RESTORE_ROWS, ids=[r[0] for r in LAST_RESTORE_ROWS])
def test_last_restore(what: str, raw: dict[str, Any], want: dict[str, Any] | None) -> None:
    assert last_restore(raw) == want


MESSAGE_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("two processes, two sources", {"attempt": 2, "step": 14, "tier": "memory", "sources": ["memory", "peer"]},
     "attempt 2 restored step 14 from the memory tier: own memory: process 0; a peer's memory: process 1"),
    ("runs of processes as ranges", {"attempt": 5, "step": 90, "tier": "mixed",
                                     "sources": ["memory", "memory", "memory", "storage", "memory", "peer"]},
     ("attempt 5 restored step 90 from memory and storage: own memory: processes 0-2, 4; a peer's memory: "
      "process 5; storage: process 3")),
    ("a source this operator does not know", {"attempt": 3, "step": 7, "tier": "memory",
                                              "sources": ["unknown", "memory"]},
     ("attempt 3 restored step 7 from the memory tier: own memory: process 1; a source this operator does not know: "
      "process 0")),
]


@pytest.mark.parametrize(("what", "restore", "text"), MESSAGE_ROWS, ids=[r[0] for r in MESSAGE_ROWS])
def test_restored_message(what: str, restore: dict[str, Any], text: str) -> None:
    assert restored_message(restore) == text


def job(status: dict[str, Any] | None = None) -> Any:
    body = make_job(restartMode="InPlace", checkpoint={"uri": "/ckpt", "memory": {"sizeLimit": "1Gi"}})
    body.with_command("python", "train.py")
    return body.with_status(**(status or {"phase": "Running", "attempt": 2})).model()


def test_status_shows_memory_and_storage_steps_and_one_restored_event_per_attempt() -> None:
    j = job()
    report = prog(2, 15, NOW.timestamp(), 0.2, MEM, memoryStep=20, committedStep=10)
    patch = status_patch(j, RestartPlan(phase="Running", attempt=2), NOW, report)
    assert (patch["memoryStep"], patch["lastCheckpointStep"]) == (20, 10)
    assert patch["lastRestore"] == {"attempt": 2, "step": 14, "tier": "memory", "sources": ["memory", "peer"]}
    assert patch["goodput"]["restores"] == {"memory": {"count": 1, "seconds": 0.2}}
    events = for_status_change(j, patch, NOW.timestamp(), None)
    assert Event("Restored", restored_message(patch["lastRestore"])) in events
    later = job({"phase": "Running", "attempt": 2, "lastRestore": patch["lastRestore"], "memoryStep": 20})
    again = status_patch(later, RestartPlan(phase="Running", attempt=2), NOW, {**report, "memoryStep": 30})
    assert again["memoryStep"] == 30 and "lastRestore" not in again
    assert not [e for e in for_status_change(later, again, NOW.timestamp(), None) if e.reason == "Restored"]


def test_a_restore_from_a_source_this_operator_does_not_know_is_recorded_said_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue #45 (3): an unknown source was dropped in silence (no lastRestore, no Restored Event)."""
    j = job()
    report = prog(2, 15, NOW.timestamp(), 0.2, {**MEM, "sources": ["memory", "disk"]})
    with caplog.at_level("WARNING", logger="reprieve_operator.policy.status"):
        patch = status_patch(j, RestartPlan(phase="Running", attempt=2), NOW, report)
    assert patch["lastRestore"]["sources"] == ["memory", "unknown"]
    assert [r.getMessage() for r in caplog.records if "'disk'" in r.getMessage() and "unknown" in r.getMessage()]
    restored = [e for e in for_status_change(j, patch, NOW.timestamp(), None) if e.reason == "Restored"]
    assert restored == [Event("Restored", restored_message(patch["lastRestore"]), "Warning")]
    caplog.clear()
    later = job({"phase": "Running", "attempt": 2, "lastRestore": patch["lastRestore"]})
    with caplog.at_level("WARNING", logger="reprieve_operator.policy.status"):
        again = status_patch(later, RestartPlan(phase="Running", attempt=2), NOW, report)
    assert "lastRestore" not in again and not caplog.records  # recorded once: said once
