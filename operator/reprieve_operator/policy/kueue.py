"""Kueue, decided purely: what the answer on a queued TrainingJob's Workload (``policy.workload``) lets it do now
(:func:`gate`), the Workload operation a pass carries out (:func:`decide_queue`: create, replace, move, give the
quota back, publish the last checkpoint; :func:`finish` once the job ended), the notice an eviction gives the gang
(:func:`eviction_notice`, delivered by ``policy.notice``'s rule like a node's) and the preemption restart it counts
(:func:`eviction_restart`). ``kueue.py`` only reads what :class:`Read` holds and carries out what this module
decided (``reconcile.apply_outcome``).

The integration is Kueue's external-framework path (``docs/kueue.md``): the operator owns one ``Workload`` per job
(``kueue.x-k8s.io/v1beta2``), as Kueue's own job reconciler does for a batch Job, and Kueue admits or evicts it.

* No Workload yet, or one without quota: the job is **held** (no attempt starts), condition ``Queued=True`` with
  Kueue's own message (``Pending``: the LocalQueue, ClusterQueue and why it waits).
* Admitted (``Admitted=True``, not evicted): the job runs; its pods get the node labels and tolerations of the
  flavors the admission assigned (``admitted_template``).
* Evicted while it holds quota (preempted, reclaimed, deactivated): the running gang gets a notice
  (``kueue-preemption``, deadline = eviction + ``preemption.noticeSeconds["kueue-preemption"]``, default
  :data:`DEFAULT_NOTICE_SECONDS`), saves and exits; only once no pod is left does the operator clear the admission
  (``workload.release_patch``: Kueue's own ``UnsetQuotaReservationWithCondition``), and only then is the quota
  free.
  A gang still running at the deadline is stopped (deleted: SIGTERM, the runtime's last-resort save).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ..models import KUEUE_NOTICE, TrainingJob
from .events import Event
from .restart import PREEMPTION, Condition, RestartPlan, Verdict, WorkerPod, gang_restart, still_running
from .signals import Notice
from .times import rfc3339
from .views import PodView
from .workload import (
    ANNOTATION_CHECKPOINT,
    KUEUE_GROUP,
    KUEUE_VERSION,
    WORKLOADS,
    Eviction,
    Workload,
    build_workload,
    finish_patch,
    parse_workload,
    pod_sets,
    release_patch,
    workload_name,
)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
NOTICE_REASON = KUEUE_NOTICE  # the notice's reason, and its key in spec.preemption.noticeSeconds
DEFAULT_NOTICE_SECONDS = 60
QUEUED = "Queued"  # the job's condition type


def notice_seconds(job: TrainingJob) -> int:
    return int(job.spec.preemption.notice_seconds.get(NOTICE_REASON, DEFAULT_NOTICE_SECONDS))


@dataclass(frozen=True)
class Gate:
    """What Kueue lets the job do now. ``hold``: no attempt may start, and a running gang is stopped once it
    exited or ``stop_by`` passed (``policy.decide``); ``notice``: the annotation value to deliver (an eviction);
    ``node_selector``/``tolerations``: the admitted flavors' (for pods created now)."""

    hold: bool
    condition: Condition
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    notice: Eviction | None = None
    notice_id: str = ""
    deadline: datetime | None = None  # the notice's deadline: a gang still running then is stopped
    release: bool = False  # evicted and holding quota: give it back once no pod is left
    warning: bool = False  # the condition is a problem the user must act on (a Warning Event)


def queued(reason: str, message: str, *, warning: bool = False) -> Gate:
    return Gate(hold=True, condition=Condition(QUEUED, "True", reason, message), warning=warning)


def gate(job: TrainingJob, queue: str, wl: Workload | None, flavors: Mapping[str, Mapping[str, Any] | None],
         now: datetime) -> Gate:
    """The job's gate from its Workload (None: not created yet) and the ResourceFlavors its admission names
    (name -> the object, None: not found)."""
    where = f"LocalQueue {job.namespace}/{queue}"
    if wl is None:
        return queued("WorkloadCreating", f"creating its Workload in {where}")
    if wl.finished is not None:
        return queued("WorkloadFinished", f"Workload {wl.name} is finished: {wl.finished}", warning=True)
    if wl.evicted is not None and wl.quota_reserved:
        ev = wl.evicted
        if not job.spec.preemption.enabled:
            # Notices are off for this job: the eviction stops the gang at once, as Kueue stops a batch Job.
            msg = (f"Kueue evicted Workload {wl.name} ({ev.reason}: {ev.message}); notices are off "
                   f"(spec.preemption.enabled: false): the pods are stopped now, then the quota of ClusterQueue "
                   f"{wl.cluster_queue} is given back")
            return Gate(hold=True, condition=Condition(QUEUED, "True", "Evicted", msg), release=True)
        deadline = ev.since + timedelta(seconds=notice_seconds(job))
        msg = (f"Kueue evicted Workload {wl.name} ({ev.reason}: {ev.message}); the gang saves by "
               f"{rfc3339(deadline)}, then the quota of ClusterQueue {wl.cluster_queue} is given back")
        return Gate(hold=True, condition=Condition(QUEUED, "True", "Evicted", msg), notice=ev,
                    notice_id=f"{NOTICE_REASON}/{wl.name}/{int(ev.since.timestamp())}", deadline=deadline,
                    release=True)
    if not wl.quota_reserved:
        why = wl.pending or "waiting for quota"
        if wl.evicted is not None:
            why = f"evicted ({wl.evicted.reason}: {wl.evicted.message}); {why}"
        return queued("Pending", f"waiting in {where}: {why}{unfit_advice(job, wl.pending)}",
                      warning=unfit(wl.pending))

    if not wl.admitted:
        return queued("AdmissionChecks", f"quota reserved in ClusterQueue {wl.cluster_queue}; waiting for its "
                                         f"admission checks")
    names = sorted({f for fs in wl.flavors.values() for f in fs})
    missing = [n for n in names if flavors.get(n) is None]
    if missing:
        return queued("FlavorNotFound", f"admitted by ClusterQueue {wl.cluster_queue}, but ResourceFlavor(s) "
                                        f"{', '.join(missing)} cannot be read", warning=True)
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for n in names:
        fspec = (flavors[n] or {}).get("spec") or {}
        for k, v in (fspec.get("nodeLabels") or {}).items():
            if selector.get(k, v) != v:
                return queued("FlavorConflict", f"the flavors {', '.join(names)} of ClusterQueue {wl.cluster_queue} "
                                                f"ask for different values of node label {k}", warning=True)
            selector[k] = v
        tolerations += [t for t in fspec.get("tolerations") or [] if t not in tolerations]
    own = (job.spec.template.get("spec") or {}).get("nodeSelector") or {}
    clash = sorted(k for k, v in selector.items() if k in own and own[k] != v)
    if clash:
        return queued("FlavorConflict", f"spec.template.spec.nodeSelector sets {', '.join(clash)} to "
                                        f"{', '.join(repr(own[k]) for k in clash)}, but flavor(s) {', '.join(names)} "
                                        f"of ClusterQueue {wl.cluster_queue} need "
                                        f"{', '.join(repr(selector[k]) for k in clash)}: the pods could run on no "
                                        f"node", warning=True)
    shown = f" on flavor(s) {', '.join(names)}" if names else ""
    return Gate(hold=False, condition=Condition(QUEUED, "False", "Admitted",
                                                f"admitted by ClusterQueue {wl.cluster_queue}{shown}"),
                node_selector=selector, tolerations=tuple(tolerations))


# Kueue's words (pkg/scheduler/flavorassigner, v0.17) when no flavor of the ClusterQueue fits the pod template
# itself: the job will not be admitted until the template or the queue changes, so the Event is a Warning.
UNFIT = ("doesn't match node affinity", "untolerated taint")
# ... and when the Workload asks for more than the ClusterQueue can ever hold (its quota plus what it may borrow):
# "insufficient quota for cpu in flavor default, request > maximum capacity (5 > 4)", or, for a later pod set,
# "previously considered podsets requests (4) + current podset request (1) > maximum capacity (4)".
TOO_BIG = "> maximum capacity"


def unfit(pending: str) -> bool:
    """Kueue keeps the Workload pending for good: no flavor can run the template, or the Workload is larger than
    the ClusterQueue's maximum capacity (a message that names only insufficient quota may clear by itself)."""
    return TOO_BIG in pending or (any(w in pending for w in UNFIT) and "insufficient quota" not in pending)


def unfit_advice(job: TrainingJob, pending: str) -> str:
    """What to change so that a Workload Kueue can never admit fits (empty when it may still fit by itself)."""
    if TOO_BIG in pending:
        spares = f" + spec.spares ({job.spec.spares}: a spare holds a node's resources too)" if job.spec.spares else ""
        return (f": the job asks for more than its ClusterQueue can ever hold; lower spec.replicas "
                f"({job.spec.replicas}){spares} or the pods' resource requests, or raise the ClusterQueue's "
                f"nominalQuota (or its borrowingLimit)")
    if unfit(pending):
        return ": no flavor of the ClusterQueue can run the pod template; change the template's nodeSelector or " \
               "tolerations, or the ClusterQueue's flavors"
    return ""


def needs_new_workload(job: TrainingJob, wl: Workload) -> str | None:
    """Why the Workload no longer describes the job (its pod counts: ``spares`` edited while queued), or None.
    Only a Workload without quota is replaced; an admitted one keeps running as admitted."""
    want = {p["name"]: p["count"] for p in pod_sets(job)}
    if dict(wl.counts) == want or wl.quota_reserved:
        return None
    return f"the job asks for pod sets {want}, its Workload {wl.name} for {dict(wl.counts)}"


def admitted_template(template: Mapping[str, Any], g: Gate) -> dict[str, Any]:
    """The pod template with the admission's node labels and tolerations added (``gate`` already refused a
    conflict)."""
    spec = dict(template.get("spec") or {})
    if g.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **g.node_selector}
    if g.tolerations:
        own = list(spec.get("tolerations") or [])
        spec["tolerations"] = own + [dict(t) for t in g.tolerations if t not in own]
    return {**template, "spec": spec}


def evicted(read: Read) -> bool:
    """Whether the job's Workload, as read, is evicted while it still holds quota (its gang is due a notice)."""
    if read.workload is None:
        return False
    wl = parse_workload(read.workload)
    return wl.evicted is not None and wl.quota_reserved


def eviction_notice(g: Gate) -> Notice | None:
    """The notice an eviction gives the gang: a notice like a node's (``policy.notice`` delivers it, the runtime
    reads the same ``reprieve.dev/notice``), for the whole job rather than one node (``node`` empty)."""
    if g.notice is None or g.deadline is None:
        return None
    return Notice(id=g.notice_id, reason=NOTICE_REASON, node="", deadline=g.deadline, observed_at=g.notice.since)


def eviction_message(g: Gate, attempt: int) -> str:
    """The PreemptionNotice Event's text for an eviction's notice delivered to ``attempt``."""
    assert g.notice is not None and g.deadline is not None
    return (f"Kueue evicted the job's Workload ({g.notice.reason}: {g.notice.message}); notice {g.notice_id} "
            f"delivered to attempt {attempt}, save by {rfc3339(g.deadline)}")


def eviction_restart(job: TrainingJob, plan: RestartPlan, hold: Condition | None, g: Gate | None,
                     pods: Sequence[WorkerPod] | Sequence[PodView]) -> RestartPlan:
    """``plan`` as an eviction leaves it: one that stops a running attempt is a preemption restart, counted in
    ``status.restarts`` (and ``restartCount``) when the job is held (``hold``) and capped by
    ``restartPolicy.maxPreemptionRestarts`` like any other (``restart.gang_restart``); the next attempt starts when
    Kueue admits the job again."""
    st = job.status
    restarting = st.restarting_from is not None and st.restarting_from >= st.attempt
    if hold is None or g is None or not g.release or job.spec.suspend or plan.phase != "Suspended" or \
            st.phase in (None, "Suspended") or st.attempt == 0 or restarting:
        return plan
    why = f"Kueue evicted the job ({g.condition.message})"
    capped = gang_restart(job, st.attempt, Verdict(cause=PREEMPTION, why=why), None,
                          stragglers=still_running(pods), teardown=plan.delete)
    if capped.phase == "Failed":
        return capped
    return replace(plan, cause=PREEMPTION, message=f"attempt {st.attempt} stopped ({PREEMPTION}): {why}; it "
                                                   "resumes once Kueue admits it again")


def checkpoint_annotation(job: TrainingJob) -> str | None:
    """The ``reprieve.dev/last-checkpoint`` value: the last committed checkpoint (step, time, where), or None
    before the first commit."""
    st = job.status
    if st.last_checkpoint_step is None:
        return None
    return json.dumps({"step": st.last_checkpoint_step, "time": st.last_checkpoint_time,
                       "uri": st.last_checkpoint_uri or job.spec.checkpoint.uri}, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Read:
    """What the shell read for a job's queue (``kueue.read``; no write): the job's labels, its Workload and what
    the Workload names."""

    queue: str | None  # the kueue.x-k8s.io/queue-name label (None: the job is not queued)
    priority_class: str | None = None  # the kueue.x-k8s.io/priority-class label
    workload: Mapping[str, Any] | None = None  # the job's Workload as read (None: none yet)
    priority: int | None = None  # the WorkloadPriorityClass's value (read only to create; None: not found)
    flavors: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)  # admitted flavor -> object
    served: bool = True  # False: the API server does not serve Workloads (Kueue is not installed)


@dataclass(frozen=True)
class WorkloadOp:
    """One write to the job's Workload (``reconcile.apply_outcome`` carries it out): ``create`` ``body``;
    ``delete``; ``patch`` ``body`` (metadata or spec, a merge patch); ``status``: ``body`` on the status
    subresource (it carries ``resourceVersion``: a Workload changed meanwhile is read again, never overwritten)."""

    verb: str
    name: str
    body: Mapping[str, Any] | None = None
    log: str = ""  # said once done
    event: Event | None = None  # posted once done
    requeue_after: float | None = None  # look again after this many seconds once done
    conflict_requeue: float | None = None  # a 409 (changed meanwhile): look again after this many seconds


@dataclass(frozen=True)
class Queue:
    """What a job's queue decides for one pass: the gate (None: not queued, or ended) and the Workload writes,
    before the job's status is written (``finish`` comes after it: :func:`finish`)."""

    gate: Gate | None
    workload: tuple[WorkloadOp, ...] = ()
    annotate: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # pod -> the last checkpoint


def decide_queue(job: TrainingJob, read: Read, pods: Sequence[Mapping[str, Any]], now: datetime) -> Queue:
    """The gate and the Workload writes for ``job`` from what was ``read`` (``pods``: the job's pods as cached)."""
    ns, name = job.namespace, workload_name(job.name, job.uid)
    if read.queue is None:
        if any(c.type == QUEUED for c in job.status.conditions):  # the label was removed: no longer Kueue's
            return Queue(None, (WorkloadOp("delete", name, log=f"label {QUEUE_LABEL} removed: Workload {name} "
                                                               f"deleted"),))
        return Queue(None)
    if not read.served:
        return Queue(queued("KueueNotInstalled", f"label {QUEUE_LABEL}={read.queue} is set, but the API server does "
                            f"not serve {WORKLOADS}.{KUEUE_GROUP}/{KUEUE_VERSION}: install Kueue (docs/kueue.md) or "
                            f"remove the label", warning=True))
    if job.status.phase in ("Succeeded", "Failed"):
        return Queue(None)  # an ended job is no longer queued: nothing to gate (its Workload: ``finish``)
    if read.workload is None:
        prio: tuple[str, int] | None = None
        if read.priority_class:
            if read.priority is None:
                return Queue(queued("PriorityClassNotFound", f"label {PRIORITY_LABEL}={read.priority_class}: no "
                                    f"WorkloadPriorityClass {read.priority_class}", warning=True))
            prio = (read.priority_class, read.priority)
        return Queue(gate(job, read.queue, None, {}, now), (WorkloadOp(
            "create", name, build_workload(job, read.queue, prio),
            log=f"created Workload {name} in LocalQueue {read.queue}"),))
    wl = parse_workload(read.workload)
    why = needs_new_workload(job, wl)
    if why is not None:
        return Queue(queued("WorkloadReplaced", f"Workload {name} replaced: {why}"),
                     (WorkloadOp("delete", name, requeue_after=1.0),))
    if wl.queue != read.queue and not wl.quota_reserved:
        return Queue(queued("Pending", f"moved to LocalQueue {ns}/{read.queue}"),
                     (WorkloadOp("patch", name, {"spec": {"queueName": read.queue}}),))
    g = gate(job, read.queue, wl, read.flavors, now)
    ops = []
    release = release_patch(read.workload, now) if g.release and not pods else None
    if release is not None:
        msg = f"every pod is gone: quota of Workload {name} given back to Kueue"
        ops.append(WorkloadOp("status", name, release, log=msg, event=Event("QuotaReleased", msg),
                              conflict_requeue=0.5))
    value = checkpoint_annotation(job)
    if value is not None and wl.checkpoint != value:
        ops.append(WorkloadOp("patch", name, {"metadata": {"annotations": {ANNOTATION_CHECKPOINT: value}}}))
    return Queue(g, tuple(ops), checkpoint_annotations(job, pods))


def finish(job: TrainingJob, read: Read, phase: str | None, now: datetime) -> WorkloadOp | None:
    """The Workload's ``Finished`` write once the job ended (``phase``: its phase after this pass's status
    write), so Kueue frees the quota in the pass that ends the job; None while it runs or when already done."""
    if phase not in ("Succeeded", "Failed") or read.workload is None:
        return None
    patch = finish_patch(read.workload, phase, now)
    if patch is None:
        return None
    name = workload_name(job.name, job.uid)
    return WorkloadOp("status", name, patch, log=f"{phase}: Workload {name} finished")


def checkpoint_annotations(job: TrainingJob, pods: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The live pods (pod name -> annotations) that lack the job's current ``reprieve.dev/last-checkpoint``."""
    value = checkpoint_annotation(job)
    if value is None:
        return {}
    out = {}
    for p in pods:
        meta = p.get("metadata") or {}
        if not meta.get("deletionTimestamp") and (meta.get("annotations") or {}).get(ANNOTATION_CHECKPOINT) != value:
            out[str(meta.get("name"))] = {ANNOTATION_CHECKPOINT: value}
    return out


def refused(name: str, message: str) -> Gate:
    """The gate of a job whose Workload the API server (Kueue's webhook) refused to create."""
    return queued("WorkloadRefused", f"the API server (Kueue's webhook) refused Workload {name}: {message}",
                  warning=True)
