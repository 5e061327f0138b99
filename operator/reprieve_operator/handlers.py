"""kopf handlers: read, decide (pure policy), apply (``apply``), patch status once.

Triggers: TrainingJob create/resume/update and a periodic resync timer, every worker-pod event, every Node
event. Work for one job is serialised by a per-job lock and coalesced (a burst of pod events runs one
reconcile plus one follow-up). Notices are delivered straight from the Node event through the node->pods
index, so the latency is a handful of API calls, independent of how many jobs the operator watches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from . import ANNOTATION_NOTICE, LABEL_JOB, apply, builders, metrics, observe
from .models import GROUP, KIND, PLURAL, VERSION, TrainingJob, spec_error
from .policy.notice import decide_notice
from .policy.restart import RestartPlan, decide_restart
from .signals import Signal, node_notice, present_signals, rfc3339, signals_for_job

log = logging.getLogger("reprieve_operator")
WAIT_DELAY = 2.0


@dataclass
class State:
    """Process-local state; everything here can be re-derived from the cluster after a restart."""

    api: apply.Api
    signals: tuple[Signal, ...]
    first_seen: dict[str, dict[str, datetime]] = field(default_factory=dict)  # node -> signal -> time
    seen_mono: dict[str, float] = field(default_factory=dict)  # node -> monotonic time of first signal
    notice_nodes: set[str] = field(default_factory=set)
    delivered: set[tuple[str, int]] = field(default_factory=set)  # (job uid, attempt)
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    pending: dict[tuple[str, str], bool] = field(default_factory=dict)  # key -> dirty
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    jobs_index: Any = None
    custom_jobs: set[tuple[str, str]] = field(default_factory=set)  # jobs with their own custom signals
    nodes_index: Any = None


def _state(memo: Any) -> State:
    return memo.state  # type: ignore[no-any-return]


def _now() -> datetime:
    return datetime.now(UTC)


def _job_ref(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"],
            "namespace": meta["namespace"], "uid": meta.get("uid")}


# --- indices: O(affected) lookups for node events ---------------------------------------------------------

@kopf.index("pods", labels={LABEL_JOB: kopf.PRESENT})
def pods_by_node(spec: Any, namespace: str, labels: Any, **_: Any) -> dict[str, tuple[str, str]] | None:
    node = spec.get("nodeName")
    return {node: (namespace, labels[LABEL_JOB])} if node else None


@kopf.index("pods", labels={LABEL_JOB: kopf.PRESENT})
def pods_by_job(body: Any, namespace: str, labels: Any, **_: Any) -> dict[tuple[str, str], Any]:
    return {(namespace, labels[LABEL_JOB]): observe.compact_pod(body)}


@kopf.index("nodes")
def node_names(name: str, **_: Any) -> dict[str, bool]:
    return {name: True}


# --- reconcile ----------------------------------------------------------------------------------------------

async def reconcile(state: State, namespace: str, name: str, nodes: Any) -> RestartPlan | None:
    """Read the job and its pods, decide, apply, patch status once. Returns the plan (None if no job)."""
    api = state.api
    async with state.locks[(namespace, name)]:
        body = await apply.run(apply.get_job, api, namespace, name)
        if body is None:
            return None
        try:
            job = TrainingJob.from_body(body)
        except ValidationError as err:
            await _reject(state, body, spec_error(name, namespace, err))
            raise kopf.PermanentError(spec_error(name, namespace, err)) from err
        if job.spec.preemption.custom:
            state.custom_jobs.add((namespace, name))
        else:
            state.custom_jobs.discard((namespace, name))
        raw_pods = await apply.run(apply.list_job_pods, api, namespace, name)
        known = set(nodes.keys()) if nodes is not None else None
        pods = [p for p in (observe.worker_pod(r, known) for r in raw_pods) if p is not None]
        plan = decide_restart(job, pods, state.notice_nodes)
        now = _now()
        ref = _job_ref(body)
        if plan.cause:
            # Record the decision before acting on it, so a crash in between cannot count it twice.
            patch = observe.status_patch(job, plan, now, None)
            await apply.run(apply.patch_job_status, api, namespace, name, patch)
            job = job.model_copy(update={"status": job.status.model_validate({**_dump(job), **patch})})
            if plan.phase == "Failed":
                metrics.FAILED_JOBS.labels(plan.conditions[0].reason if plan.conditions else "Failed").inc()
                await apply.run(apply.post_event, api, ref, "Failed", plan.message, "Warning")
            else:
                metrics.RESTARTS.labels(plan.cause).inc()
                await apply.run(apply.post_event, api, ref, "GangRestart", plan.message,
                                "Warning" if plan.cause != "preemption" else "Normal")
            log.info("TrainingJob %s/%s: %s", namespace, name, plan.message)
            plan = dataclasses.replace(plan, cause=None)  # recorded; the final patch must not count it again
        if plan.create:
            # In order: a RoleBinding's escalation check needs its Role to exist already.
            for obj in (builders.build_service(job), *builders.build_identity(job)):
                await apply.run(apply.create, api, obj)
            pods_ = [builders.build_worker_pod(job, i, plan.attempt, plan.exclude_nodes) for i in plan.create]
            await apply.gather([lambda o=o: apply.create(api, o) for o in pods_])  # type: ignore[misc]
            if plan.new_attempt:
                await apply.run(apply.post_event, api, ref, "AttemptStarted",
                                f"attempt {plan.attempt}: created {len(plan.create)} worker pod(s)"
                                + (f" avoiding {', '.join(plan.exclude_nodes)}" if plan.exclude_nodes else ""))
        if plan.delete:
            await apply.gather([lambda n=n: apply.delete_pod(api, namespace, n) for n in plan.delete])  # type: ignore[misc]
        patch = observe.status_patch(job, plan, now, observe.progress(raw_pods))
        if patch:
            await apply.run(apply.patch_job_status, api, namespace, name, patch)
        return plan


def _dump(job: TrainingJob) -> dict[str, Any]:
    return job.status.model_dump(by_alias=True)


async def _reject(state: State, body: dict[str, Any], message: str) -> None:
    status = body.get("status") or {}
    if status.get("phase") == "Failed":
        return
    cond = {"type": "Failed", "status": "True", "reason": "InvalidSpec", "message": message[:2000],
            "lastTransitionTime": rfc3339(_now())}
    meta = body["metadata"]
    await apply.run(apply.patch_job_status, state.api, meta["namespace"], meta["name"],
                    {"phase": "Failed", "conditions": [cond], "completionTime": rfc3339(_now())})
    await apply.run(apply.post_event, state.api, _job_ref(body), "InvalidSpec", message, "Warning")
    metrics.FAILED_JOBS.labels("InvalidSpec").inc()


def kick(state: State, namespace: str, name: str, nodes: Any) -> None:
    """Schedule a reconcile of one job; bursts coalesce into one run plus one follow-up."""
    key = (namespace, name)
    if key in state.pending:
        state.pending[key] = True
        return
    state.pending[key] = False

    async def runner() -> None:
        try:
            while True:
                try:
                    await reconcile(state, namespace, name, nodes)
                except kopf.PermanentError:
                    pass
                except Exception:  # logged and counted; the resync timer retries
                    metrics.RECONCILE_ERRORS.labels("pod-event").inc()
                    log.exception("TrainingJob %s/%s: reconcile failed", namespace, name)
                if not state.pending.get(key):
                    break
                state.pending[key] = False
        finally:
            state.pending.pop(key, None)

    task = asyncio.get_running_loop().create_task(runner())
    state.tasks.add(task)
    task.add_done_callback(state.tasks.discard)


async def _reconcile_or_wait(memo: Any, namespace: str, name: str, node_names: Any, handler: str) -> None:
    state = _state(memo)
    try:
        plan = await reconcile(state, namespace, name, node_names)
    except (kopf.PermanentError, kopf.TemporaryError):
        raise
    except Exception as err:
        metrics.RECONCILE_ERRORS.labels(handler).inc()
        raise kopf.TemporaryError(f"reconcile failed: {err}", delay=WAIT_DELAY) from err
    if plan is not None and plan.waiting:
        raise kopf.TemporaryError(plan.message or "waiting for old pods to go", delay=WAIT_DELAY)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def job_changed(namespace: str, name: str, memo: Any, node_names: Any, jobs_by_name: Any,
                      **_: Any) -> None:
    state = _state(memo)
    state.jobs_index, state.nodes_index = jobs_by_name, node_names
    await _reconcile_or_wait(memo, namespace, name, node_names, "job")


async def resync_loop(state: State, interval: float) -> None:
    """Safety net for missed events (the normal path is event-driven): kick every unfinished job.

    A loop over the jobs index rather than a per-object kopf timer, because kopf protects timers with a
    finalizer, and a finalizer would keep deleted jobs (and their pods) alive while the operator is down.
    """
    while True:
        await asyncio.sleep(interval)
        jobs, nodes = state.jobs_index, state.nodes_index
        if jobs is None:
            continue
        try:
            keys = [key for key, bodies in list(jobs.items())
                    if any((b["status"].get("phase") not in ("Succeeded", "Failed")) for b in bodies)]
            log.debug("resync: %d unfinished job(s)", len(keys))
            for namespace, name in keys:
                kick(state, namespace, name, nodes)
        except Exception:  # never let the safety net die
            metrics.RECONCILE_ERRORS.labels("resync").inc()
            log.exception("resync failed")


@kopf.index(GROUP, VERSION, PLURAL)
def jobs_by_name(body: Any, namespace: str, name: str, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The job as last seen (spec, status, identity): notice delivery reads it without an API round trip."""
    meta = body["metadata"]
    return {(namespace, name): {
        "metadata": {"name": name, "namespace": namespace, "uid": meta.get("uid"),
                     "generation": meta.get("generation")},
        "spec": dict(body.get("spec") or {}), "status": dict(body.get("status") or {})}}


@kopf.on.event("pods", labels={LABEL_JOB: kopf.PRESENT})
async def pod_event(event: Any, namespace: str, labels: Any, memo: Any, node_names: Any, jobs_by_name: Any,
              **_: Any) -> None:
    state = _state(memo)
    state.jobs_index, state.nodes_index = jobs_by_name, node_names  # live views, for resync_loop
    kick(state, namespace, labels[LABEL_JOB], node_names)


# --- node signals -------------------------------------------------------------------------------------------

@kopf.on.event("nodes")
async def node_event(event: Any, name: str, body: Any, memo: Any, pods_by_node: Any, pods_by_job: Any,
                     node_names: Any, jobs_by_name: Any, **_: Any) -> None:
    state = _state(memo)
    jobs = sorted(set(pods_by_node.get(name, ())))
    if event.get("type") == "DELETED":
        state.notice_nodes.discard(name)
        state.first_seen.pop(name, None)
        state.seen_mono.pop(name, None)
        metrics.NOTICE_NODES.set(len(state.notice_nodes))
        for ns, job in jobs:
            kick(state, ns, job, node_names)
        return
    node = dict(body)
    now = _now()
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
    done = await asyncio.gather(*(_deliver(state, node, ns, job, pods_by_job, jobs_by_name, t0)
                                  for ns, job in jobs))
    # Events only once every affected job has its notice: they must not slow the deliveries down.
    await apply.gather([lambda ref=ref, msg=msg: apply.post_event(state.api, ref, "PreemptionNotice", msg, "Warning")
                        for refs, msg in done for ref in refs])  # type: ignore[misc]


async def _deliver(state: State, node: dict[str, Any], namespace: str, name: str, pods_by_job: Any,
                   jobs_by_name: Any, t0: float) -> tuple[list[dict[str, Any]], str]:
    """Deliver the node's notice to one job; returns the objects to post an Event on, and its message."""
    api = state.api
    node_name = node["metadata"]["name"]
    try:
        async with state.locks[(namespace, name)]:
            t_lock = time.monotonic()
            # The watched copy is current to within the watch lag; the once-per-attempt guards below
            # (status, pod annotations, the in-process set) do not depend on it being fresher.
            cached = list(jobs_by_name.get((namespace, name), ()))
            body = cached[0] if cached else await apply.run(apply.get_job, api, namespace, name)
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
                seen.setdefault(sig, _now())
            notice = node_notice(node, _now(), sigs, seen)
            if notice is None:
                return [], ""
            raw = list(pods_by_job.get((namespace, name), ()))
            pods = [p for p in (observe.worker_pod(r) for r in raw) if p is not None]
            notes = {r["metadata"]["name"]: observe.notice_annotation(r) for r in raw}
            plan = decide_notice(job, pods, notice, notes)
            if plan is None or (job.uid, plan.attempt) in state.delivered:
                return [], ""
            value = notice.annotation()
            await apply.gather([lambda n=n: apply.annotate_pod(api, namespace, n, {ANNOTATION_NOTICE: value})
                                for n in plan.annotate])  # type: ignore[misc]
            t_done = time.monotonic()
            started = state.seen_mono.get(node_name)
            if started is not None:
                metrics.NOTICE_LATENCY.observe(t_done - started)
            now = _now()
            patch: dict[str, Any] = {"lastNotice": observe.notice_status(notice, plan.attempt, now)}
            if job.status.phase in (None, "Pending", "Running"):
                patch["phase"] = "Preempting"
            await apply.run(apply.patch_job_status, api, namespace, name, patch)
            state.delivered.add((job.uid, plan.attempt))
            metrics.NOTICES.labels(notice.reason).inc()
        msg = (f"node {notice.node} will go away ({notice.reason}) by {rfc3339(notice.deadline)}; "
               f"notice {notice.id} delivered to attempt {plan.attempt}")
        log.info("TrainingJob %s/%s: %s (%d pods annotated in %.3fs: lock %.3fs, read %.3fs, patch %.3fs)",
                 namespace, name, msg, len(plan.annotate), t_done - t0, t_lock - t0, t_get - t_lock,
                 t_done - t_get)
        refs = [_job_ref(body)] + [
            {"apiVersion": "v1", "kind": "Pod", "name": r["metadata"]["name"], "namespace": namespace,
             "uid": r["metadata"].get("uid")} for r in raw if r["metadata"]["name"] in plan.annotate]
        return refs, msg
    except Exception:
        metrics.RECONCILE_ERRORS.labels("node-event").inc()
        log.exception("TrainingJob %s/%s: notice delivery for node %s failed", namespace, name, node_name)
    return [], ""
