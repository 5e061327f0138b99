"""Notice delivery: a Node event -> the notice its signals give -> every pod of each affected job.

The cache's node -> jobs index keeps the work proportional to the pods on that node. The earliest deadline
always reaches every pod (``policy.notice``): a later notice with an earlier deadline is delivered again. A
notice beyond the horizon is held, and the node is looked at again when it opens. The job's Event and status,
and the pods' Events, are written only after every affected job has its annotations.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from . import ANNOTATION_NOTICE, apply, metrics
from .models import TrainingJob
from .policy.notice import (
    decide_notice,
    first_seen_in_notices,
    is_open,
    notice_status_patch,
    opens_at,
    recorded_deadline,
)
from .policy.signals import Notice, node_notice, present_signals, signals_for_job
from .policy.status import notice_status
from .policy.times import rfc3339
from .policy.views import compact_node, notice_annotation, workers
from .reconcile import kick
from .state import State, job_ref
from .state import now as state_now

log = logging.getLogger("reprieve_operator")
STARTUP_GRACE = timedelta(seconds=5)  # a signal first seen this soon after start was there before it


async def on_node(state: State, event_type: str | None, name: str, body: Any) -> None:
    """A Node event: track its signals; deliver a notice to every job with pods on it."""
    jobs = state.cache.jobs_on(name)
    timer = state.node_timers.pop(name, None)
    if timer is not None:
        timer.cancel()
    if event_type == "DELETED":
        state.cache.nodes.pop(name, None)
        state.notice_nodes.discard(name)
        state.first_seen.pop(name, None)
        state.seen_mono.pop(name, None)
        metrics.NOTICE_NODES.set(len(state.notice_nodes))
        for ns, job in jobs:
            kick(state, ns, job)
        return
    node = compact_node(dict(body))
    state.cache.nodes[name] = node
    present = present_signals(node, state.signals)
    seen = state.first_seen.setdefault(name, {})
    for sig in set(seen) - present:
        seen.pop(sig)
    _remember_first_seen(state, name, present, jobs)
    if present:
        state.seen_mono.setdefault(name, time.monotonic())
        state.notice_nodes.add(name)
    else:
        state.seen_mono.pop(name, None)
        state.notice_nodes.discard(name)
    metrics.NOTICE_NODES.set(len(state.notice_nodes))
    if not present:  # only jobs with custom signals can still see something on this node
        jobs = [j for j in jobs if j in state.custom_jobs]
    if not jobs:
        return
    t0 = time.monotonic()
    done = await asyncio.gather(*(_deliver(state, node, ns, job, t0) for ns, job in jobs))
    delivered = [d for d in done if isinstance(d, Delivered)]
    held = [d for d in done if isinstance(d, datetime)]
    if held:
        _look_again(state, name, min(held))
    # Bookkeeping only once every affected job has its annotations: it must not slow the deliveries down.
    await asyncio.gather(*(_record(state, d) for d in delivered))
    await apply.gather([functools.partial(apply.post_event, state.api, ref, "PreemptionNotice", d.message,
                                          "Warning") for d in delivered for ref in d.pods])


def _remember_first_seen(state: State, node: str, signals: set[str],
                         jobs: list[tuple[str, str]]) -> dict[str, datetime]:
    """Record when each of ``signals`` on ``node`` was first seen, if not yet known: by an operator before this one
    when the notices on ``jobs``' pods say so (``policy.notice.first_seen_in_notices``), else now."""
    seen = state.first_seen.setdefault(node, {})
    missing = [sig for sig in signals if sig not in seen]
    if missing:
        values = [notice_annotation(p) for ns, job in jobs for p in state.cache.pods_of(ns, job)]
        now = state_now()
        for sig in missing:
            seen[sig] = first_seen_in_notices(values, node, sig) or now
    return seen


def _look_again(state: State, name: str, when: datetime) -> None:
    """Re-examine node ``name`` (as cached) when a held notice opens."""
    delay = max(0.0, (when - state_now()).total_seconds()) + 0.05

    def fire() -> None:
        state.node_timers.pop(name, None)
        node = state.cache.nodes.get(name)
        if node is not None:
            task = asyncio.get_running_loop().create_task(on_node(state, "MODIFIED", name, node))
            state.tasks.add(task)
            task.add_done_callback(state.tasks.discard)

    state.node_timers[name] = asyncio.get_running_loop().call_later(delay, fire)
    log.info("node %s: a notice is held until %s (deadline beyond the %.0f s horizon)", name, rfc3339(when),
             state.horizon_seconds)


@dataclass(frozen=True)
class Delivered:
    """One job's pods carry the notice; its Event and status are still to be written."""

    namespace: str
    name: str
    job: dict[str, Any]  # job_ref
    attempt: int
    notice: Notice
    message: str
    pods: list[dict[str, Any]]  # refs of the pods annotated now, for their Events


async def _deliver(state: State, node: dict[str, Any], namespace: str, name: str,
                   t0: float) -> Delivered | datetime | None:
    """Annotate the pods of one job with the node's notice if it is earlier than what they know.

    Returns what was delivered, the time a held notice opens, or None."""
    api = state.api
    node_name = node["metadata"]["name"]
    try:
        async with state.locks[(namespace, name)]:
            t_lock = time.monotonic()
            # The watched copy is current to within the watch lag; the guards below (status, pod
            # annotations, the in-process set) do not depend on it being fresher.
            body = state.cache.jobs.get((namespace, name)) or await apply.run(apply.get_job, api, namespace, name)
            t_get = time.monotonic()
            if body is None:
                return None
            try:
                job = TrainingJob.from_body(body)
            except ValidationError:
                return None
            sigs = signals_for_job(state.signals, job.spec.preemption)
            seen = _remember_first_seen(state, node_name, present_signals(node, sigs), [(namespace, name)])
            now = state_now()
            notice = node_notice(node, now, sigs, seen)
            if notice is None:
                return None
            if not is_open(notice, now, state.horizon_seconds):
                return opens_at(notice, state.horizon_seconds)
            raw = state.cache.pods_of(namespace, name)
            pods = workers(job, raw, state.assignments.get((namespace, name)))
            notes = {r["metadata"]["name"]: notice_annotation(r) for r in raw}
            plan = decide_notice(job, pods, notice, notes, now, state.horizon_seconds)
            if plan is None or (job.uid, plan.attempt, notice.id) in state.delivered:
                return None
            before = recorded_deadline(job, plan.attempt)
            value = notice.annotation(plan.attempt)
            await apply.gather([functools.partial(apply.annotate_pod, api, namespace, n, {ANNOTATION_NOTICE: value})
                                for n in plan.annotate])
            for r in raw:  # the cache learns it now, not only when the watch event comes
                if r["metadata"]["name"] in plan.annotate:
                    annotated = {**r["metadata"], "annotations": {**(r["metadata"].get("annotations") or {}),
                                                                  ANNOTATION_NOTICE: value}}
                    state.cache.upsert_pod({**r, "metadata": annotated})  # a new compact pod: no stale parse
            t_done = time.monotonic()
            state.delivered.add((job.uid, plan.attempt, notice.id))
        started = state.seen_mono.get(node_name)
        if started is not None:
            metrics.NOTICE_LATENCY.observe(t_done - started)
        msg = notice_message(notice, plan.attempt, before, seen.get(notice.reason), state.started)
        log.info("TrainingJob %s/%s: %s (%d pods annotated in %.3fs: lock %.3fs, read %.3fs, patch %.3fs)",
                 namespace, name, msg, len(plan.annotate), t_done - t0, t_lock - t0, t_get - t_lock,
                 t_done - t_get)
        refs = [
            {"apiVersion": "v1", "kind": "Pod", "name": r["metadata"]["name"], "namespace": namespace,
             "uid": r["metadata"].get("uid")} for r in raw if r["metadata"]["name"] in plan.annotate]
        return Delivered(namespace, name, job_ref(body), plan.attempt, notice, msg, refs)
    except Exception:
        metrics.RECONCILE_ERRORS.labels("node-event").inc()
        log.exception("TrainingJob %s/%s: notice delivery for node %s failed", namespace, name, node_name)
    return None


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


async def _record(state: State, d: Delivered) -> None:
    """The job's Event, then the status that records the delivery.

    The Event is named after (job uid, attempt, notice id) and goes first: an operator killed in between finds
    the pods annotated but not ``status.lastNotice``, records again, and the apiserver refuses a second Event.
    If this fails, the in-process guard is dropped so the next Node event records it.
    """
    api = state.api
    try:
        async with state.locks[(d.namespace, d.name)]:
            body = state.cache.jobs.get((d.namespace, d.name))
            job = TrainingJob.from_body(body) if body is not None else None
            if job is None or job.uid != d.job.get("uid"):
                return  # deleted (or replaced) meanwhile
            patch = notice_status_patch(job, notice_status(d.notice, d.attempt, state_now()), d.attempt)
            if patch is None:
                return
            await apply.run(apply.post_event, api, d.job, "PreemptionNotice", d.message, "Warning",
                            notice_event_name(d.job, d.attempt, d.notice.id))
            await apply.run(apply.patch_job_status, api, d.namespace, d.name, patch)
            if body is not None:  # the watch event follows; deliveries meanwhile must see this record
                body["status"] = {**(body.get("status") or {}), **patch}
        metrics.NOTICES.labels(d.namespace, metrics.job(d.name), d.notice.reason).inc()
        metrics.NOTICE_LEAD.labels(d.namespace, metrics.job(d.name), d.notice.reason).observe(
            max(0.0, (d.notice.deadline - d.notice.observed_at).total_seconds()))
    except Exception:
        state.delivered.discard((d.job.get("uid"), d.attempt, d.notice.id))
        metrics.RECONCILE_ERRORS.labels("node-event").inc()
        log.exception("TrainingJob %s/%s: recording the notice failed", d.namespace, d.name)


def notice_event_name(job: dict[str, Any], attempt: int, notice_id: str) -> str:
    """The name of a job's PreemptionNotice Event for one notice delivered to one attempt."""
    digest = hashlib.sha256(notice_id.encode()).hexdigest()[:8]
    return f"{job['name']}.{(job.get('uid') or '')[:8]}.notice-{attempt}-{digest}"
