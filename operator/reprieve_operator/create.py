"""Create what an outcome asks for: a new gang's dry run, Service and identity, then the pods.

A refusal is classified (``policy.create``) and comes back as the API's answer (``NotCreated``: the refusal, the
backoff, what this try made), which stops the steps after the create; its own outcome (``NotCreated.instead``)
fails the job and deletes what the attempt left behind, or retries after a backoff. This module writes no status
and deletes nothing.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import secrets
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from . import apply
from .models import TrainingJob
from .policy import builders, memorypeers
from .policy.create import TRANSIENT, NotCreated, Refusal, classify_refusal, owned, watched_since
from .state import State

log = logging.getLogger("reprieve_operator")


async def create(state: State, job: TrainingJob, pods: list[dict[str, Any]], dry_run: bool,
                 created: list[dict[str, Any]]) -> NotCreated | None:
    """Create ``pods`` (appending what the API returned to ``created``): None when they exist now, else what
    stopped them (a backoff still running, a refusal).

    A new gang (``dry_run``) is dry-run first (its first pod through validation and admission), so a template
    the API server refuses creates nothing; its Service and identity come next.
    """
    api, key = state.api, (job.namespace, job.name)
    wait = state.queue.backoff_left(key)
    if wait is not None:  # the refusal before this one set the requeue
        return NotCreated(wait)
    if not pods:
        return None
    made: list[dict[str, Any]] = []  # what this call created (a final refusal's outcome deletes it)
    current = pods[0]["metadata"].get("name") or pods[0]["metadata"]["generateName"]
    try:
        if dry_run:
            probe = copy.deepcopy(pods[0])
            if builders.owns_identity(job):
                # Its ServiceAccount does not exist yet; any existing one checks the rest of the pod.
                probe["spec"]["serviceAccountName"] = "default"
            await apply.run(apply.dry_run_pod, api, probe)
            # In order: a RoleBinding's escalation check needs its Role to exist already.
            for obj in owned(job, secrets.token_urlsafe(32)):
                current = f"{obj['kind']} {obj['metadata']['name']}"
                if await apply.run(apply.create, api, obj):
                    made.append(obj)
                elif obj["kind"] == "ServiceAccount" and obj["metadata"].get("annotations"):
                    await apply.run(apply.patch_metadata, api, obj)  # an edited spec.serviceAccount
        elif memorypeers.enabled(job):  # a tier turned on after the first attempt: its pods need the Secret too
            obj = builders.build_memory_secret(job, secrets.token_urlsafe(32))
            current = f"{obj['kind']} {obj['metadata']['name']}"
            await apply.run(apply.create, api, obj)
        results = await asyncio.gather(*(apply.run(apply.create_pod, api, p) for p in pods),
                                       return_exceptions=True)
        errors = [(p, r) for p, r in zip(pods, results, strict=True) if isinstance(r, BaseException)]
        cached = {str((c.get("metadata") or {}).get("name")): c for c in state.cache.pods_of(job.namespace, job.name)}
        for r in results:
            if isinstance(r, dict):
                if not watched_since(r, cached.get(str((r.get("metadata") or {}).get("name")))):
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
        log.info("%s (%s)", refusal.message, refusal.kind)
        if refusal.final:  # nothing of a job that cannot start is left behind: its outcome deletes ``made``
            state.queue.backoff_clear(key)
            return NotCreated(0.0, refusal, 0, tuple(made))
        tries, wait = state.queue.backoff_failed(key)
        return NotCreated(wait, refusal, tries)
    state.queue.backoff_clear(key)
    return None
