"""One reconcile's complete outcome, decided in one pure function: ``decide(view) -> Outcome``.

``reconcile`` reads (the job, its cached pods, its assignment, its queue's Workload, the nodes), calls
:func:`decide`, and applies the :class:`Outcome` in a fixed order, for both restart modes and both callers (the kopf
handler and the pod-event kick):

0. ``first_event``: only a failure decided outside the restart policy (:func:`failed`) has one: its reason,
   posted before its status, so whoever sees the Failed phase finds the Event that says why;
   then ``notices``' ``PreemptionNotice`` Events (the node notices ``delivery`` put on the pods, ``View.delivered``),
   named, before the status that records them (step 7): an operator killed in between posts them again and the
   apiserver refuses a second;
1. ``record``: the status a decided gang restart or failure leads to, written before anything is deleted (a
   crash in between cannot count it twice), then its Event (``record_event``) and its counter;
2. ``annotate``: the pods' annotations (a Kueue eviction's notice, ``policy.notice``'s rule as for a node's; the
   last checkpoint of a queued job): the running gang learns its deadline before anything else is done;
3. ``create``: the pods to create (a new gang is dry-run first, with its Service and identity), then
   ``created_event``; in place, the worker Role is rewritten with every pod's name (``role``);
4. ``force_delete`` (grace 0: pods whose node is gone, no kubelet will confirm), ``delete``, then ``remove`` (the
   Service and identity a job that cannot start leaves behind, in that order);
5. ``assign``: the next in-place attempt's assignment, then ``assigned_event``. When every pod it lists already
   runs and none of them is created, deleted or dry-run here (``assign_first``: a restart in place, a spare taking
   over), it is written right after step 1 instead: the gang waits for nothing of steps 2-4 (a new spare, the
   Role, the doomed pod's deletion), which follow while it restarts;
6. ``workload``: the job's Workload writes (``policy.kueue``: create, replace, move to another LocalQueue, give the
   quota back, publish the last checkpoint), each then its log line and Event, before the status that describes
   them;
7. ``status``: the final merge patch, then ``status_events`` (the ``Queued`` condition's change, a Kueue notice,
   a commit, success); the node notices it records (``status.lastNotice``) are counted;
8. ``finish``: the Workload of a job this status ended, marked ``Finished`` so that Kueue frees the quota in this
   pass (after the status: a Workload is never finished for a job whose status still says it runs);
9. ``requeue_after``: look again after this many seconds (a backoff, old pods still draining, a notice's end).

An API answer that refuses a step stops the steps after it: ``apply_outcome`` returns it (an :class:`Answer`: a
create that did not create everything, ``policy.create.NotCreated``; a refused Workload, :class:`WorkloadRefused`),
and ``reconcile`` carries out the answer's own outcome, decided here (``Answer.instead``: :func:`failed` and what
the attempt made deleted, a retry with backoff, ``Queued=True/WorkloadRefused``), in the same order. Status is
written by carrying out an outcome only: ``record`` and ``status``, nothing else.

Which reads a decision needs is also decided here: ``look_at_nodes`` (a lost pod's nodes, fresh from the API,
before a lost pod is counted as preempted or disrupted; in place also ``look_also``, the nodes of the pods the
restart would keep, so a node lost with the first is replaced by the same restart), ``probe`` (the silent peers'
pods a wait is for: does their address answer? ``unreachable``) and ``needs_placement`` (the nodes new pods must
avoid, computed only when pods are about to be created). The shell reads them and decides again. A disruption with
no lost pod (an exit-code rule's Ignore) has no node to read and is decided in the same pass: the shell carries out
an outcome that names no node as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .. import ANNOTATION_NOTICE
from ..models import TrainingJob
from . import builders, events, fanout, kueue, memorypeers, podsready, views
from .events import Event
from .inplace import Assignment, InPlace, PodView, decide_inplace
from .kueue import Gate, admitted_template
from .notice import (
    Delivered,
    NoticePlan,
    current_attempt,
    decide_notice,
    notice_event_name,
    notice_status_patch,
    record_deliveries,
)
from .restart import (
    DISRUPTION,
    PEER_LOST_WAIT_SECONDS,
    TERMINAL_PHASES,
    Condition,
    RestartPlan,
    decide_restart,
    lost_nodes,
    orphaned_pods,
)
from .status import closing_goodput, notice_status, status_patch
from .times import parse_time, rfc3339

WAIT_SECONDS = 2.0  # look again while old pods drain (their deletion events usually come first)
PROBE_EVERY_SECONDS = 5.0  # while a silent peer is waited for: probe its pod again this often


@dataclass(frozen=True)
class View:
    """What a reconcile read: the job, its pods (cached compact pods or API objects, never written to), the
    in-place assignment, the known nodes (None: node cache not primed), the cached nodes (their zones and Ready
    conditions are read here: :func:`decide`), and the node facts the shell derived."""

    job: TrainingJob
    pods: Sequence[Mapping[str, Any]]
    now: datetime
    assignment: Assignment | None = None
    known_nodes: Collection[str] | None = None
    doomed: Collection[str] = ()  # nodes with an open notice for this job now
    avoid: Sequence[str] = ()  # nodes new pods must avoid (only computed when ``needs_placement``)
    placed: bool = False  # ``avoid`` was computed
    looked: bool = False  # the lost pods' nodes were read fresh
    last_commit_event: float | None = None  # when the job's last CheckpointCommitted Event was posted
    nodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> compact node, as cached
    kueue: kueue.Read | None = None  # the job's queue as read (None: Kueue off; ``policy.kueue.decide_queue``)
    peer_lost_wait_s: float = PEER_LOST_WAIT_SECONDS  # --peer-lost-wait-seconds (``policy.restart``)
    gone: Sequence[views.GonePod] = ()  # the job's pods the watch saw deleted (where a missing worker ran)
    said: Sequence[tuple[int, int, float]] = ()  # last steps the job's deleted pods said (``Cache.said_of``)
    notice_object: str | None = None  # what the job's notice object carries (``<job>-notice``; None: nothing known)
    probed: bool = False  # the silent peers' pods were probed (``Outcome.probe``)
    unreachable: Collection[str] = ()  # ... and these did not answer
    delivered: Sequence[Delivered] = ()  # node notices ``delivery`` put on the pods, for the status to record


@dataclass(frozen=True)
class NoticeWrite:
    """A Kueue eviction's notice through the job's notice object (``policy.fanout``, as a node's): ``value`` written
    when ``route`` says so, the pods that do not watch it annotated (``Outcome.annotate``); if the write is refused,
    every pod of ``plan`` is annotated instead (``fanout.fallback``), and either is said in a ``NoticeFallback``
    Event."""

    job: TrainingJob
    plan: NoticePlan
    route: fanout.NoticeRoute
    value: str


@dataclass(frozen=True)
class Counter:
    """A metric increment: ``restart`` by cause, ``failed`` by reason, or ``error`` by handler (a refused create)."""

    kind: str
    label: str


@dataclass(frozen=True)
class Outcome:
    job: TrainingJob | None  # the job the steps act on, as it is once ``record`` is written (None: no valid spec)
    plan: RestartPlan  # the decision (phase, attempt, conditions, message); what reconcile() returns
    decided_at: float = 0.0  # epoch seconds (when a CheckpointCommitted Event in ``status_events`` is posted)
    first_event: Event | None = None
    record: Mapping[str, Any] | None = None
    record_event: Event | None = None
    counter: Counter | None = None
    create: tuple[dict[str, Any], ...] = ()
    dry_run: bool = False  # a new gang: dry-run its first pod, create its Service and identity first
    created_event: Event | None = None
    role: bool = False  # in place: rewrite the worker Role with every pod's name after creating
    force_delete: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    remove: tuple[Mapping[str, Any], ...] = ()  # objects to delete after the pods, in this order (``policy.create``)
    assign: Assignment | None = None
    assigned_event: Event | None = None
    assign_first: bool = False  # write ``assign`` right after ``record`` (step 4 of the module docstring)
    annotate: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # pod -> annotations (Kueue's notice, ...)
    notice_write: NoticeWrite | None = None  # a Kueue eviction's notice for the job's notice object, before ``annotate``
    workload: tuple[kueue.WorkloadOp, ...] = ()  # the Workload writes before the status (``policy.kueue``)
    status: Mapping[str, Any] = field(default_factory=dict)
    status_events: tuple[Event, ...] = ()
    finish: kueue.WorkloadOp | None = None  # the ended job's Workload, finished once the status says it ended
    requeue_after: float | None = None
    look_at_nodes: frozenset[str] = frozenset()  # read these nodes fresh and decide again
    look_also: frozenset[str] = frozenset()  # ... then these, as far as the reads allow (the pods a restart keeps)
    needs_placement: bool = False  # compute the nodes to avoid and decide again
    probe: frozenset[tuple[str, str]] = frozenset()  # (pod, address): probe these and decide again (``unreachable``)
    log: str = ""  # what to log once the record is written
    # node notices ``status`` records (``View.delivered``): each one's named PreemptionNotice Event is posted
    # first, before ``record`` (an operator killed before the status posts it again, and the apiserver refuses a
    # second one); counted once the status is written
    notices: tuple[Delivered, ...] = ()

    @property
    def final(self) -> bool:
        """Carried out as it is: it asks for no read and no second decision (``look_at_nodes``, ``probe``,
        ``needs_placement``)."""
        return not (self.look_at_nodes or self.probe or self.needs_placement)


class Answer(Protocol):
    """The API's answer to a step that it refused (``apply_outcome`` returns it): the steps after it are not carried
    out; :meth:`instead` decides the outcome carried out in their place."""

    def instead(self, out: Outcome, now: datetime) -> Outcome:
        """The outcome carried out instead of the steps of ``out`` after the refused one."""
        ...


@dataclass(frozen=True)
class WorkloadRefused:
    """The API server refused to create Workload ``name`` (``message``: its answer)."""

    name: str
    message: str

    def instead(self, out: Outcome, now: datetime) -> Outcome:
        return workload_refused(out, self.name, self.message, now)


def decide(view: View) -> Outcome:
    """The whole outcome of one reconcile of ``view.job`` (see the module docstring for the order)."""
    queue = kueue.decide_queue(view.job, view.kueue, view.pods, view.now) if view.kueue is not None else None
    g = queue.gate if queue is not None else None
    out = _in_place(view, g) if view.job.spec.mode == "InPlace" else _recreate(view, g)
    if g is not None and g.notice is not None and (out.record is not None or out.assign is not None) \
            and held(view, g) is None:
        out = _saving(view, g)
    if g is not None and g.deadline is not None and out.requeue_after is None and g.deadline > view.now and \
            out.plan.phase not in ("Suspended", *TERMINAL_PHASES):
        # An evicted gang still running: look again when its notice runs out (it is stopped then).
        out = dataclasses.replace(out, requeue_after=(g.deadline - view.now).total_seconds())
    if out.assign is not None and _assign_first(out, view):
        out = dataclasses.replace(out, assign_first=True)
    if queue is not None and view.kueue is not None:
        out = _queued(out, view, view.kueue, queue)
    return _delivered(out, view)


def _delivered(out: Outcome, view: View) -> Outcome:
    """``out`` with the node notices ``delivery`` put on the pods recorded (``policy.notice.record_deliveries``):
    ``status.lastNotice`` (the earliest, with an eviction's notice of this pass) and phase ``Preempting`` unless
    this pass decides the phase, each recorded one's ``PreemptionNotice`` Event."""
    if not view.delivered or out.job is None or not out.final:
        return out
    patch, recorded = record_deliveries(out.job, view.delivered, view.now)
    if patch is None:
        return out
    status = {**patch, **out.status}
    if "lastNotice" in out.status:  # an eviction's notice decided in this pass too: the earlier deadline stands
        status["lastNotice"] = min(out.status["lastNotice"], patch["lastNotice"],
                                   key=lambda n: parse_time(n.get("deadline")) or view.now)
    return dataclasses.replace(out, status=status, notices=recorded)


def _queued(out: Outcome, view: View, read: kueue.Read, queue: kueue.Queue) -> Outcome:
    """``out`` with what the job's queue adds: the eviction's notice (``policy.notice``'s rule, as a node's: the
    pods' annotation, ``status.lastNotice``, one named ``PreemptionNotice`` Event), the last checkpoint on the pods,
    the Workload writes, the ``Queued`` condition's Event when the status writes a new one, and the Workload's
    ``Finished`` once the job ended."""
    job, now, g = view.job, view.now, queue.gate
    after = out.job or job
    annotate = {n: dict(a) for n, a in queue.annotate.items()}
    status, posted = dict(out.status), list(out.status_events)
    notice = kueue.eviction_notice(g) if g is not None else None
    write: NoticeWrite | None = None
    if g is not None and notice is not None:
        workers = views.workers(job, view.pods, view.assignment, view.known_nodes)
        object_name = builders.notice_object_name(job)
        attempt = current_attempt(job, workers)
        notes = fanout.heard_by_pods(view.pods, object_name, view.notice_object, attempt)
        plan = decide_notice(job, workers, notice, notes, now, math.inf)  # an eviction's notice is open at once
        if plan is not None:
            value = notice.annotation(plan.attempt)
            route = fanout.route(plan, view.notice_object,
                                 [str(p["metadata"]["name"]) for p in view.pods if fanout.watches(p, object_name)])
            write = NoticeWrite(job, plan, route, value)
            for name in route.annotate:
                annotate.setdefault(name, {})[ANNOTATION_NOTICE] = value
            patch = notice_status_patch(after, notice_status(notice, plan.attempt, now), plan.attempt)
            if patch is not None:
                status = {**patch, **status}
                posted.append(Event("PreemptionNotice", kueue.eviction_message(g, plan.attempt), "Warning",
                                    notice_event_name({"name": job.name, "uid": job.uid}, plan.attempt, notice.id)))
    old = next((c for c in job.status.conditions if c.type == kueue.QUEUED), None)
    new = g is not None and (old is None or (old.status, old.reason, old.message) !=
                             (g.condition.status, g.condition.reason, g.condition.message))
    if g is not None and new and (_writes(out.record, g.condition) or _writes(status, g.condition)):
        posted.insert(0, Event(g.condition.reason, g.condition.message, "Warning" if g.warning else "Normal"))
    phase = status.get("phase") or after.status.phase
    return dataclasses.replace(out, annotate=annotate, workload=queue.workload, status=status,
                               status_events=tuple(posted), finish=kueue.finish(job, read, phase, now),
                               notice_write=write)


def _writes(patch: Mapping[str, Any] | None, cond: Condition) -> bool:
    """Whether ``patch`` writes condition ``cond`` (its Event follows that write, once per change)."""
    return any((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) ==
               (cond.type, cond.status, cond.reason, cond.message) for c in (patch or {}).get("conditions") or [])


def _assign_first(out: Outcome, view: View) -> bool:
    """Whether ``out``'s assignment can be written before its creates and deletes: every pod it lists is a pod
    that exists, is not being deleted, and is neither created nor deleted by ``out`` (not a new gang)."""
    assert out.assign is not None
    live = {str((p.get("metadata") or {}).get("name")) for p in view.pods
            if not (p.get("metadata") or {}).get("deletionTimestamp")}
    made = {(p.get("metadata") or {}).get("name") for p in out.create}  # None: a generated name
    touched = {str(n) for n in made if n} | set(out.delete) | set(out.force_delete)
    listed = set(out.assign.processes)
    return not out.dry_run and bool(listed) and listed <= live and not listed & touched


def _saving(view: View, g: Gate) -> Outcome:
    """Evicted by Kueue, part of the gang already exited on the notice and the rest still saving: no gang restart
    (in place, the workers that exited would start the next attempt in their pods while Kueue wants the quota
    back). Nothing changes until the rest exit or the notice runs out; then the job is held (:func:`held`)."""
    st = view.job.status
    plan = RestartPlan(phase=st.phase or "Preempting", attempt=st.attempt, conditions=(g.condition,),
                       message="waiting for the gang to exit on Kueue's eviction notice")
    return Outcome(view.job, plan, view.now.timestamp())


def held(view: View, g: Gate | None) -> Condition | None:
    """The queue's condition (``g``: its gate) when the job must be held now (no attempt starts, every pod goes),
    else None.

    Queued or waiting: at once. Evicted: once the gang stopped by itself (every worker of the current attempt
    exited, after its agreed save) or its notice ran out; until then the running gang saves on the notice."""
    if g is None or not g.hold:
        return None
    if g.notice is None or (g.deadline is not None and view.now >= g.deadline):
        return g.condition
    workers = views.workers(view.job, view.pods, view.assignment, view.known_nodes)
    attempt = max([view.job.status.attempt, *(p.attempt for p in workers)])
    if all(p.terminated or p.deleting or p.node_lost for p in workers if p.attempt == attempt):
        return g.condition
    return None


def _queue_conditions(plan: RestartPlan, g: Gate | None, hold: Condition | None) -> RestartPlan:
    """The queue's condition joins the plan's (a held plan carries it already)."""
    if g is None or hold is not None:
        return plan
    return dataclasses.replace(plan, conditions=(*plan.conditions, g.condition))


def _pods_ready(plan: RestartPlan, view: View) -> RestartPlan:
    """The plan with condition ``PodsReady`` when a pod of the job is stuck, or was (``policy.podsready``; the
    callers look again when a pod waiting for a node reaches its grace). Nothing once the job ends."""
    if plan.phase in TERMINAL_PHASES:
        return plan
    found = podsready.stuck(view.pods, view.now)
    live = [p for p in view.pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    running = bool(live) and all((p.get("status") or {}).get("phase") == "Running" for p in live)
    current = next((c for c in view.job.status.conditions if c.type == podsready.PODS_READY), None)
    cond = podsready.condition(found, running, None if current is None else
                               Condition(current.type, current.status, current.reason or "", current.message or ""))
    return plan if cond is None else dataclasses.replace(plan, conditions=(*plan.conditions, cond))


def _sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _admitted(job: TrainingJob, g: Gate | None) -> TrainingJob:
    """The job its pods are built from: with the admitted flavors' node labels and tolerations, when queued."""
    if g is None or g.hold or not (g.node_selector or g.tolerations):
        return job
    spec = job.spec.model_copy(update={"template": admitted_template(job.spec.template, g)})
    return job.model_copy(update={"spec": spec})


def _recreate(view: View, g: Gate | None) -> Outcome:
    job, now = view.job, view.now
    pods = [p for p in (views.worker_pod(r, view.known_nodes) for r in view.pods) if p is not None]
    not_ready = _not_ready(view)
    pods = [dataclasses.replace(p, node_ready=False) if p.node in not_ready else p for p in pods]
    pods = [dataclasses.replace(p, reachable=False) if p.name in view.unreachable else p for p in pods]
    hold = held(view, g)
    gone = [(p.index, p.attempt, p.node) for p in view.gone]
    plan = decide_restart(job, pods, view.avoid, now, view.doomed, held=hold,
                          peer_lost_wait_s=view.peer_lost_wait_s, gone=gone)
    plan = kueue.eviction_restart(job, plan, hold, g, pods)
    plan = _pods_ready(_queue_conditions(plan, g, hold), view)
    look = lost_nodes(pods) | {node for _, a, node in gone if a == plan.attempt}  # this attempt's pods, gone
    if plan.cause == DISRUPTION and not view.looked and look:  # none to read: decided already
        return Outcome(job, plan, look_at_nodes=frozenset(look))
    if (probe := _to_probe(plan, view)):
        return Outcome(job, plan, probe=probe)
    if plan.create and not view.placed:
        return Outcome(job, plan, needs_placement=True)
    job, record = _record(job, plan, now)
    plan = dataclasses.replace(plan, cause=None)
    orphans = orphaned_pods(pods, view.known_nodes)
    pod_job = _admitted(job, g)
    create = tuple(builders.build_worker_pod(pod_job, i, plan.attempt, plan.exclude_nodes) for i in plan.create)
    created_event = _attempt_started(plan, len(create)) if plan.new_attempt and create else None
    running = plan.attempt > 0 and plan.phase not in (*TERMINAL_PHASES, "Suspended")
    status = status_patch(job, _created(job, plan, create), now, views.progress(view.pods),
                          views.last_steps(view.pods, view.said), workers=job.spec.replicas if running else None)
    requeue = plan.requeue_after if plan.requeue_after is not None else (WAIT_SECONDS if plan.waiting else None)
    requeue = _sooner(requeue, podsready.unschedulable_due(view.pods, now))
    requeue = _sooner(requeue, PROBE_EVERY_SECONDS if plan.probe else None)
    return Outcome(job, plan, now.timestamp(), **record, create=create, dry_run=plan.new_attempt,
                   created_event=created_event, force_delete=orphans,
                   delete=tuple(n for n in plan.delete if n not in orphans), status=status,
                   status_events=_status_events(job, status, view), requeue_after=requeue)


def _in_place(view: View, g: Gate | None) -> Outcome:
    job, now = view.job, view.now
    pods = [v for v in (views.pod_view(r, view.known_nodes) for r in view.pods) if v is not None]
    zones = views.zones(view.pods, view.nodes) if memorypeers.enabled(job) else {}
    if zones:
        pods = [dataclasses.replace(v, zone=zones[v.node]) if v.node and v.node in zones else v for v in pods]
    not_ready = _not_ready(view)
    pods = [dataclasses.replace(v, node_ready=False) if v.node in not_ready else v for v in pods]
    pods = [dataclasses.replace(v, reachable=False) if v.name in view.unreachable else v for v in pods]
    hold = held(view, g)
    stuck = {str((r.get("metadata") or {}).get("name")): v for r in view.pods
             if (v := podsready.unschedulable(r)) is not None} if job.spec.elastic is not None else {}
    plan, extra = decide_inplace(job, pods, view.assignment, view.avoid, now, view.doomed, held=hold,
                                 peer_lost_wait_s=view.peer_lost_wait_s, gone={p.name: p.node for p in view.gone},
                                 stuck=stuck, ahead=view.kueue is None or view.kueue.queue is None)
    plan = _pods_ready(_queue_conditions(kueue.eviction_restart(job, plan, hold, g, pods), g, hold), view)
    current = view.assignment
    if current is not None and extra.assign is None and extra.record is None and plan.cause is None:
        paired = memorypeers.pairing_condition(job, current.processes, current.memory_peers, pods)
        if paired is not None:  # the pairing in force, once its pods run on known nodes
            plan = dataclasses.replace(plan, conditions=(*plan.conditions, paired))
    decided = extra.record or (plan if plan.cause else None)
    if decided is not None and decided.cause == DISRUPTION and not view.looked:
        workers = current.processes if current is not None else {}
        look = frozenset({p.node for p in pods if p.node and (p.deleting or p.node_lost)} |
                         {p.node for p in view.gone if p.name in workers})  # a worker's pod, gone
        if look:  # none to read (an exit-code rule's Ignore, nothing lost): decided already
            # and the nodes of the pods it would keep: one lost with them (two nodes at once) is replaced in this
            # restart, not found by the next (issue #46, 7: the watch had not yet said the second node was gone)
            kept = frozenset(p.node for p in pods if p.node and not p.deleting) - look
            return Outcome(job, plan, look_at_nodes=look, look_also=kept)
    if (probe := _to_probe(plan, view)):
        return Outcome(job, plan, probe=probe)
    if (plan.create or extra.create_workers or extra.create_spares) and not view.placed:
        return Outcome(job, plan, needs_placement=True)
    job, record = _record(job, decided, now)
    plan = dataclasses.replace(plan, cause=None)
    fails = decided is not None and decided.phase == "Failed"
    create = () if fails else _pods_to_create(_admitted(job, g), plan, extra)
    first = view.assignment is None  # only the first attempt's pods are dry-run and announced on creation
    created_event = _attempt_started(plan, len(create)) if first and plan.new_attempt and create else None
    assign, assigned_event = None, None
    if not fails and extra.assign is not None and (current is None or extra.assign.attempt > current.attempt):
        assign = extra.assign
        if current is not None:  # a restart, not the first attempt
            assigned_event = Event("AttemptStarted", plan.message)
    orphans = orphaned_pods(pods, view.known_nodes)
    size = extra.assign if extra.assign is not None and plan.new_attempt else current
    status = status_patch(job, _created(job, plan, create), now, views.progress(view.pods),
                          views.last_steps(view.pods, view.said), workers=len(size.processes) if size is not None else None)
    status.update(_inplace_status(job, pods, extra, plan, current))
    resized: tuple[Event, ...] = ()
    if assign is not None and extra.resize is not None:  # a size change: when, and its Event after the status
        status["lastResizeTime"] = rfc3339(now)
        resized = (extra.resize.event,)
    return Outcome(job, plan, now.timestamp(), **record, create=create, dry_run=first and plan.new_attempt,
                   created_event=created_event, role=bool(create),
                   force_delete=orphans, delete=tuple(n for n in plan.delete if n not in orphans),
                   assign=assign, assigned_event=assigned_event, status=status,
                   status_events=(*resized, *_status_events(job, status, view)),
                   requeue_after=_sooner(_sooner(plan.requeue_after, podsready.unschedulable_due(view.pods, now)),
                                         PROBE_EVERY_SECONDS if plan.probe else None))


def _not_ready(view: View) -> frozenset[str]:
    """The nodes of ``view.pods`` whose Ready condition is False or Unknown (``views.not_ready_nodes`` over the
    cached nodes these pods run on, not all of them)."""
    on = {str(n) for p in view.pods if (n := (p.get("spec") or {}).get("nodeName")) and n in view.nodes}
    return views.not_ready_nodes({n: view.nodes[n] for n in on})


def _to_probe(plan: RestartPlan, view: View) -> frozenset[tuple[str, str]]:
    """The silent peers' pods to probe (name, IP) before this pass's wait is carried out: none once probed, and
    none without an address (a pod that has none was never reachable: its node or the pod tells the rest)."""
    if view.probed or not plan.probe:
        return frozenset()
    ips = {str((p.get("metadata") or {}).get("name")): (p.get("status") or {}).get("podIP") for p in view.pods}
    return frozenset((name, ip) for name in plan.probe if (ip := ips.get(name)))


def _created(job: TrainingJob, plan: RestartPlan, create: Sequence[dict[str, Any]]) -> RestartPlan:
    """The plan the final patch is decided on: once its pods exist, a job whose creation was refused before says
    so (``PodsCreated=True``). A refused create never reaches the final patch."""
    if create and any(c.type == "PodsCreated" and c.status == "False" for c in job.status.conditions):
        done = Condition("PodsCreated", "True", "Created", f"created {len(create)} worker pod(s) of attempt "
                                                          f"{plan.attempt}")
        return dataclasses.replace(plan, conditions=(*plan.conditions, done))
    return plan


def failed(status: Mapping[str, Any], reason: str, message: str, now: datetime) -> Outcome:
    """Fail a job that cannot run, outside the restart policy (an invalid spec, worker pods the API server refuses
    for good): the Warning Event first, then phase Failed with condition Failed/<reason> (``PodsCreated``
    dropped) and its open attempts' goodput closed, and the counter. Works on the raw status (such a job's spec
    may not parse: ``job`` is None); nothing when it is Failed already."""
    plan = RestartPlan(phase="Failed", attempt=int(status.get("attempt") or 0))
    if status.get("phase") == "Failed":
        return Outcome(None, plan)
    cond = {"type": "Failed", "status": "True", "reason": reason, "message": message[:2000],
            "lastTransitionTime": rfc3339(now)}
    conds = [c for c in status.get("conditions") or [] if c.get("type") not in ("Failed", "PodsCreated")]
    patch: dict[str, Any] = {"phase": "Failed", "conditions": [*conds, cond], "completionTime": rfc3339(now)}
    closed = closing_goodput(status, now)
    if closed is not None:  # the attempts that ran end here: the figures are final, not provisional
        patch["goodput"] = closed
    return Outcome(None, plan, first_event=Event(reason, message, "Warning"), record=patch,
                   counter=Counter("failed", reason))


def _attempt_started(plan: RestartPlan, pods: int) -> Event:
    """The Event of a new gang's pods, once they exist."""
    return Event("AttemptStarted", f"attempt {plan.attempt}: created {pods} worker pod(s)"
                 + (f" avoiding {', '.join(plan.exclude_nodes)}" if plan.exclude_nodes else ""))


def _record(job: TrainingJob, decided: RestartPlan | None, now: datetime) -> tuple[TrainingJob, dict[str, Any]]:
    """A decided gang restart or failure: the status to write first, its Event and counter; and the job as it
    is once that status is written (what the rest of the outcome is decided on)."""
    if decided is None or not decided.cause:
        return job, {}
    patch = status_patch(job, decided, now, None)
    if decided.phase == "Suspended":  # a Kueue eviction (``kueue.eviction_restart``): restarts once admitted
        patch["restartCount"] = job.status.restart_count + 1
    after = job.model_copy(update={"status": job.status.model_validate(
        {**job.status.model_dump(by_alias=True), **patch})})
    if decided.phase == "Failed":
        reason = decided.conditions[0].reason if decided.conditions else "Failed"
        event, counter = Event(reason, decided.message, "Warning"), Counter("failed", reason)
    else:
        event = Event("GangRestart", decided.message, "Normal" if decided.cause == "preemption" else "Warning")
        counter = Counter("restart", decided.cause)
    return after, {"record": patch, "record_event": event, "counter": counter, "log": decided.message}


def _status_events(job: TrainingJob, patch: Mapping[str, Any], view: View) -> tuple[Event, ...]:
    return tuple(events.for_status_change(job, patch, view.now.timestamp(), view.last_commit_event)) if patch else ()


def _pods_to_create(job: TrainingJob, plan: RestartPlan, extra: InPlace) -> tuple[dict[str, Any], ...]:
    pods = [builders.build_worker_pod(job, i, plan.attempt, plan.exclude_nodes) for i in plan.create]
    nxt = plan.attempt + (0 if plan.new_attempt else 1)
    pods += [builders.build_worker_pod(job, i, nxt, plan.exclude_nodes, name=f"{job.name}-{i}-")
             for i in extra.create_workers]
    pods += [builders.build_worker_pod(job, -1, plan.attempt, plan.exclude_nodes, name=f"{job.name}-spare-",
                                       role="spare") for _ in range(extra.create_spares)]
    return tuple(pods)


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


def workload_refused(out: Outcome, name: str, message: str, now: datetime) -> Outcome:
    """What replaces the steps after a refused Workload create (the API server's answer, ``message``): the final
    status with condition ``Queued=True/WorkloadRefused`` in place of the one ``out`` wrote, and its Warning."""
    job = out.job
    assert job is not None, "a Workload refused without a job"
    g = kueue.refused(name, message)
    c = g.condition
    old = next((x for x in job.status.conditions if x.type == c.type), None)
    ltt = old.last_transition_time if old is not None and old.status == c.status else rfc3339(now)
    written = out.status.get("conditions") or [x.model_dump(by_alias=True, exclude_none=True)
                                                for x in job.status.conditions]
    conds = [*(x for x in written if x.get("type") != c.type),
             {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message, "lastTransitionTime": ltt}]
    plan = dataclasses.replace(out.plan, conditions=(c,))
    return Outcome(job, plan, out.decided_at, status={**out.status, "conditions": conds},
                   status_events=(Event(c.reason, c.message, "Warning"),), requeue_after=out.requeue_after)
