"""The local control plane is real: RBAC with ServiceAccount tokens, garbage collection, clean start/stop, an
apiserver restart that keeps every object."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.error
from pathlib import Path

import pytest
from localcluster import Cluster, ClusterError
from localcluster.pki import PKI
from localcluster.procs import Proc, free_port
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


def test_an_apiserver_restart_keeps_every_object_and_every_client_comes_back(cluster: Cluster,
                                                                             namespace: str) -> None:
    """The chaos soak's apiserver-restart on the shared cluster: down for real, everything kept, and the
    controller-manager (a client-go client like the operator) reconnects on its own. Leaves the cluster healthy."""
    cluster.kubectl("create", "configmap", "before", "-n", namespace, "--from-literal=k=v")
    uid = cluster.read("cm", "before", namespace)["metadata"]["uid"]
    old_pid = next(p.popen.pid for p in cluster._procs if p.name == "kube-apiserver")
    refused: list[float] = []
    served: list[float] = []
    stop = threading.Event()

    def poll() -> None:  # reads all through the restart: the down window must show as refused connections
        while not stop.is_set():
            try:
                cluster.read("cm", "before", namespace, timeout=2)
                served.append(time.monotonic())
            except urllib.error.URLError as err:
                if isinstance(err.reason, ConnectionRefusedError):
                    refused.append(time.monotonic())
            except OSError:  # a connection cut while the server shut down
                pass
            stop.wait(0.1)

    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    wait_for(lambda: bool(served), 10, "a first read before the restart")
    try:
        cluster.restart_apiserver(down_seconds=2.0)
    finally:
        stop.set()
        reader.join(10)

    assert refused, "no read was refused while the apiserver was down"
    assert refused[-1] - refused[0] >= 1.0, f"refused reads spanned {refused[-1] - refused[0]:.2f}s of a 2 s window"
    assert served[-1] > refused[-1], "no read succeeded after the restart"
    apiservers = [p for p in cluster._procs if p.name == "kube-apiserver"]
    assert len(apiservers) == 1 and apiservers[0].popen.pid != old_pid and apiservers[0].popen.poll() is None
    assert cluster.read("cm", "before", namespace)["metadata"]["uid"] == uid
    assert cluster.kubectl("get", "configmap", "before", "-n", namespace, "-o",
                           "jsonpath={.data.k}").stdout == "v"
    # The controller-manager's ServiceAccount controller gives a namespace created now its `default` account.
    cluster.kubectl("create", "serviceaccount", "after", "-n", namespace)
    other = f"{namespace}-after"
    cluster.kubectl("create", "namespace", other)
    try:
        wait_for(lambda: cluster.read("sa", "default", other, missing_ok=True) is not None, 30,
                 f"the controller-manager to create ServiceAccount default in {other} after the restart")
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_an_apiserver_that_does_not_come_back_is_named_with_its_log(tmp_path: Path) -> None:
    """A restart whose new kube-apiserver exits (here a fake localkube: a port taken meanwhile) is a ClusterError
    with the log's last lines, and stop() still owns the process in the old one's place."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "localkube").write_text("#!/bin/sh\necho \"failed to listen: bind: address already in use\" >&2\n"
                                    "exit 1\n")
    (fake / "localkube").chmod(0o755)
    (tmp_path / "logs").mkdir()
    cluster = Cluster(tmp_path, fake, PKI(tmp_path / "pki"), free_port(), tmp_path / "admin.kubeconfig")
    old = Proc("kube-apiserver", subprocess.Popen(["sleep", "60"], start_new_session=True),
                tmp_path / "logs" / "kube-apiserver.log")
    cluster._procs.append(old)
    try:
        with pytest.raises(ClusterError, match=r"(?s)did not come back after a restart: kube-apiserver exited "
                                               r"with code 1.*address already in use"):
            cluster.restart_apiserver(down_seconds=0.0, timeout=10)
        assert old.popen.poll() is not None, "the old kube-apiserver was not stopped"
        assert [p.name for p in cluster._procs] == ["kube-apiserver"] and cluster._procs[0] is not old
    finally:
        cluster.stop()
