"""One reconcile pass of one TrainingJob: read it, its pods, its assignment, its queue (``kueue.read``) and the
nodes; decide its whole outcome (``policy.decide``, pure); carry that outcome out in its fixed order
(:func:`apply_outcome`); an API answer that refuses a step (a create, a Workload) stops the steps after it, and the
answer's own outcome (decided in ``policy``) is carried out instead, in the same order.

When a pass runs is the queue's (``workqueue``: locks, coalescing, requeues, the resync); how pods are created,
``create``'s. Status is written here only, by carrying out an outcome: its ``record`` and its final ``status``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Iterable
from typing import Any

import kopf
from pydantic import ValidationError

from . import ANNOTATION_NOTICE, apply, delivery, kueue, metrics
from .clock import SYSTEM
from .create import create
from .models import TrainingJob, spec_error
from .policy import builders
from .policy.decide import Answer, Outcome, View, WorkloadRefused, decide, failed
from .policy.kueue import WorkloadOp, evicted
from .policy.notice import notice_event_name
from .policy.pairing import MEMORY_PORT
from .policy.restart import RestartPlan
from .state import State

log = logging.getLogger("reprieve_operator")
NODE_READS = 20  # at most this many nodes are read fresh in one pass (the lost pods' first)
PROBE_TIMEOUT_SECONDS = 2.0  # a silent peer's pod that does not answer a connect within this is cut off


async def reconcile(state: State, namespace: str, name: str, fresh: bool = False) -> RestartPlan | None:
    """Read the job, its pods, its assignment, its queue and the nodes; decide the whole outcome (``decide``, with
    the further reads it asks for); apply it in its fixed order (:func:`apply_outcome`), and an API answer's own
    outcome in place of the steps it stopped. Returns the plan carried out (None if there is no job). Run by
    ``state.queue`` (under the job's lock)."""
    api, key = state.api, (namespace, name)
    body = await apply.run(apply.get_job, api, namespace, name)
    if body is None:
        return None
    try:
        job = TrainingJob.from_body(body)
    except ValidationError as err:
        message = spec_error(name, namespace, err)
        await apply_outcome(state, body, [], failed(body.get("status") or {}, "InvalidSpec", message, SYSTEM.now()))
        raise kopf.PermanentError(message) from err
    state.nodes.track_job(key, bool(job.spec.preemption.custom))
    # The cache, not a LIST: it is updated from the watch before any pod event kicks this reconcile,
    # and with the create responses below, so it is never behind on what this operator did itself.
    # Before priming (never, in practice: priming precedes watching) fall back to a LIST.
    # ``fresh`` (the resync) LISTs instead and repairs the cache, so a lost watch event heals itself.
    # A LIST is at least as new as the cache was when it was asked for, but a watch event (or this operator's own
    # write) that changes the job's pods while it is in flight makes it older than the cache: then it is dropped
    # (the watch is live for this job), or it would undo that event until the next fresh LIST.
    if not state.cache.primed or fresh:
        mark = state.cache.pods_changed(namespace, name)
        try:
            listed: list[dict[str, Any]] | None = await apply.run(apply.list_job_pods, api, namespace, name,
                                                                  state.cache.pods_seen)
        except Exception as err:  # the safety net's LIST only: the cache the watch keeps stands
            if not state.cache.primed:
                raise
            log.info("TrainingJob %s/%s: the resync's LIST of its pods failed (%s); the watched cache stands",
                     namespace, name, apply.refusal_of(err)[0] or err)
            listed = None
        if listed is not None and (not state.cache.primed or state.cache.pods_changed(namespace, name) == mark):
            state.cache.replace_job_pods(namespace, name, listed)
    raw_pods = state.cache.pods_of(namespace, name)
    now, queued = SYSTEM.now(), await apply.run(kueue.read, api, body, job) if state.kueue else None
    # a Kueue eviction's notice goes through the job's notice object, as a node's (``delivery``): what it carries
    held = await delivery.object_notice(state, job) if queued is not None and evicted(queued) else None
    view = View(job=job, pods=raw_pods, now=now, kueue=queued,
                assignment=await state.assignments.current(api, job) if builders.in_place(job) else None,
                known_nodes=state.cache.nodes if state.cache.primed else None, nodes=state.cache.nodes,
                doomed=state.nodes.doomed(job, now), last_commit_event=state.commits.last(key),
                peer_lost_wait_s=state.peer_lost_wait_s, gone=state.cache.gone_of(namespace, name),
                said=state.cache.said_of(namespace, name),
                notice_object=held,
                delivered=state.nodes.unrecorded(job.uid))
    outcome = decide(view)
    for _ in range(3):  # the reads a decision asked for, then decide again
        if outcome.probe:
            # Silent peers a wait is for: a pod whose address does not answer is cut off, not slow to report.
            view = dataclasses.replace(view, probed=True, unreachable=await unreachable(outcome.probe))
        elif outcome.look_at_nodes:
            # A pod lost on a node with an open notice was preempted, even if the status does not say so
            # yet (a NoExecute taint evicts at once): read the lost (or gone) pods' nodes, fresh, before counting.
            await read_nodes(state, [*sorted(outcome.look_at_nodes), *sorted(outcome.look_also)])
            # view.nodes is the cache itself: decide sees the nodes just read (and forgets one the API no longer has)
            view = dataclasses.replace(view, doomed=state.nodes.doomed(job, now), looked=True)
        elif outcome.needs_placement:
            view = dataclasses.replace(view, avoid=state.nodes.avoid(job, now), placed=True)
        else:
            break
        outcome = decide(view)
    answer = await apply_outcome(state, body, raw_pods, outcome)
    if answer is None and outcome.final:  # its status went through: the node notices it saw are recorded
        state.nodes.recorded(job.uid, view.delivered)
    while answer is not None:
        outcome = answer.instead(outcome, SYSTEM.now())  # the API's answer decides what replaces the steps it stopped
        answer = await apply_outcome(state, body, raw_pods, outcome)
    return outcome.plan


async def unreachable(pods: Iterable[tuple[str, str]], port: int = MEMORY_PORT,
                      timeout: float = PROBE_TIMEOUT_SECONDS) -> frozenset[str]:
    """The pods (name, IP) whose address does not answer a TCP connect to ``port`` within ``timeout``. A refused
    connection is an answer (the pod's network is there; nothing need listen: ``MEMORY_PORT``, reprieve-supervisor's
    replica server, serves only with the memory tier)."""
    async def answers(ip: str) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
        except ConnectionRefusedError:
            return True
        except (TimeoutError, OSError):
            return False
        writer.close()
        return True

    pods = sorted(pods)
    results = await asyncio.gather(*(answers(ip) for _, ip in pods))
    silent = frozenset(name for (name, _), ok in zip(pods, results, strict=True) if not ok)
    for name, ip in pods:
        log.info("probed silent peer %s at %s:%d: %s", name, ip, port, "no answer" if name in silent else "answers")
    return silent


async def read_nodes(state: State, names: Iterable[str], limit: int = NODE_READS) -> bool:
    """Read the first ``limit`` of ``names`` from the API into the cache and the node signals; a node the API no
    longer has is forgotten (its deletion's watch event may still be on its way). True if any changed."""
    changed = False
    for node_name in list(dict.fromkeys(names))[:limit]:
        try:
            body = await apply.run(apply.get_node, state.api, node_name)
        except Exception as err:  # noqa: BLE001 - best effort: the decision stands without it
            log.info("could not read node %s: %s", node_name, err)
            continue
        if body is None:
            if node_name in state.cache.nodes:
                log.info("node %s is gone (read before its deletion was watched)", node_name)
                state.nodes.forget(node_name)
                changed = True
        elif state.nodes.refresh(body):
            changed = True
    return changed


async def apply_outcome(state: State, body: dict[str, Any], raw_pods: list[dict[str, Any]],
                        outcome: Outcome) -> Answer | None:
    """Carry ``outcome`` out in the order ``policy.decide`` documents, one step after another; None when every step
    was carried out, else the API's answer to the step it refused (a create, a Workload), which stops the rest."""
    api, job = state.api, outcome.job
    meta = body["metadata"]
    ns, name, ref = meta["namespace"], meta["name"], builders.job_ref(body)
    key = (ns, name)
    if outcome.first_event is not None:
        ev = outcome.first_event
        await apply.run(apply.post_event, api, ref, ev.reason, ev.message, ev.type)
    for d in outcome.notices:  # named after (job uid, attempt, notice id): posted again, the apiserver refuses it
        await apply.run(apply.post_event, api, ref, "PreemptionNotice", d.message, "Warning",
                        notice_event_name(ref, d.attempt, d.notice.id))
    if outcome.record is not None:
        await apply.run(apply.patch_job_status, api, ns, name, dict(outcome.record))
        if outcome.record_event is not None:
            ev = outcome.record_event
            await apply.run(apply.post_event, api, ref, ev.reason, ev.message, ev.type)
    if outcome.counter is not None:
        _count(ns, name, outcome.counter.kind, outcome.counter.label)
    if outcome.log:
        log.info("TrainingJob %s/%s: %s", ns, name, outcome.log)
    if outcome.assign_first:
        await _assign(state, ref, outcome)
    annotate: dict[str, dict[str, str | None]] = {n: dict(a) for n, a in outcome.annotate.items()}
    if outcome.notice_write is not None:  # a Kueue eviction's notice: the job's object first, as a node's
        w = outcome.notice_write
        route, fell_back = await delivery.send_notice_object(state, w.job, w.plan, w.route, w.value)
        for n in route.annotate:
            annotate.setdefault(n, {})[ANNOTATION_NOTICE] = w.value
        if fell_back is not None:
            await apply.run(apply.post_event, api, ref, "NoticeFallback", fell_back, "Warning")
    if annotate:
        await apply.gather([functools.partial(apply.annotate_pod, api, ns, n, a) for n, a in annotate.items()])
    if outcome.create:
        assert job is not None, "pods to create without a job"
        made: list[dict[str, Any]] = []
        not_created = await create(state, job, list(outcome.create), outcome.dry_run, made)
        if not_created is not None:
            return not_created
        if outcome.role:
            names = {p["metadata"]["name"] for p in raw_pods} | {p["metadata"]["name"] for p in made}
            await apply.run(apply.put_role, api, builders.worker_role(job, names))
        if outcome.created_event is not None:
            await apply.run(apply.post_event, api, ref, outcome.created_event.reason, outcome.created_event.message)
    if outcome.force_delete:
        log.info("TrainingJob %s/%s: force-deleting %s: their node is gone", ns, name, ", ".join(outcome.force_delete))
        await apply.gather([lambda n=n: apply.delete_pod(api, ns, n, grace_seconds=0)  # type: ignore[misc]
                            for n in outcome.force_delete])
    if outcome.delete:
        await apply.gather([lambda n=n: apply.delete_pod(api, ns, n)  # type: ignore[misc]
                            for n in outcome.delete])
    for obj in outcome.remove:
        await apply.run(apply.delete, api, dict(obj))
    if outcome.assign is not None and not outcome.assign_first:
        await _assign(state, ref, outcome)
    for op in outcome.workload:
        try:
            await _write_workload(state, ref, op)
        except kueue.Refused as err:
            return WorkloadRefused(op.name, str(err))
    if outcome.status:
        await apply.run(apply.patch_job_status, api, ns, name, dict(outcome.status))
    for d in outcome.notices:
        metrics.NOTICES.labels(ns, metrics.job(name), d.notice.reason).inc()
        metrics.NOTICE_LEAD.labels(ns, metrics.job(name), d.notice.reason).observe(
            max(0.0, (d.notice.deadline - d.notice.observed_at).total_seconds()))
    for ev in outcome.status_events:  # a Queued condition's change may be written by the record alone
        if ev.reason == "CheckpointCommitted":
            state.commits.posted(key, outcome.decided_at)
        await apply.run(apply.post_event, api, ref, ev.reason, ev.message, ev.type, ev.name)
    if outcome.status.get("phase") in ("Succeeded", "Failed"):
        state.commits.forget(key)
    if outcome.finish is not None:
        await _write_workload(state, ref, outcome.finish)
    if outcome.requeue_after is not None:
        state.queue.requeue(ns, name, outcome.requeue_after)
    return None


async def _assign(state: State, ref: dict[str, Any], outcome: Outcome) -> None:
    """Write the outcome's assignment, then its Event (step 4 of ``policy.decide``'s order, or right after the
    record when ``assign_first``)."""
    job, a = outcome.job, outcome.assign
    assert job is not None and a is not None, "an assignment without a job"
    await apply.run(apply.put_configmap, state.api, builders.build_assignment(
        job, a.attempt, dict(a.processes), a.coordinator, dict(a.memory_peers), dict(a.memory_peer_nodes),
        a.resize, a.loss_every))
    state.assignments.wrote(job, a)
    if outcome.assigned_event is not None:
        ev = outcome.assigned_event
        await apply.run(apply.post_event, state.api, ref, ev.reason, ev.message)
        log.info("TrainingJob %s/%s: %s", ref["namespace"], ref["name"], ev.message)


async def _write_workload(state: State, ref: dict[str, Any], op: WorkloadOp) -> None:
    """One Workload write (``kueue.write``), then what it says and its Event; a Workload that changed meanwhile
    is looked at again."""
    ns, name = ref["namespace"], ref["name"]
    if not await apply.run(kueue.write, state.api, ns, op):
        state.queue.requeue(ns, name, op.conflict_requeue or 0.5)
        return
    if op.log:
        log.info("TrainingJob %s/%s: %s", ns, name, op.log)
    if op.event is not None:
        await apply.run(apply.post_event, state.api, ref, op.event.reason, op.event.message, op.event.type)
    if op.requeue_after is not None:
        state.queue.requeue(ns, name, op.requeue_after)


def _count(namespace: str, name: str, kind: str, label: str) -> None:
    if kind == "error":
        metrics.RECONCILE_ERRORS.labels(label).inc()
        return
    counter = metrics.FAILED_JOBS if kind == "failed" else metrics.RESTARTS
    counter.labels(namespace, metrics.job(name), label).inc()
