"""decide_notice / notice_status_patch: the earliest deadline reaches every pod; far-future notices are held."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.notice import decide_notice, is_open, notice_status_patch, opens_at
from reprieve_operator.policy.restart import WorkerPod
from reprieve_operator.policy.signals import Notice
from reprieve_operator.policy.times import rfc3339

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)
HORIZON = 600.0


def notice(seconds: float, node: str = "n0", reason: str = "gke-spot") -> Notice:
    deadline = NOW + timedelta(seconds=seconds)
    return Notice(f"{reason}/{node}/{int(deadline.timestamp())}", reason, node, deadline, NOW)


SPOT = notice(30)  # the notice being delivered in every row


def last(seconds: float, attempt: int) -> dict[str, Any]:
    """status.lastNotice recording a notice with this deadline for ``attempt``."""
    n = notice(seconds, "n1", "aws-rebalance")
    return {"id": n.id, "node": n.node, "reason": n.reason, "deadline": rfc3339(n.deadline),
            "observedAt": rfc3339(NOW), "attempt": attempt}


def note(seconds: float) -> str:
    return notice(seconds, "n1", "aws-rebalance").annotation()


def p(i: int, attempt: int = 1, **kw: Any) -> WorkerPod:
    return WorkerPod(name=f"llama-{i}", index=i, attempt=attempt, **kw)


RUN = {"phase": "Running", "attempt": 1}
ROWS: list[tuple[str, dict[str, Any], dict[str, Any], list[WorkerPod], dict[str, str], tuple[str, ...] | None]] = [
    ("running job: all pods", RUN, {}, [p(0), p(1)], {}, ("llama-0", "llama-1")),
    ("pending pods count too", {"phase": "Pending", "attempt": 1}, {}, [p(0, phase="Pending")], {}, ("llama-0",)),
    ("the same notice delivered and recorded: nothing",
     {"phase": "Preempting", "attempt": 1, "lastNotice": {**last(30, 1), "id": SPOT.id}}, {}, [p(0), p(1)],
     {"llama-0": SPOT.annotation(), "llama-1": SPOT.annotation()}, None),
    ("an earlier deadline than the one delivered: every pod again",
     {"phase": "Preempting", "attempt": 1, "lastNotice": last(120, 1)}, {}, [p(0), p(1)],
     {"llama-0": note(120), "llama-1": note(120)}, ("llama-0", "llama-1")),
    ("a later deadline than the one delivered: nothing",
     {"phase": "Preempting", "attempt": 1, "lastNotice": last(10, 1)}, {}, [p(0), p(1)],
     {"llama-0": note(10), "llama-1": note(10)}, None),
    ("delivered in an older attempt: counts for nothing",
     {"phase": "Running", "attempt": 2, "lastNotice": last(10, 1)}, {}, [p(0, 2), p(1, 2)], {},
     ("llama-0", "llama-1")),
    ("status lags the pods' attempt", {"phase": "Running", "attempt": 1, "lastNotice": last(10, 1)},
     {}, [p(0, 2), p(1, 2)], {}, ("llama-0", "llama-1")),
    ("crash mid-delivery: the annotated pod is skipped", RUN, {}, [p(0), p(1)],
     {"llama-0": SPOT.annotation()}, ("llama-1",)),
    ("crash after annotating every pod, before the status: status only", RUN, {}, [p(0), p(1)],
     {"llama-0": SPOT.annotation(), "llama-1": SPOT.annotation()}, ()),
    ("a malformed annotation (save now, to the runtime) is kept", RUN, {}, [p(0), p(1)],
     {"llama-0": "not json"}, ("llama-1",)),
    ("restarting", {"phase": "Restarting", "attempt": 1, "restartingFrom": 1}, {}, [p(0)], {}, None),
    ("suspended", {"phase": "Suspended", "attempt": 1}, {"suspend": True}, [], {}, None),
    ("succeeded", {"phase": "Succeeded", "attempt": 1}, {}, [p(0, phase="Succeeded", exit_code=0)], {}, None),
    ("notices disabled", RUN, {"preemption": {"enabled": False}}, [p(0)], {}, None),
    ("no pod of the attempt on the notice's node (in place: replaced already): nothing", RUN, {},
     [p(0, node="n5"), p(1, node="n6")], {}, None),
    ("one pod of the attempt on the notice's node: every pod", RUN, {},
     [p(0, node="n0"), p(1, node="n6")], {}, ("llama-0", "llama-1")),
    ("deleting and finished pods skipped", RUN, {},
     [p(0, deleting=True), p(1, phase="Failed", exit_code=42), p(2)], {}, ("llama-2",)),
]


@pytest.mark.parametrize("status,spec,pods,notes,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decide_notice(status: dict[str, Any], spec: dict[str, Any], pods: list[WorkerPod],
                       notes: dict[str, str], expected: tuple[str, ...] | None) -> None:
    job = make_job(replicas=3, **spec).with_status(**status).model()
    plan = decide_notice(job, pods, SPOT, notes, NOW, HORIZON)
    assert (plan.annotate if plan else None) == expected
    if plan:
        assert plan.notice is SPOT


@pytest.mark.parametrize("seconds,delivered", [(-5, True), (0, True), (600, True), (601, False), (30 * 86400, False)])
def test_far_future_notices_are_held_until_the_horizon(seconds: float, delivered: bool) -> None:
    job = make_job(replicas=1).with_status(**RUN).model()
    n = notice(seconds, reason="gke-scheduled-maintenance")
    assert is_open(n, NOW, HORIZON) is delivered
    assert (decide_notice(job, [p(0)], n, {}, NOW, HORIZON) is not None) is delivered
    assert opens_at(n, HORIZON) == n.deadline - timedelta(seconds=HORIZON)


def test_held_maintenance_leaves_the_job_open_to_an_earlier_spot_notice() -> None:
    """A maintenance label an hour ahead is held; a spot taint on another node 1 s later is delivered."""
    job = make_job(replicas=2).with_status(**RUN).model()
    assert decide_notice(job, [p(0), p(1)], notice(3600, "n1", "gke-scheduled-maintenance"), {}, NOW, HORIZON) is None
    plan = decide_notice(job, [p(0), p(1)], SPOT, {}, NOW + timedelta(seconds=1), HORIZON)
    assert plan is not None and plan.annotate == ("llama-0", "llama-1")


RECORD_ROWS: list[tuple[str, dict[str, Any], int, dict[str, Any] | None]] = [
    ("running: notice and phase", RUN, 1, {"lastNotice": "N", "phase": "Preempting"}),
    ("pending: notice and phase", {"phase": "Pending", "attempt": 1}, 1, {"lastNotice": "N", "phase": "Preempting"}),
    ("recorded already (operator restarted after the status write)",
     {"phase": "Preempting", "attempt": 1, "lastNotice": last(30, 1)}, 1, None),
    ("an earlier deadline is recorded already", {"phase": "Preempting", "attempt": 1, "lastNotice": last(10, 1)},
     1, None),
    ("a later deadline was recorded: the earlier replaces it",
     {"phase": "Preempting", "attempt": 1, "lastNotice": last(120, 1)}, 1, {"lastNotice": "N"}),
    ("older attempt's notice does not count", {"phase": "Running", "attempt": 2, "lastNotice": last(10, 1)},
     2, {"lastNotice": "N", "phase": "Preempting"}),
    ("a newer attempt's notice is recorded: leave it", {"phase": "Running", "attempt": 2, "lastNotice": last(90, 2)},
     1, None),
    ("restart began meanwhile: phase left to it", {"phase": "Restarting", "attempt": 1, "restartingFrom": 1}, 1,
     {"lastNotice": "N"}),
    ("newer attempt meanwhile: phase left alone", {"phase": "Running", "attempt": 2}, 1, {"lastNotice": "N"}),
]


@pytest.mark.parametrize("status,attempt,expected", [r[1:] for r in RECORD_ROWS], ids=[r[0] for r in RECORD_ROWS])
def test_notice_status_patch(status: dict[str, Any], attempt: int, expected: dict[str, Any] | None) -> None:
    job = make_job(replicas=2).with_status(**status).model()
    record = {"id": SPOT.id, "deadline": rfc3339(SPOT.deadline)}
    patch = notice_status_patch(job, record, attempt)
    if expected is not None:
        expected = {**expected, "lastNotice": record}
    assert patch == expected


def test_annotation_round_trip_keeps_whole_seconds() -> None:
    assert json.loads(SPOT.annotation())["deadline"] == rfc3339(SPOT.deadline)


def test_first_seen_comes_from_the_notices_already_delivered_on_that_node() -> None:
    """A restarted operator must count a timestamp-less signal's deadline from when its predecessor saw it (the
    CI run where a restarted operator re-delivered with a new id and posted a second PreemptionNotice Event)."""
    from reprieve_operator.policy.notice import first_seen_in_notices

    def notice(**fields: Any) -> str:
        return json.dumps(fields)

    early, late = "2026-11-24T03:38:14Z", "2026-11-24T03:38:16Z"
    values = [notice(node="n0", reason="gke-spot", observedAt=late),
              notice(node="n0", reason="gke-spot", observedAt=early),
              notice(node="n0", reason="cordon", observedAt="2026-11-24T03:00:00Z"),  # another signal
              notice(node="n1", reason="gke-spot", observedAt="2026-11-24T03:00:00Z"),  # another node
              None, "{broken", notice(node="n0", reason="gke-spot")]  # no annotation, malformed, no time
    got = first_seen_in_notices(values, "n0", "gke-spot")
    assert got is not None and got.isoformat() == "2026-11-24T03:38:14+00:00"
    assert first_seen_in_notices(values, "n0", "aws-spot-itn") is None
    assert first_seen_in_notices([], "n0", "gke-spot") is None


def test_the_deadline_delivered_before_comes_from_the_status_or_else_the_pods() -> None:
    """The Event says a notice is earlier than the one delivered before. The status the operator wrote comes back
    through its watch, which lags under load (a suite run: the Event left it out); its own annotations do not."""
    from reprieve_operator.policy.notice import delivered_before

    job = make_job().with_status(phase="Preempting", attempt=1, lastNotice=last(120, 1)).model()
    assert delivered_before(job, {}, 1, SPOT) == NOW + timedelta(seconds=120)
    lagging = make_job().with_status(**RUN).model()  # the status write not seen yet
    pods = {"llama-0": note(120), "llama-1": note(90), "llama-2": None}
    assert delivered_before(lagging, pods, 1, SPOT) == NOW + timedelta(seconds=90)
    assert delivered_before(lagging, {"llama-0": note(20), "llama-1": SPOT.annotation()}, 1, SPOT) is None
    assert delivered_before(lagging, {"llama-0": "{not json"}, 1, SPOT) is None  # malformed: "save now", no deadline
    first = {"llama-0": notice(120, "n1", "aws-rebalance").annotation(1)}
    assert delivered_before(lagging, first, 1, SPOT) == NOW + timedelta(seconds=120)
    assert delivered_before(lagging, first, 2, SPOT) is None  # delivered to another attempt
