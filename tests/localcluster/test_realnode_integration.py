"""Real nodes: pods are real containers with the cluster's DNS and API, no way out, and nothing is left behind.

The same pods run on a process node of the same cluster where the two kinds are compared (docs/local-cluster.md,
"What the real kubelet taught us").
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster import cgroups
from localcluster.realnodespec import node_ip
from localcluster.testing import wait_for, wait_for_pod_phase

pytestmark = [pytest.mark.integration, pytest.mark.realnodes, pytest.mark.timeout(1800)]

PROBE = r"""
import json, os, socket, ssl, sys, time, urllib.request
out = {"uid": os.getuid(), "hostname": socket.gethostname(), "env_api": os.environ.get("KUBERNETES_SERVICE_HOST")}
me = f"{os.environ['HOSTNAME']}.probe.{os.environ['NS']}.svc"
for _ in range(100):  # the pod's own name exists once its EndpointSlice does
    try:
        out["dns_self"] = socket.gethostbyname(me)
        break
    except OSError:
        time.sleep(0.1)
try:
    socket.gethostbyname("pypi.org")
    out["outside_dns"] = "resolved"
except OSError:
    out["outside_dns"] = "nxdomain"
try:
    socket.create_connection(("1.1.1.1", 443), timeout=3).close()
    out["outside_tcp"] = "connected"
except OSError as err:
    out["outside_tcp"] = err.strerror
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
req = urllib.request.Request(f"https://kubernetes.default.svc/api/v1/namespaces/{os.environ['NS']}/pods",
                             headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
try:
    out["api"] = urllib.request.urlopen(req, context=ctx, timeout=5).status
except urllib.error.HTTPError as err:
    out["api"] = err.code
print("RESULT " + json.dumps(out), flush=True)
sys.exit(3)
"""


@pytest.fixture
def real_ns(real_cluster: Any) -> Iterator[str]:
    name = f"r-{uuid.uuid4().hex[:8]}"
    real_cluster.kubectl("create", "namespace", name)
    wait_for(lambda: real_cluster.read("sa", "default", name, missing_ok=True) is not None, 30,
             f"ServiceAccount default in {name}")
    yield name
    real_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def real_api(real_cluster: Any) -> Iterator[Any]:
    client = real_cluster.api_client()
    yield client
    client.close()


def pod(name: str, node: str, image: str, command: list[str], **extra: Any) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "probe"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                     "hostname": name, "subdomain": "probe",
                     "containers": [{"name": "main", "image": image, "command": command, **extra}]}}


def result(cluster: Any, ns: str, name: str) -> dict:
    for path in cluster.pod_logs(ns, name, "main"):
        for line in path.read_text().splitlines():
            if "RESULT " in line:
                return dict(json.loads(line.split("RESULT ", 1)[1]))
    raise AssertionError(f"no RESULT line in the logs of {ns}/{name}")


def test_a_pod_on_a_real_node_is_a_container_with_cluster_dns_and_api_and_no_route_out(
        real_cluster: Any, real_ns: str, real_api: Any) -> None:
    image = real_cluster.real.images["operator"].ref  # any image of ours with python
    real_cluster.kubectl("apply", "-n", real_ns, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "probe"},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "probe"}}}))
    body = pod("p-0", "real-sys-0", image, ["python", "-c", PROBE],
               env=[{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}])
    real_cluster.kubectl("apply", "-n", real_ns, "-f", "-", input=json.dumps(body))
    done = wait_for_pod_phase(real_api, real_ns, "p-0", ["Failed", "Succeeded"], timeout=120)
    out = result(real_cluster, real_ns, "p-0")
    assert out["uid"] == 65532 and out["hostname"] == "p-0", out
    assert out["env_api"] == "10.96.0.1", out                 # the kubernetes Service, as kubelets set it
    assert out["dns_self"] == done.status.pod_ip, out           # J-0.J.NS.svc-style name -> the pod's own IP
    assert done.status.pod_ip.startswith("10.244."), done.status.pod_ip
    assert out["api"] == 403, out                               # reached and authenticated (no RBAC for default)
    assert out["outside_dns"] == "nxdomain" and out["outside_tcp"] == "Network is unreachable", out
    state = done.status.container_statuses[0].state.terminated
    assert (done.status.phase, state.exit_code, state.reason) == ("Failed", 3, "Error")
    assert done.status.host_ip.startswith("10.243.0."), done.status.host_ip
    # kubectl logs: the API server reaches the kubelet through clusternet's proxy
    assert "RESULT " in real_cluster.kubectl("logs", "p-0", "-n", real_ns).stdout


def test_downward_api_annotations_reach_a_real_container(real_cluster: Any, real_ns: str, real_api: Any) -> None:
    """The refresh time is printed (docs/local-cluster.md records it); the kubelet's worst case is its sync
    period (1 min), bounded here by the wait for Succeeded."""
    watcher = ("import time, sys\n"
               "print('READY', open('/info/a').read().count('k=\"1\"'), flush=True)\n"
               "while 'k=\"2\"' not in open('/info/a').read(): time.sleep(0.02)\n"
               "print('SEEN', time.time(), flush=True)\n")
    body = pod("d-0", "real-sys-0", real_cluster.real.images["operator"].ref, ["python", "-c", watcher],
               volumeMounts=[{"name": "info", "mountPath": "/info"}])
    body["metadata"]["annotations"] = {"k": "1"}
    body["spec"]["volumes"] = [{"name": "info", "downwardAPI": {
        "items": [{"path": "a", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}]
    real_cluster.kubectl("apply", "-n", real_ns, "-f", "-", input=json.dumps(body))
    wait_for_pod_phase(real_api, real_ns, "d-0", "Running", timeout=120)
    # the container has read the file as it was (k="1") before the annotation changes
    wait_for(lambda: any("READY 1" in p.read_text() for p in real_cluster.pod_logs(real_ns, "d-0", "main")), 60,
             "the container's first read of the downward-API file")
    t0 = time.time()
    real_cluster.kubectl("annotate", "pod", "d-0", "-n", real_ns, "k=2", "--overwrite")
    wait_for_pod_phase(real_api, real_ns, "d-0", "Succeeded", timeout=90)
    seen = next(float(line.split("SEEN ")[1]) for p in real_cluster.pod_logs(real_ns, "d-0", "main")
                for line in p.read_text().splitlines() if "SEEN " in line)
    print(f"downward-API annotation refresh on a real node: {seen - t0:.2f}s")
    assert seen > t0  # seen after the change: the file was refreshed in the running container


def test_a_stopped_real_node_leaves_no_process_cgroup_mount_or_address(real_cluster: Any, real_ns: str,
                                                                        real_api: Any) -> None:
    name = "real-tmp"
    real_cluster.add_node(name, {"reprieve.test/pool": "tmp"}, kind="real", images=[])
    body = pod("t-0", name, real_cluster.real.images["pause"].ref, ["/pause"])
    real_cluster.kubectl("apply", "-n", real_ns, "-f", "-", input=json.dumps(body))
    wait_for_pod_phase(real_api, real_ns, "t-0", "Running", timeout=120)
    tree = real_cluster.real.tree(name)
    address = node_ip(real_cluster.real.indexes[name])
    node_dir = str(real_cluster.real.paths(name).root)
    assert len(cgroups.pids(tree)) >= 4  # launcher, containerd, kubelet, shim, pause x2
    real_cluster.kill_node(name)         # the machine vanishes: everything at once
    assert cgroups.pids(tree) == set()
    assert not any(Path(m, tree.lstrip("/")).exists() for m in set(cgroups.hierarchies().values()))
    assert node_dir not in Path("/proc/self/mountinfo").read_text()
    assert real_cluster.real.net is not None
    local = re.findall(r"\b(10\.243\.0\.\d+)\b", Path(f"/proc/{real_cluster.real.net.popen.pid}/net/fib_trie").read_text())
    assert address not in local and node_ip(real_cluster.real.indexes["real-sys-0"]) in local, local
    real_cluster.kubectl("delete", "node", name, "--wait=false")


def test_pod_start_is_measured_on_both_kinds_of_node(real_cluster: Any) -> None:
    from tests.benchmark_module import load_benchmark

    bench = load_benchmark("pod_start")
    times = bench.measure(real_cluster, 3)
    print(bench.report(times))
    assert len(times["real"]) == len(times["process"]) == 3
    assert all(t > 0 for t in times["real"] + times["process"])  # the benchmark's own timeout bounds each
