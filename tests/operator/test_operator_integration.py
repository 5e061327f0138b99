"""The operator against the local control plane, with exactly the chart's RBAC (see conftest.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from conftest import apply, job_manifest, node_tag
from kubernetes import client
from localcluster.testing import taint_node, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SPOT_TAINT = "cloud.google.com/impending-node-termination"


def get_job(api: Any, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object("reprieve.dev", "v1alpha1", ns,
                                                                     "trainingjobs", name)


def status(api: Any, ns: str, name: str) -> dict[str, Any]:
    return get_job(api, ns, name).get("status") or {}


def job_pods(api: Any, ns: str, name: str) -> list[Any]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"reprieve.dev/job-name={name}").items
    return sorted(pods, key=lambda p: p.metadata.name)


def wait_phase(api: Any, ns: str, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    return wait_for(lambda: (s := status(api, ns, name)).get("phase") == phase and s, timeout,
                    f"TrainingJob {ns}/{name} phase {phase}", describe=lambda: json.dumps(status(api, ns, name)))


def wait_running(api: Any, ns: str, name: str, attempt: int = 1, timeout: float = 60) -> list[Any]:
    def ok() -> list[Any] | None:
        st = status(api, ns, name)
        pods = job_pods(api, ns, name)
        if st.get("phase") == "Running" and st.get("attempt") == attempt and \
                all(p.metadata.labels["reprieve.dev/attempt"] == str(attempt) for p in pods):
            return pods
        return None

    return wait_for(ok, timeout, f"TrainingJob {ns}/{name} Running attempt {attempt}",
                    describe=lambda: json.dumps(status(api, ns, name)))


def events(api: Any, ns: str, reason: str, kind: str = "TrainingJob") -> list[Any]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns).items
    return [e for e in evs if e.reason == reason and e.involved_object.kind == kind]


def test_job_gets_pods_service_and_identity_per_contract(cluster, api, namespace, operator) -> None:
    apply(cluster, job_manifest("llama", namespace, replicas=2, coordinatorPort=9123))
    pods = wait_running(api, namespace, "llama")
    assert [p.metadata.name for p in pods] == ["llama-0", "llama-1"]
    for i, p in enumerate(pods):
        assert (p.spec.hostname, p.spec.subdomain, p.spec.restart_policy) == (f"llama-{i}", "llama", "Never")
        assert p.metadata.labels["reprieve.dev/replica-index"] == str(i)
        assert p.metadata.owner_references[0].kind == "TrainingJob"
        env = {e.name: e.value for e in p.spec.containers[0].env}
        assert env["REPRIEVE_PROCESS_ID"] == str(i) and env["REPRIEVE_NUM_PROCESSES"] == "2"
        assert env["REPRIEVE_COORDINATOR_ADDRESS"] == f"llama-0.llama.{namespace}.svc:9123"
        assert env["REPRIEVE_ATTEMPT"] == "1" and p.spec.service_account_name == "llama-worker"
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    svc = core.read_namespaced_service("llama", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    role = rbac.read_namespaced_role("llama-worker", namespace)
    assert role.rules[0].resource_names == ["llama-0", "llama-1"]
    st = status(api, namespace, "llama")
    assert st["ready"] == "2/2" and st["startTime"]
    out = cluster.kubectl("get", "tj", "-n", namespace).stdout
    assert "Running" in out and "2/2" in out, out
    operator.assert_no_errors()


def notices(api: Any, ns: str, name: str) -> dict[str, str | None]:
    return {p.metadata.name: (p.metadata.annotations or {}).get("reprieve.dev/notice")
            for p in job_pods(api, ns, name)}


def test_taint_notifies_every_pod_within_a_second_then_gang_restarts_elsewhere(
        cluster, api, namespace, operator, nodes) -> None:
    apply(cluster, job_manifest("llama", namespace, replicas=2, tag=node_tag(cluster, nodes[0])))
    pods = wait_running(api, namespace, "llama")
    doomed = pods[0].spec.node_name
    t0 = time.monotonic()
    taint_node(api, doomed, SPOT_TAINT, "true", "NoSchedule")
    got = wait_for(lambda: (n := notices(api, namespace, "llama")) and all(n.values()) and n, 10,
                   "notice annotation on every pod", interval=0.02,
                   describe=lambda: f"annotations {notices(api, namespace, 'llama')}\n{operator.tail(60)}")
    latency = time.monotonic() - t0
    assert latency < 1.0, f"taint -> notice on all pods took {latency:.3f}s"
    values = {json.loads(v)["id"] for v in got.values()}
    assert len(values) == 1  # one node event, one id
    notice = json.loads(next(iter(got.values())))
    assert (notice["reason"], notice["node"]) == ("gke-spot", doomed) and notice["deadline"] > notice["observedAt"]

    new = wait_running(api, namespace, "llama", attempt=2)
    assert doomed not in {p.spec.node_name for p in new}, "attempt 2 landed on the doomed node"
    for p in new:
        # The spot taint (NoSchedule, not tolerated) keeps the scheduler off the doomed node already: no
        # affinity is needed (policy.placement), so none is added.
        assert p.spec.affinity is None
        assert not (p.metadata.annotations or {}).get("reprieve.dev/notice")
    st = status(api, namespace, "llama")
    assert st["restarts"] == {"preemption": 1, "failure": 0, "disruption": 0} and st["restartCount"] == 1
    assert st["lastNotice"]["attempt"] == 1 and st["lastNotice"]["node"] == doomed
    assert len(events(api, namespace, "PreemptionNotice")) == 1
    assert len(events(api, namespace, "PreemptionNotice", kind="Pod")) == 2
    assert operator.metric("reprieve_notices_delivered_total", reason="gke-spot") == 1
    assert operator.metric("reprieve_gang_restarts_total", cause="preemption") == 1
    assert operator.metric("reprieve_notice_latency_seconds_count") == 1
    operator.assert_no_errors()


def test_failures_are_counted_then_the_job_fails(cluster, api, namespace, operator) -> None:
    apply(cluster, job_manifest("crash", namespace, mode="exit:1", restartPolicy={"maxFailures": 1}))
    st = wait_phase(api, namespace, "crash", "Failed", timeout=90)
    assert st["restarts"] == {"preemption": 0, "failure": 2, "disruption": 0}
    assert st["attempt"] == 2 and st["restartCount"] == 1
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "TooManyFailures" and "exited with code 1" in cond["message"]
    assert "maxFailures=1" in cond["message"]
    time.sleep(2)  # and it stays that way: no attempt 3
    assert status(api, namespace, "crash")["attempt"] == 2
    assert operator.metric("reprieve_jobs_failed_total", reason="TooManyFailures") == 1
    assert operator.metric("reprieve_jobs_failed_total", namespace=namespace, trainingjob="crash") == 1
    assert operator.metric("reprieve_jobs", namespace=namespace, phase="Failed") == 1
    # the Event says why, not a generic "Failed"
    (ev,) = events(api, namespace, "TooManyFailures")
    assert ev.type == "Warning" and "maxFailures=1" in ev.message and not events(api, namespace, "Failed")


def test_success(cluster, api, namespace, operator) -> None:
    apply(cluster, job_manifest("done", namespace, mode="exit:0"))
    st = wait_phase(api, namespace, "done", "Succeeded")
    assert st["completionTime"] and st["restartCount"] == 0
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in st["conditions"])
    (ev,) = wait_for(lambda: events(api, namespace, "Succeeded"), 10, "the Succeeded Event")
    assert ev.type == "Normal" and "after 1 attempt(s)" in ev.message, ev.message


def test_deleted_pod_is_a_disruption(cluster, api, namespace, operator) -> None:
    apply(cluster, job_manifest("llama", namespace))
    wait_running(api, namespace, "llama")
    client.CoreV1Api(api).delete_namespaced_pod("llama-1", namespace)
    wait_running(api, namespace, "llama", attempt=2)
    st = status(api, namespace, "llama")
    assert st["restarts"] == {"preemption": 0, "failure": 0, "disruption": 1}


def test_lost_node_is_a_disruption_and_is_avoided(cluster, api, namespace, operator, nodes) -> None:
    apply(cluster, job_manifest("llama", namespace, tag=node_tag(cluster, nodes[0])))
    pods = wait_running(api, namespace, "llama")
    lost = pods[0].spec.node_name
    cluster.remove_node(lost)
    new = wait_running(api, namespace, "llama", attempt=2, timeout=90)
    assert lost not in {p.spec.node_name for p in new}
    assert status(api, namespace, "llama")["restarts"]["disruption"] == 1


def test_suspend_and_resume(cluster, api, namespace, operator) -> None:
    apply(cluster, job_manifest("llama", namespace))
    wait_running(api, namespace, "llama")
    custom = client.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object("reprieve.dev", "v1alpha1", namespace, "trainingjobs", "llama",
                                          {"spec": {"suspend": True}})
    wait_phase(api, namespace, "llama", "Suspended")
    wait_for(lambda: not job_pods(api, namespace, "llama"), 60, "pods of the suspended job to be deleted")
    custom.patch_namespaced_custom_object("reprieve.dev", "v1alpha1", namespace, "trainingjobs", "llama",
                                          {"spec": {"suspend": False}})
    wait_running(api, namespace, "llama", attempt=2)
    st = status(api, namespace, "llama")
    assert st["restartCount"] == 0  # a suspension is not a restart


def test_deleting_the_job_collects_everything(cluster, api, namespace, operator) -> None:
    apply(cluster, job_manifest("llama", namespace))
    wait_running(api, namespace, "llama")
    cluster.kubectl("delete", "tj", "llama", "-n", namespace, "--wait=false")

    def leftovers() -> list[str]:
        out = cluster.kubectl("get", "pods,svc,sa,role,rolebinding", "-n", namespace,
                              "-l", "reprieve.dev/job-name=llama", "-o", "name").stdout.split()
        return out

    wait_for(lambda: not leftovers(), 90, "garbage collection of the job's objects",
             describe=lambda: " ".join(leftovers()))


def test_operator_restart_mid_preemption_neither_notifies_nor_restarts_twice(
        cluster, api, namespace, operator, nodes) -> None:
    # The workers "save" for 20 s: the restarted operator (7 s to start on a loaded 2-core machine) must find
    # them still there to finish the delivery it was killed in (its Event); see docs/operator.md.
    apply(cluster, job_manifest("llama", namespace, tag=node_tag(cluster, nodes[0]), save_seconds=20))
    pods = wait_running(api, namespace, "llama")
    doomed = pods[0].spec.node_name
    taint_node(api, doomed, SPOT_TAINT, "true", "NoSchedule")
    first = wait_for(lambda: (n := notices(api, namespace, "llama")) and all(n.values()) and n, 10,
                     "notice on every pod")
    operator.kill()  # SIGKILL while the workers are still "saving"
    operator.start()
    time.sleep(1)
    still = {p.metadata.name: (p.metadata.annotations or {}).get("reprieve.dev/notice")
             for p in job_pods(api, namespace, "llama") if p.metadata.labels["reprieve.dev/attempt"] == "1"}
    assert all(first[n] == v for n, v in still.items()), still  # not re-delivered (if they are still there)
    wait_running(api, namespace, "llama", attempt=2, timeout=90)
    operator.restart()
    time.sleep(3)
    st = status(api, namespace, "llama")
    assert st["attempt"] == 2 and st["restartCount"] == 1
    assert st["restarts"] == {"preemption": 1, "failure": 0, "disruption": 0}
    assert len(events(api, namespace, "PreemptionNotice")) == 1
    assert operator.metric("reprieve_notices_delivered_total") == 0


def test_malformed_node_label_is_ignored(cluster, api, namespace, operator, nodes) -> None:
    from localcluster.testing import label_node

    apply(cluster, job_manifest("llama", namespace, tag=node_tag(cluster, nodes[0])))
    pods = wait_running(api, namespace, "llama")
    node = pods[0].spec.node_name
    label_node(api, node, {"cloud.google.com/scheduled-maintenance-time": "soon"})
    wait_for(lambda: "is not epoch seconds" in operator.log_path.read_text(), 10, "the malformed label warning")
    assert not any(notices(api, namespace, "llama").values())
    label_node(api, node, {"cloud.google.com/active-node-maintenance": "ONGOING"})  # a good signal still works
    wait_for(lambda: all(notices(api, namespace, "llama").values()), 10, "notice after a valid label")
    assert operator.proc is not None and operator.proc.poll() is None


def test_spec_the_crd_cannot_catch_fails_with_a_condition(cluster, api, namespace, operator) -> None:
    bad = job_manifest("bad", namespace)
    bad["spec"]["template"]["spec"]["hostname"] = "mine"
    apply(cluster, bad)
    st = wait_phase(api, namespace, "bad", "Failed")
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "InvalidSpec" and "template.spec.hostname is set by the operator" in cond["message"]
    assert f"TrainingJob {namespace}/bad" in cond["message"]
    assert not job_pods(api, namespace, "bad")
    assert not client.CoreV1Api(api).list_namespaced_service(namespace).items


def test_named_event_is_posted_once_however_often_it_is_retried(api, namespace) -> None:
    """A delivery retried by a restarted operator re-posts the job's Event under the same name: one Event."""
    from reprieve_operator import apply as apply_mod
    from reprieve_operator.policy.notice import notice_event_name

    ref = {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob", "name": "llama", "namespace": namespace,
           "uid": "0123456789abcdef"}
    ops = apply_mod.Api(api)
    name = notice_event_name(ref, 3, "gke-spot/node-a/1763780000")
    for _ in range(2):
        apply_mod.post_event(ops, ref, "PreemptionNotice", "node a will go away", "Warning", name)
    apply_mod.post_event(ops, ref, "PreemptionNotice", "unnamed", "Warning")
    apply_mod.post_event(ops, ref, "PreemptionNotice", "unnamed", "Warning")
    evs = events(api, namespace, "PreemptionNotice")
    assert sorted(e.message for e in evs) == ["node a will go away", "unnamed", "unnamed"]
    assert [e.metadata.name for e in evs if e.message != "unnamed"] == [name]
