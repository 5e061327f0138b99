"""Notice delivery: a Node event -> the notice its signals give -> every pod of each affected job.

The cache's node -> jobs index keeps the work proportional to the pods on that node. At most once per job
per attempt (``policy.notice``); Events are posted only after every affected job has its annotations.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from pydantic import ValidationError

from . import ANNOTATION_NOTICE, apply, metrics, observe
from .models import TrainingJob
from .policy.notice import decide_notice
from .reconcile import kick
from .signals import node_notice, present_signals, rfc3339, signals_for_job
from .state import State, job_ref
from .state import now as state_now

log = logging.getLogger("reprieve_operator")


async def on_node(state: State, event_type: str | None, name: str, body: Any) -> None:
    """A Node event: track its signals; deliver a notice to every job with pods on it."""
    jobs = state.cache.jobs_on(name)
    if event_type == "DELETED":
        state.cache.nodes.discard(name)
        state.notice_nodes.discard(name)
        state.first_seen.pop(name, None)
        state.seen_mono.pop(name, None)
        metrics.NOTICE_NODES.set(len(state.notice_nodes))
        for ns, job in jobs:
            kick(state, ns, job)
        return
    state.cache.nodes.add(name)
    node = dict(body)
    now = state_now()
    present = present_signals(node, state.signals)
    seen = state.first_seen.setdefault(name, {})
    for sig in set(seen) - present:
        seen.pop(sig)
    for sig in present:
        seen.setdefault(sig, now)
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
    done = await asyncio.gather(*(_deliver(state, node, ns, job, t0)
                                  for ns, job in jobs))
    # Pod Events only once every affected job has its notice: they must not slow the deliveries down.
    await apply.gather([functools.partial(apply.post_event, state.api, ref, "PreemptionNotice", msg, "Warning")
                        for refs, msg in done for ref in refs])


async def _deliver(state: State, node: dict[str, Any], namespace: str, name: str,
                   t0: float) -> tuple[list[dict[str, Any]], str]:
    """Deliver the node's notice to one job; returns the pods to post an Event on, and its message."""
    api = state.api
    node_name = node["metadata"]["name"]
    try:
        async with state.locks[(namespace, name)]:
            t_lock = time.monotonic()
            # The watched copy is current to within the watch lag; the once-per-attempt guards below
            # (status, pod annotations, the in-process set) do not depend on it being fresher.
            body = state.cache.jobs.get((namespace, name)) or await apply.run(apply.get_job, api, namespace, name)
            t_get = time.monotonic()
            if body is None:
                return [], ""
            try:
                job = TrainingJob.from_body(body)
            except ValidationError:
                return [], ""
            sigs = signals_for_job(state.signals, job.spec.preemption)
            seen = state.first_seen.setdefault(node_name, {})
            for sig in present_signals(node, sigs):
                seen.setdefault(sig, state_now())
            notice = node_notice(node, state_now(), sigs, seen)
            if notice is None:
                return [], ""
            raw = state.cache.pods_of(namespace, name)
            pods = [p for p in (observe.worker_pod(r) for r in raw) if p is not None]
            notes = {r["metadata"]["name"]: observe.notice_annotation(r) for r in raw}
            plan = decide_notice(job, pods, notice, notes)
            if plan is None or (job.uid, plan.attempt) in state.delivered:
                return [], ""
            value = notice.annotation()
            await apply.gather([functools.partial(apply.annotate_pod, api, namespace, n, {ANNOTATION_NOTICE: value})
                                for n in plan.annotate])
            t_done = time.monotonic()
            started = state.seen_mono.get(node_name)
            if started is not None:
                metrics.NOTICE_LATENCY.observe(t_done - started)
            msg = (f"node {notice.node} will go away ({notice.reason}) by {rfc3339(notice.deadline)}; "
                   f"notice {notice.id} delivered to attempt {plan.attempt}")
            # The job's Event goes before the status that records the delivery, under a name fixed by
            # (job, attempt): an operator killed in between posts it on restart, and never twice.
            ref = job_ref(body)
            await apply.run(apply.post_event, api, ref, "PreemptionNotice", msg, "Warning",
                            notice_event_name(ref, plan.attempt))
            now = state_now()
            patch: dict[str, Any] = {"lastNotice": observe.notice_status(notice, plan.attempt, now)}
            if job.status.phase in (None, "Pending", "Running"):
                patch["phase"] = "Preempting"
            await apply.run(apply.patch_job_status, api, namespace, name, patch)
            state.delivered.add((job.uid, plan.attempt))
            metrics.NOTICES.labels(notice.reason).inc()
        log.info("TrainingJob %s/%s: %s (%d pods annotated in %.3fs: lock %.3fs, read %.3fs, patch %.3fs)",
                 namespace, name, msg, len(plan.annotate), t_done - t0, t_lock - t0, t_get - t_lock,
                 t_done - t_get)
        refs = [
            {"apiVersion": "v1", "kind": "Pod", "name": r["metadata"]["name"], "namespace": namespace,
             "uid": r["metadata"].get("uid")} for r in raw if r["metadata"]["name"] in plan.annotate]
        return refs, msg
    except Exception:
        metrics.RECONCILE_ERRORS.labels("node-event").inc()
        log.exception("TrainingJob %s/%s: notice delivery for node %s failed", namespace, name, node_name)
    return [], ""


def notice_event_name(job: dict[str, Any], attempt: int) -> str:
    """The name of a job's PreemptionNotice Event for one attempt (unique per job uid, not only name)."""
    return f"{job['name']}.{(job.get('uid') or '')[:8]}.notice-{attempt}"
