"""The memory tier's first attempt against the real API server, the operator as a local process (chart RBAC), the
pods on a process kubelet: the token Secret, each trainer's peer and token, the first assignment's pairing, and a
pairing problem (both processes scheduled on one node) as condition MemoryPaired and one Warning Event, and a tier
the runtime reports switched off (``memoryOff``) as MemoryPaired=False/MemoryTierOff and a Warning Event."""

from __future__ import annotations

import base64
import json
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import apply
from kubernetes import client
from localcluster.testing import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# The trainer reprieve-supervisor starts (no JAX: what the operator gave it is the point): its memory-tier environment,
# written where the test reads it, then it waits to be stopped.
TRAINER = """
    import json, os, pathlib, time
    env = {k: v for k, v in os.environ.items() if k.startswith("REPRIEVE_")}
    out = pathlib.Path(os.environ["OUT"]) / (os.environ["REPRIEVE_POD_NAME"] + ".json")
    out.with_suffix(".tmp").write_text(json.dumps(env))
    out.with_suffix(".tmp").rename(out)
    time.sleep(150)
"""


@pytest.fixture
def one_node(cluster: Any) -> Any:
    tag = uuid.uuid4().hex[:6]
    name = cluster.add_node(f"mem-{tag}", labels={"reprieve-test": tag, "topology.kubernetes.io/zone": "z1"})
    yield name, tag
    cluster.remove_node(name)


def manifest(namespace: str, tag: str, out: Path) -> dict[str, Any]:
    container = {"name": "trainer", "image": "python:3.11", "command": ["python", "-c", textwrap.dedent(TRAINER)],
                 "env": [{"name": "OUT", "value": "/out"}], "volumeMounts": [{"name": "out", "mountPath": "/out"}]}
    return {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "mem", "namespace": namespace},
            "spec": {"replicas": 2, "restartMode": "InPlace", "terminationGracePeriodSeconds": 5,
                     "checkpoint": {"uri": "/tmp/ckpt", "memory": {"sizeLimit": "64Mi", "intervalSteps": 10}},
                     "template": {"spec": {"nodeSelector": {"reprieve-test": tag}, "containers": [container],
                                           "volumes": [{"name": "out", "hostPath": {"path": str(out)}}]}}}}


def test_the_first_attempt_gets_its_peers_and_token_and_a_same_node_pairing_is_reported(
        cluster: Any, api: Any, namespace: str, operator: Any, one_node: Any, tmp_path: Path) -> None:
    node, tag = one_node
    out = tmp_path / "out"
    out.mkdir()
    apply(cluster, manifest(namespace, tag, out))
    core = client.CoreV1Api(api)

    # the Secret: made by the operator with the job's first pods, owned by the job
    secret = wait_for(lambda: _get(core.read_namespaced_secret, "mem-memory", namespace), 60, "Secret mem-memory")
    assert [o.kind for o in secret.metadata.owner_references] == ["TrainingJob"]
    token = base64.b64decode(secret.data["token"]).decode()
    assert len(token) >= 32

    # each trainer: its peer (the other pod, by its stable name, which resolves to that pod) and the token
    envs = wait_for(lambda: _envs(out), 90, "both trainers' environments", describe=lambda: operator.tail(40))
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    assert {p.spec.node_name for p in pods.values()} == {node}
    for me, other in (("mem-0", "mem-1"), ("mem-1", "mem-0")):
        assert envs[me]["REPRIEVE_MEMORY_PEER"] == f"{pods[other].status.pod_ip}:8477", envs[me]
        assert envs[me]["REPRIEVE_MEMORY_TOKEN"] == token
        assert envs[me]["REPRIEVE_NODE_NAME"] == node
    assignment = core.read_namespaced_config_map("mem-assignment", namespace).data
    assert json.loads(assignment["memoryPeers"]) == {"0": f"mem-1.mem.{namespace}.svc:8477",
                                                      "1": f"mem-0.mem.{namespace}.svc:8477"}

    # both on one node: the condition names both processes and the node, and one Warning Event says the same
    def paired() -> dict[str, Any] | None:
        st = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "reprieve.dev", "v1alpha1", namespace, "trainingjobs", "mem").get("status") or {}
        return next((c for c in st.get("conditions") or [] if c["type"] == "MemoryPaired"), None)

    cond = wait_for(paired, 60, "condition MemoryPaired", describe=lambda: operator.tail(40))
    assert cond["status"] == "False" and cond["reason"] == "PairingProblem"
    for proc in (0, 1):
        assert f"runs on node {node}, as process {proc} does" in cond["message"]
    def warnings() -> list[Any]:
        return [e for e in core.list_namespaced_event(namespace).items if e.reason == "MemoryPairingProblem"]

    (event,) = wait_for(warnings, 30, "the MemoryPairingProblem Event")
    assert event.type == "Warning" and event.message == cond["message"]
    # posted once, not on every reconcile: a pod event makes the operator look again
    before = operator.metric("reprieve_reconciles_total")
    core.patch_namespaced_pod("mem-0", namespace, {"metadata": {"annotations": {"test.reprieve.dev/poke": "1"}}})
    operator.handled("reprieve_reconciles_total", before)
    (event,) = warnings()
    assert (event.count or 1) == 1

    # issue #46, 8: process 0's progress report says the tier switched itself off (a limit below the state; the
    # report the runtime patches, written here for it): the condition says so, why and what to change, whatever
    # the pairing, and one Warning Event MemoryTierOff says the same
    why = ("this process's shards take 40.0 MiB (41943040 bytes), so its pod's memory directory must hold 120.0 MiB "
           "(125829120 bytes) (its own copy, its peer's copy and one in flight), but REPRIEVE_MEMORY_LIMIT_BYTES is "
           "64.0 MiB (67108864 bytes): raise the limit (spec.checkpoint.memory) to at least 120.0 MiB (125829120 "
           "bytes), or spread the state over more processes")
    report = {"step": 12, "committedStep": -1, "attempt": 1, "time": "2026-11-28T20:00:00Z", "memoryOff": why}
    core.patch_namespaced_pod("mem-0", namespace, {"metadata": {"annotations": {
        "reprieve.dev/progress": json.dumps(report)}}})
    off = wait_for(lambda: (c := paired()) and c["reason"] == "MemoryTierOff" and c, 60, "MemoryPaired=MemoryTierOff",
                   describe=lambda: operator.tail(40))
    assert off["status"] == "False" and why in off["message"] and "in attempt 1" in off["message"]
    (tier_off,) = wait_for(lambda: [e for e in core.list_namespaced_event(namespace).items
                                    if e.reason == "MemoryTierOff"], 30, "the MemoryTierOff Event")
    assert tier_off.type == "Warning" and tier_off.message == off["message"]
    operator.assert_no_errors()


def _get(read: Any, name: str, namespace: str) -> Any:
    try:
        return read(name, namespace)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def _envs(out: Path) -> dict[str, dict[str, str]] | None:
    found = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return found if {"mem-0", "mem-1"} <= set(found) else None
