"""Reconcile one TrainingJob: read it and its pods, decide (``policy.restart``), apply, patch status once.

Reconciles of one job are serialised by a per-job lock; ``kick`` coalesces bursts of pod events into one
run plus one follow-up. ``resync_loop`` is the safety net for missed events.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import logging
from typing import Any

import kopf
from pydantic import ValidationError

from . import apply, builders, metrics, observe
from .models import TrainingJob, spec_error
from .policy.restart import RestartPlan, decide_restart, orphaned_pods
from .signals import rfc3339
from .state import State, job_ref
from .state import now as state_now

log = logging.getLogger("reprieve_operator")


async def reconcile(state: State, namespace: str, name: str, fresh: bool = False) -> RestartPlan | None:
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
        known = state.cache.nodes if state.cache.primed else None
        pods = [p for p in (observe.worker_pod(r, known) for r in raw_pods) if p is not None]
        plan = decide_restart(job, pods, state.notice_nodes)
        now = state_now()
        ref = job_ref(body)
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
            created = await apply.gather([lambda o=o: apply.create_pod(api, o) for o in pods_])  # type: ignore[misc]
            for pod in created:
                if pod is not None:
                    state.cache.upsert_pod(pod)
            if plan.new_attempt:
                await apply.run(apply.post_event, api, ref, "AttemptStarted",
                                f"attempt {plan.attempt}: created {len(plan.create)} worker pod(s)"
                                + (f" avoiding {', '.join(plan.exclude_nodes)}" if plan.exclude_nodes else ""))
        orphans = orphaned_pods(pods, known)
        if orphans:
            log.info("TrainingJob %s/%s: force-deleting %s: their node is gone", namespace, name, ", ".join(orphans))
            await apply.gather([lambda n=n: apply.delete_pod(api, namespace, n, grace_seconds=0)  # type: ignore[misc]
                                for n in orphans])
        if plan.delete:
            await apply.gather([lambda n=n: apply.delete_pod(api, namespace, n)  # type: ignore[misc]
                                for n in plan.delete if n not in orphans])
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
            "lastTransitionTime": rfc3339(state_now())}
    meta = body["metadata"]
    await apply.run(apply.patch_job_status, state.api, meta["namespace"], meta["name"],
                    {"phase": "Failed", "conditions": [cond], "completionTime": rfc3339(state_now())})
    await apply.run(apply.post_event, state.api, job_ref(body), "InvalidSpec", message, "Warning")
    metrics.FAILED_JOBS.labels("InvalidSpec").inc()


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
