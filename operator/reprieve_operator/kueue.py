"""Kueue's I/O (the decisions are ``policy.kueue``'s): read or create a queued job's Workload, read the flavors its
admission names, deliver an eviction's notice to the pods, give the quota back once the gang is gone, publish the
last committed checkpoint on the Workload and the pods, and watch Workloads to reconcile their jobs.

Only with the operator's ``--kueue`` (chart ``kueue.enabled``); without it a queue label is ignored.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from . import ANNOTATION_NOTICE, LABEL_JOB, apply
from .clock import SYSTEM
from .models import TrainingJob
from .policy import kueue as policy
from .policy.builders import job_ref
from .policy.notice import annotation_deadline
from .policy.times import rfc3339
from .state import State

log = logging.getLogger("reprieve_operator")
G, V = policy.KUEUE_GROUP, policy.KUEUE_VERSION


def _body(err: ApiException) -> dict[str, Any]:
    try:
        parsed = json.loads(err.body or "{}")
        return parsed if isinstance(parsed, dict) else {}
    except ValueError:
        return {}


def _not_served(err: ApiException) -> bool:
    """A 404 for the resource itself (Kueue's CRDs not installed), not for one object of it."""
    return err.status == 404 and not (_body(err).get("details") or {}).get("name")


def _get(api: apply.Api, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    def call() -> dict[str, Any]:
        if namespace is None:
            return apply._raw(api.custom.get_cluster_custom_object(G, V, plural, name, _preload_content=False))
        return apply._raw(api.custom.get_namespaced_custom_object(G, V, namespace, plural, name,
                                                                  _preload_content=False))
    try:
        return call()
    except ApiException as err:
        if err.status == 404 and not _not_served(err):
            return None
        raise


def _create(api: apply.Api, wl: dict[str, Any]) -> dict[str, Any]:
    ns = wl["metadata"]["namespace"]
    return apply._raw(api.custom.create_namespaced_custom_object(G, V, ns, policy.WORKLOADS, wl,  # type: ignore[no-any-return]
                                                                 _preload_content=False))


def _patch(api: apply.Api, ns: str, name: str, body: dict[str, Any], status: bool = False) -> None:
    fn = api.custom.patch_namespaced_custom_object_status if status else api.custom.patch_namespaced_custom_object
    apply._raw(fn(G, V, ns, policy.WORKLOADS, name, body, _preload_content=False))


def _message(err: ApiException) -> str:
    return str(_body(err).get("message") or err.reason or err)[:600]


async def gate_for(state: State, body: dict[str, Any], job: TrainingJob, raw_pods: list[dict[str, Any]],
                   now: datetime) -> policy.Gate | None:
    """The job's gate (None: not queued), after the Workload I/O it needs: create, replace or requeue the Workload,
    deliver an eviction's notice, give the quota back once no pod is left, publish the last checkpoint."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    queue = labels.get(policy.QUEUE_LABEL)
    if not state.kueue:
        return None
    if not queue:
        if any(c.type == policy.QUEUED for c in job.status.conditions):
            await _forget(state, job)  # the label was removed: the job is no longer Kueue's
        return None
    g = await _gate(state, body, job, raw_pods, now, queue, labels.get(policy.PRIORITY_LABEL))
    if g is None:
        return None
    old = next((c for c in job.status.conditions if c.type == policy.QUEUED), None)
    c = g.condition
    if old is None or (old.status, old.reason, old.message) != (c.status, c.reason, c.message):
        # One Event per change of the condition (the status write follows in this reconcile).
        await apply.run(apply.post_event, state.api, job_ref(body), c.reason, c.message,
                        "Warning" if g.warning else "Normal")
    return g


async def _gate(state: State, body: dict[str, Any], job: TrainingJob, raw_pods: list[dict[str, Any]],
                now: datetime, queue: str, priority_class: str | None) -> policy.Gate | None:
    api, ns = state.api, job.namespace
    name = policy.workload_name(job.name, job.uid)
    try:
        raw = await apply.run(_get, api, policy.WORKLOADS, name, ns)
        if raw is None:
            made = await _create_workload(state, job, queue, priority_class)
            if isinstance(made, policy.Gate):
                return made
            raw = made
        wl = policy.parse_workload(raw)
        if job.status.phase in ("Succeeded", "Failed"):
            done = policy.finish_patch(raw, job.status.phase, now)
            if done is not None:
                await apply.run(_patch, api, ns, name, done, True)
                log.info("TrainingJob %s/%s: %s: Workload %s finished", ns, job.name, job.status.phase, name)
            return None  # an ended job is no longer queued: nothing to gate
        why = policy.needs_new_workload(job, wl)
        if why is not None:
            await apply.run(lambda: api.custom.delete_namespaced_custom_object(G, V, ns, policy.WORKLOADS, name))
            state.queue.requeue(ns, job.name, 1.0)
            return policy.queued("WorkloadReplaced", f"Workload {name} replaced: {why}")
        if wl.queue != queue and not wl.quota_reserved:
            await apply.run(_patch, api, ns, name, {"spec": {"queueName": queue}})
            return policy.queued("Pending", f"moved to LocalQueue {ns}/{queue}")
        flavors: dict[str, Any] = {}
        for f in sorted({f for fs in wl.flavors.values() for f in fs}):
            flavors[f] = await apply.run(_get, api, policy.FLAVORS, f)
    except ApiException as err:
        if _not_served(err):
            return policy.queued("KueueNotInstalled", f"label {policy.QUEUE_LABEL}={queue} is set, but the API "
                                 f"server does not serve {policy.WORKLOADS}.{G}/{V}: install Kueue (docs/kueue.md) "
                                 f"or remove the label", warning=True)
        raise
    g = policy.gate(job, queue, wl, flavors, now)
    if g.notice is not None:
        await _deliver(state, body, job, raw_pods, g)
    if g.release and not raw_pods:
        await _release(state, body, raw)
    await _publish(state, job, raw_pods, wl)
    return g


async def _forget(state: State, job: TrainingJob) -> None:
    """Delete the Workload of a job whose queue label was removed (it runs unqueued now; a Workload left behind
    would wait in the queue, and once admitted hold quota nobody uses)."""
    name = policy.workload_name(job.name, job.uid)

    def delete() -> bool:
        state.api.custom.delete_namespaced_custom_object(G, V, job.namespace, policy.WORKLOADS, name)
        return True

    try:
        if await apply.run(apply.tolerate, delete, 404, False):
            log.info("TrainingJob %s/%s: label %s removed: Workload %s deleted", job.namespace, job.name,
                     policy.QUEUE_LABEL, name)
    except ApiException as err:
        if not _not_served(err):
            raise


async def _create_workload(state: State, job: TrainingJob, queue: str,
                           pc: str | None) -> dict[str, Any] | policy.Gate:
    api = state.api
    prio: tuple[str, int] | None = None
    if pc:
        obj = await apply.run(_get, api, policy.PRIORITY_CLASSES, pc)
        if obj is None:
            return policy.queued("PriorityClassNotFound", f"label {policy.PRIORITY_LABEL}={pc}: no "
                                 f"WorkloadPriorityClass {pc}", warning=True)
        prio = (pc, int(obj.get("value") or 0))
    wl = policy.build_workload(job, queue, prio)
    try:
        made = await apply.run(_create, api, wl)
    except ApiException as err:
        if err.status == 409:
            got = await apply.run(_get, api, policy.WORKLOADS, wl["metadata"]["name"], job.namespace)
            if got is not None:
                return got
        if err.status in (400, 403, 422):
            return policy.queued("WorkloadRefused", f"the API server (Kueue's webhook) refused Workload "
                                 f"{wl['metadata']['name']}: {_message(err)}", warning=True)
        raise
    log.info("TrainingJob %s/%s: created Workload %s in LocalQueue %s", job.namespace, job.name,
             wl["metadata"]["name"], queue)
    return made


async def _deliver(state: State, body: dict[str, Any], job: TrainingJob, raw_pods: list[dict[str, Any]],
                   g: policy.Gate) -> None:
    """The eviction's notice on every live pod that knows no deadline as early (``policy.notice``'s rule)."""
    attempt = job.status.attempt
    value = policy.notice_annotation(g, attempt)
    if value is None or g.deadline is None or attempt == 0:
        return
    todo = []
    for p in raw_pods:
        meta = p.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        known = annotation_deadline((meta.get("annotations") or {}).get(ANNOTATION_NOTICE), attempt)
        if known is None or known > g.deadline:
            todo.append(str(meta.get("name")))
    if not todo:
        return
    await apply.gather([functools.partial(apply.annotate_pod, state.api, job.namespace, n,
                                          {ANNOTATION_NOTICE: value}) for n in todo])
    assert g.notice is not None
    msg = (f"Kueue evicted the job's Workload ({g.notice.reason}: {g.notice.message}); notice {g.notice_id} "
           f"delivered to attempt {attempt}, save by {rfc3339(g.deadline)}")
    log.info("TrainingJob %s/%s: %s (%d pods)", job.namespace, job.name, msg, len(todo))
    ref = job_ref(body)
    await apply.run(apply.post_event, state.api, ref, "PreemptionNotice", msg, "Warning",
                    f"{job.name}.{job.uid[:8]}.kueue-{attempt}-{int(g.notice.since.timestamp())}")
    last = {"id": g.notice_id, "node": "", "reason": policy.NOTICE_REASON, "deadline": rfc3339(g.deadline),
            "observedAt": rfc3339(g.notice.since), "attempt": attempt, "deliveredAt": rfc3339(SYSTEM.now())}
    patch: dict[str, Any] = {"lastNotice": last}
    if job.status.phase in ("Pending", "Running"):
        patch["phase"] = "Preempting"
    await apply.run(apply.patch_job_status, state.api, job.namespace, job.name, patch)
    state.cache.merge_job_status(job.namespace, job.name, patch)


async def _release(state: State, body: dict[str, Any], raw: dict[str, Any]) -> None:
    """Give the evicted Workload's quota back: the gang is gone."""
    patch = policy.release_patch(raw, SYSTEM.now())
    if patch is None:
        return
    meta = raw["metadata"]
    try:
        await apply.run(_patch, state.api, meta["namespace"], meta["name"], patch, True)
    except ApiException as err:
        if err.status == 409:  # changed meanwhile: decide again on the new one
            state.queue.requeue(meta["namespace"], body["metadata"]["name"], 0.5)
            return
        raise
    msg = f"every pod is gone: quota of Workload {meta['name']} given back to Kueue"
    log.info("TrainingJob %s/%s: %s", meta["namespace"], body["metadata"]["name"], msg)
    await apply.run(apply.post_event, state.api, job_ref(body), "QuotaReleased", msg)


async def _publish(state: State, job: TrainingJob, raw_pods: list[dict[str, Any]], wl: policy.Workload) -> None:
    """The last committed checkpoint as ``reprieve.dev/last-checkpoint`` on the Workload and the live pods."""
    value = policy.checkpoint_annotation(job)
    if value is None:
        return
    if wl.checkpoint != value:
        await apply.run(_patch, state.api, job.namespace, wl.name,
                        {"metadata": {"annotations": {policy.ANNOTATION_CHECKPOINT: value}}})
    stale = [str(p["metadata"]["name"]) for p in raw_pods if not p["metadata"].get("deletionTimestamp")
             and (p["metadata"].get("annotations") or {}).get(policy.ANNOTATION_CHECKPOINT) != value]
    await apply.gather([functools.partial(apply.annotate_pod, state.api, job.namespace, n,
                                          {policy.ANNOTATION_CHECKPOINT: value}) for n in stale])


def watch_workloads(state: State, namespaces: Iterable[str] | None, loop: asyncio.AbstractEventLoop,
                    stop: threading.Event) -> list[threading.Thread]:
    """Threads that watch the operator's Workloads (label ``reprieve.dev/job-name``) and kick their jobs'
    reconciles: an admission, an eviction or a requeue is seen at once."""
    def run(ns: str | None) -> None:
        api = state.api.custom
        while not stop.is_set():
            try:
                fn = (functools.partial(api.list_namespaced_custom_object, G, V, ns, policy.WORKLOADS) if ns
                      else functools.partial(api.list_cluster_custom_object, G, V, policy.WORKLOADS))
                for ev in watch.Watch().stream(fn, label_selector=LABEL_JOB, timeout_seconds=60):
                    obj = ev.get("object") or {}
                    meta = obj.get("metadata") or {}
                    job = (meta.get("labels") or {}).get(LABEL_JOB)
                    if job:
                        loop.call_soon_threadsafe(state.queue.kick, str(meta.get("namespace")), str(job))
                    if stop.is_set():
                        return
            except Exception as err:  # noqa: BLE001 - Kueue not installed yet, a dropped watch: try again
                log.debug("watching Workloads%s: %s", f" in {ns}" if ns else "", err)
                stop.wait(5.0)

    threads = [threading.Thread(target=run, args=(ns,), name=f"reprieve-kueue-{ns or 'all'}", daemon=True)
               for ns in (list(namespaces) if namespaces else [None])]
    for t in threads:
        t.start()
    return threads
