"""A queued TrainingJob's Workload (``kueue.x-k8s.io/v1beta2``), purely: its name and pod sets, the body the
operator creates (:func:`build_workload`), what the policy reads of one (:func:`parse_workload`), and the status
patches Kueue's own job reconciler writes for its jobs: the quota given back after an eviction
(:func:`release_patch`) and ``Finished`` (:func:`finish_patch`). What to do with them is ``policy.kueue``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..models import GROUP, KIND, VERSION, TrainingJob
from .times import parse_time, rfc3339

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
WORKLOADS, FLAVORS, PRIORITY_CLASSES = "workloads", "resourceflavors", "workloadpriorityclasses"
FRAMEWORK = f"{KIND}.{VERSION}.{GROUP}"  # Kueue's integrations.externalFrameworks entry
ANNOTATION_CHECKPOINT = "reprieve.dev/last-checkpoint"  # on the Workload and the pods (docs/contract.toml)
WORKERS, SPARES = "workers", "spares"  # the Workload's pod sets
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def workload_name(job: str, uid: str) -> str:
    """The Workload of a job: stable for the job's life, new for a job of the same name created again."""
    return f"trainingjob-{job}-{uid[:5]}"


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
