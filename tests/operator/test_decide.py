"""decide(view) -> Outcome: one reconcile's whole outcome, both restart modes, as a table.

Each row is a situation (the job's status, its pods as the cache holds them, the nodes) and what the outcome
must say: the status written before anything destructive (and its Event and counter), the pods created, the
Events after each step, what is force-deleted and deleted, the assignment, the final status patch and the
requeue delay. The shell (``reconcile.apply_outcome``) only executes these in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.decide import WAIT_SECONDS, Counter, View, decide
from reprieve_operator.policy.events import Event
from reprieve_operator.policy.inplace import Assignment
from reprieve_operator.policy.kueue import Read
from reprieve_operator.policy.views import GonePod, compact_pod

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC)
RUN = {"phase": "Running", "attempt": 1, "attemptStartTime": "2026-11-24T05:00:00Z", "ready": "2/2",
       "replicas": 2, "selector": "reprieve.dev/job-name=llama", "startTime": "2026-11-24T05:00:00Z",
       "restartMode": "Recreate"}


def pod(name: str, index: int, attempt: int = 1, phase: str = "Running", code: int | None = None,
        node: str | None = None, role: str | None = None, deleting: bool = False, ip: str | None = "10.0.0.1",
        annotations: dict[str, Any] | None = None, created: str = "2026-11-24T05:00:00Z") -> dict[str, Any]:
    labels = {"reprieve.dev/job-name": "llama", "reprieve.dev/attempt": str(attempt)}
    if index >= 0:
        labels["reprieve.dev/replica-index"] = str(index)
    if role:
        labels["reprieve.dev/role"] = role
    status: dict[str, Any] = {"phase": phase, "podIP": ip}
    if code is not None:
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": code}}}]
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": labels, "creationTimestamp": created,
                            "annotations": {k: json.dumps(v) for k, v in (annotations or {}).items()}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T05:59:00Z"
    return compact_pod({"metadata": meta, "spec": {"nodeName": node or f"n-{name}"}, "status": status})


def job(status: dict[str, Any] | None = None, **spec: Any) -> Any:
    spec.setdefault("restartMode", "Recreate")  # the rows say which mode; the default is tested apart
    body = make_job(name="llama", namespace="ml", **spec)
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "train.py"]
    return body.with_status(**(status or {})).model()


def nodes(*pods: dict[str, Any], extra: tuple[str, ...] = ()) -> set[str]:
    return {p["spec"].get("nodeName") for p in pods} | set(extra)


def exit_report(attempt: int, code: int) -> dict[str, Any]:
    return {"reprieve.dev/exit": {"attempt": attempt, "code": code, "time": "2026-11-24T05:59:59Z"}}


@dataclass
class Row:
    view: View
    record: dict[str, Any] | None = None  # keys the crash-safety patch must hold (None: no record)
    record_event: Event | None = None
    counter: Counter | None = None
    create: int = 0
    dry_run: bool = False
    created_event: str | None = None  # words in the AttemptStarted Event after creating
    force_delete: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    assign: int | None = None  # the attempt assigned
    assigned_event: str | None = None
    assign_first: bool = False  # written right after the record, before creates and deletes
    status: dict[str, Any] = field(default_factory=dict)  # keys the final patch must hold
    status_events: tuple[str, ...] = ()  # their reasons
    requeue: float | None = None
    look: frozenset[str] = frozenset()
    look_also: frozenset[str] = frozenset()
    placement: bool = False
    workload: tuple[str, ...] = ()  # the Workload writes before the status, by verb (Kueue)
    finish: bool = False  # the Workload finished after the status (Kueue)
    annotate: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pod -> the annotations it is given


def _view(j: Any, pods: list[dict[str, Any]], **kw: Any) -> View:
    kw.setdefault("known_nodes", nodes(*pods))
    kw.setdefault("placed", True)
    kw.setdefault("looked", True)
    return View(job=j, pods=pods, now=NOW, **kw)


P0, P1 = pod("llama-0", 0), pod("llama-1", 1)


def _gone_restart(gone_attempt: int, doomed: str, cause: str) -> Row:
    """llama-0 gone (its pod of ``gone_attempt`` last seen on n-llama-0), ``doomed`` the node with an open notice:
    the restart is recorded as ``cause``, llama-1 deleted."""
    view = _view(job(RUN), [P1], gone=(GonePod("llama-0", "n-llama-0", 0, gone_attempt),), doomed={doomed})
    counts = {"preemption": 0, "failure": 0, "disruption": 0, cause: 1}
    return Row(view, record={"phase": "Restarting", "restarts": counts},
               record_event=Event("GangRestart", "", "Normal" if cause == "preemption" else "Warning"),
               counter=Counter("restart", cause), delete=("llama-1",), requeue=WAIT_SECONDS)
IGNORE_KILL = {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}}
ASSIGNED = Assignment(1, {"llama-0": 0, "llama-1": 1}, "10.0.0.1:8476")
IP_RUN = {**RUN}

# -- Kueue: what a queued job's Workload, as read, leads to ------------------------------------------------------

def cond(type_: str, status: bool, reason: str = "", message: str = "", at: str = "2026-11-24T05:00:00Z") -> dict:
    return {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": at}


def workload(*conds: dict[str, Any], counts: dict[str, int] | None = None, queue: str = "team",
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conds)}
    if any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in conds):
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "workers", "flavors": {"cpu": "default"}, "count": 2}]}
    return {"metadata": {"name": "trainingjob-llama-uid-l", "namespace": "ml", "resourceVersion": "7",
                         "annotations": annotations or {}},
            "spec": {"queueName": queue, "podSets": [{"name": n, "count": c}
                                                     for n, c in (counts or {"workers": 2}).items()]},
            "status": status}


EVICTED_AT = "2026-11-24T05:59:50Z"
WL_PENDING = workload(cond("QuotaReserved", False, "Pending", "couldn't assign flavors to pod set workers: "
                                                              "insufficient quota for cpu in flavor default"))
WL_TOO_BIG = workload(cond("QuotaReserved", False, "Pending", "couldn't assign flavors to pod set spares: "
                           "insufficient quota for cpu in flavor default, previously considered podsets requests (2) "
                           "+ current podset request (1) > maximum capacity (2)"), counts={"workers": 2, "spares": 1})
WL_ADMITTED = workload(cond("QuotaReserved", True, "QuotaReserved"), cond("Admitted", True, "Admitted"))
WL_EVICTED = workload(cond("QuotaReserved", True, "QuotaReserved"), cond("Admitted", True, "Admitted"),
                      cond("Evicted", True, "Preempted", "Preempted to accommodate a higher priority", EVICTED_AT))
WL_RELEASED = workload(cond("QuotaReserved", False, "Pending", "Preempted"),
                       cond("Evicted", True, "Preempted", "Preempted", EVICTED_AT))
DEFAULT_FLAVOR = {"default": {"spec": {}}}
QUEUED_COND = {"type": "Queued", "status": "True", "reason": "Pending", "message": "waiting",
               "lastTransitionTime": "2026-11-24T05:00:00Z"}
ADMITTED_RUN = {**RUN, "conditions": [{"type": "Queued", "status": "False", "reason": "Admitted",
                                       "message": "admitted by ClusterQueue cq on flavor(s) default",
                                       "lastTransitionTime": "2026-11-24T05:00:00Z"}]}
EXITED_42 = [pod("llama-0", 0, phase="Failed", code=42), pod("llama-1", 1, phase="Failed", code=42)]
NOTICE_KEYS = ("reprieve.dev/notice",)


def queued(wl: dict[str, Any] | None, *, flavors: dict[str, Any] | None = None, **kw: Any) -> Read:
    return Read("team", workload=wl, flavors=DEFAULT_FLAVOR if flavors is None and wl is not None else flavors or {},
                **kw)


KUEUE_ROWS = {
    "queued, no Workload yet: held, the Workload created before the status that says so": Row(
        _view(job(), [], kueue=queued(None)), workload=("create",),
        status={"phase": "Suspended"}, status_events=("WorkloadCreating",)),
    "queued, its WorkloadPriorityClass missing: held with a Warning, nothing created": Row(
        _view(job(), [], kueue=queued(None, priority_class="low")),
        status={"phase": "Suspended"}, status_events=("PriorityClassNotFound",)),
    "queued, Kueue not installed: held with a Warning, nothing created": Row(
        _view(job(), [], kueue=Read("team", served=False)),
        status={"phase": "Suspended"}, status_events=("KueueNotInstalled",)),
    "queued, waiting for quota: held, Kueue's words": Row(
        _view(job(), [], kueue=queued(WL_PENDING)), status={"phase": "Suspended"}, status_events=("Pending",)),
    "queued, the spares' pod set larger than the ClusterQueue can ever hold: a Warning that says what to change": Row(
        _view(job(restartMode="InPlace", spares=1), [], kueue=queued(WL_TOO_BIG)),
        status={"phase": "Suspended"}, status_events=("Pending",)),
    "spares edited while queued: the Workload is replaced": Row(
        _view(job(restartMode="InPlace", spares=1), [], kueue=queued(WL_PENDING)), workload=("delete",),
        status={"phase": "Suspended"}, status_events=("WorkloadReplaced",)),
    "the queue label edited while queued: the Workload moves": Row(
        _view(job(), [], kueue=queued(workload(queue="old"))), workload=("patch",),
        status={"phase": "Suspended"}, status_events=("Pending",)),
    "the queue label removed: the Workload is deleted, the job runs unqueued": Row(
        _view(job({"conditions": [QUEUED_COND]}), [], kueue=Read(None)), workload=("delete",), create=2,
        dry_run=True, created_event="attempt 1: created 2 worker pod(s)", status={"phase": "Pending"}),
    "admitted: the gang starts, the condition's Event": Row(
        _view(job(), [], kueue=queued(WL_ADMITTED)), create=2, dry_run=True,
        created_event="attempt 1: created 2 worker pod(s)", status={"phase": "Pending", "attempt": 1},
        status_events=("Admitted",)),
    "admitted, a commit: the last checkpoint on the Workload and the pods": Row(
        _view(job({**ADMITTED_RUN, "lastCheckpointStep": 100, "lastCheckpointTime": "2026-11-24T05:59:00Z"}),
              [P0, P1], kueue=queued(WL_ADMITTED)), workload=("patch",),
        annotate={"llama-0": ("reprieve.dev/last-checkpoint",), "llama-1": ("reprieve.dev/last-checkpoint",)}),
    "evicted, the gang runs: the notice to every pod, lastNotice, one PreemptionNotice; looked at at the deadline": Row(
        _view(job(ADMITTED_RUN), [P0, P1], kueue=queued(WL_EVICTED)),
        annotate={"llama-0": NOTICE_KEYS, "llama-1": NOTICE_KEYS},
        status={"phase": "Preempting", "lastNotice": {
            "id": "kueue-preemption/trainingjob-llama-uid-l/1795499990", "node": "", "reason": "kueue-preemption",
            "deadline": "2026-11-24T06:00:50Z", "observedAt": EVICTED_AT, "attempt": 1,
            "deliveredAt": "2026-11-24T06:00:00Z"}},
        status_events=("Evicted", "PreemptionNotice"), requeue=50.0),
    # issue #46, item 12: a Kueue preemption and resume is a preemption restart, counted once
    "evicted, the gang exited on its notice: a preemption restart recorded, held, the pods go": Row(
        _view(job({**ADMITTED_RUN, "lastNotice": {"id": "x", "reason": "kueue-preemption", "node": "",
                                                  "deadline": "2026-11-24T06:00:50Z", "observedAt": EVICTED_AT,
                                                  "attempt": 1}}),
              EXITED_42, kueue=queued(WL_EVICTED)),
        record={"phase": "Suspended", "restarts": {"preemption": 1, "failure": 0, "disruption": 0},
                "restartCount": 1},
        record_event=Event("GangRestart", "", "Normal"), counter=Counter("restart", "preemption"),
        delete=("llama-0", "llama-1"), requeue=WAIT_SECONDS, status_events=("Evicted",)),
    "evicted past restartPolicy.maxPreemptionRestarts: Failed, and its Workload finished in the same pass": Row(
        _view(job({**ADMITTED_RUN, "restarts": {"preemption": 1}}, restartPolicy={"maxPreemptionRestarts": 1}),
              EXITED_42, kueue=queued(WL_EVICTED)),
        record={"phase": "Failed", "restarts": {"preemption": 2, "failure": 0, "disruption": 0}},
        record_event=Event("TooManyPreemptions", "", "Warning"), counter=Counter("failed", "TooManyPreemptions"),
        finish=True),
    "evicted and every pod gone: the quota given back": Row(
        _view(job({**ADMITTED_RUN, "phase": "Suspended"}), [], kueue=queued(WL_EVICTED)), workload=("status",),
        status_events=("Evicted",)),
    "held after an eviction, admitted again: the next attempt, no second count": Row(
        _view(job({**RUN, "phase": "Suspended", "restarts": {"preemption": 1}, "conditions": [
            {**QUEUED_COND, "reason": "Evicted", "message": "Kueue evicted Workload trainingjob-llama-uid-l"}]}), [],
              kueue=queued(WL_ADMITTED)),
        create=2, dry_run=True, created_event="attempt 2: created 2 worker pod(s)",
        status={"phase": "Pending", "attempt": 2}, status_events=("Admitted",)),
    # issue #46, item 12: the pass that ends the job finishes its Workload (no later pass need come)
    "admitted, all exit 0: Succeeded, and the Workload finished in the same pass": Row(
        _view(job(ADMITTED_RUN), [pod("llama-0", 0, phase="Succeeded", code=0),
                                  pod("llama-1", 1, phase="Succeeded", code=0)], kueue=queued(WL_ADMITTED)),
        status={"phase": "Succeeded"}, status_events=("Succeeded",), finish=True),
    "ended before, its Workload not finished yet: finished now": Row(
        _view(job({**ADMITTED_RUN, "phase": "Succeeded"}), [], kueue=queued(WL_ADMITTED)), finish=True),
    "ended, its Workload finished: nothing": Row(
        _view(job({**ADMITTED_RUN, "phase": "Failed"}), [],
              kueue=queued(workload(cond("Finished", True, "Failed", "Job failed"))))),
}

ROWS = {
    "new job: pods created after a dry run, AttemptStarted, Pending": Row(
        _view(job(), []), create=2, dry_run=True, created_event="attempt 1: created 2 worker pod(s)",
        status={"phase": "Pending", "attempt": 1}),
    "new job, placement not computed yet: ask for it": Row(
        _view(job(), [], placed=False), placement=True),
    "running: nothing to do, nothing to write": Row(_view(job(RUN), [P0, P1])),
    "all exit 42: record first (counted once), GangRestart, delete all, wait for them": Row(
        _view(job(RUN), [pod("llama-0", 0, phase="Failed", code=42), pod("llama-1", 1, phase="Failed", code=42)]),
        record={"phase": "Restarting", "restarts": {"preemption": 1, "failure": 0, "disruption": 0},
                "restartCount": 1, "restartingFrom": 1},
        record_event=Event("GangRestart", "", "Normal"), counter=Counter("restart", "preemption"),
        delete=("llama-0", "llama-1"), requeue=WAIT_SECONDS),
    "a worker failed past the budget: record Failed, TooManyFailures Warning": Row(
        _view(job({**RUN, "restarts": {"failure": 3}}), [pod("llama-0", 0, phase="Failed", code=1), P1]),
        record={"phase": "Failed"}, record_event=Event("TooManyFailures", "", "Warning"),
        counter=Counter("failed", "TooManyFailures"), delete=("llama-1",)),
    "a lost pod, its node not read yet: read it first": Row(
        _view(job(RUN), [pod("llama-0", 0, phase="Failed"), P1], looked=False),
        look=frozenset({"n-llama-0"})),
    # A NoExecute taint evicts at once: the pod can be gone (deleted and confirmed) before a reconcile sees it
    # deleting; the node it ran on, read fresh, decides (stale tombstones of other attempts decide nothing).
    "a pod gone before it was seen deleting, its node not read yet: read it first": Row(
        _view(job(RUN), [P1], looked=False, gone=(GonePod("llama-0", "n-llama-0", 0, 1),)),
        look=frozenset({"n-llama-0"})),
    "a pod gone from a node with an open notice: a preemption": _gone_restart(1, "n-llama-0", "preemption"),
    "a pod gone from a node without a notice: a disruption": _gone_restart(1, "n-other", "disruption"),
    "a pod gone, but its tombstone is of the attempt before: a disruption":
        _gone_restart(0, "n-llama-0", "disruption"),
    "old pods gone, restarting: the next attempt avoiding the doomed node": Row(
        _view(job({**RUN, "phase": "Restarting", "restartingFrom": 1}), [], avoid=("n-bad",)),
        create=2, dry_run=True, created_event="avoiding n-bad",
        status={"attempt": 2, "phase": "Pending"}),
    "a pod on a deleted node: force-deleted (no kubelet will confirm)": Row(
        _view(job(RUN), [P0, P1], known_nodes={"n-llama-1"}),
        record={"phase": "Restarting"}, record_event=Event("GangRestart", "", "Warning"),
        counter=Counter("restart", "disruption"), force_delete=("llama-0",), delete=("llama-1",),
        requeue=WAIT_SECONDS),
    "a rapid restart: backoff, looked at again when it runs out": Row(
        _view(job({**RUN, "phase": "Restarting", "restartingFrom": 1, "rapidRestarts": 1,
                   "nextAttemptTime": "2026-11-24T06:00:10Z"}), []),
        status={"replicas": 0}, requeue=10.0),
    "a commit reported: lastCheckpointStep, CheckpointCommitted Event": Row(
        _view(job(RUN), [pod("llama-0", 0, annotations={"reprieve.dev/progress": {
            "attempt": 1, "step": 120, "committedStep": 100, "time": "2026-11-24T05:59:58Z"}}), P1]),
        status={"step": 120, "lastCheckpointStep": 100}, status_events=("CheckpointCommitted",)),
    "a commit within the throttle: no second Event": Row(
        _view(job(RUN), [pod("llama-0", 0, annotations={"reprieve.dev/progress": {
            "attempt": 1, "step": 120, "committedStep": 100, "time": "2026-11-24T05:59:58Z"}}), P1],
            last_commit_event=NOW.timestamp() - 10),
        status={"lastCheckpointStep": 100}),
    "all exit 0: Succeeded with its Event": Row(
        _view(job(RUN), [pod("llama-0", 0, phase="Succeeded", code=0), pod("llama-1", 1, phase="Succeeded", code=0)]),
        status={"phase": "Succeeded"}, status_events=("Succeeded",)),
    # In place
    "in place, new job: workers and a spare, dry run, assignment 1": Row(
        _view(job(restartMode="InPlace", spares=1), []), create=3, dry_run=True,
        created_event="attempt 1: created 3 worker pod(s)", assign=1, status={"phase": "Pending", "attempt": 1}),
    "in place, both exit 42: record, keep both pods, assign attempt 2 at once": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace"), [pod("llama-0", 0, annotations=exit_report(1, 42)),
                                                pod("llama-1", 1, annotations=exit_report(1, 42))],
              assignment=ASSIGNED),
        record={"phase": "Restarting", "restarts": {"preemption": 1, "failure": 0, "disruption": 0}},
        record_event=Event("GangRestart", "", "Normal"), counter=Counter("restart", "preemption"),
        assign=2, assigned_event="attempt 2: 2 worker(s) restarted in place", assign_first=True,
        status={"phase": "Running", "attempt": 2, "lastRestart": {"attempt": 2, "inPlace": 2, "replaced": []}}),
    "in place, worker on a deleted node with a ready spare: the spare takes over, the orphan is force-deleted": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace", spares=1),
              [pod("llama-0", 0, annotations=exit_report(1, 42)), pod("llama-1", 1),
               pod("llama-spare-a", -1, role="spare", ip="10.0.0.9")],
              assignment=ASSIGNED, known_nodes={"n-llama-0", "n-llama-spare-a"}),
        record={"restarts": {"preemption": 0, "failure": 0, "disruption": 1}},
        record_event=Event("GangRestart", "", "Warning"), counter=Counter("restart", "disruption"),
        create=1, force_delete=("llama-1",), assign=2, assigned_event="spare llama-spare-a takes over", assign_first=True,
        status={"attempt": 2, "spares": "0/1"}),
    # the assignment goes first only where it lists pods that exist (a spare taking over, above); a replacement pod
    # (no spare) has a generated name: its attempt is assigned in a later pass, once it exists
    "in place, worker on a deleted node, no spare: a replacement is created, not assigned yet": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace"),
              [pod("llama-0", 0, annotations=exit_report(1, 42)), pod("llama-1", 1)],
              assignment=ASSIGNED, known_nodes={"n-llama-0"}),
        record={"restarts": {"preemption": 0, "failure": 0, "disruption": 1}},
        record_event=Event("GangRestart", "", "Warning"), counter=Counter("restart", "disruption"),
        create=1, force_delete=("llama-1",)),
    "in place, a worker gone from a node with an open notice (never seen deleting): a preemption": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace"), [P1], assignment=ASSIGNED,
              gone=(GonePod("llama-0", "n-llama-0", 0, 1),), doomed={"n-llama-0"}),
        record={"restarts": {"preemption": 1, "failure": 0, "disruption": 0}},
        record_event=Event("GangRestart", "", "Normal"), counter=Counter("restart", "preemption"), create=1),
    "in place, an image without reprieve-supervisor: Failed at once, everything deleted, nothing created": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace", spares=1),
              [P0, {**P1, "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
                  "exitCode": 128, "reason": "StartError",
                  "message": 'exec: "reprieve-supervisor": executable file not found in $PATH'}}}]}, "_view": None}],
              assignment=ASSIGNED),
        record={"phase": "Failed"}, record_event=Event("SupervisorNotFound", "", "Warning"),
        counter=Counter("failed", "SupervisorNotFound"), delete=("llama-0", "llama-1")),
    # issue #25's soak: a SIGKILLed trainer's 137 under an Ignore rule is a disruption with no lost pod, so no node
    # to read: the restart is decided in this pass (asking to look at no node left it undecided until some node was
    # lost: 36 s later in the soak)
    "a SIGKILLed worker, exitCodeRules Ignore, no node to read: the disruption is recorded at once": Row(
        _view(job(RUN, restartPolicy={"exitCodeRules": [IGNORE_KILL]}),
              [pod("llama-0", 0, phase="Failed", code=137), P1], looked=False),
        record={"phase": "Restarting", "restarts": {"preemption": 0, "failure": 0, "disruption": 1}},
        record_event=Event("GangRestart", "", "Warning"), counter=Counter("restart", "disruption"),
        delete=("llama-0", "llama-1"), requeue=WAIT_SECONDS),
    "in place, a trainer SIGKILLed, exitCodeRules Ignore, no node to read: attempt 2 assigned at once": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace",
                  restartPolicy={"exitCodeRules": [IGNORE_KILL]}),
              [P0, pod("llama-1", 1, annotations=exit_report(1, 137))], assignment=ASSIGNED, looked=False),
        record={"phase": "Restarting", "restarts": {"preemption": 0, "failure": 0, "disruption": 1}},
        record_event=Event("GangRestart", "", "Warning"), counter=Counter("restart", "disruption"),
        assign=2, assigned_event="attempt 2: 2 worker(s) restarted in place", assign_first=True,
        status={"phase": "Running", "attempt": 2}),
    # Issue #46 (7): two nodes lost at once (a worker's and the spare's holding its memory-tier replica); the watch
    # said only the first was gone. Reading only that one kept the second's pod, and its loss 0.22 s later restarted
    # the gang again (two disruptions for one event): the nodes of the pods a restart would keep are read too.
    "in place, a worker's node lost: read it, then the nodes of the pods the restart would keep": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace", spares=1),
              [P0, P1, pod("llama-spare-a", -1, role="spare", ip="10.0.0.9")], assignment=ASSIGNED,
              known_nodes={"n-llama-0", "n-llama-spare-a"}, looked=False),
        look=frozenset({"n-llama-1"}), look_also=frozenset({"n-llama-0", "n-llama-spare-a"})),
    "in place, the spare's node found gone by that read too: one restart replaces both, counted once": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace", spares=1),
              [P0, P1, pod("llama-spare-a", -1, role="spare", ip="10.0.0.9")], assignment=ASSIGNED,
              known_nodes={"n-llama-0"}),
        record={"restarts": {"preemption": 0, "failure": 0, "disruption": 1}, "restartCount": 1},
        record_event=Event("GangRestart", "", "Warning"), counter=Counter("restart", "disruption"),
        create=2, force_delete=("llama-1", "llama-spare-a")),
    "in place, all exit 0: Succeeded, its Event, spares go": Row(
        _view(job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace", spares=1),
              [pod("llama-0", 0, annotations=exit_report(1, 0)), pod("llama-1", 1, annotations=exit_report(1, 0)),
               pod("llama-spare-a", -1, role="spare")], assignment=ASSIGNED),
        delete=("llama-spare-a",), status={"phase": "Succeeded"}, status_events=("Succeeded",)),
    **KUEUE_ROWS,
}


@pytest.mark.parametrize("name", list(ROWS))
def test_decide(name: str) -> None:
    row = ROWS[name]
    out = decide(row.view)
    assert (out.look_at_nodes, out.look_also, out.needs_placement) == (row.look, row.look_also, row.placement), out
    if row.look or row.placement:
        return
    if row.record is None:
        assert out.record is None and out.record_event is None and out.counter is None, out.record
    else:
        assert out.record is not None and {k: out.record.get(k) for k in row.record} == row.record, out.record
        assert out.record_event is not None and row.record_event is not None
        assert (out.record_event.reason, out.record_event.type) == (row.record_event.reason, row.record_event.type)
        assert out.counter == row.counter
    assert (len(out.create), out.dry_run) == (row.create, row.dry_run), [p["metadata"] for p in out.create]
    if row.created_event:
        assert out.created_event is not None and out.created_event.reason == "AttemptStarted"
        assert row.created_event in out.created_event.message, out.created_event
    else:
        assert out.created_event is None, out.created_event
    assert (out.force_delete, tuple(sorted(out.delete))) == (row.force_delete, row.delete)
    assert (out.assign.attempt if out.assign else None) == row.assign, out.assign
    assert out.assign_first == row.assign_first, out
    if row.assigned_event:
        assert out.assigned_event is not None and row.assigned_event in out.assigned_event.message, out.assigned_event
    else:
        assert out.assigned_event is None, out.assigned_event
    assert {k: out.status.get(k) for k in row.status} == row.status, out.status
    assert tuple(e.reason for e in out.status_events) == row.status_events, out.status_events
    assert out.requeue_after == pytest.approx(row.requeue) if row.requeue is not None else out.requeue_after is None
    assert tuple(op.verb for op in out.workload) == row.workload, out.workload
    assert (out.finish is not None) == row.finish, out.finish
    assert {n: tuple(a) for n, a in out.annotate.items()} == row.annotate, out.annotate


@pytest.mark.parametrize("name", list(ROWS))
def test_a_pass_that_asks_to_read_no_node_decides_as_if_it_had_read_them(name: str) -> None:
    """The shell reads the nodes an outcome names and decides again; an outcome that names none is carried out
    as it is. So before the nodes are read, an outcome either names some or is already the whole decision."""
    view = ROWS[name].view
    first = decide(replace(view, looked=False))
    assert first.look_at_nodes or first == decide(replace(view, looked=True)), first


def test_the_steps_after_a_record_see_the_recorded_status() -> None:
    """The final patch is decided on the job as it is once the record is written: a restart is counted in the
    record only, never again in the final patch."""
    row = ROWS["in place, both exit 42: record, keep both pods, assign attempt 2 at once"]
    out = decide(row.view)
    assert out.record is not None and "restarts" in out.record and "restarts" not in out.status
    assert out.job.status.restarts.preemption == 1 and out.job.status.phase == "Restarting"


def test_nothing_in_a_view_is_written_to() -> None:
    pods = [pod("llama-0", 0, phase="Failed", code=42), pod("llama-1", 1, phase="Failed", code=42)]
    before = json.dumps([{k: v for k, v in p.items() if k != "_view"} for p in pods], sort_keys=True)
    decide(_view(job(RUN), pods))
    assert json.dumps([{k: v for k, v in p.items() if k != "_view"} for p in pods], sort_keys=True) == before


def test_a_plan_that_waits_requeues_on_either_path() -> None:
    """The kopf handler no longer raises TemporaryError to wait for old pods: the plan carries the delay."""
    row = ROWS["all exit 42: record first (counted once), GangRestart, delete all, wait for them"]
    waiting = replace(row.view, job=decide(row.view).job)  # the next pass: recorded, old pods still there
    out = decide(waiting)
    assert out.record is None and out.plan.waiting and out.requeue_after == WAIT_SECONDS


@pytest.mark.parametrize("command,mode,effective", [
    (["python", "train.py"], None, "InPlace"),  # the default when the command can be wrapped
    (None, None, "Recreate"),  # the image's entrypoint cannot be wrapped
    (["python", "train.py"], "Recreate", "Recreate"),
    (["python", "train.py"], "InPlace", "InPlace"),
])
def test_the_restart_mode_in_effect_and_its_status(command: list[str] | None, mode: str | None,
                                                   effective: str) -> None:
    body = make_job(name="llama", namespace="ml", **({"restartMode": mode} if mode else {}))
    if command:
        body["spec"]["template"]["spec"]["containers"][0]["command"] = command
    j = body.model()
    assert j.spec.mode == effective
    out = decide(View(job=j, pods=[], now=NOW, known_nodes=set(), placed=True, looked=True))
    assert out.status["restartMode"] == effective
    assert (out.assign is not None) == (effective == "InPlace")  # in place: the first assignment is written


REFUSED_BEFORE = {"phase": "Pending", "conditions": [
    {"type": "PodsCreated", "status": "False", "reason": "QuotaExceeded", "message": "exceeded quota; try 2",
     "lastTransitionTime": "2026-11-24T05:50:00Z"}]}


@pytest.mark.parametrize("mode", ["Recreate", "InPlace"])
def test_once_the_pods_are_created_the_final_patch_says_so(mode: str) -> None:
    """A create refused before (PodsCreated=False) that succeeds now: the final patch, written only after the
    create, turns the condition True; no second status write."""
    out = decide(_view(job(REFUSED_BEFORE, restartMode=mode), []))
    assert len(out.create) == 2 and out.record is None
    conds = {c["type"]: c for c in out.status["conditions"]}
    assert (conds["PodsCreated"]["status"], conds["PodsCreated"]["reason"]) == ("True", "Created")
    assert conds["PodsCreated"]["message"] == "created 2 worker pod(s) of attempt 1"
    assert all(c.type != "PodsCreated" for c in out.plan.conditions)  # the plan itself says nothing of it


def test_a_job_never_refused_gets_no_pods_created_condition() -> None:
    out = decide(_view(job(), []))
    assert len(out.create) == 2 and "PodsCreated" not in {c["type"] for c in out.status.get("conditions", [])}


def test_the_progress_a_container_left_in_its_termination_message_counts_as_its_newest_report() -> None:
    """A job that ended while the API server was down: its last reports were refused, but the kubelet copies
    process 0's termination message into the pod's status once it can (docs/contract.md, "Progress"). The newest
    report wins, wherever it came from; a malformed one is skipped."""
    seen = {"attempt": 1, "step": 60, "committedStep": 59, "time": "2026-11-24T05:58:00Z"}
    left = {"attempt": 1, "step": 100, "committedStep": 99, "time": "2026-11-24T05:59:00Z"}

    def done(name: str, index: int, message: str) -> dict[str, Any]:
        p = pod(name, index, phase="Succeeded", annotations={"reprieve.dev/progress": seen} if index == 0 else None)
        p["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": 0,
                                                                                        "message": message}}}]
        return p

    pods = [done("llama-0", 0, json.dumps({"progress": left})), done("llama-1", 1, "{not json")]
    out = decide(_view(job(RUN), pods))
    assert out.status["phase"] == "Succeeded"
    assert (out.status["step"], out.status["lastCheckpointStep"]) == (100, 99), out.status
    older = [done("llama-0", 0, json.dumps({"progress": {**left, "step": 50, "committedStep": 39}}))]
    assert decide(_view(job(RUN), older)).status["lastCheckpointStep"] == 59  # the annotation's is newer


@pytest.mark.parametrize("mode", ["Recreate", "InPlace"])
def test_a_survivors_last_step_reaches_the_goodput_accounting(mode: str) -> None:
    """Process 0 hard-killed after reporting step 30: the survivor's termination message (Recreate) or its
    supervisor's exit report (in place) says the gang finished 49, and the open attempt's report is raised to it
    (docs/goodput.md), so its steps after 30 are counted lost, not restart gap, once the next attempt reports."""
    from reprieve_operator.policy.goodput import Report, fold

    t0 = datetime(2026, 11, 24, 5, 0, 0, tzinfo=UTC).timestamp()
    acc = fold(None, now=t0, new_attempt=1, report=Report(1, 30, t0 + 35, 0, t0 + 5, 1.0))
    assert acc is not None
    said = {"peerLost": [0], "attempt": 1, "lastStep": 49, "lastStepAt": t0 + 54}
    survivor = pod("llama-1", 1, phase="Failed", code=134)
    if mode == "Recreate":
        survivor["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps(said)
    else:
        survivor = pod("llama-1", 1, annotations={"reprieve.dev/exit": {**said, "code": 134,
                                                                        "time": "2026-11-24T05:00:55Z"}})
    pods = [pod("llama-0", 0, phase="Failed", code=137), survivor]
    status = {**RUN, "restartMode": mode, "goodput": {"accounting": acc.to_status()}}
    assignment = Assignment(1, {"llama-0": 0, "llama-1": 1}) if mode == "InPlace" else None
    out = decide(_view(job(status, restartMode=mode), pods, assignment=assignment))
    opened = out.status["goodput"]["accounting"]["open"]
    assert [(a["attempt"], a["report"]["step"], a["report"]["time"]) for a in opened if "report" in a] == \
        [(1, 49, t0 + 54)], out.status


def test_a_deleted_survivors_last_step_still_reaches_the_goodput_accounting() -> None:
    """Recreate: the restart deletes the survivor's pod, and the next attempt's pod takes its name, often before a
    reconcile read the survivor's termination message (CI: lost steps 4 where the step log said 23). The cache keeps
    what a deleted pod's final state said (``Cache.said_of``), and the accounting is raised to it all the same."""
    from reprieve_operator.cache import Cache
    from reprieve_operator.policy.goodput import Report, fold

    t0 = datetime(2026, 11, 24, 5, 0, 0, tzinfo=UTC).timestamp()
    acc = fold(None, now=t0, new_attempt=1, report=Report(1, 30, t0 + 35, 0, t0 + 5, 1.0))
    assert acc is not None
    said = {"peerLost": [0], "attempt": 1, "lastStep": 49, "lastStepAt": t0 + 54}
    survivor = pod("llama-1", 1, phase="Failed", code=134)
    survivor["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps(said)
    cache = Cache()
    cache.upsert_pod(survivor)
    cache.pod_gone(survivor)
    cache.upsert_pod(pod("llama-1", 1, attempt=2, phase="Pending"))  # the next attempt's pod of its name
    assert cache.said_of("ml", "llama") == ((1, 49, t0 + 54),)
    status = {**RUN, "goodput": {"accounting": acc.to_status()}}
    pods = [pod("llama-0", 0, phase="Failed", code=137)]
    assert "goodput" not in decide(_view(job(status), pods)).status  # nothing new without it: still step 30
    out = decide(_view(job(status), pods, said=cache.said_of("ml", "llama")))
    opened = out.status["goodput"]["accounting"]["open"]
    assert [(a["attempt"], a["report"]["step"]) for a in opened if "report" in a] == [(1, 49)], out.status


def test_a_workload_that_can_never_fit_says_what_to_change() -> None:
    out = decide(KUEUE_ROWS["queued, the spares' pod set larger than the ClusterQueue can ever hold: a Warning that "
                            "says what to change"].view)
    (ev,) = out.status_events
    assert ev.type == "Warning" and "> maximum capacity (2)" in ev.message, ev
    assert "lower spec.replicas (2) + spec.spares (1" in ev.message and "nominalQuota" in ev.message, ev


def test_an_eviction_notice_is_a_notice_like_a_nodes() -> None:
    """One kind of notice: the annotation a node's notice has, its Event named as ``policy.notice`` names one."""
    out = decide(KUEUE_ROWS["evicted, the gang runs: the notice to every pod, lastNotice, one PreemptionNotice; "
                            "looked at at the deadline"].view)
    value = json.loads(out.annotate["llama-0"]["reprieve.dev/notice"])
    assert value == {"id": "kueue-preemption/trainingjob-llama-uid-l/1795499990", "reason": "kueue-preemption",
                     "node": "", "deadline": "2026-11-24T06:00:50Z", "observedAt": EVICTED_AT, "attempt": 1}
    notice = out.status_events[-1]
    assert notice.reason == "PreemptionNotice" and notice.name is not None and ".notice-1-" in notice.name
    assert "save by 2026-11-24T06:00:50Z" in notice.message


def test_an_eviction_notice_goes_through_the_jobs_notice_object_as_a_nodes_does() -> None:
    """Issue #51: pods that watch ``<job>-notice`` hear an eviction's notice from its one write; only those that do
    not are annotated (and every pod is, if the write is refused: ``fanout.fallback`` in the shell); once the object
    carries the notice, nothing is written again."""
    watch = {"reprieve.dev/notice-watch": "llama-notice"}
    p0 = pod("llama-0", 0, annotations={})
    p1 = pod("llama-1", 1, annotations={})
    p0["metadata"]["annotations"] = dict(watch)  # the runtime's own value: a plain string, not JSON
    out = decide(_view(job(ADMITTED_RUN), [p0, p1], kueue=queued(WL_EVICTED)))
    w = out.notice_write
    assert w is not None and w.route.write_object and w.plan.annotate == ("llama-0", "llama-1"), w
    assert list(out.annotate) == ["llama-1"] and w.route.unwatched == ("llama-1",), out.annotate  # llama-0 watches
    assert json.loads(w.value)["reason"] == "kueue-preemption" and out.status["lastNotice"]["attempt"] == 1
    p1["metadata"]["annotations"] = dict(watch)
    both = decide(_view(job(ADMITTED_RUN), [p0, p1], kueue=queued(WL_EVICTED)))
    assert both.notice_write is not None and both.notice_write.route.write_object and not both.annotate
    again = decide(_view(job({**ADMITTED_RUN, **both.status}), [p0, p1], kueue=queued(WL_EVICTED),
                         notice_object=both.notice_write.value))
    assert again.notice_write is None and not again.annotate, again


def test_a_refused_workload_rewrites_only_the_queued_condition() -> None:
    from reprieve_operator.policy.decide import WorkloadRefused

    out = decide(KUEUE_ROWS["queued, no Workload yet: held, the Workload created before the status that says "
                            "so"].view)
    instead = WorkloadRefused("trainingjob-llama-uid-l", "admission webhook denied").instead(out, NOW)
    conds = {c["type"]: c for c in instead.status["conditions"]}
    assert (conds["Queued"]["reason"], instead.status["phase"]) == ("WorkloadRefused", "Suspended")
    assert [(e.reason, e.type) for e in instead.status_events] == [("WorkloadRefused", "Warning")]
    assert instead.workload == () and instead.create == ()


# -- Elastic: the shrink's outcome (docs/elastic-operator.md) ---------------------------------------------------------

def _unschedulable(p: dict[str, Any], since: str) -> dict[str, Any]:
    """``p`` Pending without a node, refused by the scheduler since ``since`` (what the cache keeps of it)."""
    raw = {"metadata": {k: v for k, v in p["metadata"].items() if k != "_view"}, "spec": {},
           "status": {"phase": "Pending", "conditions": [
               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": since,
                "message": "0/3 nodes are available: 3 Insufficient cpu."}]}}
    return compact_pod(raw)


FOUR = Assignment(1, {f"llama-{i}": i for i in range(4)}, "10.0.0.1:8476")
ELASTIC = {"minReplicas": 2, "unschedulableSeconds": 5}
RESTARTING_4 = {**RUN, "phase": "Restarting", "restartingFrom": 1, "restartMode": "InPlace", "ready": "3/4",
                "replicas": 4, "currentWorkers": 4, "desiredWorkers": 4,
                "goodput": {"accounting": {"open": [{"attempt": 1, "created": 1795496400.0, "workers": 4,
                                                     "desired": 4}]}}}


def test_a_shrink_writes_the_smaller_assignment_first_and_its_size_in_the_patch_that_records_the_attempt() -> None:
    probe = _unschedulable(pod("llama-1-xk2p9", 1, attempt=2), "2026-11-24T05:59:50Z")
    survivors = [pod(f"llama-{i}", i) for i in (0, 2, 3)]
    out = decide(_view(job(RESTARTING_4, replicas=4, restartMode="InPlace", elastic=ELASTIC), [*survivors, probe],
                       assignment=FOUR))
    assert out.assign is not None and dict(out.assign.processes) == {"llama-0": 0, "llama-2": 1, "llama-3": 2}
    assert out.assign_first and out.create == () and out.delete == ()  # the probe stays pending
    st = out.status
    assert (st["attempt"], st["currentWorkers"], st["lastResizeTime"]) == (2, 3, "2026-11-24T06:00:00Z")
    assert "desiredWorkers" not in st  # unchanged: 4
    new = st["goodput"]["accounting"]["open"][-1]
    assert (new["attempt"], new["workers"], new["desired"]) == (2, 3, 4)  # goodput records the size
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Shrunk")
    assert out.status_events[0].reason == "Shrinking" and out.status_events[0].type == "Warning"
    assert out.assigned_event is not None and out.assigned_event.reason == "AttemptStarted"


SHRUNK_3 = {**RUN, "attempt": 2, "restartMode": "InPlace", "ready": "3/3", "replicas": 3, "currentWorkers": 3,
            "desiredWorkers": 4, "lastResizeTime": "2026-11-24T05:30:00Z"}


def test_a_grow_writes_an_assignment_that_says_so_and_the_shrink_one_that_does_not() -> None:
    """The grow's assignment carries ``resize: grow`` (the supervisors stop the running trainers with the resize
    signal and the gang saves the agreed step to memory); the shrink's, after a loss, does not."""
    survivors = [pod(f"llama-{i}", i, attempt=2, node=f"n{i}") for i in (0, 2, 3)]
    probe = pod("llama-1-xk2p9", 1, attempt=2, node="n-new", ip="10.0.1.1")  # the replacement, scheduled at last
    shrunk = Assignment(2, {"llama-0": 0, "llama-2": 1, "llama-3": 2}, "10.0.0.1:8476")
    out = decide(_view(job(SHRUNK_3, replicas=4, restartMode="InPlace", elastic=ELASTIC), [*survivors, probe],
                       assignment=shrunk))
    assert out.assign is not None and dict(out.assign.processes) == {**shrunk.processes, "llama-1-xk2p9": 3}
    assert out.assign.resize == "grow" and out.status["attempt"] == 3
    assert out.status_events[0].reason == "Growing"
    lost = _unschedulable(pod("llama-1-xk2p9", 1, attempt=2), "2026-11-24T05:59:50Z")
    out = decide(_view(job(RESTARTING_4, replicas=4, restartMode="InPlace", elastic=ELASTIC),
                       [*(pod(f"llama-{i}", i) for i in (0, 2, 3)), lost], assignment=FOUR))
    assert out.assign is not None and out.assign.resize is None


def test_the_same_loss_without_the_block_waits_and_writes_no_size_change() -> None:
    probe = _unschedulable(pod("llama-1-xk2p9", 1, attempt=2), "2026-11-24T05:00:00Z")
    survivors = [pod(f"llama-{i}", i) for i in (0, 2, 3)]
    out = decide(_view(job(RESTARTING_4, replicas=4, restartMode="InPlace"), [*survivors, probe], assignment=FOUR))
    assert out.assign is None and "lastResizeTime" not in out.status and "currentWorkers" not in out.status
    assert not [e for e in out.status_events if e.reason in ("Shrinking", "Growing")]


@pytest.mark.parametrize("mode", ["Recreate", "InPlace"])
def test_every_running_job_gets_its_desired_and_current_workers(mode: str) -> None:
    status = {**RUN, "restartMode": mode}
    out = decide(_view(job(status, restartMode=mode), [P0, P1], assignment=ASSIGNED if mode == "InPlace" else None))
    assert (out.status["desiredWorkers"], out.status["currentWorkers"]) == (2, 2)
    written = job({**status, "desiredWorkers": 2, "currentWorkers": 2}, restartMode=mode)
    out = decide(_view(written, [P0, P1], assignment=ASSIGNED if mode == "InPlace" else None))
    assert "desiredWorkers" not in out.status and "currentWorkers" not in out.status
