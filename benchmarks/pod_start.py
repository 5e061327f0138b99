"""Pod create -> Running on a real node (upstream kubelet, containerd, runc) vs a process node, in one cluster.

    python benchmarks/pod_start.py --pods 20

Pods are created one at a time, pinned by ``nodeName``-free node selectors to one node of each kind, and timed
from the create call to the first read that shows phase Running (polled every 10 ms). The real pod runs the
locally built pause image (already imported: no pull), the process pod ``sleep``. Prints the median and p90 of
each and the ratio real/process. The images are built or reused by hack/build-images.sh.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))

from localcluster import Cluster


def time_pod(core: Any, namespace: str, node: str, spec: dict, timeout: float = 120.0) -> float:
    name = f"p-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 0, "containers": [{"name": "main", **spec}]}}
    t0 = time.monotonic()
    core.create_namespaced_pod(namespace, body)
    while time.monotonic() - t0 < timeout:
        if core.read_namespaced_pod_status(name, namespace).status.phase == "Running":
            elapsed = time.monotonic() - t0
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            return elapsed
        time.sleep(0.01)
    raise TimeoutError(f"pod {namespace}/{name} on {node} not Running after {timeout:.0f}s")


def measure(cluster: Cluster, pods: int) -> dict[str, list[float]]:
    from kubernetes import client

    for name, kind in (("bench-process", "process"), ("bench-real", "real")):
        if name not in cluster.node_names():
            cluster.add_node(name, kind=kind, images=[] if kind == "real" else None)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    # the ServiceAccount admission needs the namespace's default ServiceAccount
    deadline = time.monotonic() + 30
    while not core.list_namespaced_service_account(namespace).items and time.monotonic() < deadline:
        time.sleep(0.1)
    pause = cluster.real.images["pause"].ref
    specs = {"bench-real": {"image": pause},
             "bench-process": {"image": pause, "command": ["sleep", "600"]}}
    times: dict[str, list[float]] = {"real": [], "process": []}
    try:
        for _ in range(pods):
            for node, kind in (("bench-process", "process"), ("bench-real", "real")):
                times[kind].append(time_pod(core, namespace, node, specs[node]))
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        api.close()
    return times


def report(times: dict[str, list[float]]) -> str:
    lines = []
    for kind in ("process", "real"):
        xs = sorted(times[kind])
        p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
        lines.append(f"{kind:8s} node: create -> Running median {statistics.median(xs):.3f}s  p90 {p90:.3f}s  "
                     f"(n={len(xs)})")
    ratio = statistics.median(times["real"]) / statistics.median(times["process"])
    lines.append(f"real / process median: {ratio:.1f}x")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=20)
    args = parser.parse_args()
    with Cluster.start() as cluster:
        print(report(measure(cluster, args.pods)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
