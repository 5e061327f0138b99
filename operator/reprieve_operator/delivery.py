"""Notice delivery: a Node event -> the notice its signals give -> every pod of each affected job.

The cache's node -> jobs index keeps the work proportional to the pods on that node. The earliest deadline
always reaches every pod (``policy.notice``): a later notice with an earlier deadline is delivered again. A
notice beyond the horizon is held, and the node is looked at again when it opens. One write per job: the job's
notice object ``<job>-notice``, which every pod that watches it hears through the API server's watch cache; the
annotation only on the pods that do not watch it, or on every pod due the notice when the object cannot be written
(``policy.fanout``, said in a ``NoticeFallback`` Event). Those writes are made here, and the Events once every
affected job has its notice (queued in ``eventsink.EventSink``, posted off the notices' path); each delivery is then handed to
``state.nodes`` and the job's reconcile kicked, which posts the job's Event and records ``status.lastNotice``
(``policy.decide``: the reconcile owns the status).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from . import ANNOTATION_NOTICE, NOTICE_OBJECT_KEY, apply, metrics
from .clock import SYSTEM
from .models import TrainingJob
from .policy import fanout
from .policy.builders import build_notice_object, job_ref, notice_object_name
from .policy.notice import (
    Delivered,
    NoticePlan,
    current_attempt,
    decide_notice,
    delivered_before,
    is_open,
    notice_message,
    opens_at,
)
from .policy.signals import node_notice, present_signals, signals_for_job
from .policy.times import rfc3339
from .policy.views import workers
from .state import State

log = logging.getLogger("reprieve_operator")


async def on_node(state: State, event_type: str | None, name: str, body: Any) -> None:
    """A Node event: track its signals; deliver a notice to every job with pods on it. Counted once handled
    (``reprieve_node_events_total``): every notice it gives is delivered (or held) by then."""
    try:
        await _on_node(state, event_type, name, body)
    finally:
        metrics.NODE_EVENTS.labels(name).inc()


async def _on_node(state: State, event_type: str | None, name: str, body: Any) -> None:
    nodes = state.nodes
    jobs = state.cache.jobs_on(name)
    nodes.release(name)
    if event_type == "DELETED":
        nodes.forget(name)
        metrics.NOTICE_NODES.set(nodes.carrying)
        for ns, job in jobs:
            state.queue.kick(ns, job)
        return
    node, signalled = nodes.observe(dict(body))
    metrics.NOTICE_NODES.set(nodes.carrying)
    if not signalled:  # only jobs with custom signals can still see something on this node
        jobs = [j for j in jobs if nodes.has_custom(j)]
    if not jobs:
        return
    t0 = time.monotonic()
    done = await asyncio.gather(*(_deliver(state, node, ns, job, t0) for ns, job in jobs))
    delivered = [d for d in done if isinstance(d, Annotated)]
    held = [d for d in done if isinstance(d, datetime)]
    if held:
        _look_again(state, name, min(held))
    # Bookkeeping only once every affected job has its annotations: it must not slow the deliveries down.
    for d in delivered:
        nodes.to_record(d.uid, d.delivered)
        state.queue.kick(d.namespace, d.name)
    for d in delivered:  # queued, posted by the sink's own threads: never in front of the next notice's writes
        for ref in d.pods:
            state.events.emit(ref, "PreemptionNotice", d.delivered.message, "Warning")
        if d.job is not None and d.fallback:
            state.events.emit(d.job, "NoticeFallback", d.fallback, "Warning", droppable=False)


async def object_notice(state: State, job: TrainingJob) -> str | None:
    """The notice the job's notice object carries: as this operator last wrote or read it, else read once (a
    refused read counts as none: the write that follows says whether the object can be used)."""
    key = (job.namespace, job.name)
    known, value = state.nodes.notice_object(key)
    if known:
        return value
    try:
        obj = await apply.run(apply.get_configmap, state.api, job.namespace, notice_object_name(job))
    except Exception as err:  # noqa: BLE001 - refused or no answer: not known, the write decides
        log.info("TrainingJob %s/%s: could not read %s (%s)", job.namespace, job.name, notice_object_name(job),
                 apply.refusal_of(err)[0] or err)
        return None
    value = None if obj is None else (obj.get("data") or {}).get(NOTICE_OBJECT_KEY)
    if obj is not None:
        state.nodes.object_written(key, value)
    return value


async def write_notice_object(state: State, job: TrainingJob, route: fanout.NoticeRoute, value: str) -> str | None:
    """Write the job's notice object when ``route`` says so; None, or why it was refused."""
    if not route.write_object:
        return None
    key = (job.namespace, job.name)
    try:
        await state.lanes.objects.gather([functools.partial(apply.write_data, state.api, build_notice_object(job, value),
                                                            state.nodes.object_exists(key))], first=route.heard_now)
    except Exception as err:  # noqa: BLE001 - any refusal (403 RBAC, 429 shedding, no answer): the pods are annotated
        status, detail = apply.refusal_of(err)
        why = f"HTTP {status}" if status is not None else str(detail)
        log.warning("TrainingJob %s/%s: %s could not be written (%s): annotating the pods instead", job.namespace,
                    job.name, notice_object_name(job), why)
        return why
    state.nodes.object_written(key, value)
    return None


async def send_notice_object(state: State, job: TrainingJob, plan: NoticePlan, route: fanout.NoticeRoute,
                             value: str) -> tuple[fanout.NoticeRoute, str | None]:
    """Write the job's notice object when ``route`` says so; the route the pods are then annotated by (every pod
    of ``plan`` when the write is refused: ``fanout.fallback``) and the ``NoticeFallback`` Event's text (None:
    none). A node's notice (``_deliver``) and a Kueue eviction's (``reconcile.apply_outcome``) both go this way."""
    refused = await write_notice_object(state, job, route, value)
    if refused is not None:
        route = fanout.fallback(plan)
    return route, fanout.fallback_message(notice_object_name(job), route, refused)


def _look_again(state: State, name: str, when: datetime) -> None:
    """Re-examine node ``name`` (as cached) when a held notice opens."""

    def look() -> None:
        node = state.cache.nodes.get(name)
        if node is not None:
            state.queue.spawn(on_node(state, "MODIFIED", name, node))

    state.nodes.hold(name, when, look)
    log.info("node %s: a notice is held until %s (deadline beyond the %.0f s horizon)", name, rfc3339(when),
             state.nodes.horizon_seconds)


@dataclass(frozen=True)
class Annotated:
    """One job's pods carry the notice; the job's Event and status are its reconcile's to write."""

    namespace: str
    name: str
    uid: str | None
    delivered: Delivered
    pods: list[dict[str, Any]]  # refs of the pods annotated now, for their Events
    job: dict[str, Any] | None = None  # the job's ref when ``fallback`` is to be said in its Event
    fallback: str | None = None  # why pods were annotated instead of hearing the job's notice object


async def _deliver(state: State, node: dict[str, Any], namespace: str, name: str,
                   t0: float) -> Annotated | datetime | None:
    """Annotate the pods of one job with the node's notice if it is earlier than what they know.

    Returns what was delivered, the time a held notice opens, or None."""
    api, nodes = state.api, state.nodes
    node_name = node["metadata"]["name"]
    try:
        async with state.queue.lock(namespace, name):
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
            sigs = signals_for_job(nodes.table, job.spec.preemption)
            seen = nodes.remember(node_name, present_signals(node, sigs), [(namespace, name)])
            now = SYSTEM.now()
            notice = node_notice(node, now, sigs, seen)
            if notice is None:
                return None
            if not is_open(notice, now, nodes.horizon_seconds):
                return opens_at(notice, nodes.horizon_seconds)
            object_value = await object_notice(state, job)
            raw = state.cache.pods_of(namespace, name)
            pods = workers(job, raw, state.assignments.get(job))
            notes = fanout.heard_by_pods(raw, notice_object_name(job), object_value, current_attempt(job, pods))
            plan = decide_notice(job, pods, notice, notes, now, nodes.horizon_seconds)
            if plan is None or nodes.delivered(job.uid, plan.attempt, notice.id):
                return None
            before = delivered_before(job, notes, plan.attempt, notice)
            value = notice.annotation(plan.attempt)
            watching = [r["metadata"]["name"] for r in raw if fanout.watches(r, notice_object_name(job))]
            uids = {r["metadata"]["name"]: r["metadata"].get("uid") for r in raw}
            ref = job_ref(body)
            # A burst's thousands of deliveries wait on their writes below at once: none holds its job's decoded pods
            # or body meanwhile (~50 KB a job: 2,300 jobs' were ~100 MB of the operator's memory).
            del raw, pods, body
            route, fell_back = fanout.route(plan, object_value, watching), None
            if route.heard_now or not route.write_object:  # pods hear the object now: it goes first
                route, fell_back = await send_notice_object(state, job, plan, route, value)
            await state.lanes.pods.gather([functools.partial(apply.annotate_pod, api, namespace, n,
                                                             {ANNOTATION_NOTICE: value}) for n in route.annotate])
            if route.write_object and not route.heard_now:
                # No pod due the notice watches the object: all are annotated above (as a refused write would have
                # them); the object, for a process that starts later, after them and behind every object pods hear
                # now (``BatchLane.gather(first=False)``).
                route, fell_back = await send_notice_object(state, job, plan, route, value)
            for r in state.cache.pods_of(namespace, name):  # the cache learns it now, not only from the watch event
                if r["metadata"]["name"] in route.annotate:
                    annotated = {**r["metadata"], "annotations": {**(r["metadata"].get("annotations") or {}),
                                                                  ANNOTATION_NOTICE: value}}
                    state.cache.upsert_pod({**r, "metadata": annotated})  # a new compact pod: no stale parse
            t_done = time.monotonic()
            nodes.mark_delivered(job.uid, plan.attempt, notice.id)
        started = nodes.since(node_name)
        if started is not None:
            metrics.NOTICE_LATENCY.observe(t_done - started)
        msg = notice_message(notice, plan.attempt, before, seen.get(notice.reason), nodes.started)
        log.info("TrainingJob %s/%s: %s (%d pods annotated, %s, in %.3fs: lock %.3fs, read %.3fs, write %.3fs)",
                 namespace, name, msg, len(route.annotate), f"{notice_object_name(job)} written"
                 if route.write_object else "no object written", t_done - t0, t_lock - t0, t_get - t_lock,
                 t_done - t_get)
        refs = [{"apiVersion": "v1", "kind": "Pod", "name": n, "namespace": namespace, "uid": uid}
                for n, uid in uids.items() if n in route.annotate]
        return Annotated(namespace, name, job.uid, Delivered(notice, plan.attempt, msg), refs,
                         ref if fell_back else None, fell_back)
    except Exception:
        metrics.RECONCILE_ERRORS.labels("node-event").inc()
        log.exception("TrainingJob %s/%s: notice delivery for node %s failed", namespace, name, node_name)
    return None

