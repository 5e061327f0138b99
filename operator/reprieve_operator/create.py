"""Create what an outcome asks for: a new gang's dry run, Service and identity, then the pods.

A refusal is classified (``policy.create``) and what it leads to comes back as an ``Outcome`` (``refused``) for
``reconcile.apply_outcome`` to carry out instead of the steps after the create; this module writes no status.
What a final refusal leaves behind of this attempt (its pods, the Service, the worker identity) is removed
here, before that outcome fails the job.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import secrets
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from . import apply
from .clock import SYSTEM
from .models import TrainingJob
from .policy import builders, memorypeers
from .policy.create import TRANSIENT, Refusal, classify_refusal, refused
from .policy.decide import Outcome
from .policy.restart import RestartPlan
from .state import State

log = logging.getLogger("reprieve_operator")


async def create(state: State, job: TrainingJob, plan: RestartPlan, pods: list[dict[str, Any]], dry_run: bool,
                 created: list[dict[str, Any]]) -> Outcome | None:
    """Create ``pods`` (appending what the API returned to ``created``): None when they exist now, else the
    outcome to carry out instead (a backoff still running, a refusal).

    A new gang (``dry_run``) is dry-run first (its first pod through validation and admission), so a template
    the API server refuses creates nothing; its Service and identity come next.
    """
    api, key = state.api, (job.namespace, job.name)
    wait = state.queue.backoff_left(key)
    if wait is not None:  # the refusal before this one set the requeue
        return Outcome(job, dataclasses.replace(plan, create=(), requeue_after=wait))
    if not pods:
        return None
    made: list[dict[str, Any]] = []  # what this call created, removed again on a final refusal
    current = pods[0]["metadata"].get("name") or pods[0]["metadata"]["generateName"]
    try:
        if dry_run:
            probe = copy.deepcopy(pods[0])
            if builders.owns_identity(job):
                # Its ServiceAccount does not exist yet; any existing one checks the rest of the pod.
                probe["spec"]["serviceAccountName"] = "default"
            await apply.run(apply.dry_run_pod, api, probe)
            # In order: a RoleBinding's escalation check needs its Role to exist already.
            for obj in (builders.build_service(job), *builders.build_identity(job), *_memory_secret(job)):
                current = f"{obj['kind']} {obj['metadata']['name']}"
                if await apply.run(apply.create, api, obj):
                    made.append(obj)
                elif obj["kind"] == "ServiceAccount" and obj["metadata"].get("annotations"):
                    await apply.run(apply.patch_metadata, api, obj)  # an edited spec.serviceAccount
        elif memorypeers.enabled(job):  # a tier turned on after the first attempt: its pods need the Secret too
            for obj in _memory_secret(job):
                current = f"{obj['kind']} {obj['metadata']['name']}"
                await apply.run(apply.create, api, obj)
        results = await asyncio.gather(*(apply.run(apply.create_pod, api, p) for p in pods),
                                       return_exceptions=True)
        errors = [(p, r) for p, r in zip(pods, results, strict=True) if isinstance(r, BaseException)]
        for r in results:
            if isinstance(r, dict):
                state.cache.upsert_pod(r)
                made.append(r)
                created.append(r)
        if errors:
            meta = errors[0][0]["metadata"]
            current = meta.get("name") or meta["generateName"]
            raise errors[0][1]
    except Exception as err:
        status, body = apply.refusal_of(err)
        refusal = classify_refusal(job, status, body, current)
        if not isinstance(err, ApiException | ValidationError) and not apply.is_no_answer(err):
            log.error("TrainingJob %s/%s: creating %s failed inside the operator", job.namespace, job.name, current,
                      exc_info=err)  # a bug, not a flaky API server: retried, and said so in the condition
            refusal = Refusal(TRANSIENT, "InternalError", f"TrainingJob {job.namespace}/{job.name}: creating "
                              f"{current}: an error inside the operator ({body}; its log has the traceback)")
        if dry_run and refusal.reason == "ServiceAccountNotFound" and builders.owns_identity(job):
            refusal = Refusal(TRANSIENT, "ApiError", f"{refusal.message} (the namespace's default "
                                                     f"ServiceAccount, used for the dry run, is missing)")
        return await _refused(state, job, plan, refusal, made)
    state.queue.backoff_clear(key)
    return None


def _memory_secret(job: TrainingJob) -> list[dict[str, Any]]:
    """The job's memory-tier token Secret, with a fresh token (an existing Secret is left as it is: 409)."""
    return [builders.build_memory_secret(job, secrets.token_urlsafe(32))] if memorypeers.enabled(job) else []


async def _refused(state: State, job: TrainingJob, plan: RestartPlan, refusal: Refusal,
                   made: list[dict[str, Any]]) -> Outcome:
    api, key = state.api, (job.namespace, job.name)
    log.info("%s (%s)", refusal.message, refusal.kind)
    if not refusal.final:
        tries, wait = state.queue.backoff_failed(key)
        return refused(job, plan, refusal, tries, wait, SYSTEM.now())
    state.queue.backoff_clear(key)
    # Nothing of a job that cannot start is left behind: what this attempt created (its pods, the Service, the
    # worker identity); pods of an attempt already running are stopped by the Failed phase.
    pods = [o["metadata"]["name"] for o in made if o.get("kind") == "Pod"]
    await apply.gather([lambda n=n: apply.delete_pod(api, job.namespace, n)  # type: ignore[misc]
                        for n in pods])
    owned = [o for o in made if o.get("kind") != "Pod"]
    if job.status.attempt == 0:  # never started: an earlier try's Service and identity go too
        owned = [builders.build_service(job), *builders.build_identity(job), *_memory_secret(job)]
    for obj in reversed(owned):
        await apply.run(apply.delete, api, obj)
    return refused(job, plan, refusal, 0, 0.0, SYSTEM.now())
