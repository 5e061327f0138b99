"""decide_notice: delivered once per job per attempt, to the live pods of the current attempt."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.notice import decide_notice
from reprieve_operator.policy.restart import WorkerPod
from reprieve_operator.signals import Notice

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)
NOTICE = Notice("gke-spot/n0/1", "gke-spot", "n0", NOW, NOW)
LAST = {"id": "x", "node": "n0", "reason": "gke-spot", "deadline": "x", "observedAt": "x"}


def p(i: int, attempt: int = 1, **kw: Any) -> WorkerPod:
    return WorkerPod(name=f"llama-{i}", index=i, attempt=attempt, **kw)


ROWS: list[tuple[str, dict[str, Any], dict[str, Any], list[WorkerPod], dict[str, str], tuple[str, ...] | None]] = [
    ("running job: all pods", {"phase": "Running", "attempt": 1}, {}, [p(0), p(1)], {}, ("llama-0", "llama-1")),
    ("pending pods count too", {"phase": "Pending", "attempt": 1}, {}, [p(0, phase="Pending")], {}, ("llama-0",)),
    ("already delivered this attempt", {"phase": "Preempting", "attempt": 1, "lastNotice": {**LAST, "attempt": 1}},
     {}, [p(0), p(1)], {}, None),
    ("delivered in an older attempt", {"phase": "Running", "attempt": 2, "lastNotice": {**LAST, "attempt": 1}},
     {}, [p(0, 2), p(1, 2)], {}, ("llama-0", "llama-1")),
    ("status lags the pods' attempt", {"phase": "Running", "attempt": 1, "lastNotice": {**LAST, "attempt": 1}},
     {}, [p(0, 2), p(1, 2)], {}, ("llama-0", "llama-1")),
    ("crash mid-delivery: annotated pod skipped", {"phase": "Running", "attempt": 1}, {}, [p(0), p(1)],
     {"llama-0": '{"id":"gke-spot/n0/1"}'}, ("llama-1",)),
    ("restarting", {"phase": "Restarting", "attempt": 1, "restartingFrom": 1}, {}, [p(0)], {}, None),
    ("suspended", {"phase": "Suspended", "attempt": 1}, {"suspend": True}, [], {}, None),
    ("succeeded", {"phase": "Succeeded", "attempt": 1}, {}, [p(0, phase="Succeeded", exit_code=0)], {}, None),
    ("notices disabled", {"phase": "Running", "attempt": 1}, {"preemption": {"enabled": False}}, [p(0)], {}, None),
    ("deleting and finished pods skipped", {"phase": "Running", "attempt": 1}, {},
     [p(0, deleting=True), p(1, phase="Failed", exit_code=42), p(2)], {}, ("llama-2",)),
]


@pytest.mark.parametrize("status,spec,pods,notes,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decide_notice(status: dict[str, Any], spec: dict[str, Any], pods: list[WorkerPod],
                       notes: dict[str, str], expected: tuple[str, ...] | None) -> None:
    job = make_job(replicas=3, **spec).with_status(**status).model()
    plan = decide_notice(job, pods, NOTICE, notes)
    assert (plan.annotate if plan else None) == expected
    if plan:
        assert plan.record and plan.notice is NOTICE


RECORD_ROWS: list[tuple[str, dict[str, Any], int, dict[str, Any] | None]] = [
    ("running: notice and phase", {"phase": "Running", "attempt": 1}, 1, {"lastNotice": "N", "phase": "Preempting"}),
    ("pending: notice and phase", {"phase": "Pending", "attempt": 1}, 1, {"lastNotice": "N", "phase": "Preempting"}),
    ("recorded already (operator restarted after the status write)",
     {"phase": "Preempting", "attempt": 1, "lastNotice": {**LAST, "attempt": 1}}, 1, None),
    ("older attempt's notice does not count", {"phase": "Running", "attempt": 2, "lastNotice": {**LAST, "attempt": 1}},
     2, {"lastNotice": "N", "phase": "Preempting"}),
    ("restart began meanwhile: phase left to it", {"phase": "Restarting", "attempt": 1, "restartingFrom": 1}, 1,
     {"lastNotice": "N"}),
    ("newer attempt meanwhile: phase left alone", {"phase": "Running", "attempt": 2}, 1, {"lastNotice": "N"}),
    ("already preempting", {"phase": "Preempting", "attempt": 1}, 1, {"lastNotice": "N"}),
]


@pytest.mark.parametrize("status,attempt,expected", [r[1:] for r in RECORD_ROWS], ids=[r[0] for r in RECORD_ROWS])
def test_notice_status_patch(status: dict[str, Any], attempt: int, expected: dict[str, Any] | None) -> None:
    from reprieve_operator.policy.notice import notice_status_patch

    job = make_job(replicas=2).with_status(**status).model()
    assert notice_status_patch(job, "N", attempt) == expected  # type: ignore[arg-type]
