"""Which Events a reconcile's status change deserves (pure): ``Succeeded`` with the job's goodput,
``CheckpointCommitted``, throttled to one per ``COMMIT_EVENT_SECONDS`` per job except the first commit after a
notice (the agreed save), which always gets one, ``Restored`` once per attempt that restored through the memory
tier (naming each process's source), and the memory tier's pairing when its ``MemoryPaired``
condition changes (a Warning ``MemoryPairingProblem`` naming the processes and nodes, or ``MemoryTierOff`` when
the runtime switched the tier off, ``MemoryPaired`` once it is fixed). Failures get an Event named after their reason
(``TooManyFailures``, ``TooManyPreemptions``, ``InvalidSpec``, ...) where they are decided, in ``reconcile``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..models import TrainingJob
from . import restores
from .memorypeers import PAIRED, TIER_OFF
from .podsready import PODS_READY
from .times import parse_time

COMMIT_EVENT_SECONDS = 300.0


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    type: str = "Normal"
    name: str | None = None  # posted at most once under this name (a notice's Event: ``policy.notice``)


def for_status_change(job: TrainingJob, patch: Mapping[str, Any], now: float,
                      last_commit_event: float | None) -> list[Event]:
    """Events for ``job`` whose status is about to take ``patch`` at ``now`` (epoch seconds);
    ``last_commit_event``: when this job's last CheckpointCommitted Event was posted (None: never)."""
    out = []
    st = job.status
    step = patch.get("lastCheckpointStep")
    if step is not None:
        notice = st.last_notice
        committed = parse_time(patch.get("lastCheckpointTime"))
        after_notice = (notice is not None and committed is not None and notice.attempt == st.attempt
                        and (parse_time(notice.observed_at) or committed) <= committed)
        if after_notice or last_commit_event is None or now - last_commit_event >= COMMIT_EVENT_SECONDS:
            why = f" after notice {notice.id}" if after_notice and notice is not None else ""
            out.append(Event("CheckpointCommitted", f"checkpoint of step {step} committed (attempt {st.attempt}){why}"))
    out += _problem(job, patch, PAIRED, None if _reason(patch, PAIRED) == TIER_OFF else "MemoryPairingProblem")
    out += _problem(job, patch, PODS_READY, None, ("status", "reason"))
    restore = patch.get("lastRestore")
    if restore and (st.last_restore is None or st.last_restore.attempt != restore.get("attempt")):
        out.append(restored_event(restore))
    if patch.get("phase") == "Succeeded" and st.phase != "Succeeded":
        gp = patch.get("goodput") or (st.goodput.model_dump(by_alias=True) if st.goodput else {})
        restarts = st.restarts
        text = (f"finished at step {patch.get('step', st.step)} after {st.attempt} attempt(s) "
                f"(restarts: {restarts.preemption} preemption, {restarts.failure} failure, "
                f"{restarts.disruption} disruption)")
        if gp.get("goodput") is not None:
            bad = gp.get("badputSeconds") or {}
            text += (f"; goodput {gp['goodput']:.1%} of {gp.get('wallSeconds', 0):.0f}s; badput "
                     + ", ".join(f"{k} {v:.0f}s" for k, v in bad.items() if v))
        out.append(Event("Succeeded", text))
    return out


def _problem(job: TrainingJob, patch: Mapping[str, Any], type_: str, warning: str | None,
             same_when: tuple[str, ...] = ("status", "message")) -> list[Event]:
    """Condition ``type_`` changed in ``patch``: a Warning Event when it turns False or changes in ``same_when``
    while False (reason ``warning``, or the condition's own reason when None), a Normal one under ``type_`` once
    the problem is gone."""
    new = next((c for c in patch.get("conditions") or [] if c.get("type") == type_), None)
    if new is None:
        return []
    old = next((c for c in job.status.conditions if c.type == type_), None)
    if old is not None and tuple(getattr(old, k) for k in same_when) == tuple(new.get(k) for k in same_when):
        return []
    if new.get("status") == "False":
        return [Event(warning or str(new.get("reason")), str(new.get("message")), "Warning")]
    if new.get("status") == "True" and old is not None and old.status != "True":
        return [Event(type_, str(new.get("message")))]
    return []


def _reason(patch: Mapping[str, Any], type_: str) -> str | None:
    """The reason of condition ``type_`` in ``patch`` (None when the patch does not set it)."""
    new = next((c for c in patch.get("conditions") or [] if c.get("type") == type_), None)
    return None if new is None else new.get("reason")


def restored_event(restore: Mapping[str, Any]) -> Event:
    """The ``Restored`` Event of ``status.lastRestore``: a Warning when it names a source (or tier) this operator
    does not know (``policy.restores``: kept as ``unknown``, never dropped)."""
    names = [restore.get("tier"), *(restore.get("sources") or [])]
    return Event("Restored", restored_message(restore), "Warning" if restores.UNKNOWN in names else "Normal")


def restored_message(restore: Mapping[str, Any]) -> str:
    """``attempt 3 restored step 120 from the memory tier: own memory: processes 0, 2-5; a peer's memory:
    process 1`` (processes grouped by source in the table's order, runs of indices as ranges)."""
    words = {**restores.SOURCES, restores.UNKNOWN: restores.UNKNOWN_WORDS}
    by: dict[str, list[int]] = {}
    for i, source in enumerate(restore.get("sources") or []):
        by.setdefault(restores.known(source, restores.SOURCES), []).append(i)
    parts = [f"{words[src]}: process{'es' if len(idx) > 1 else ''} {_ranges(idx)}"
             for src, idx in sorted(by.items(), key=lambda kv: list(words).index(kv[0]))]
    tier = restores.known(restore.get("tier"), restores.TIERS)
    return (f"attempt {restore.get('attempt')} restored step {restore.get('step')} from "
            f"{restores.TIERS.get(tier, 'a tier this operator does not know')}: " + "; ".join(parts))


def _ranges(indices: list[int]) -> str:
    out: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out)
