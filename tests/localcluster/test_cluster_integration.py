"""The local control plane is real: RBAC with ServiceAccount tokens, garbage collection, clean start/stop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from localcluster import Cluster, ClusterError
from localcluster.testing import wait_for

pytestmark = pytest.mark.integration

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  ownerReferences:
  - {{apiVersion: v1, kind: ConfigMap, name: owner, uid: "{uid}", blockOwnerDeletion: true}}
spec:
  nodeSelector: {{nowhere: "true"}}
  containers: [{{name: main, image: none, command: ["true"]}}]
"""


def test_serviceaccount_token_is_bound_by_rbac(cluster: Cluster, namespace: str) -> None:
    other = f"{namespace}-other"
    cluster.kubectl("create", "namespace", other)
    try:
        cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
        cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", namespace)
        cluster.kubectl("create", "rolebinding", "reader", "--role=pod-reader",
                        f"--serviceaccount={namespace}:reader", "-n", namespace)
        kubeconfig = cluster.token_kubeconfig(namespace, "reader")

        allowed = wait_for(lambda: cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=kubeconfig,
                                                   check=False).returncode == 0,
                           10, "RoleBinding to take effect")
        assert allowed
        refused = cluster.kubectl("get", "pods", "-n", other, kubeconfig=kubeconfig, check=False)
        assert refused.returncode != 0
        assert "forbidden" in refused.stderr.lower()
        assert f"system:serviceaccount:{namespace}:reader" in refused.stderr
        # Reading secrets in its own namespace is not granted either.
        secrets = cluster.kubectl("get", "secrets", "-n", namespace, kubeconfig=kubeconfig, check=False)
        assert secrets.returncode != 0 and "forbidden" in secrets.stderr.lower()
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_deleting_an_owner_garbage_collects_owned_pods(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    uid = cluster.kubectl("get", "configmap", "owner", "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    for name in ("owned-a", "owned-b"):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=POD.format(name=name, uid=uid))
    assert len(cluster.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.split()) == 2

    cluster.kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=background")
    wait_for(lambda: cluster.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.strip() == "",
             30, f"garbage collection of the pods owned by {namespace}/owner")


def test_read_returns_what_kubectl_get_prints_and_names_what_is_missing(cluster: Cluster, namespace: str) -> None:
    """Cluster.read (the tests' polls) against ``kubectl get -o json`` on the same objects."""
    import json

    from localcluster.reads import NotFound

    cluster.kubectl("create", "configmap", "owner", "-n", namespace, "--from-literal=k=v")
    cluster.kubectl("label", "configmap", "owner", "-n", namespace, "team=a")
    via_kubectl = json.loads(cluster.kubectl("get", "configmap", "owner", "-n", namespace, "-o", "json").stdout)
    assert cluster.read("cm", "owner", namespace) == via_kubectl
    listed = cluster.read("configmaps", namespace=namespace, selector="team=a")["items"]
    assert [o["metadata"]["uid"] for o in listed] == [via_kubectl["metadata"]["uid"]]
    assert cluster.read("configmaps", namespace=namespace, selector="team=b")["items"] == []
    assert cluster.read("configmap", "absent", namespace, missing_ok=True) is None
    with pytest.raises(NotFound, match=f"configmap {namespace}/absent not found"):
        cluster.read("configmap", "absent", namespace)


def _descendants_alive(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists() and
            "zombie" not in Path(f"/proc/{p}/status").read_text().lower()]


def test_a_second_cluster_starts_beside_the_first_and_stops_without_leftovers(cluster: Cluster) -> None:
    second = Cluster.start(bin_dir=cluster.bin_dir)
    workdir = second.workdir
    try:
        assert second.api_port != cluster.api_port
        assert second.kubectl("get", "namespaces", "default", "-o", "name").stdout.strip() == "namespace/default"
        pids = [p.popen.pid for p in second._procs]
        assert len(pids) == 4
    finally:
        second.stop()
    assert not workdir.exists(), f"{workdir} left behind"
    assert _descendants_alive(pids) == [], "control plane processes left running"
    # The first cluster is untouched.
    assert cluster.kubectl("get", "namespaces", "default", "-o", "name").returncode == 0


def test_missing_binaries_fail_with_a_message_that_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="localkube missing: run hack/build-tools.sh"):
        Cluster.start(tmp_path / "cluster", bin_dir=tmp_path / "no-bin")


def test_a_component_that_dies_at_start_up_is_named_with_its_log(cluster: Cluster, tmp_path: Path) -> None:
    # A fake "localkube" that exits at once stands for a broken build or a port already taken.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "localkube").write_text("#!/bin/sh\necho \"cannot listen: address already in use\" >&2\nexit 3\n")
    (fake / "localkube").chmod(0o755)
    with pytest.raises(ClusterError, match=r"(?s)etcd exited with code 3.*address already in use"):
        Cluster.start(tmp_path / "cluster", bin_dir=fake, timeout=10)


def test_build_tools_is_cached(cluster: Cluster) -> None:
    script = Path(__file__).resolve().parents[2] / "hack" / "build-tools.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "building" not in proc.stderr, f"second build-tools run rebuilt something:\n{proc.stderr}"
    assert Path(proc.stdout.strip()) == cluster.bin_dir
