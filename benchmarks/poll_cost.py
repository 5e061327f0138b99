"""What one read of the cluster costs a test that polls: ``python benchmarks/poll_cost.py [--calls 40]``.

The suite waits on clusters by polling (a job's phase, its pods, a node's Ready): each read ran ``kubectl get -o
json``, a Go binary's start. This starts a local control plane (no nodes), makes four pods of a job, and reads them
``--calls`` times each way, printing the CPU of the calling process and of its children (kubectl) per call, the wall
time per call, and each way's CPU against ``Cluster.read`` (localcluster/reads.py, what the tests use now).

Measures CPU on a shared machine: run it with nothing else running for numbers to compare.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))

from localcluster import Cluster

SELECTOR = "reprieve.dev/job-name=j"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    """Per call: own CPU, children's CPU (ms), wall (ms); one call before, not counted (imports, connections)."""
    fn()
    own, kids, wall = time.process_time(), children_cpu(), time.monotonic()
    for _ in range(calls):
        fn()
    return {"own_ms": 1000 * (time.process_time() - own) / calls,
            "children_ms": 1000 * (children_cpu() - kids) / calls,
            "wall_ms": 1000 * (time.monotonic() - wall) / calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    from kubernetes import client

    with Cluster.start() as cluster:
        cluster.kubectl("create", "namespace", "x")
        for i in range(4):
            cluster.kubectl("run", f"p{i}", "-n", "x", "--image=none", f"--labels={SELECTOR}")
        core = client.CoreV1Api(cluster.api_client())
        ways: dict[str, Callable[[], Any]] = {
            "kubectl get pods -l ... -o json": lambda: json.loads(cluster.kubectl(
                "get", "pods", "-n", "x", "-l", SELECTOR, "-o", "json").stdout),
            "Python client list_namespaced_pod (models)": lambda: core.list_namespaced_pod(
                "x", label_selector=SELECTOR),
            "Cluster.read('pods', selector=...)": lambda: cluster.read("pods", namespace="x", selector=SELECTOR),
        }
        results = {name: measure(fn, args.calls) for name, fn in ways.items()}
    ours = results["Cluster.read('pods', selector=...)"]
    ours_cpu = ours["own_ms"] + ours["children_ms"]
    print(f"{args.calls} reads of a job's 4 pods each way (CPU per call: own + children; wall per call)")
    for name, r in results.items():
        cpu = r["own_ms"] + r["children_ms"]
        print(f"  {name:45s} {cpu:7.1f} ms CPU ({r['own_ms']:.1f} + {r['children_ms']:.1f}), "
              f"{r['wall_ms']:6.1f} ms wall, {cpu / ours_cpu:5.1f}x Cluster.read's CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
