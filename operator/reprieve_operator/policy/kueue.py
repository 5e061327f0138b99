"""Kueue, decided purely: the Workload a queued TrainingJob owns, what Kueue's answer lets the job do now
(:func:`gate`), the Workload operation a pass carries out (:func:`decide_queue`: create, replace, move, give the
quota back, publish the last checkpoint; :func:`finish` once the job ended), and the notice an eviction gives the
gang (:func:`eviction_notice`, delivered by ``policy.notice``'s rule like a node's). ``kueue.py`` only reads what
:class:`Read` holds and carries out what this module decided (``reconcile.apply_outcome``).

The integration is Kueue's external-framework path (``docs/kueue.md``): the operator owns one ``Workload`` per job
(``kueue.x-k8s.io/v1beta2``), as Kueue's own job reconciler does for a batch Job, and Kueue admits or evicts it.

* No Workload yet, or one without quota: the job is **held** (no attempt starts), condition ``Queued=True`` with
  Kueue's own message (``Pending``: the LocalQueue, ClusterQueue and why it waits).
* Admitted (``Admitted=True``, not evicted): the job runs; its pods get the node labels and tolerations of the
  flavors the admission assigned (``admitted_template``).
* Evicted while it holds quota (preempted, reclaimed, deactivated): the running gang gets a notice
  (``kueue-preemption``, deadline = eviction + ``preemption.noticeSeconds["kueue-preemption"]``, default
  :data:`DEFAULT_NOTICE_SECONDS`), saves and exits; only once no pod is left does the operator clear the admission
  (:func:`release_patch`: Kueue's own ``UnsetQuotaReservationWithCondition``), and only then is the quota free.
  A gang still running at the deadline is stopped (deleted: SIGTERM, the runtime's last-resort save).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..models import GROUP, KIND, KUEUE_NOTICE, VERSION, TrainingJob
from .events import Event
from .restart import Condition
from .signals import Notice
from .times import parse_time, rfc3339

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
WORKLOADS, FLAVORS, PRIORITY_CLASSES = "workloads", "resourceflavors", "workloadpriorityclasses"
FRAMEWORK = f"{KIND}.{VERSION}.{GROUP}"  # Kueue's integrations.externalFrameworks entry
NOTICE_REASON = KUEUE_NOTICE  # the notice's reason, and its key in spec.preemption.noticeSeconds
DEFAULT_NOTICE_SECONDS = 60
ANNOTATION_CHECKPOINT = "reprieve.dev/last-checkpoint"  # on the Workload and the pods (docs/contract.toml)
WORKERS, SPARES = "workers", "spares"  # the Workload's pod sets
QUEUED = "Queued"  # the job's condition type
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def workload_name(job: str, uid: str) -> str:
    """The Workload of a job: stable for the job's life, new for a job of the same name created again."""
    return f"trainingjob-{job}-{uid[:5]}"


def notice_seconds(job: TrainingJob) -> int:
    return int(job.spec.preemption.notice_seconds.get(NOTICE_REASON, DEFAULT_NOTICE_SECONDS))


def pod_sets(job: TrainingJob) -> list[dict[str, Any]]:
    """The pod sets Kueue counts: every worker, and every spare (a spare holds a node's resources while it waits,
    so the quota must count it: ``docs/kueue.md``, "Spares")."""
    tpl = job.spec.template
    template = {"metadata": {k: v for k, v in (tpl.get("metadata") or {}).items() if k in ("labels", "annotations")},
                "spec": tpl.get("spec") or {}}
    sets = [{"name": WORKERS, "count": job.spec.replicas, "template": template}]
    if job.spec.spares:
        sets.append({"name": SPARES, "count": job.spec.spares, "template": template})
    return sets


def build_workload(job: TrainingJob, queue: str, priority: tuple[str, int] | None = None) -> dict[str, Any]:
    """The Workload the operator creates for ``job`` in LocalQueue ``queue`` (``priority``: the
    WorkloadPriorityClass named by the job's ``kueue.x-k8s.io/priority-class`` label, and its value)."""
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets(job)}
    if priority is not None:
        spec["priorityClassRef"] = {"group": KUEUE_GROUP, "kind": "WorkloadPriorityClass", "name": priority[0]}
        spec["priority"] = priority[1]
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "Workload",
        "metadata": {
            "name": workload_name(job.name, job.uid), "namespace": job.namespace,
            "labels": {"reprieve.dev/job-name": job.name, "kueue.x-k8s.io/job-uid": job.uid},
            "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": job.name,
                                 "uid": job.uid, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class Eviction:
    reason: str  # Kueue's: Preempted, Deactivated, ClusterQueueStopped, ...
    message: str
    since: datetime


@dataclass(frozen=True)
class Workload:
    """A Workload as the policy needs it (:func:`parse_workload`)."""

    name: str
    queue: str
    counts: Mapping[str, int]  # pod set -> count, as the Workload says
    quota_reserved: bool = False
    admitted: bool = False
    cluster_queue: str | None = None
    flavors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # pod set -> flavor names assigned
    evicted: Eviction | None = None
    pending: str = ""  # why it waits (QuotaReserved=False message, Kueue's own words; no condition yet: not evaluated)
    finished: str | None = None  # the Finished condition's message, once Kueue (or we) finished it
    checkpoint: str | None = None  # the current ANNOTATION_CHECKPOINT value


def _cond(body: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c  # type: ignore[no-any-return]
    return None


def _true(c: Mapping[str, Any] | None) -> bool:
    return c is not None and c.get("status") == "True"


def parse_workload(body: Mapping[str, Any]) -> Workload:
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    admission = status.get("admission") or {}
    flavors = {str(a.get("name")): tuple(sorted(set((a.get("flavors") or {}).values())))
               for a in admission.get("podSetAssignments") or []}
    ev = _cond(body, "Evicted")
    evicted = None
    if _true(ev):
        assert ev is not None
        evicted = Eviction(str(ev.get("reason") or ""), str(ev.get("message") or ""),
                           parse_time(ev.get("lastTransitionTime")) or EPOCH)
    qr, fin = _cond(body, "QuotaReserved"), _cond(body, "Finished")
    return Workload(
        name=str(meta.get("name")), queue=str(spec.get("queueName") or ""),
        counts={str(p.get("name")): int(p.get("count") or 0) for p in spec.get("podSets") or []},
        quota_reserved=_true(qr), admitted=_true(_cond(body, "Admitted")),
        cluster_queue=admission.get("clusterQueue"), flavors=flavors, evicted=evicted,
        pending=("" if _true(qr) else str(qr.get("message") or "") if qr is not None
                 else "not yet evaluated by Kueue"),
        finished=str((fin or {}).get("message") or "finished") if _true(fin) else None,
        checkpoint=(meta.get("annotations") or {}).get(ANNOTATION_CHECKPOINT))


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


def release_patch(body: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The Workload status patch that gives an evicted Workload's quota back once the gang is gone: what Kueue's
    job reconciler does for its own jobs (``QuotaReserved=False/Pending``, ``Admitted=False``, ``Requeued``,
    ``admission`` cleared). None when there is nothing to give back. Carries ``resourceVersion``: a Workload that
    changed meanwhile is read again, never overwritten."""
    wl = parse_workload(body)
    if wl.evicted is None or not wl.quota_reserved:
        return None
    ev, ts = wl.evicted, rfc3339(now)
    gen = (body.get("metadata") or {}).get("generation")
    requeued = ev.reason in ("Preempted", "NodeFailures")
    new = {
        "QuotaReserved": {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": ev.message},
        "Admitted": {"type": "Admitted", "status": "False", "reason": "NoReservation",
                     "message": "The workload has no reservation"},
        "Requeued": {"type": "Requeued", "status": "True" if requeued else "False", "reason": ev.reason,
                     "message": ev.message},
    }
    conds = []
    for c in (body.get("status") or {}).get("conditions") or []:
        repl = new.pop(c.get("type"), None)
        if repl is None:
            conds.append(c)
            continue
        same = c.get("status") == repl["status"]
        conds.append({**repl, "lastTransitionTime": c.get("lastTransitionTime") if same else ts,
                      "observedGeneration": gen})
    conds += [{**c, "lastTransitionTime": ts, "observedGeneration": gen} for c in new.values()]
    for c in conds:
        if c.get("observedGeneration") is None:
            c.pop("observedGeneration", None)
    return {"metadata": {"resourceVersion": (body.get("metadata") or {}).get("resourceVersion")},
            "status": {"conditions": conds, "admission": None}}


def finish_patch(body: Mapping[str, Any], phase: str, now: datetime) -> dict[str, Any] | None:
    """The Workload status patch of a job that ended (``Succeeded``/``Failed``): ``Finished=True``, as Kueue's job
    reconciler writes it, so Kueue frees the quota. None when it says so already."""
    if parse_workload(body).finished is not None:
        return None
    conds = [c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") != "Finished"]
    msg = "Job finished successfully" if phase == "Succeeded" else "Job failed"
    conds.append({"type": "Finished", "status": "True", "reason": phase, "message": msg,
                  "lastTransitionTime": rfc3339(now)})
    return {"metadata": {"resourceVersion": (body.get("metadata") or {}).get("resourceVersion")},
            "status": {"conditions": conds}}


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
