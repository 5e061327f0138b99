"""The status merge patch a decision leads to (pure): phase, attempt, counters, conditions, progress, goodput."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .. import LABEL_JOB
from ..models import TrainingJob
from . import goodput, restores
from .restart import Condition, RestartPlan
from .signals import Notice
from .times import parse_time, rfc3339
from .views import to_int

log = logging.getLogger(__name__)
TERMINAL = ("Succeeded", "Failed", "Suspended")  # phases that end the accounting of the attempts so far


def conditions_patch(job: TrainingJob, plan: RestartPlan, now: datetime) -> list[dict[str, Any]] | None:
    if not plan.conditions:
        return None
    current = {c.type: c.model_dump(by_alias=True, exclude_none=True) for c in job.status.conditions}
    changed = False
    for c in plan.conditions:
        old = current.get(c.type)
        if old and (old.get("status"), old.get("reason"), old.get("message")) == (c.status, c.reason, c.message):
            continue
        changed = True
        ltt = old.get("lastTransitionTime") if old and old.get("status") == c.status else rfc3339(now)
        current[c.type] = {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
                           "lastTransitionTime": ltt}
    return list(current.values()) if changed else None


def status_patch(job: TrainingJob, plan: RestartPlan, now: datetime,
                 prog: Mapping[str, Any] | None = None,
                 last_steps: Iterable[tuple[int, int, float]] = (), workers: int | None = None) -> dict[str, Any]:
    """The minimal merge patch taking ``job.status`` to what ``plan`` says (empty if nothing changes).
    ``last_steps``: the processes' last steps per attempt (``views.last_steps``), for the goodput accounting;
    ``workers``: the size of the attempt the plan runs (``currentWorkers``, with ``desiredWorkers``; written in the
    patch that creates the attempt, so its goodput records the size)."""
    st = job.status
    patch: dict[str, Any] = {}
    if st.phase != plan.phase:
        patch["phase"] = plan.phase
    # Called only after the plan's pods were created, so the plan's attempt is real now.
    attempt = plan.attempt
    if attempt != st.attempt:
        patch["attempt"] = attempt
        patch["attemptStartTime"] = rfc3339(now)
        if st.start_time is None:
            patch["startTime"] = rfc3339(now)
    if plan.restarting_from != st.restarting_from:
        patch["restartingFrom"] = plan.restarting_from
    if plan.rapid_restarts is not None and plan.rapid_restarts != st.rapid_restarts:
        patch["rapidRestarts"] = plan.rapid_restarts
    due = rfc3339(plan.next_attempt_time) if plan.next_attempt_time is not None else None
    if due != st.next_attempt_time and (due is not None or plan.new_attempt or plan.cause):
        patch["nextAttemptTime"] = due
    if plan.cause:
        counts = st.restarts.model_dump()
        counts[plan.cause] += 1
        patch["restarts"] = counts
        if plan.phase == "Restarting":
            patch["restartCount"] = st.restart_count + 1
    ready = f"{plan.ready}/{job.spec.replicas}"
    if st.ready != ready:
        patch["ready"] = ready
    replicas = len(plan.create) if plan.new_attempt else plan.replicas + len(plan.create)
    if plan.phase in ("Running", "Pending", "Preempting") and st.replicas != replicas:
        patch["replicas"] = replicas
    elif plan.phase not in ("Running", "Pending", "Preempting") and st.replicas not in (None, 0):
        patch["replicas"] = 0
    selector = f"{LABEL_JOB}={job.name}"
    if st.selector != selector:
        patch["selector"] = selector
    if st.restart_mode != job.spec.mode:
        patch["restartMode"] = job.spec.mode
    if plan.phase in ("Succeeded", "Failed") and st.completion_time is None:
        patch["completionTime"] = rfc3339(now)
    conds = conditions_patch(job, plan, now)
    if conds is not None:
        patch["conditions"] = conds
    if prog:
        step, committed = to_int(prog.get("step")), to_int(prog.get("committedStep"))
        if step is not None and step != st.step:
            patch["step"] = step
        if committed is not None and committed >= 0 and committed != st.last_checkpoint_step:
            patch["lastCheckpointStep"] = committed
            if isinstance(prog.get("time"), str):
                patch["lastCheckpointTime"] = prog["time"]
            if st.last_checkpoint_uri != job.spec.checkpoint.uri:
                patch["lastCheckpointUri"] = job.spec.checkpoint.uri
        memory_step = to_int(prog.get("memoryStep"))
        if memory_step is not None and memory_step != st.memory_step:
            patch["memoryStep"] = memory_step
        restore = last_restore(prog)
        if restore is not None and restore != (st.last_restore.model_dump(by_alias=True) if st.last_restore else None):
            patch["lastRestore"] = restore
            unknown = unknown_restore_names(prog)
            if unknown:  # once, when the restore is recorded (the Restored Event, a Warning then, says it too)
                log.warning("TrainingJob %s/%s: attempt %s restored from %s, which this operator does not know "
                            "(known: tiers %s, sources %s): recorded as %r; is the runtime newer than the operator?",
                            job.namespace, job.name, restore["attempt"], ", ".join(map(repr, unknown)),
                            ", ".join(restores.TIERS), ", ".join(restores.SOURCES), restores.UNKNOWN)
    if workers is not None and st.current_workers != workers:
        patch["currentWorkers"] = workers
    if workers is not None and st.desired_workers != job.spec.replicas:
        patch["desiredWorkers"] = job.spec.replicas
    if job.generation is not None and st.observed_generation != job.generation:
        patch["observedGeneration"] = job.generation
    gp = goodput_patch(job, plan.phase, patch, prog, now, last_steps)
    if gp is not None:
        patch["goodput"] = gp
    return patch


def last_restore(prog: Mapping[str, Any]) -> dict[str, Any] | None:
    """``status.lastRestore`` from process 0's report (``restoredFrom``: the memory tier); None without it or
    when malformed. A tier or source name this operator does not know is kept as ``unknown`` (``policy.restores``):
    the restore happened, and the status says so."""
    raw, attempt = prog.get("restoredFrom"), to_int(prog.get("attempt"))
    if not isinstance(raw, Mapping) or attempt is None:
        return None
    step, sources = to_int(raw.get("step")), raw.get("sources")
    if step is None or not isinstance(sources, list):
        return None
    return {"attempt": attempt, "step": step, "tier": restores.known(raw.get("tier"), restores.TIERS),
            "sources": [restores.known(s, restores.SOURCES) for s in sources]}


def unknown_restore_names(prog: Mapping[str, Any]) -> list[str]:
    """The tier and source names of the report's ``restoredFrom`` this operator does not know, as reported."""
    raw = prog.get("restoredFrom")
    if not isinstance(raw, Mapping):
        return []
    sources = raw.get("sources")
    sources = sources if isinstance(sources, list) else []
    return sorted({*restores.unknown_names([raw.get("tier")], restores.TIERS),
                   *restores.unknown_names(sources, restores.SOURCES)})


def goodput_patch(job: TrainingJob, phase: str, patch: Mapping[str, Any], prog: Mapping[str, Any] | None,
                  now: datetime, last_steps: Iterable[tuple[int, int, float]] = ()) -> dict[str, Any] | None:
    """``status.goodput`` after this reconcile's facts (a new attempt in ``patch``, the progress report, the
    processes' last steps per attempt (``views.last_steps``), the end of the job); None when the accounting did
    not change. A new attempt's size is ``currentWorkers`` of ``desiredWorkers`` (``spec.replicas`` when not set),
    from ``patch`` where it sets them, else from the status: the degraded time of ``docs/goodput.md`` counts only
    for attempts created with ``currentWorkers`` set."""
    st = job.status
    raw = st.goodput.accounting if st.goodput is not None else None
    t = now.timestamp()
    report = goodput.report_of(dict(prog) if prog else None)
    new_attempt, created = None, None
    if patch.get("attempt"):
        new_attempt = int(patch["attempt"])
    elif not raw and report is not None and st.attempt > 0 and phase not in TERMINAL:
        # A job that ran before accounting existed (an operator upgrade): start with its current attempt.
        started = parse_time(st.attempt_start_time)
        new_attempt, created = st.attempt, (started.timestamp() if started else t)
    workers = to_int(patch.get("currentWorkers", st.current_workers))
    desired = to_int(patch.get("desiredWorkers", st.desired_workers)) or job.spec.replicas
    acc = goodput.fold(raw, now=t, new_attempt=new_attempt, created_at=created, report=report,
                       ended=phase in TERMINAL, last_steps=last_steps,
                       workers=workers, desired=desired)
    if acc is None:
        return None
    return {**goodput.status(acc, t), "updatedAt": rfc3339(now)}


def closing_goodput(status: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """``status.goodput`` of a job failed outside a restart plan (an invalid spec, a pod the API server refuses):
    its open attempts end now. Works on the raw status (the spec of such a job may not parse); None when there is
    no accounting to close."""
    raw = (status.get("goodput") or {}).get("accounting")
    if not raw:
        return None
    t = now.timestamp()
    acc = goodput.fold(dict(raw), now=t, ended=True)
    if acc is None:
        return None
    return {**goodput.status(acc, t), "updatedAt": rfc3339(now)}


def notice_status(notice: Notice, attempt: int, now: datetime) -> dict[str, Any]:
    return {"id": notice.id, "node": notice.node, "reason": notice.reason, "deadline": rfc3339(notice.deadline),
            "observedAt": rfc3339(notice.observed_at), "attempt": attempt, "deliveredAt": rfc3339(now)}


def with_condition(job: TrainingJob, type_: str, status: str, reason: str, message: str,
                   now: datetime) -> list[dict[str, Any]]:
    """``status.conditions`` with condition ``type_`` set (its transition time kept if the status is the same)."""
    plan = RestartPlan(phase=job.status.phase or "Pending", attempt=job.status.attempt,
                       conditions=(Condition(type_, status, reason, message[:2000]),))
    return conditions_patch(job, plan, now) or [
        c.model_dump(by_alias=True, exclude_none=True) for c in job.status.conditions]
