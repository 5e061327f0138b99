"""An elastic in-place job against the real API server and kube-scheduler, the operator as a local process (chart
RBAC), the pods on process kubelets: a worker lost while no node can take its replacement (the scheduler's own
``PodScheduled=False/Unschedulable``), the shrink onto the survivor after ``unschedulableSeconds``, and the grow
back once the replacement schedules (docs/elastic-operator.md)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import apply
from kubernetes import client
from localcluster.testing import taint_node, untaint_node, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# The trainer reprieve-run starts (no JAX: what the assignment gave it is the point): its contract environment per
# attempt, written where the test reads it; it tells the supervisor its first step is done (as the runtime does), then
# waits to be stopped and writes the signal that stopped it (a grow's is the resize signal, SIGUSR1) before it dies of it.
TRAINER = """
    import json, os, pathlib, signal, time
    env = {k: v for k, v in os.environ.items() if k.startswith("REPRIEVE_")}
    name = f"{os.environ['REPRIEVE_POD_NAME']}-a{os.environ['REPRIEVE_ATTEMPT']}"
    out = pathlib.Path(os.environ["OUT"]) / (name + ".json")
    def stopped(signum, frame):
        out.with_suffix(".stop").write_text(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, stopped)
    out.with_suffix(".tmp").write_text(json.dumps(env))
    out.with_suffix(".tmp").rename(out)
    os.write(int(os.environ["REPRIEVE_SUPERVISOR_FD"]), b'{"event": "step", "step": 0}\\n')
    time.sleep(200)
"""
FULL = "test.reprieve.dev/full"  # a taint no signal reads: the node is out of room, not doomed
HOST = "test.reprieve.dev/host"  # one worker per node (required anti-affinity on this label)


def manifest(namespace: str, tag: str, out: Path) -> dict[str, Any]:
    container = {"name": "trainer", "image": "python:3.11", "command": ["python", "-c", textwrap.dedent(TRAINER)],
                 "env": [{"name": "OUT", "value": "/out"}, {"name": "REPRIEVE_PREWARM", "value": "0"}], "volumeMounts": [{"name": "out", "mountPath": "/out"}]}
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"reprieve.dev/job-name": "el"}}, "topologyKey": HOST}]}}
    return {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "el", "namespace": namespace},
            "spec": {"replicas": 2, "restartMode": "InPlace", "terminationGracePeriodSeconds": 5,
                     "checkpoint": {"uri": "/tmp/ckpt"},
                     "elastic": {"minReplicas": 1, "unschedulableSeconds": 2, "minResizeIntervalSeconds": 0},
                     "template": {"spec": {"nodeSelector": {"reprieve-test": tag}, "affinity": apart,
                                           "containers": [container],
                                           "volumes": [{"name": "out", "hostPath": {"path": str(out)}}]}}}}


def live_pod(core: Any, namespace: str, prefix: str) -> Any:
    """The job's pod whose name starts with ``prefix`` and is not being deleted (None: none)."""
    return next((p for p in core.list_namespaced_pod(namespace, label_selector="reprieve.dev/job-name=el").items
                 if p.metadata.name.startswith(prefix) and not p.metadata.deletion_timestamp), None)


def unschedulable(pod: Any) -> Any:
    """``pod`` when the scheduler said ``PodScheduled=False/Unschedulable`` of it, else None."""
    cond = next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None) if pod else None
    return pod if cond is not None and (cond.status, cond.reason) == ("False", "Unschedulable") else None


def start_job(cluster: Any, api: Any, namespace: str, nodes: list[str], tmp_path: Path) -> tuple[Any, Any, Path, Any]:
    """One worker per node (``HOST`` labels), the 2-worker job applied; its clients, the trainers' directory and a
    reader of its status."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    tag = str(core.read_node(nodes[0]).metadata.labels["reprieve-test"])
    for n in nodes:
        core.patch_node(n, {"metadata": {"labels": {HOST: n}}})
    out = tmp_path / "out"
    out.mkdir()
    apply(cluster, manifest(namespace, tag, out))

    def status() -> dict[str, Any]:
        return dict(custom.get_namespaced_custom_object("reprieve.dev", "v1alpha1", namespace, "trainingjobs",
                                                        "el").get("status") or {})

    return core, custom, out, status


def test_a_lost_worker_whose_replacement_cannot_schedule_shrinks_the_job_then_it_grows_back(
        cluster: Any, api: Any, namespace: str, operator: Any, nodes: list[str], tmp_path: Path) -> None:
    core, _custom, out, status = start_job(cluster, api, namespace, nodes, tmp_path)

    def trainer(pod: str, attempt: int) -> dict[str, str] | None:
        path = out / f"{pod}-a{attempt}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def stop_signal(pod: str, attempt: int) -> str | None:
        path = out / f"{pod}-a{attempt}.stop"
        return path.read_text() if path.exists() else None

    def processes() -> dict[str, int]:
        return dict(json.loads(core.read_namespaced_config_map("el-assignment", namespace).data["processes"]))

    def degraded() -> dict[str, Any] | None:
        return next((c for c in status().get("conditions") or [] if c["type"] == "Degraded"), None)

    def events(reason: str) -> list[Any]:
        return [e for e in core.list_namespaced_event(namespace).items if e.reason == reason]

    wait_for(lambda: trainer("el-0", 1) and trainer("el-1", 1), 90, "both trainers of attempt 1",
             describe=lambda: operator.tail(40))
    st = wait_for(lambda: (s := status()).get("currentWorkers") == 2 and s, 30, "currentWorkers 2")
    assert (st["desiredWorkers"], st["currentWorkers"]) == (2, 2) and degraded() is None  # every job has its size

    # worker 1 is lost and its node is out of room; the other node holds worker 0 (one worker per node)
    lost_node = core.read_namespaced_pod("el-1", namespace).spec.node_name
    taint_node(api, lost_node, FULL)
    core.delete_namespaced_pod("el-1", namespace)

    def probe() -> Any:
        return live_pod(core, namespace, "el-1-")

    def refused() -> Any:
        return unschedulable(probe())

    stuck = wait_for(refused, 60, "the replacement refused by the scheduler", describe=lambda: operator.tail(40))

    # after unschedulableSeconds (2 s): attempt 2 on the survivor alone, the replacement kept pending as a probe
    st = wait_for(lambda: (s := status()).get("currentWorkers") == 1 and s.get("attempt") == 2 and s, 60,
                  "the shrink to 1 worker", describe=lambda: operator.tail(60))
    assert processes() == {"el-0": 0}
    assert st["desiredWorkers"] == 2 and st.get("lastResizeTime")
    cond = degraded()
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Shrunk")
    assert f"pod {stuck.metadata.name} (replacement for a lost worker) unschedulable" in cond["message"]
    (shrinking,) = wait_for(lambda: events("Shrinking"), 30, "the Shrinking Event")
    assert shrinking.type == "Warning" and "shrinking from 2 to 1 workers" in shrinking.message
    env = wait_for(lambda: trainer("el-0", 2), 60, "the survivor's trainer of attempt 2")
    assert (env["REPRIEVE_NUM_PROCESSES"], env["REPRIEVE_PROCESS_ID"]) == ("1", "0")  # the smaller world
    goodput = st["goodput"]["accounting"]["open"]
    assert [(a["attempt"], a.get("workers"), a.get("desired")) for a in goodput][-1] == (2, 1, 2)
    assert probe() is not None and probe().metadata.name == stuck.metadata.name  # kept, not re-created
    # a shrink follows a loss: the survivor's trainer of attempt 1 was stopped as at any restart
    assert wait_for(lambda: stop_signal("el-0", 1), 30, "attempt 1's stop") == "SIGTERM"

    # capacity returns: the probe schedules, runs, and the job grows back in place with it as process 1
    untaint_node(api, lost_node, FULL)
    st = wait_for(lambda: (s := status()).get("currentWorkers") == 2 and s.get("attempt") == 3 and s, 90,
                  "the grow back to 2 workers", describe=lambda: operator.tail(60))
    assert processes() == {"el-0": 0, stuck.metadata.name: 1}
    # the grow's assignment says so, and the survivor's supervisor stopped its trainer of attempt 2 with the resize
    # signal: the runtime saves the agreed step to the memory tier for attempt 3 (tests/runtime/test_grow_step.py)
    assert core.read_namespaced_config_map("el-assignment", namespace).data.get("resize") == "grow"
    assert wait_for(lambda: stop_signal("el-0", 2), 30, "attempt 2's stop") == "SIGUSR1"
    cond = degraded()
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "FullSize")
    (growing,) = wait_for(lambda: events("Growing"), 30, "the Growing Event")
    assert growing.type == "Normal" and f"pod {stuck.metadata.name} (replacement) takes process 1" in growing.message
    env = wait_for(lambda: trainer(stuck.metadata.name, 3), 60, "the newcomer's trainer of attempt 3")
    assert (env["REPRIEVE_NUM_PROCESSES"], env["REPRIEVE_PROCESS_ID"]) == ("2", "1")
    assert wait_for(lambda: trainer("el-0", 3), 60, "the survivor's trainer of attempt 3")["REPRIEVE_NUM_PROCESSES"] \
        == "2"
    operator.assert_no_errors()


def test_the_operator_restarted_before_the_shrink_then_a_loss_below_the_minimum_waits_and_resumes(
        cluster: Any, api: Any, namespace: str, operator: Any, nodes: list[str], tmp_path: Path) -> None:
    """The fault table's operator cases on 3 workers with ``minReplicas: 2``: the operator is stopped when worker 2
    is lost (its node out of room) and started again before the shrink: it shrinks once, to 2 (one Shrinking Event,
    one attempt); a second loss while shrunk would leave 1 worker, below the minimum: the job waits (Degraded=True/
    BelowMinReplicas naming the minimum and the unschedulable pod), starts no attempt on 1 worker, and resumes on 2
    once one node has room again, then grows to 3 when the last one has."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    tag = str(core.read_node(nodes[0]).metadata.labels["reprieve-test"])
    third = cluster.add_node(f"{nodes[0].rsplit('-', 1)[0]}-2", labels={"reprieve-test": tag})
    try:
        for n in (*nodes, third):
            core.patch_node(n, {"metadata": {"labels": {HOST: n}}})
        out = tmp_path / "out"
        out.mkdir()
        body = manifest(namespace, tag, out)
        body["spec"]["replicas"] = 3
        body["spec"]["elastic"]["minReplicas"] = 2
        apply(cluster, body)

        def status() -> dict[str, Any]:
            return dict(custom.get_namespaced_custom_object("reprieve.dev", "v1alpha1", namespace, "trainingjobs",
                                                            "el").get("status") or {})

        def processes() -> dict[str, int]:
            return dict(json.loads(core.read_namespaced_config_map("el-assignment", namespace).data["processes"]))

        def degraded() -> dict[str, Any]:
            return next((c for c in status().get("conditions") or [] if c["type"] == "Degraded"), {})

        def events(reason: str) -> list[Any]:
            return [e for e in core.list_namespaced_event(namespace).items if e.reason == reason]

        def node_of(pod: str) -> str:
            return str(core.read_namespaced_pod(pod, namespace).spec.node_name)

        wait_for(lambda: status().get("currentWorkers") == 3 and status().get("phase") == "Running", 90,
                 "3 workers running", describe=lambda: operator.tail(40))

        # worker 2 lost while the operator is down; its node is out of room
        operator.stop()
        full = [node_of("el-2")]
        taint_node(api, full[0], FULL)
        core.delete_namespaced_pod("el-2", namespace)
        operator.start()
        st = wait_for(lambda: (s := status()).get("currentWorkers") == 2 and s.get("attempt") == 2 and s, 90,
                      "the shrink to 2 workers after the operator's restart", describe=lambda: operator.tail(60))
        assert processes() == {"el-0": 0, "el-1": 1}, processes()
        assert (degraded().get("status"), degraded().get("reason")) == ("True", "Shrunk"), degraded()
        assert len(wait_for(lambda: events("Shrinking"), 30, "the Shrinking Event")) == 1
        assert st["restarts"]["disruption"] == 1, st["restarts"]

        # a second loss while shrunk: 1 worker would be left, below minReplicas 2: wait, no attempt on 1 worker
        full.append(node_of("el-1"))
        taint_node(api, full[1], FULL)
        core.delete_namespaced_pod("el-1", namespace)
        cond = wait_for(lambda: (c := degraded()).get("reason") == "BelowMinReplicas" and c, 90,
                        "Degraded=True/BelowMinReplicas", describe=lambda: operator.tail(60))
        assert cond["status"] == "True" and "spec.elastic.minReplicas 2" in cond["message"], cond
        assert "unschedulable" in cond["message"], cond
        assert status()["attempt"] == 2 and len(events("Shrinking")) == 1, status()

        # one node has room again: the job resumes on 2 workers; the last one: it grows to 3
        untaint_node(api, full[1], FULL)
        st = wait_for(lambda: (s := status()).get("currentWorkers") == 2 and s.get("attempt") == 3
                      and s.get("phase") == "Running" and s, 90, "the resume on 2 workers",
                      describe=lambda: operator.tail(60))
        assert sorted(processes().values()) == [0, 1], processes()
        assert degraded().get("status") == "True", degraded()
        untaint_node(api, full[0], FULL)
        wait_for(lambda: (s := status()).get("currentWorkers") == 3 and (s.get("attempt") or 0) >= 4, 90,
                 "the grow to 3 workers", describe=lambda: operator.tail(60))
        assert (degraded().get("status"), degraded().get("reason")) == ("False", "FullSize"), degraded()
        operator.assert_no_errors()
    finally:
        cluster.remove_node(third)


def test_a_spare_that_cannot_schedule_is_shrunk_past_and_grows_the_job_back_once_it_runs(
        cluster: Any, api: Any, namespace: str, operator: Any, nodes: list[str], tmp_path: Path) -> None:
    """make demo's stockout, against the real scheduler: 2 workers, one pod per node, 2 nodes, and a spare asked
    for once the workers run, so it is Pending (Unschedulable); worker 1 is lost and its node is out of room: the
    restart puts the Pending spare in index 1, and since the scheduler refuses it the job shrinks onto worker 0
    after unschedulableSeconds (it waited for capacity before: 0 steps while out of room); once the node has room
    the spare runs and the job grows back with it as process 1."""
    core, custom, out, status = start_job(cluster, api, namespace, nodes, tmp_path)

    def spare() -> Any:
        return live_pod(core, namespace, "el-spare-")

    def refused() -> Any:
        return unschedulable(spare())

    wait_for(lambda: (out / "el-0-a1.json").exists() and (out / "el-1-a1.json").exists(), 90,
             "both trainers of attempt 1", describe=lambda: f"{status()}\n{operator.tail(40)}")
    # the spare asked for once both workers hold the two nodes (asked with the job, it raced worker 1 for a node)
    custom.patch_namespaced_custom_object("reprieve.dev", "v1alpha1", namespace, "trainingjobs", "el",
                                          {"spec": {"spares": 1}})
    pending = wait_for(refused, 60, "the spare refused by the scheduler (no third node)").metadata.name

    lost_node = core.read_namespaced_pod("el-1", namespace).spec.node_name
    taint_node(api, lost_node, FULL)
    core.delete_namespaced_pod("el-1", namespace)
    st = wait_for(lambda: (s := status()).get("currentWorkers") == 1 and s.get("attempt") == 2 and s, 60,
                  "the shrink past the Pending spare", describe=lambda: operator.tail(60))
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Shrunk"), degraded
    assert f"pod {pending} (spare for a lost worker) unschedulable" in degraded["message"], degraded

    untaint_node(api, lost_node, FULL)
    wait_for(lambda: (s := status()).get("currentWorkers") == 2 and s.get("attempt") == 3, 90,
             "the grow back with the spare", describe=lambda: operator.tail(60))
    processes = json.loads(core.read_namespaced_config_map("el-assignment", namespace).data["processes"])
    newcomer = next(pod for pod, i in processes.items() if i == 1)
    assert processes["el-0"] == 0 and newcomer.startswith("el-spare-"), processes  # a spare (the same or a re-made one)
    # the Event follows the status that names attempt 3 (policy.decide's order: status, then its Events)
    growing = wait_for(lambda: [e for e in core.list_namespaced_event(namespace).items if e.reason == "Growing"],
                       30, "the Growing Event", describe=lambda: operator.tail(60))
    assert len(growing) == 1 and f"pod {newcomer} (spare) takes process 1" in growing[0].message, growing
    operator.assert_no_errors()
