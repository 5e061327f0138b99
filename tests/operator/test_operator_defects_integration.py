"""Regression tests for the operator defects a busy real cluster shows (issue: four defects), against the local
control plane with exactly the chart's RBAC. Each failed on the operator before the fix."""

from __future__ import annotations

import itertools
import json
import random
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import Operator, apply, job_manifest, node_tag
from kubernetes import client
from kubernetes.client.rest import ApiException
from localcluster.testing import label_node, taint_node, wait_for
from test_operator_integration import events, job_pods, notices, status, wait_phase, wait_running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SPOT = "cloud.google.com/impending-node-termination"
REBALANCE = "aws-node-termination-handler/rebalance-recommendation"
MAINTENANCE = {"cloud.google.com/active-node-maintenance": "ONGOING"}
SCHEDULED = "cloud.google.com/scheduled-maintenance-time"


def spread(manifest: dict[str, Any]) -> dict[str, Any]:
    """One worker per node (required pod anti-affinity on the job's label)."""
    name = manifest["metadata"]["name"]
    manifest["spec"]["template"]["spec"]["affinity"] = {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"reprieve.dev/job-name": name}},
            "topologyKey": "kubernetes.io/hostname"}]}}
    return manifest


def deadlines(api: Any, ns: str, name: str) -> dict[str, tuple[str, str]]:
    return {pod: (json.loads(v)["reason"], json.loads(v)["deadline"]) for pod, v in notices(api, ns, name).items()
            if v}


def owned_objects(cluster: Any, ns: str, job: str) -> list[str]:
    out = cluster.kubectl("get", "pods,svc,sa,role,rolebinding", "-n", ns, "-l", f"reprieve.dev/job-name={job}",
                          "-o", "name").stdout.split()
    return out


# -- 1. the affinity shape ---------------------------------------------------------------------------------

def test_two_doomed_nodes_anywhere_do_not_block_a_new_job(cluster, api, namespace, operator, nodes) -> None:
    """Two nodes in maintenance (a label: the scheduler alone would use them) before a job is created."""
    for n in nodes:
        label_node(api, n, MAINTENANCE)
    # The operator learns of signals through its Node watch: a job created in the same instant as a label may be
    # built before the label is seen (it then converges through the notice path). This test is about the affinity
    # shape with both nodes known, so it waits until the operator has seen both.
    wait_for(lambda: operator.metric("reprieve_nodes_with_notice") >= len(nodes), 30, "the operator to see both labels")
    apply(cluster, job_manifest("llama", namespace, replicas=2))
    pods = wait_running(api, namespace, "llama", timeout=30)
    assert not {p.spec.node_name for p in pods} & set(nodes), "a worker landed on a node in maintenance"
    terms = pods[0].spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    fields = [(f.key, f.operator, f.values) for f in terms.node_selector_terms[0].match_fields]
    assert sorted(fields) == sorted(("metadata.name", "NotIn", [n]) for n in nodes)
    operator.assert_no_errors()


def _random_template(rng: random.Random, names: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "image": "python:3.11", "command": ["python"]}]}
    if rng.random() < 0.5:
        spec["nodeSelector"] = {"pool": rng.choice(["a", "b"])}
    if rng.random() < 0.4:
        spec["tolerations"] = rng.choice([[{"operator": "Exists"}], [{"key": SPOT, "operator": "Exists"}]])
    if rng.random() < 0.6:
        terms = []
        for _ in range(rng.randint(1, 3)):
            term: dict[str, Any] = {}
            if rng.random() < 0.7:
                term["matchExpressions"] = [{"key": "pool", "operator": rng.choice(["In", "NotIn"]),
                                             "values": ["a", "b"][: rng.randint(1, 2)]}]
            if rng.random() < 0.5 or not term:
                term["matchFields"] = [{"key": "metadata.name", "operator": rng.choice(["In", "NotIn"]),
                                        "values": [rng.choice(names)]}]
            terms.append(term)
        affinity: dict[str, Any] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
        if rng.random() < 0.5:
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "pool", "operator": "In",
                                                                    "values": ["a"]}]}}]
        spec["affinity"] = affinity
    return {"metadata": {"labels": {"team": "ml"}}, "spec": spec}


def _random_node(rng: random.Random, name: str, now: datetime) -> dict[str, Any]:
    labels = {"pool": rng.choice(["a", "b"])}
    taints: list[dict[str, Any]] = []
    kind = rng.randrange(5)
    if kind == 0:
        labels.update(MAINTENANCE)
    elif kind == 1:
        taints.append({"key": SPOT, "value": "true", "effect": "NoSchedule"})
    elif kind == 2:
        labels[SCHEDULED] = str(int((now + timedelta(seconds=rng.choice([60, 3600]))).timestamp()))
    elif kind == 3:
        taints.append({"key": REBALANCE, "effect": "NoSchedule"})
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints, "unschedulable": rng.random() < 0.1}, "status": {}}


def test_every_pod_the_builders_make_is_accepted_by_the_api_server(api, namespace, chart) -> None:
    """Property: random jobs x random sets of doomed nodes -> placement -> builder -> a server-side dry run."""
    from reprieve_operator.models import TrainingJob
    from reprieve_operator.policy.builders import build_worker_pod
    from reprieve_operator.policy.placement import avoid_nodes
    from reprieve_operator.policy.signals import BUILTIN_SIGNALS

    core = client.CoreV1Api(api)
    rng = random.Random(20261123)
    now = datetime.now(UTC)
    refused = []
    for case in range(80):
        name = f"j{case}"
        core.create_namespaced_service_account(namespace, {"metadata": {"name": f"{name}-worker"}})
        names = [f"node-{rng.randrange(10_000)}.zone-{rng.randrange(3)}" for _ in range(rng.choice([0, 1, 2, 5, 40,
                                                                                                 150]))]
        cluster_nodes = [_random_node(rng, n, now) for n in names]
        preemption: dict[str, Any] = rng.choice([{}, {"enabled": False}, {"signals": ["gke-spot", "cordon"]}])
        job = TrainingJob.from_body({
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{case}"},
            "spec": {"replicas": rng.randint(1, 8), "template": _random_template(rng, names or ["n0"]),
                     "checkpoint": {"uri": "/ckpt"}, "preemption": preemption}})
        avoid = avoid_nodes(job, cluster_nodes, BUILTIN_SIGNALS, now, 600)
        pod = build_worker_pod(job, rng.randrange(job.spec.replicas), rng.randint(1, 9), avoid)
        try:
            core.create_namespaced_pod(namespace, pod, dry_run="All", field_validation="Strict")
        except ApiException as err:
            refused.append(f"case {case} (avoiding {len(avoid)} nodes): {err.status} {err.body[:300]}")
    assert not refused, "\n".join(refused)


# -- 2. every earlier deadline reaches every pod; far-future maintenance is held ---------------------------

def test_a_later_notice_with_an_earlier_deadline_reaches_every_pod(cluster, api, namespace, operator, nodes) -> None:
    apply(cluster, spread(job_manifest("llama", namespace, tag=node_tag(cluster, nodes[0]), save_seconds=60)))
    pods = wait_running(api, namespace, "llama")
    a, b = pods[0].spec.node_name, pods[1].spec.node_name
    assert a != b
    taint_node(api, a, REBALANCE, None, "NoSchedule")  # AWS rebalance: +30 s
    first = wait_for(lambda: (d := deadlines(api, namespace, "llama")) and len(d) == 2 and
                     {r for r, _ in d.values()} == {"aws-rebalance"} and d, 10, "the rebalance notice on both pods",
                     describe=lambda: f"{notices(api, namespace, 'llama')}\n{operator.tail(40)}")
    # The spot taint comes after the rebalance notice is recorded (so first seen later), not just after a sleep.
    wait_for(lambda: status(api, namespace, "llama").get("lastNotice", {}).get("reason") == "aws-rebalance", 30,
             "status.lastNotice to name the rebalance notice", describe=lambda: operator.tail(40))
    taint_node(api, b, SPOT, "true", "NoSchedule")  # GKE spot on the other node: +15 s, earlier
    second = wait_for(lambda: (d := deadlines(api, namespace, "llama")) and
                      {r for r, _ in d.values()} == {"gke-spot"} and d, 10, "the earlier spot notice on both pods",
                      describe=lambda: f"{notices(api, namespace, 'llama')}\n{operator.tail(40)}")
    assert max(dl for _, dl in second.values()) < min(dl for _, dl in first.values())
    st = wait_for(lambda: (s := status(api, namespace, "llama")).get("lastNotice", {}).get("reason") == "gke-spot"
                  and s, 10, "status.lastNotice to name the spot notice")
    assert st["phase"] == "Preempting" and st["lastNotice"]["node"] == b
    evs = events(api, namespace, "PreemptionNotice")
    assert len(evs) == 2 and any("earlier than the deadline" in e.message for e in evs), [e.message for e in evs]
    # A later, third signal changes nothing: the rebalance taint replaced by Karpenter's (+30 s, first seen
    # later: later) in one Node update, and nothing looked for until the operator has handled that update.
    # Counted after the status is written (the test can read that status first): wait for the count, both notices.
    wait_for(lambda: operator.metric("reprieve_notices_delivered_total", namespace=namespace) == 2, 10,
             "both notices counted as delivered", describe=lambda: operator.tail(40))
    before = operator.metric("reprieve_node_events_total", node=a)
    taints = [t for t in client.CoreV1Api(api).read_node(a).spec.taints or [] if t.key != REBALANCE]
    client.CoreV1Api(api).patch_node(a, {"spec": {"taints": [
        *(api.sanitize_for_serialization(t) for t in taints), {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}})
    operator.handled("reprieve_node_events_total", before, node=a)
    assert {r for r, _ in deadlines(api, namespace, "llama").values()} == {"gke-spot"}
    assert operator.metric("reprieve_notices_delivered_total", namespace=namespace) == 2
    operator.assert_no_errors()


def test_far_future_maintenance_is_held_and_never_makes_the_job_deaf(cluster, api, namespace, chart, nodes,
                                                                     tmp_path) -> None:
    op = Operator(cluster, namespace, tmp_path)
    op.extra_args = ["--notice-horizon-seconds", "20"]
    op.start()
    try:
        apply(cluster, spread(job_manifest("llama", namespace, tag=node_tag(cluster, nodes[0]), save_seconds=60)))
        pods = wait_running(api, namespace, "llama")
        a, b = pods[0].spec.node_name, pods[1].spec.node_name
        in_an_hour = datetime.now(UTC) + timedelta(hours=1)
        label_node(api, a, {SCHEDULED: str(int(in_an_hour.timestamp()))})
        held(op, a)
        assert not any(notices(api, namespace, "llama").values()), "a maintenance an hour away was delivered"
        assert status(api, namespace, "llama")["phase"] == "Running"
        # Maintenance 28 s away: held until 20 s before it, then delivered without any further Node event.
        soon = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=28)
        label_node(api, b, {SCHEDULED: str(int(soon.timestamp()))})
        opens = held(op, b)
        assert opens == soon - timedelta(seconds=20)
        assert not any(notices(api, namespace, "llama").values()), "delivered before its window opened"
        got = wait_for(lambda: (d := deadlines(api, namespace, "llama")) and len(d) == 2 and d, 60,
                       "the held notice once its window opens", describe=lambda: op.tail(40))
        assert {dl for _, dl in got.values()} == {soon.strftime("%Y-%m-%dT%H:%M:%SZ")}
        annotated = {pod: annotated_at(api, namespace, pod) for pod in got}
        assert all(t >= opens for t in annotated.values()), f"annotated {annotated}, before the window opened {opens}"
        assert wait_phase(api, namespace, "llama", "Preempting", timeout=10)
        op.assert_no_errors()
    finally:
        op.stop()


def held(op: Operator, node: str) -> datetime:
    """Wait for the operator's word that a notice on ``node`` is held; returns until when."""
    prefix = f"node {node}: a notice is held until "
    line = wait_for(lambda: next((ln for ln in op.log_path.read_text().splitlines() if prefix in ln), None), 30,
                    f"the notice on {node} to be held", describe=lambda: op.tail(40))
    return datetime.fromisoformat(line.split(prefix, 1)[1].split()[0])


def annotated_at(api: Any, namespace: str, pod: str) -> datetime:
    """When the API server recorded the notice annotation on ``pod`` (its managedFields entry, 1 s resolution)."""
    p = client.CoreV1Api(api).read_namespaced_pod(pod, namespace)
    (t,) = [f.time for f in p.metadata.managed_fields or [] if "f:reprieve.dev/notice" in json.dumps(f.fields_v1)]
    return t  # type: ignore[no-any-return]


def test_a_spot_taint_gets_through_while_a_maintenance_is_held(cluster, api, namespace, operator, nodes) -> None:
    apply(cluster, job_manifest("llama", namespace, tag=node_tag(cluster, nodes[0]), save_seconds=60))
    pods = wait_running(api, namespace, "llama")
    node = pods[0].spec.node_name
    label_node(api, node, {SCHEDULED: str(int((datetime.now(UTC) + timedelta(days=30)).timestamp()))})
    held(operator, node)  # the maintenance is held before the spot taint comes
    taint_node(api, node, SPOT, "true", "NoSchedule")
    got = wait_for(lambda: (d := deadlines(api, namespace, "llama")) and len(d) == 2 and d, 10,
                   "the spot notice despite the held maintenance", describe=lambda: operator.tail(40))
    assert {r for r, _ in got.values()} == {"gke-spot"}


# -- 3. templates the API server refuses ------------------------------------------------------------------

BAD_TEMPLATES = [
    ("container without image", lambda c, s: c.pop("image"), "spec.template.spec.containers[0].image: Required value"),
    ("invalid container name", lambda c, s: c.update(name="Trainer_1"), "spec.template.spec.containers[0].name"),
    ("misspelt container field", lambda c, s: c.update(imagePullPolicyy="Always"),
     "spec.template.spec.containers[0].imagePullPolicyy: unknown field"),
    ("misspelt PodSpec field", lambda c, s: s.update(terminationGracePeriod=5),
     "spec.template.spec.terminationGracePeriod: unknown field"),
]


@pytest.mark.parametrize("mutate,needle", [r[1:] for r in BAD_TEMPLATES], ids=[r[0] for r in BAD_TEMPLATES])
def test_a_template_the_api_server_refuses_fails_the_job_and_creates_nothing(
        cluster, api, namespace, operator, mutate, needle) -> None:
    manifest = job_manifest("bad", namespace)
    pod_spec = manifest["spec"]["template"]["spec"]
    mutate(pod_spec["containers"][0], pod_spec)
    apply(cluster, manifest)
    st = wait_phase(api, namespace, "bad", "Failed", timeout=30)
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "InvalidSpec" and needle in cond["message"], cond
    assert f"TrainingJob {namespace}/bad" in cond["message"] and "python:3.11" not in cond["message"]
    assert [e.message for e in events(api, namespace, "InvalidSpec")] == [cond["message"]]
    # And nothing appears later either: a spec change makes the operator reconcile the failed job once more;
    # what it decided is applied by the time it is counted.
    before = operator.metric("reprieve_reconciles_total", namespace=namespace, trainingjob="bad")
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "reprieve.dev", "v1alpha1", namespace, "trainingjobs", "bad", {"spec": {"terminationGracePeriodSeconds": 6}})
    operator.handled("reprieve_reconciles_total", before, namespace=namespace, trainingjob="bad")
    assert owned_objects(cluster, namespace, "bad") == []
    assert status(api, namespace, "bad")["phase"] == "Failed"


def test_a_missing_service_account_waits_with_a_condition_and_starts_once_it_exists(
        cluster, api, namespace, operator) -> None:
    manifest = job_manifest("llama", namespace)
    manifest["spec"]["template"]["spec"]["serviceAccountName"] = "trainer"
    apply(cluster, manifest)
    st = wait_for(lambda: (s := status(api, namespace, "llama")) and any(
        c["type"] == "PodsCreated" and c["reason"] == "ServiceAccountNotFound" for c in s.get("conditions", []))
        and s, 20, "condition PodsCreated=False/ServiceAccountNotFound", describe=lambda: operator.tail(40))
    cond = next(c for c in st["conditions"] if c["type"] == "PodsCreated")
    assert cond["status"] == "False" and "spec.template.spec.serviceAccountName" in cond["message"]
    assert st["phase"] == "Pending" and owned_objects(cluster, namespace, "llama") == []
    assert events(api, namespace, "FailedCreate")
    client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    wait_running(api, namespace, "llama", timeout=30)
    cond = next(c for c in status(api, namespace, "llama")["conditions"] if c["type"] == "PodsCreated")
    assert cond["status"] == "True"


def test_a_quota_that_frees_up_is_retried_with_backoff(cluster, api, namespace, operator) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "1"}}})
    wait_for(lambda: (core.read_namespaced_resource_quota("pods", namespace).status.hard or {}).get("pods"), 20,
             "the quota controller to fill in the quota's status")
    apply(cluster, job_manifest("llama", namespace, replicas=2))
    st = wait_for(lambda: (s := status(api, namespace, "llama")) and any(
        c["type"] == "PodsCreated" and c["reason"] == "QuotaExceeded" for c in s.get("conditions", []))
        and s, 20, "condition PodsCreated=False/QuotaExceeded", describe=lambda: operator.tail(40))
    cond = next(c for c in st["conditions"] if c["type"] == "PodsCreated")
    assert cond["status"] == "False" and "next in" in cond["message"] and "exceeded quota" in cond["message"]
    # Retried with backoff (2 s, 4 s, 8 s ...), not once per reconcile: each FailedCreate Event says which try
    # it was and when the next comes, and the next comes no sooner (Event times: 1 s resolution).
    fails = wait_for(lambda: len(evs := events(api, namespace, "FailedCreate")) >= 3 and evs, 60,
                     "three refused tries", describe=lambda: operator.tail(40))
    tries = sorted((int(m[1]), float(m[2]), e.first_timestamp) for e in fails
                   if (m := re.search(r"try (\d+), next in (\d+) s", e.message)))
    assert [(n, w) for n, w, _ in tries[:3]] == [(1, 2.0), (2, 4.0), (3, 8.0)], [e.message for e in fails]
    for (_, wait, t), (_, _, t_next) in itertools.pairwise(tries[:3]):
        assert (t_next - t).total_seconds() >= wait - 1, f"try after {(t_next - t).total_seconds()} s, not {wait}"
    core.delete_namespaced_resource_quota("pods", namespace)
    wait_running(api, namespace, "llama", timeout=40)


# -- 4. restart codes --------------------------------------------------------------------------------------

def test_rapid_restarts_back_off_and_are_capped(cluster, api, namespace, operator) -> None:
    apply(cluster, job_manifest("fast", namespace, mode="exit:42", restartPolicy={"maxRapidRestarts": 1}))
    st = wait_for(lambda: (s := status(api, namespace, "fast")).get("nextAttemptTime") and s, 30,
                  "a backoff after the first rapid restart", describe=lambda: operator.tail(40))
    assert st["rapidRestarts"] == 1 and st["restarts"]["preemption"] == 1
    due = datetime.fromisoformat(st["nextAttemptTime"])
    st = wait_phase(api, namespace, "fast", "Failed", timeout=60)
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "TooManyRapidRestarts" and "maxRapidRestarts=1" in cond["message"]
    assert st["attempt"] == 2 and datetime.fromisoformat(st["attemptStartTime"]) >= due
    assert st["restarts"]["preemption"] == 2  # counted as it happens (as failures are), the second ends the job


# -- smaller ------------------------------------------------------------------------------------------------

def test_noexecute_evictions_after_a_notice_count_as_preemptions(cluster, api, namespace, operator, nodes) -> None:
    """A NoExecute taint evicts at once: three jobs on the node, each restart counted as a preemption."""
    tag = node_tag(cluster, nodes[0])
    for name in ("a", "b", "c"):
        manifest = job_manifest(name, namespace, replicas=1, tag=tag, save_seconds=60)
        manifest["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] = nodes[0]
        apply(cluster, manifest)
    for name in ("a", "b", "c"):
        wait_running(api, namespace, name)
    taint_node(api, nodes[0], SPOT, "true", "NoExecute")
    for name in ("a", "b", "c"):
        st = wait_for(lambda n=name: (s := status(api, namespace, n)).get("restartCount") and s, 30,
                      f"job {name} to restart")
        assert st["restarts"] == {"preemption": 1, "failure": 0, "disruption": 0}, (name, st)


def test_kubectl_scale_is_refused_clearly(cluster, api, namespace, chart) -> None:
    apply(cluster, job_manifest("llama", namespace, suspend=True))
    out = cluster.kubectl("scale", "tj", "llama", "-n", namespace, "--replicas=3", check=False)
    assert out.returncode != 0 and "replicas is immutable" in out.stderr, out.stderr
    assert not job_pods(api, namespace, "llama")
