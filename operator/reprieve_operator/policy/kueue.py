"""Kueue, decided purely: the Workload a queued TrainingJob owns, what Kueue's answer lets the job do now
(:func:`gate`), the notice an eviction gives the gang, and the status patch that gives the quota back.

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
from .restart import Condition
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
        return queued("Pending", f"waiting in {where}: {why}", warning=unfit(wl.pending))

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


def unfit(pending: str) -> bool:
    """Kueue keeps the Workload pending because no flavor can run the template (not for want of quota: a
    message that also names insufficient quota may clear by itself)."""
    return any(w in pending for w in UNFIT) and "insufficient quota" not in pending


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


def notice_annotation(g: Gate, attempt: int) -> str | None:
    """The ``reprieve.dev/notice`` value an eviction gives the pods of ``attempt`` (docs/contract.md)."""
    if g.notice is None or g.deadline is None:
        return None
    return json.dumps({"id": g.notice_id, "reason": NOTICE_REASON, "deadline": rfc3339(g.deadline),
                       "observedAt": rfc3339(g.notice.since), "attempt": attempt,
                       "message": f"{g.notice.reason}: {g.notice.message}"[:500]}, separators=(",", ":"))


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


def live_pods(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Names of the pods that still hold resources (not yet gone from the API)."""
    return sorted(str((p.get("metadata") or {}).get("name")) for p in pods)
