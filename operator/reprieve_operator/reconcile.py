"""Reconcile one TrainingJob: read it, its pods, its assignment and the nodes; decide its whole outcome
(``decide``, pure); apply that outcome in a fixed order.

Reconciles of one job are serialised by a per-job lock; ``kick`` coalesces bursts of pod events into one
run plus one follow-up. ``resync_loop`` is the safety net for missed events.
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import dataclasses
import logging
import time
from datetime import datetime
from typing import Any

import kopf
from pydantic import ValidationError

from . import apply, builders, metrics
from .assignment import assignment_of
from .models import TrainingJob, spec_error
from .policy.create import TRANSIENT, Refusal, classify_refusal, retry_seconds
from .policy.decide import Outcome, View, decide
from .policy.notice import is_open
from .policy.placement import avoid_nodes
from .policy.restart import Condition, RestartPlan
from .policy.signals import node_notice, present_signals, signals_for_job
from .policy.status import closing_goodput, conditions_patch
from .policy.times import rfc3339
from .policy.views import compact_node
from .state import State, job_ref
from .state import now as state_now

log = logging.getLogger("reprieve_operator")


async def reconcile(state: State, namespace: str, name: str, fresh: bool = False) -> RestartPlan | None:
    """Read the job, its pods, its assignment and the nodes; decide the whole outcome (``decide``); apply it in
    its fixed order. Returns the plan (None if there is no job)."""
    api = state.api
    key = (namespace, name)
    async with state.locks[key]:
        body = await apply.run(apply.get_job, api, namespace, name)
        if body is None:
            return None
        try:
            job = TrainingJob.from_body(body)
        except ValidationError as err:
            message = spec_error(name, namespace, err)
            await _fail(state, body, "InvalidSpec", message)
            raise kopf.PermanentError(message) from err
        if job.spec.preemption.custom:
            state.custom_jobs.add(key)
        else:
            state.custom_jobs.discard(key)
        # The cache, not a LIST: it is updated from the watch before any pod event kicks this reconcile,
        # and with the create responses below, so it is never behind on what this operator did itself.
        # Before priming (never, in practice: priming precedes watching) fall back to a LIST.
        # ``fresh`` (the resync) LISTs instead and repairs the cache, so a lost watch event heals itself.
        if state.cache.primed and not fresh:
            raw_pods = state.cache.pods_of(namespace, name)
        else:
            listed = await apply.run(apply.list_job_pods, api, namespace, name)
            state.cache.replace_job_pods(namespace, name, listed)
            raw_pods = state.cache.pods_of(namespace, name)
        now = state_now()
        view = View(job=job, pods=raw_pods, now=now,
                    assignment=await assignment_of(state, job) if builders.in_place(job) else None,
                    known_nodes=state.cache.nodes if state.cache.primed else None,
                    doomed=_doomed(state, job, now), last_commit_event=_commit_events.get(key))
        outcome = decide(view)
        for _ in range(2):  # the reads a decision asked for, then decide again
            if outcome.look_at_nodes:
                # A pod lost on a node with an open notice was preempted, even if the status does not say so
                # yet (a NoExecute taint evicts at once): read the lost pods' nodes, fresh, before counting.
                await _refresh_nodes(state, set(outcome.look_at_nodes))
                view = dataclasses.replace(view, doomed=_doomed(state, job, now), looked=True)
            elif outcome.needs_placement:
                view = dataclasses.replace(view, avoid=_avoid(state, job, now), placed=True)
            else:
                break
            outcome = decide(view)
        return await apply_outcome(state, body, raw_pods, outcome)


async def apply_outcome(state: State, body: dict[str, Any], raw_pods: list[dict[str, Any]],
                        outcome: Outcome) -> RestartPlan:
    """Carry ``outcome`` out in the order ``decide`` documents; a refused create stops the steps after it."""
    api, job, plan = state.api, outcome.job, outcome.plan
    ns, name, ref = job.namespace, job.name, job_ref(body)
    if outcome.record is not None:
        await apply.run(apply.patch_job_status, api, ns, name, outcome.record)
        if outcome.record_event is not None:
            ev = outcome.record_event
            await apply.run(apply.post_event, api, ref, ev.reason, ev.message, ev.type)
        if outcome.counter is not None:
            counter = metrics.FAILED_JOBS if outcome.counter.kind == "failed" else metrics.RESTARTS
            counter.labels(ns, metrics.job(name), outcome.counter.label).inc()
        log.info("TrainingJob %s/%s: %s", ns, name, outcome.log)
    if outcome.create:
        made: list[dict[str, Any]] = []
        result = await _create(state, job, ref, plan, list(outcome.create), outcome.dry_run, made)
        if result == FAILED:
            return dataclasses.replace(plan, phase="Failed", create=())
        if outcome.role:
            names = {p["metadata"]["name"] for p in raw_pods} | {p["metadata"]["name"] for p in made}
            await apply.run(apply.put_role, api, builders.worker_role(job, names))
        if result != CREATED:
            return dataclasses.replace(plan, create=(), requeue_after=float(result))
        if outcome.created_event is not None:
            await apply.run(apply.post_event, api, ref, outcome.created_event.reason, outcome.created_event.message)
    if outcome.force_delete:
        log.info("TrainingJob %s/%s: force-deleting %s: their node is gone", ns, name, ", ".join(outcome.force_delete))
        await apply.gather([lambda n=n: apply.delete_pod(api, ns, n, grace_seconds=0)  # type: ignore[misc]
                            for n in outcome.force_delete])
    if outcome.delete:
        await apply.gather([lambda n=n: apply.delete_pod(api, ns, n)  # type: ignore[misc]
                            for n in outcome.delete])
    if outcome.assign is not None:
        a = outcome.assign
        await apply.run(apply.put_configmap, api, builders.build_assignment(job, a.attempt, dict(a.processes),
                                                                             a.coordinator))
        state.assignments[(ns, name)] = a
        if outcome.assigned_event is not None:
            await apply.run(apply.post_event, api, ref, outcome.assigned_event.reason, outcome.assigned_event.message)
            log.info("TrainingJob %s/%s: %s", ns, name, outcome.assigned_event.message)
    if outcome.status:
        await apply.run(apply.patch_job_status, api, ns, name, dict(outcome.status))
        key = (ns, name)
        for ev in outcome.status_events:
            if ev.reason == "CheckpointCommitted":
                _commit_events[key] = outcome.decided_at
            await apply.run(apply.post_event, api, ref, ev.reason, ev.message, ev.type)
        if outcome.status.get("phase") in ("Succeeded", "Failed"):
            _commit_events.pop(key, None)
    if outcome.requeue_after is not None:
        requeue(state, ns, name, outcome.requeue_after)
    return plan


_commit_events: dict[tuple[str, str], float] = {}  # when each job's last CheckpointCommitted Event was posted


def _avoid(state: State, job: TrainingJob, now: datetime) -> tuple[str, ...]:
    """The nodes a new pod of ``job`` must avoid (``policy.placement``), from the cached Nodes."""
    return avoid_nodes(job, _candidates(state, job), state.signals, now, state.horizon_seconds, state.first_seen)


def _doomed(state: State, job: TrainingJob, now: datetime) -> set[str]:
    """Nodes with an open notice for ``job`` now (whether or not the scheduler could place pods there)."""
    sigs = signals_for_job(state.signals, job.spec.preemption)
    out = set()
    for node in _candidates(state, job):
        name = node["metadata"]["name"]
        notice = node_notice(node, now, sigs, state.first_seen.get(name)) if sigs else None
        if notice is not None and is_open(notice, now, state.horizon_seconds):
            out.add(name)
    return out


def _candidates(state: State, job: TrainingJob) -> list[dict[str, Any]]:
    """Cached Nodes that may carry a signal for ``job``: those with a signal of the operator's table, and
    every node when the job has custom signals of its own."""
    nodes = state.cache.nodes
    if job.spec.preemption.custom:
        return list(nodes.values())
    return [nodes[n] for n in state.notice_nodes if n in nodes]


async def _refresh_nodes(state: State, names: set[str], limit: int = 20) -> bool:
    """Read ``names`` (at most ``limit``) from the API into the cache (their signals included); True if any
    changed."""
    changed = False
    for node_name in sorted(names)[:limit]:
        try:
            body = await apply.run(apply.get_node, state.api, node_name)
        except Exception as err:  # noqa: BLE001 - best effort: the decision stands without it
            log.info("could not read node %s: %s", node_name, err)
            continue
        if body is None:
            continue
        compact = compact_node(body)
        if state.cache.nodes.get(node_name) != compact:
            state.cache.nodes[node_name] = compact
            changed = True
        present = present_signals(compact, state.signals)
        if present:
            seen = state.first_seen.setdefault(node_name, {})
            for sig in present:
                seen.setdefault(sig, state_now())
            if node_name not in state.notice_nodes:
                state.notice_nodes.add(node_name)
                changed = True
    return changed


CREATED, FAILED = "created", "failed"


async def _create(state: State, job: TrainingJob, ref: dict[str, Any], plan: RestartPlan,
                  pods: list[dict[str, Any]], dry_run: bool,
                  created: list[dict[str, Any]] | None = None) -> str | float:
    """Create ``pods``: CREATED, FAILED (a final refusal), or the seconds until the next try.

    A new gang (``dry_run``) is dry-run first (its first pod through validation and admission), so a template
    the API server refuses creates nothing; its Service and identity come next. Refusals are classified
    (``policy.create``): a final one fails the job and removes whatever this job's attempt had created; any
    other sets condition ``PodsCreated=False`` and is retried with backoff.
    """
    api, key = state.api, (job.namespace, job.name)
    tries, due = state.create_backoff.get(key, (0, 0.0))
    if tries and time.monotonic() < due:
        return due - time.monotonic()
    if not pods:
        return CREATED
    created_objects: list[dict[str, Any]] = []  # what this call created, removed again on a final refusal
    current = pods[0]["metadata"].get("name") or pods[0]["metadata"]["generateName"]
    try:
        if dry_run:
            probe = copy.deepcopy(pods[0])
            if builders.owns_identity(job):
                # Its ServiceAccount does not exist yet; any existing one checks the rest of the pod.
                probe["spec"]["serviceAccountName"] = "default"
            await apply.run(apply.dry_run_pod, api, probe)
            # In order: a RoleBinding's escalation check needs its Role to exist already.
            for obj in (builders.build_service(job), *builders.build_identity(job)):
                current = f"{obj['kind']} {obj['metadata']['name']}"
                if await apply.run(apply.create, api, obj):
                    created_objects.append(obj)
                elif obj["kind"] == "ServiceAccount" and obj["metadata"].get("annotations"):
                    await apply.run(apply.patch_metadata, api, obj)  # an edited spec.serviceAccount
        results = await asyncio.gather(*(apply.run(apply.create_pod, api, p) for p in pods),
                                       return_exceptions=True)
        errors = [(p, r) for p, r in zip(pods, results, strict=True) if isinstance(r, BaseException)]
        for r in results:
            if isinstance(r, dict):
                state.cache.upsert_pod(r)
                created_objects.append(r)
        if created is not None:
            created.extend(r for r in results if isinstance(r, dict))
        if errors:
            meta = errors[0][0]["metadata"]
            current = meta.get("name") or meta["generateName"]
            raise errors[0][1]
    except Exception as err:  # noqa: BLE001 - every refusal is classified below
        status, body = apply.refusal_of(err)
        refusal = classify_refusal(job, status, body, current)
        if dry_run and refusal.reason == "ServiceAccountNotFound" and builders.owns_identity(job):
            refusal = Refusal(TRANSIENT, "ApiError", f"{refusal.message} (the namespace's default "
                                                     f"ServiceAccount, used for the dry run, is missing)")
        return await _refused(state, job, ref, plan, refusal, created_objects)
    state.create_backoff.pop(key, None)
    if any(c.type == "PodsCreated" and c.status == "False" for c in job.status.conditions):
        msg = f"created {len(pods)} worker pod(s) of attempt {plan.attempt}"
        await apply.run(apply.patch_job_status, api, job.namespace, job.name,
                        {"conditions": _with_condition(job, "PodsCreated", "True", "Created", msg)})
    return CREATED


async def _refused(state: State, job: TrainingJob, ref: dict[str, Any], plan: RestartPlan, refusal: Refusal,
                   created: list[dict[str, Any]]) -> str | float:
    api, key = state.api, (job.namespace, job.name)
    log.info("%s (%s)", refusal.message, refusal.kind)
    if refusal.final:
        state.create_backoff.pop(key, None)
        # Nothing of a job that cannot start is left behind: what this attempt created (its pods, the
        # Service, the worker identity); pods of an attempt already running are stopped by the Failed phase.
        pods = [o["metadata"]["name"] for o in created if o.get("kind") == "Pod"]
        await apply.gather([lambda n=n: apply.delete_pod(api, job.namespace, n)  # type: ignore[misc]
                            for n in pods])
        owned = [o for o in created if o.get("kind") != "Pod"]
        if job.status.attempt == 0:  # never started: an earlier try's Service and identity go too
            owned = [builders.build_service(job), *builders.build_identity(job)]
        for obj in reversed(owned):
            await apply.run(apply.delete, api, obj)
        await _fail(state, {"metadata": {"name": job.name, "namespace": job.namespace, "uid": job.uid},
                            "status": job.status.model_dump(by_alias=True)}, refusal.reason, refusal.message)
        return FAILED
    tries = state.create_backoff.get(key, (0, 0.0))[0] + 1
    wait = retry_seconds(tries)
    state.create_backoff[key] = (tries, time.monotonic() + wait)
    msg = f"{refusal.message}; try {tries}, next in {wait:.0f} s"
    patch: dict[str, Any] = {"conditions": _with_condition(job, "PodsCreated", "False", refusal.reason, msg)}
    if job.status.phase is None:
        patch["phase"] = "Pending"
    await apply.run(apply.patch_job_status, api, job.namespace, job.name, patch)
    await apply.run(apply.post_event, api, ref, "FailedCreate", msg, "Warning")
    metrics.RECONCILE_ERRORS.labels("create").inc()
    requeue(state, job.namespace, job.name, wait)
    return wait


def _with_condition(job: TrainingJob, type_: str, status: str, reason: str, message: str) -> list[dict[str, Any]]:
    plan = RestartPlan(phase=job.status.phase or "Pending", attempt=job.status.attempt,
                       conditions=(Condition(type_, status, reason, message[:2000]),))
    return conditions_patch(job, plan, state_now()) or [
        c.model_dump(by_alias=True, exclude_none=True) for c in job.status.conditions]


async def _fail(state: State, body: dict[str, Any], reason: str, message: str) -> None:
    """Fail a job that cannot run: phase Failed, condition Failed/<reason>, a Warning Event."""
    status = body.get("status") or {}
    if status.get("phase") == "Failed":
        return
    cond = {"type": "Failed", "status": "True", "reason": reason, "message": message[:2000],
            "lastTransitionTime": rfc3339(state_now())}
    conds = [c for c in status.get("conditions") or [] if c.get("type") not in ("Failed", "PodsCreated")]
    meta = body["metadata"]
    # The Event first: whoever sees the Failed phase finds the Event that says why.
    await apply.run(apply.post_event, state.api, job_ref(body), reason, message, "Warning")
    now = state_now()
    patch: dict[str, Any] = {"phase": "Failed", "conditions": [*conds, cond], "completionTime": rfc3339(now)}
    closed = closing_goodput(status, now)
    if closed is not None:  # the attempts that ran end here: the figures are final, not provisional
        patch["goodput"] = closed
    await apply.run(apply.patch_job_status, state.api, meta["namespace"], meta["name"], patch)
    metrics.FAILED_JOBS.labels(meta["namespace"], metrics.job(meta["name"]), reason).inc()


def requeue(state: State, namespace: str, name: str, delay: float) -> None:
    """Reconcile the job again after ``delay`` seconds (one pending timer per job: the latest wins)."""
    key = (namespace, name)
    old = state.requeues.pop(key, None)
    if old is not None:
        old.cancel()
    loop = asyncio.get_running_loop()

    def fire() -> None:
        state.requeues.pop(key, None)
        kick(state, namespace, name)

    state.requeues[key] = loop.call_later(max(0.0, delay), fire)


def kick(state: State, namespace: str, name: str, fresh: bool = False) -> None:
    """Schedule a reconcile of one job; bursts coalesce into one run plus one follow-up."""
    key = (namespace, name)
    if key in state.pending:
        state.pending[key] = True
        if fresh:
            state.fresh.add(key)
        return
    state.pending[key] = False
    if fresh:
        state.fresh.add(key)

    async def runner() -> None:
        try:
            while True:
                try:
                    async with state.reconcile_slots:  # bounds memory and API load in event storms
                        want_fresh = key in state.fresh
                        state.fresh.discard(key)
                        await reconcile(state, namespace, name, fresh=want_fresh)
                except kopf.PermanentError:
                    pass
                except Exception:  # logged and counted; the resync retries
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


def release_memory() -> None:
    """Hand freed heap back to the OS (glibc keeps it after bursts such as the initial listing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _log_top_allocations() -> None:
    """With REPRIEVE_TRACEMALLOC=1 (set before start), log where memory is held: a diagnosis aid."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return
    snap = tracemalloc.take_snapshot()
    for stat in snap.statistics("traceback")[:12]:
        log.info("memory: %.1f MB in %d blocks at %s", stat.size / 1e6, stat.count,
                 " <- ".join(str(f) for f in stat.traceback[-6:]))


async def resync_loop(state: State, interval: float) -> None:
    """Safety net for missed events (the normal path is event-driven): kick every unfinished job.

    A loop over the cached jobs rather than a per-object kopf timer, because kopf protects timers with a
    finalizer, and a finalizer would keep deleted jobs (and their pods) alive while the operator is down.
    """
    while True:
        await asyncio.sleep(interval / 2)
        release_memory()
        _log_top_allocations()
        try:
            keys = state.cache.unfinished_jobs()
            log.debug("resync: %d unfinished job(s); cache %s", len(keys), state.cache.stats())
            # Spread over half the interval: a steady trickle, never a burst that delays notice delivery.
            gap = interval / 2 / max(1, len(keys))
            for namespace, name in keys:
                kick(state, namespace, name, fresh=True)
                await asyncio.sleep(gap)
        except Exception:  # never let the safety net die
            metrics.RECONCILE_ERRORS.labels("resync").inc()
            log.exception("resync failed")
