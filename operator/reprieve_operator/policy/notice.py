"""Pure decisions of notice delivery: which pods get a notice now, what status records it, and what its
``PreemptionNotice`` Event says and is named.

Rules (``docs/operator.md``, "Delivery"):

* **The earliest deadline always reaches every pod.** A job's current attempt carries at most one notice
  per pod (the ``reprieve.dev/notice`` annotation). A notice is delivered to every live pod of the attempt
  whose annotation is missing or names a *later* deadline; a notice whose deadline is the same or later than
  what the pods already carry changes nothing. The runtime moves its agreed save earlier on such a change and
  never later (``docs/contract.md``).
* **A notice opens at its deadline minus the horizon.** A signal whose deadline is further away than the
  operator's notice horizon (``--notice-horizon-seconds``, default 600 s) is *held*: not delivered, the job
  stays ``Running`` (a GKE maintenance scheduled for next week does not make the job ``Preempting`` for a
  week, nor deaf to a spot taint meanwhile). The operator re-examines the node when the notice opens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..models import NoticeStatus, TrainingJob
from .restart import WorkerPod
from .signals import Notice
from .status import notice_status
from .times import parse_time, rfc3339

DELIVERABLE_PHASES = (None, "Pending", "Running", "Preempting")
DEFAULT_HORIZON_SECONDS = 600.0
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
STARTUP_GRACE = timedelta(seconds=5)  # a signal first seen this soon after start was there before it


@dataclass(frozen=True)
class NoticePlan:
    notice: Notice
    attempt: int
    annotate: tuple[str, ...]  # pod names lacking this notice (or carrying a later deadline)


def is_open(notice: Notice, now: datetime, horizon_seconds: float) -> bool:
    """Whether ``notice`` is due for delivery: its deadline lies within the horizon (or has passed)."""
    return (notice.deadline - now).total_seconds() <= horizon_seconds


def opens_at(notice: Notice, horizon_seconds: float) -> datetime:
    return notice.deadline - timedelta(seconds=horizon_seconds)


def annotation_deadline(value: str | None, attempt: int | None = None) -> datetime | None:
    """The deadline in a ``reprieve.dev/notice`` value; None if absent or delivered to another attempt than
    ``attempt`` (a pod kept by an in-place restart still carries the previous attempt's). A malformed value
    counts as the earliest possible deadline (the runtime treats it as "save now"), so it is never
    overwritten."""
    if not value:
        return None
    try:
        parsed = json.loads(value)
        if attempt is not None and parsed.get("attempt") not in (None, attempt):
            return None
        deadline = parse_time(parsed.get("deadline"))
    except (ValueError, AttributeError):
        deadline = None
    return deadline if deadline is not None else EARLIEST


def recorded_deadline(job: TrainingJob, attempt: int) -> datetime | None:
    """The deadline ``status.lastNotice`` records for ``attempt`` (None if it records none for it)."""
    last = job.status.last_notice
    if last is None or last.attempt != attempt:
        return None
    return parse_time(last.deadline)


def delivered_before(job: TrainingJob, annotations: Mapping[str, str | None], attempt: int,
                     notice: Notice) -> datetime | None:
    """The deadline delivered to ``attempt`` before ``notice`` (pure), for the Event's "earlier than": what
    ``status.lastNotice`` records, else the earliest deadline later than ``notice``'s that the pods' notice values
    hold. The operator's own annotations are in its cache as soon as it writes them; the status it wrote comes back
    through the watch, which lags under load (then the Event left out that the notice is earlier)."""
    recorded = recorded_deadline(job, attempt)
    if recorded is not None:
        return recorded
    later = [d for v in annotations.values() if (d := annotation_deadline(v, attempt)) is not None
             and d != EARLIEST and d > notice.deadline]
    return min(later) if later else None


def current_attempt(job: TrainingJob, pods: Sequence[WorkerPod]) -> int:
    """The attempt a notice is delivered to: the newest the status or any pod knows."""
    return max([job.status.attempt, *(p.attempt for p in pods)])


def decide_notice(job: TrainingJob, pods: Sequence[WorkerPod], notice: Notice,
                  annotations: Mapping[str, str | None], now: datetime,
                  horizon_seconds: float = DEFAULT_HORIZON_SECONDS) -> NoticePlan | None:
    """Deliver ``notice`` to the live pods of the job's current attempt that do not yet know a deadline as
    early; None when there is nothing to do (no pod to annotate and the status already records as early).

    ``annotations`` maps pod name to its current ``reprieve.dev/notice`` value (None if absent). Pods that
    already carry this notice (a delivery that crashed before its status write) are not annotated again, but
    the plan is still returned so that the status gets written.
    """
    st = job.status
    if job.spec.suspend or st.phase not in DELIVERABLE_PHASES or not job.spec.preemption.enabled:
        return None
    if not is_open(notice, now, horizon_seconds):
        return None
    attempt = current_attempt(job, pods)
    if attempt == 0 or (st.restarting_from is not None and st.restarting_from >= attempt):
        return None
    current = [p for p in pods if p.attempt == attempt and not p.deleting and not p.terminated]
    if not current:
        return None
    if notice.node and all(p.node is not None and p.node != notice.node for p in current):
        # No pod of this attempt is on the node: the notice is for pods an in-place restart already replaced
        # (they linger on the node while being deleted). Telling the new attempt would make it save for nothing,
        # and past the deadline it would exit as failed. A notice of no node (Kueue's eviction) is the whole job's.
        return None
    annotate = []
    for p in current:
        known = annotation_deadline(annotations.get(p.name), attempt)
        if known is None or known > notice.deadline:
            annotate.append(p.name)
    recorded = recorded_deadline(job, attempt)
    if not annotate and recorded is not None and recorded <= notice.deadline:
        return None
    return NoticePlan(notice=notice, attempt=attempt, annotate=tuple(sorted(annotate)))


def notice_status_patch(job: TrainingJob, last_notice: dict[str, Any], attempt: int) -> dict[str, Any] | None:
    """The status patch that records a delivery to ``attempt``, or None if a notice as early is recorded.

    ``job`` is read after the pods were annotated: if the gang meanwhile began a restart (or a newer attempt
    exists) the notice is still recorded, but the phase is left to the restart.
    """
    st = job.status
    if st.last_notice is not None and st.last_notice.attempt > attempt:
        return None
    recorded = recorded_deadline(job, attempt)
    new = parse_time(last_notice.get("deadline")) if isinstance(last_notice, dict) else None
    if recorded is not None and (new is None or recorded <= new):
        return None
    patch: dict[str, Any] = {"lastNotice": last_notice}
    restarting = st.restarting_from is not None and st.restarting_from >= attempt
    if st.phase in (None, "Pending", "Running") and st.attempt <= attempt and not restarting:
        patch["phase"] = "Preempting"
    return patch



@dataclass(frozen=True)
class Delivered:
    """A notice on the pods of one attempt (``delivery`` annotated them), for the job's reconcile to record:
    ``message`` is its ``PreemptionNotice`` Event's text (:func:`notice_message`, said where the node was seen)."""

    notice: Notice
    attempt: int
    message: str


def record_deliveries(job: TrainingJob, delivered: Sequence[Delivered],
                      now: datetime) -> tuple[dict[str, Any] | None, tuple[Delivered, ...]]:
    """The status patch that records ``delivered`` (in the order they were delivered, each judged by
    :func:`notice_status_patch` on the status the ones before it leave) and the deliveries it records; (None, ())
    when the status records each as early already."""
    patch: dict[str, Any] = {}
    recorded: list[Delivered] = []
    for d in delivered:
        one = notice_status_patch(job, notice_status(d.notice, d.attempt, now), d.attempt)
        if one is None:
            continue
        patch, recorded = {**patch, **one}, [*recorded, d]
        status = job.status.model_copy(update={"last_notice": NoticeStatus.model_validate(one["lastNotice"]),
                                               "phase": one.get("phase", job.status.phase)})
        job = job.model_copy(update={"status": status})
    return (patch or None), tuple(recorded)


def first_seen_in_notices(values: Iterable[str | None], node: str, signal: str) -> datetime | None:
    """When an operator before this one first saw ``signal`` on ``node``, as the notices it delivered say (the
    ``observedAt`` of the ``reprieve.dev/notice`` ``values`` naming that node and signal); None if none does.

    A signal without a timestamp (a NoSchedule taint, a label) has its deadline counted from when the operator
    first saw it. An operator restarted mid-preemption saw it later: without this it derived a later deadline and
    a new notice id, delivered that notice again and posted a second PreemptionNotice Event."""
    earliest: datetime | None = None
    for raw in values:
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            continue
        if not isinstance(data, dict) or data.get("node") != node or data.get("reason") != signal:
            continue
        seen = parse_time(data.get("observedAt"))
        if seen is not None and (earliest is None or seen < earliest):
            earliest = seen
    return earliest


def notice_message(notice: Notice, attempt: int, before: datetime | None, first_seen: datetime | None,
                   operator_started: datetime) -> str:
    """The PreemptionNotice Event text (pure): what, by when, to which attempt, and how sure the deadline is."""
    msg = (f"node {notice.node} will go away ({notice.reason}) by {rfc3339(notice.deadline)}; "
           f"notice {notice.id} delivered to attempt {attempt}")
    if before is not None:
        msg += f" (earlier than the deadline {rfc3339(before)} delivered before)"
    if notice.estimated and first_seen is not None and first_seen <= operator_started + STARTUP_GRACE:
        msg += (f"; the signal carries no timestamp and was already present when the operator started at "
                f"{rfc3339(operator_started)}: the deadline counts from then and may be late by the time the "
                f"operator was down")
    return msg


def notice_event_name(job: dict[str, Any], attempt: int, notice_id: str) -> str:
    """The name of a job's PreemptionNotice Event for one notice delivered to one attempt."""
    digest = hashlib.sha256(notice_id.encode()).hexdigest()[:8]
    return f"{job['name']}.{(job.get('uid') or '')[:8]}.notice-{attempt}-{digest}"
