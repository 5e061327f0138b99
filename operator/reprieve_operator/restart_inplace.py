"""Reconcile an in-place job (``restartMode: InPlace``): read its assignment, decide (``policy.inplace``), apply.

The order is fixed: record a decided restart in status (before anything is deleted, so a crash cannot count it
twice) -> create pods (the first attempt's, replacements, spares) and update the worker Role with their names
-> delete doomed, lost and used-up pods -> write the next assignment (the supervisors start the next attempt
the moment they see it) -> the final status patch and the Events that say who restarted in place and who was
replaced, and why.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import datetime
from typing import Any

from . import apply, builders, observe
from .models import TrainingJob
from .policy.inplace import Assignment, InPlace, PodView, decide_inplace
from .policy.restart import DISRUPTION, RestartPlan
from .state import State, job_ref

log = logging.getLogger("reprieve_operator")


async def assignment_of(state: State, job: TrainingJob) -> Assignment | None:
    """The job's current assignment: the operator's own copy (it is the only writer), else the ConfigMap."""
    key = (job.namespace, job.name)
    if key in state.assignments:
        return state.assignments[key]
    raw = await apply.run(apply.get_configmap, state.api, job.namespace, builders.assignment_name(job))
    found = parse_assignment(raw)
    if found is not None:
        state.assignments[key] = found
    return found


def parse_assignment(raw: dict[str, Any] | None) -> Assignment | None:
    if not raw:
        return None
    data = raw.get("data") or {}
    try:
        return Assignment(int(data["attempt"]), {str(k): int(v) for k, v in json.loads(data["processes"]).items()},
                          str(data.get("coordinator") or ""))
    except (KeyError, ValueError, TypeError, AttributeError):
        log.warning("ConfigMap %s/%s is not an assignment (ignored)", (raw.get("metadata") or {}).get("namespace"),
                    (raw.get("metadata") or {}).get("name"))
        return None


def views(raw_pods: list[dict[str, Any]], known: Any) -> list[PodView]:
    return [v for v in (observe.pod_view(r, known) for r in raw_pods) if v is not None]


async def reconcile_inplace(state: State, job: TrainingJob, body: dict[str, Any], raw_pods: list[dict[str, Any]],
                            known: Any, now: datetime) -> RestartPlan:
    from .reconcile import CREATED, FAILED, _avoid, _create, _doomed, _refresh_nodes, record_decision, requeue

    api, ns, name = state.api, job.namespace, job.name
    pods = views(raw_pods, known)
    assignment = await assignment_of(state, job)
    plan, extra = decide_inplace(job, pods, assignment, (), now, _doomed(state, job, now))
    cause = extra.record.cause if extra.record else plan.cause
    if cause == DISRUPTION:  # a lost pod on a node with an open notice was preempted: look at the nodes first
        await _refresh_nodes(state, {p.node for p in pods if p.node and (p.deleting or p.node_lost)})
        plan, extra = decide_inplace(job, pods, assignment, (), now, _doomed(state, job, now))
    if plan.create or extra.create_workers or extra.create_spares:
        plan, extra = decide_inplace(job, pods, assignment, _avoid(state, job, now), now, _doomed(state, job, now))
    ref = job_ref(body)

    decided = extra.record or (plan if plan.cause else None)
    if decided is not None:
        job = await record_decision(state, job, ref, decided, now)
        plan = dataclasses.replace(plan, cause=None)

    if plan.phase == "Failed" and decided is not None and decided.phase == "Failed":
        await _delete(state, job, plan.delete)
        return plan

    new_pods = _pods_to_create(job, plan, extra)
    if new_pods:
        made: list[dict[str, Any]] = []
        first = assignment is None  # only the first attempt's pods are dry-run and announced by _create
        outcome = await _create(state, job, ref, plan if first else dataclasses.replace(plan, new_attempt=False),
                                pods=new_pods, created=made)
        if outcome == FAILED:
            return dataclasses.replace(plan, phase="Failed")
        names = {p["metadata"]["name"] for p in raw_pods} | {p["metadata"]["name"] for p in made}
        await apply.run(apply.put_role, api, builders.worker_role(job, names))
        if outcome != CREATED:
            requeue(state, ns, name, float(outcome))
            return dataclasses.replace(plan, create=(), requeue_after=float(outcome))
    await _delete(state, job, plan.delete)
    if extra.assign is not None and (assignment is None or extra.assign.attempt > assignment.attempt):
        await _assign(state, job, extra.assign)
        if assignment is not None:  # a restart, not the first attempt
            await apply.run(apply.post_event, api, ref, "AttemptStarted", plan.message)
            log.info("TrainingJob %s/%s: %s", ns, name, plan.message)
    patch = observe.status_patch(job, plan, now, observe.progress(raw_pods))
    patch.update(_inplace_status(job, pods, extra, plan, assignment))
    if patch:
        await apply.run(apply.patch_job_status, api, ns, name, patch)
    if plan.requeue_after is not None:
        requeue(state, ns, name, plan.requeue_after)
    return plan


def _pods_to_create(job: TrainingJob, plan: RestartPlan, extra: InPlace) -> list[dict[str, Any]]:
    pods = [builders.build_worker_pod(job, i, plan.attempt, plan.exclude_nodes) for i in plan.create]
    nxt = plan.attempt + (0 if plan.new_attempt else 1)
    pods += [builders.build_worker_pod(job, i, nxt, plan.exclude_nodes, name=f"{job.name}-{i}-")
             for i in extra.create_workers]
    pods += [builders.build_worker_pod(job, -1, plan.attempt, plan.exclude_nodes, name=f"{job.name}-spare-",
                                       role="spare") for _ in range(extra.create_spares)]
    return pods


async def _delete(state: State, job: TrainingJob, names: tuple[str, ...]) -> None:
    if names:
        await apply.gather([lambda n=n: apply.delete_pod(state.api, job.namespace, n)  # type: ignore[misc]
                            for n in names])


async def _assign(state: State, job: TrainingJob, assignment: Assignment) -> None:
    obj = builders.build_assignment(job, assignment.attempt, dict(assignment.processes), assignment.coordinator)
    await apply.run(apply.put_configmap, state.api, obj)
    state.assignments[(job.namespace, job.name)] = assignment


def _inplace_status(job: TrainingJob, pods: list[PodView], extra: InPlace, plan: RestartPlan,
                    assignment: Assignment | None = None) -> dict[str, Any]:
    """``status.spares`` (ready/desired: a spare that took an index, in the current or the new assignment, is a
    worker now) and, when an attempt starts in place, ``status.lastRestart``."""
    out: dict[str, Any] = {}
    workers = {*(assignment.processes if assignment else ()), *(extra.assign.processes if extra.assign else ())}
    ready = sum(1 for p in pods if p.role == "spare" and p.ready and p.name not in workers)
    spares = f"{ready}/{job.spec.spares}"
    if job.spec.spares and job.status.spares != spares:
        out["spares"] = spares
    if extra.assign is not None and extra.assign.attempt > 1 and plan.new_attempt and extra.assign.attempt == \
            plan.attempt:
        out["lastRestart"] = {"attempt": extra.assign.attempt, "inPlace": len(extra.kept),
                              "replaced": [{"index": r.index, "old": r.old, "new": r.new, "reason": r.reason}
                                           for r in extra.replaced]}
    return out
