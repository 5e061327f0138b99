"""Pure decision: which pods of a job get a notice now (at most once per job per attempt)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import TrainingJob
from ..signals import Notice
from .restart import WorkerPod

DELIVERABLE_PHASES = (None, "Pending", "Running", "Preempting")


@dataclass(frozen=True)
class NoticePlan:
    notice: Notice
    attempt: int
    annotate: tuple[str, ...]  # pod names still lacking this notice
    record: bool  # status.lastNotice must be written for this attempt


def decide_notice(job: TrainingJob, pods: Sequence[WorkerPod], notice: Notice,
                  annotations: Mapping[str, str | None]) -> NoticePlan | None:
    """Deliver ``notice`` to every live pod of the job's current attempt unless this attempt already has one.

    ``annotations`` maps pod name to its current ``reprieve.dev/notice`` value (None if absent): a pod
    that already carries a notice of this attempt is not annotated again, which keeps delivery idempotent
    across an operator restart that happened between annotating pods and recording the status.
    """
    st = job.status
    if job.spec.suspend or st.phase not in DELIVERABLE_PHASES or not job.spec.preemption.enabled:
        return None
    attempt = max([st.attempt, *(p.attempt for p in pods)])
    if attempt == 0 or (st.restarting_from is not None and st.restarting_from >= attempt):
        return None
    if st.last_notice is not None and st.last_notice.attempt >= attempt:
        return None  # delivered once for this attempt already
    current = [p for p in pods if p.attempt == attempt and not p.deleting and not p.terminated]
    if not current:
        return None
    # A pod annotated by a delivery that crashed before the status write keeps that earlier notice.
    annotate = tuple(sorted(p.name for p in current if not annotations.get(p.name)))
    return NoticePlan(notice=notice, attempt=attempt, annotate=annotate, record=True)


def notice_status_patch(job: TrainingJob, last_notice: dict[str, Any], attempt: int) -> dict[str, Any] | None:
    """The status patch that records a delivery to ``attempt``, or None if it is recorded already.

    ``job`` is read after the pods were annotated: if the gang meanwhile began a restart (or a newer attempt
    exists) the notice is still recorded, but the phase is left to the restart.
    """
    st = job.status
    if st.last_notice is not None and st.last_notice.attempt >= attempt:
        return None
    patch: dict[str, Any] = {"lastNotice": last_notice}
    restarting = st.restarting_from is not None and st.restarting_from >= attempt
    if st.phase in (None, "Pending", "Running") and st.attempt <= attempt and not restarting:
        patch["phase"] = "Preempting"
    return patch
