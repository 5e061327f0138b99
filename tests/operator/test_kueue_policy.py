"""policy.kueue and its part in decide(): the Workload a queued job owns, the gate Kueue's answer gives (held,
admitted with the flavors' node labels and tolerations, evicted with a notice), when an evicted gang is stopped,
and the status patch that gives the quota back. Tables over Workload bodies as Kueue v1beta2 writes them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy import kueue
from reprieve_operator.policy import workload as workloads
from reprieve_operator.policy.decide import View, decide
from reprieve_operator.policy.restart import RestartPlan
from test_decide import RUN, pod

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC)
EVICTED_AT = "2026-11-24T05:59:50Z"


def job(status: dict[str, Any] | None = None, template_spec: dict[str, Any] | None = None, **spec: Any) -> Any:
    spec.setdefault("restartMode", "Recreate")
    body = make_job(name="llama", namespace="ml", **spec)
    body["spec"]["template"]["spec"].update(template_spec or {})
    return body.with_status(**(status or {})).model()


def cond(type_: str, status: bool, reason: str = "", message: str = "", at: str = "2026-11-24T05:00:00Z") -> dict:
    return {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": at}


def workload(*conds: dict[str, Any], flavors: dict[str, str] | None = None, counts: dict[str, int] | None = None,
             queue: str = "team") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conds)}
    if flavors is not None:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "workers", "flavors": flavors, "count": 2}]}
    return {"metadata": {"name": "trainingjob-llama-abcde", "namespace": "ml", "resourceVersion": "7",
                         "generation": 1},
            "spec": {"queueName": queue, "podSets": [{"name": n, "count": c} for n, c in
                                                     (counts or {"workers": 2}).items()]},
            "status": status}


PENDING = workload(cond("QuotaReserved", False, "Pending", "couldn't assign flavors to pod set workers: "
                                                         "insufficient quota for cpu in flavor default"))
NO_QUEUE = workload(cond("QuotaReserved", False, "Inadmissible", "LocalQueue team doesn't exist"))
ADMITTED = workload(cond("QuotaReserved", True, "QuotaReserved"), cond("Admitted", True, "Admitted"),
                    flavors={"cpu": "spot"})
CHECKS = workload(cond("QuotaReserved", True, "QuotaReserved"), cond("Admitted", False, "UnsatisfiedChecks"),
                  flavors={"cpu": "spot"})
EVICTED = workload(cond("QuotaReserved", True, "QuotaReserved"), cond("Admitted", True, "Admitted"),
                   cond("Evicted", True, "Preempted", "Preempted to accommodate a workload (UID: x) due to "
                                                      "prioritization in the ClusterQueue", EVICTED_AT),
                   flavors={"cpu": "spot"})
RELEASED = workload(cond("QuotaReserved", False, "Pending", "Preempted"), cond("Admitted", False, "NoReservation"),
                    cond("Evicted", True, "Preempted", "Preempted", EVICTED_AT))
FINISHED = workload(cond("Finished", True, "FailedToStart", "bad flavor"))
SPOT = {"spec": {"nodeLabels": {"pool": "spot"}, "tolerations": [
    {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]}}


@pytest.mark.parametrize(("wl", "flavors", "spec", "hold", "reason", "says"), [
    (None, {}, {}, True, "WorkloadCreating", "LocalQueue ml/team"),
    (workload(), {}, {}, True, "Pending", "waiting in LocalQueue ml/team: not yet evaluated by Kueue"),
    (PENDING, {}, {}, True, "Pending", "insufficient quota for cpu"),
    (NO_QUEUE, {}, {}, True, "Pending", "LocalQueue team doesn't exist"),
    (CHECKS, {"spot": SPOT}, {}, True, "AdmissionChecks", "ClusterQueue cq"),
    (ADMITTED, {"spot": SPOT}, {}, False, "Admitted", "admitted by ClusterQueue cq on flavor(s) spot"),
    (ADMITTED, {"spot": None}, {}, True, "FlavorNotFound", "spot cannot be read"),
    (ADMITTED, {"spot": SPOT}, {"nodeSelector": {"pool": "ondemand"}}, True, "FlavorConflict",
     "nodeSelector sets pool to 'ondemand'"),
    (EVICTED, {"spot": SPOT}, {}, True, "Evicted", "the gang saves by 2026-11-24T06:00:50Z"),
    (RELEASED, {}, {}, True, "Pending", "evicted (Preempted"),
    (FINISHED, {}, {}, True, "WorkloadFinished", "bad flavor"),
])
def test_gate(wl: dict | None, flavors: dict, spec: dict, hold: bool, reason: str, says: str) -> None:
    g = kueue.gate(job(template_spec=spec), "team", workloads.parse_workload(wl) if wl else None, flavors, NOW)
    assert (g.hold, g.condition.reason) == (hold, reason)
    assert says in g.condition.message
    assert g.condition.status == ("True" if hold else "False")


@pytest.mark.parametrize(("message", "warning"), [
    ("couldn't assign flavors to pod set workers: flavor gpu doesn't match node affinity", True),
    ("couldn't assign flavors to pod set workers: untolerated taint {spot true NoSchedule <nil>} in flavor spot", True),
    # more than the ClusterQueue can ever hold: it will not clear by itself either (issue #46, item 12)
    (("couldn't assign flavors to pod set workers: flavor gpu doesn't match node affinity, insufficient quota for "
      "cpu in flavor spot, request > maximum capacity (2 > 1)"), True),
    (("couldn't assign flavors to pod set spares: insufficient quota for cpu in flavor default, previously "
      "considered podsets requests (4) + current podset request (1) > maximum capacity (4)"), True),
    ("couldn't assign flavors to pod set workers: insufficient quota for cpu in flavor default", False),
    ("LocalQueue team doesn't exist", False),
])
def test_a_flavor_that_cannot_run_the_template_is_a_warning(message: str, warning: bool) -> None:
    wl = workload(cond("QuotaReserved", False, "Pending", message))
    g = kueue.gate(job(), "team", workloads.parse_workload(wl), {}, NOW)
    assert (g.hold, g.condition.reason, g.warning) == (True, "Pending", warning)
    assert message in g.condition.message


def test_an_eviction_of_a_job_with_notices_off_stops_it_at_once() -> None:
    j = job(RUN, preemption={"enabled": False})
    g = kueue.gate(j, "team", workloads.parse_workload(EVICTED), {}, NOW)
    assert g.notice is None and g.deadline is None and g.release
    assert "spec.preemption.enabled: false" in g.condition.message
    assert kueue.eviction_notice(g) is None
    out = decide(View(job=j, pods=[pod("llama-0", 0), pod("llama-1", 1)], now=NOW,
                      known_nodes={"n-llama-0", "n-llama-1"}, placed=True, looked=True, kueue=read(EVICTED, {})))
    assert tuple(sorted(out.delete)) == ("llama-0", "llama-1") and out.plan.phase == "Suspended"


def test_an_admission_gives_the_flavors_node_labels_and_tolerations() -> None:
    g = kueue.gate(job(), "team", workloads.parse_workload(ADMITTED), {"spot": SPOT}, NOW)
    tpl = kueue.admitted_template({"spec": {"containers": [{"name": "t"}], "nodeSelector": {"zone": "a"}}}, g)
    assert tpl["spec"]["nodeSelector"] == {"zone": "a", "pool": "spot"}
    assert tpl["spec"]["tolerations"] == [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]


def test_an_eviction_gives_a_notice_with_the_jobs_window() -> None:
    j = job(preemption={"noticeSeconds": {"kueue-preemption": 120}})
    g = kueue.gate(j, "team", workloads.parse_workload(EVICTED), {}, NOW)
    assert g.deadline == datetime(2026, 11, 24, 6, 1, 50, tzinfo=UTC)
    notice = kueue.eviction_notice(g)
    assert notice is not None
    value = json.loads(notice.annotation(3))
    assert {k: value[k] for k in ("reason", "node", "deadline", "observedAt", "attempt")} == {
        "reason": "kueue-preemption", "node": "", "deadline": "2026-11-24T06:01:50Z", "observedAt": EVICTED_AT,
        "attempt": 3}
    assert value["id"] == g.notice_id and g.release
    default = kueue.gate(job(), "team", workloads.parse_workload(EVICTED), {}, NOW)
    assert default.deadline == default.notice.since + timedelta(seconds=kueue.DEFAULT_NOTICE_SECONDS)  # type: ignore[union-attr]


@pytest.mark.parametrize(("spares", "mode", "sets"), [
    (0, "Recreate", {"workers": 4}),
    (2, "InPlace", {"workers": 4, "spares": 2}),
])
def test_the_workload_counts_workers_and_spares(spares: int, mode: str, sets: dict[str, int]) -> None:
    j = job(replicas=4, spares=spares, restartMode=mode, template_spec={"containers": [
        {"name": "t", "command": ["python"], "resources": {"requests": {"cpu": "1"}}}]})
    wl = workloads.build_workload(j, "team", ("high", 1000))
    assert {p["name"]: p["count"] for p in wl["spec"]["podSets"]} == sets
    assert wl["spec"]["queueName"] == "team"
    assert wl["spec"]["priority"] == 1000 and wl["spec"]["priorityClassRef"]["name"] == "high"
    assert wl["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
    assert wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1"}}


def test_a_queued_workload_that_no_longer_fits_the_job_is_replaced_an_admitted_one_is_not() -> None:
    j = job(replicas=2, spares=1, restartMode="InPlace", template_spec={"containers": [{"name": "t",
                                                                                        "command": ["x"]}]})
    assert "spares" in (kueue.needs_new_workload(j, workloads.parse_workload(PENDING)) or "")
    assert kueue.needs_new_workload(j, workloads.parse_workload(ADMITTED)) is None
    assert kueue.needs_new_workload(job(), workloads.parse_workload(PENDING)) is None


def test_the_quota_is_given_back_the_way_kueues_job_reconciler_does() -> None:
    patch = workloads.release_patch(EVICTED, NOW)
    assert patch is not None
    assert patch["metadata"] == {"resourceVersion": "7"}
    assert patch["status"]["admission"] is None
    got = {c["type"]: (c["status"], c["reason"]) for c in patch["status"]["conditions"]}
    assert got == {"QuotaReserved": ("False", "Pending"), "Admitted": ("False", "NoReservation"),
                   "Evicted": ("True", "Preempted"), "Requeued": ("True", "Preempted")}
    assert workloads.release_patch(RELEASED, NOW) is None and workloads.release_patch(PENDING, NOW) is None


def test_the_checkpoint_annotation_says_step_time_and_where() -> None:
    assert kueue.checkpoint_annotation(job()) is None
    j = job({"lastCheckpointStep": 40, "lastCheckpointTime": "2026-11-24T05:58:00Z"})
    assert json.loads(kueue.checkpoint_annotation(j) or "") == {
        "step": 40, "time": "2026-11-24T05:58:00Z", "uri": j.spec.checkpoint.uri}


def read(wl: dict[str, Any] | None, flavors: dict[str, Any] | None = None) -> kueue.Read:
    """What the shell reads for a job in LocalQueue ``team`` whose Workload is ``wl``."""
    return kueue.Read("team", workload=wl, flavors=flavors or {})


def _gate(wl: dict[str, Any], flavors: dict | None = None, **spec: Any) -> kueue.Gate:
    return kueue.gate(job(**spec), "team", workloads.parse_workload(wl), flavors or {"spot": SPOT}, NOW)



@pytest.mark.parametrize(("status", "cap", "held", "phase", "cause"), [
    # The gang saved and exited on the eviction's notice: a preemption restart, resumed once admitted again.
    (RUN, None, True, "Suspended", "preemption"),
    # ... capped like any other: one more than restartPolicy.maxPreemptionRestarts fails the job.
    ({**RUN, "restarts": {"preemption": 1}}, 1, True, "Failed", "preemption"),
    # Not held (nothing stops the attempt), or no attempt ran yet: the plan as it was.
    (RUN, None, False, "Suspended", None),
    ({}, None, True, "Suspended", None),
])
def test_an_eviction_that_stops_a_running_attempt_is_a_preemption_restart(
        status: dict, cap: int | None, held: bool, phase: str, cause: str | None) -> None:
    j = job(status, restartPolicy={"maxPreemptionRestarts": cap})
    g = _gate(EVICTED)
    plan = RestartPlan(phase="Suspended", attempt=j.status.attempt, delete=("llama-0", "llama-1"))
    out = kueue.eviction_restart(j, plan, g.condition if held else None, g, [])
    assert (out.phase, out.cause) == (phase, cause)
    if cause == "preemption" and phase == "Suspended":
        assert out.delete == plan.delete and out.message.endswith("it resumes once Kueue admits it again")


@pytest.mark.parametrize(("status", "pods", "wl", "now", "phase", "created", "deleted"), [
    # Queued: nothing is created; the job waits Suspended with the Queued condition.
    ({}, [], PENDING, NOW, "Suspended", 0, ()),
    # Admitted: the gang starts with the flavor's node labels.
    ({}, [], ADMITTED, NOW, "Pending", 2, ()),
    # Evicted, the gang still runs: nothing is deleted (it saves on its notice).
    (RUN, [pod("llama-0", 0), pod("llama-1", 1)], EVICTED, NOW, "Running", 0, ()),
    # Evicted, the gang exited with the restart code after its save: held, the pods go.
    (RUN, [pod("llama-0", 0, phase="Failed", code=42), pod("llama-1", 1, phase="Failed", code=42)], EVICTED, NOW,
     "Suspended", 0, ("llama-0", "llama-1")),
    # Evicted and the notice ran out: the pods are stopped anyway.
    (RUN, [pod("llama-0", 0), pod("llama-1", 1)], EVICTED, NOW + timedelta(seconds=61), "Suspended", 0,
     ("llama-0", "llama-1")),
])
def test_decide_under_a_queue(status: dict, pods: list, wl: dict, now: datetime, phase: str, created: int,
                              deleted: tuple[str, ...]) -> None:
    j = job(status)
    view = View(job=j, pods=pods, now=now, known_nodes={p["spec"]["nodeName"] for p in pods}, placed=True,
                looked=True, kueue=read(wl, {"spot": SPOT}))
    out = decide(view)
    assert out.plan.phase == phase
    assert len(out.create) == created
    assert tuple(sorted(out.delete)) == deleted
    written = [*(out.record or {}).get("conditions", []), *out.status.get("conditions", [])]
    assert any(c["type"] == "Queued" for c in written) or any(c.type == "Queued" for c in j.status.conditions)
    for p in out.create:
        assert p["spec"]["nodeSelector"]["pool"] == "spot"
        assert {"key": "spot", "operator": "Exists", "effect": "NoSchedule"} in p["spec"]["tolerations"]


def test_an_evicted_gang_still_running_is_looked_at_again_when_its_notice_runs_out() -> None:
    j = job(RUN)
    out = decide(View(job=j, pods=[pod("llama-0", 0), pod("llama-1", 1)], now=NOW,
                      known_nodes={"n-llama-0", "n-llama-1"}, placed=True, looked=True, kueue=read(EVICTED, {})))
    assert out.requeue_after == pytest.approx(50.0)


def test_without_a_queue_nothing_changes() -> None:
    j = job({})
    plain = decide(View(job=j, pods=[], now=NOW, known_nodes=set(), placed=True, looked=True))
    assert plain.plan.phase == "Pending" and len(plain.create) == 2
    assert "nodeSelector" not in plain.create[0]["spec"] or "pool" not in plain.create[0]["spec"]["nodeSelector"]


def test_an_ended_job_finishes_its_workload_once() -> None:
    patch = workloads.finish_patch(ADMITTED, "Succeeded", NOW)
    assert patch is not None
    fin = [c for c in patch["status"]["conditions"] if c["type"] == "Finished"]
    assert [(c["status"], c["reason"]) for c in fin] == [("True", "Succeeded")]
    assert workloads.finish_patch(FINISHED, "Failed", NOW) is None


@pytest.mark.parametrize(("status", "body", "not_served"), [
    (404, {"kind": "Status", "reason": "NotFound", "details": {"name": "w", "kind": "workloads"}}, False),
    (404, {"kind": "Status", "reason": "NotFound", "message": "the server could not find the requested resource"},
     True),
    (403, {"kind": "Status", "reason": "Forbidden"}, False),
])
def test_kueue_not_installed_is_told_apart_from_a_missing_workload(status: int, body: dict, not_served: bool) -> None:
    from kubernetes.client.rest import ApiException
    from reprieve_operator import kueue as shell

    err = ApiException(status=status, reason=body["reason"])
    err.body = json.dumps(body)
    assert shell._not_served(err) is not_served


@pytest.mark.parametrize(("reports", "deleted"), [
    # In place the pods outlive the trainer: an evicted gang whose workers reported the restart code is stopped
    # (not restarted in place while Kueue wants the quota back) ...
    ((42, 42), ("llama-0", "llama-1")),
    # ... and one still saving keeps its pods.
    ((42, None), ()),
])
def test_an_evicted_in_place_gang_is_stopped_once_its_workers_reported(reports: tuple, deleted: tuple) -> None:
    from reprieve_operator.policy.inplace import Assignment
    from test_decide import exit_report

    j = job({**RUN, "restartMode": "InPlace"}, restartMode="InPlace",
            template_spec={"containers": [{"name": "t", "command": ["python", "train.py"]}]})
    pods = [pod(f"llama-{i}", i, annotations=exit_report(1, code) if code else None) for i, code in enumerate(reports)]
    out = decide(View(job=j, pods=pods, now=NOW, known_nodes={p["spec"]["nodeName"] for p in pods}, placed=True,
                      looked=True, kueue=read(EVICTED, {}),
                      assignment=Assignment(1, {"llama-0": 0, "llama-1": 1}, "10.0.0.1:8476")))
    assert tuple(sorted(out.delete)) == deleted
    assert out.assign is None  # never the next attempt's assignment while evicted
    # nor a gang restart in place: the one that exited waits for the rest, in its pod; once all exited the
    # eviction itself is recorded, as a preemption, and the job is held
    assert (out.record or {}).get("phase") == ("Suspended" if deleted else None), out.record


@pytest.mark.parametrize("mode", ["Recreate", "InPlace"])
def test_an_evicted_gang_is_not_restarted_when_one_worker_fails_while_the_rest_saves(mode: str) -> None:
    """One worker ended without an agreed save (exit 1; in place, the restart code but not agreed: what the
    integration test's stand-in workers report) while the other still saves on the eviction's notice: no gang
    restart (in place it would start the next attempt in the pods Kueue wants gone), nothing deleted."""
    from reprieve_operator.policy.inplace import Assignment

    spec: dict[str, Any] = {"restartMode": mode}
    if mode == "InPlace":
        spec["template_spec"] = {"containers": [{"name": "t", "command": ["python", "train.py"]}]}
        report = {"reprieve.dev/exit": {"attempt": 1, "code": 42, "agreed": False, "time": EVICTED_AT}}
        pods = [pod("llama-0", 0), pod("llama-1", 1, annotations=report)]
    else:
        pods = [pod("llama-0", 0), pod("llama-1", 1, phase="Failed", code=1)]
    j = job({**RUN, "restartMode": mode}, **spec)
    assignment = Assignment(1, {"llama-0": 0, "llama-1": 1}, "10.0.0.1:8476") if mode == "InPlace" else None
    out = decide(View(job=j, pods=pods, now=NOW, known_nodes={p["spec"]["nodeName"] for p in pods}, placed=True,
                      looked=True, kueue=read(EVICTED, {}), assignment=assignment))
    assert (out.record, out.assign, out.create, out.delete) == (None, None, (), ())
    assert out.requeue_after == pytest.approx(50.0)  # looked at again when the notice runs out
