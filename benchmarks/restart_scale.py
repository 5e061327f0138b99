"""Gang restart at scale: in-place restart vs recreate-all, API objects only (as notice_latency.py does).

Against the local control plane (real kube-apiserver/etcd/scheduler/controllers, no kubelets), for a gang of
``--replicas`` pods on as many Node objects, the operator (a local process with the chart's RBAC) restarts the
gang after every worker saved and exited with the restart code:

* **in place** (``restartMode: InPlace``): the benchmark plays the supervisors: it writes every pod's exit report
  (``reprieve.dev/exit``, attempt 1, code 42). Measured: from the last report written ("every worker reported
  exit 42") to the next assignment (``<job>-assignment``, attempt 2) being visible to a watcher -- the moment
  every supervisor can start its next trainer ("every worker of the next attempt holds its assignment").
* **recreate-all** (``restartMode: Recreate``): the benchmark plays the kubelets: it marks every pod Failed with
  exit code 42, and confirms each graceful deletion at once (the kubelet's part, without its grace). Measured:
  from the last exit written to every pod of attempt 2 existing and bound to a node by the scheduler.

The job's ``terminationGracePeriodSeconds`` is 600 s: the benchmark's one client writes 5,000 exits in ~30 s, and
with a short grace the operator's straggler rule (docs/operator.md: a worker that has not reported within the
grace after the first report is stopped and the gang restarts anyway) would answer before the last exit is
written -- that measured the straggler path, not a restart (it did, until 2026-11-24: "4.7 s at 1,000 pods" was
742 reports and a 5 s grace). A run whose operator log shows the straggler path is refused. The time to write the
exits (the benchmark's client, not the operator) is printed apart.

The pods' start (image pull, container start) is not part of either number: in place it is not needed, recreated
it comes on top (benchmarks/goodput.py has it with emulated costs).

    python benchmarks/restart_scale.py [--replicas 1000 5000] [--modes inplace recreate]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "tests" / "operator")]

from kubernetes import client, watch

NS = "bench"
TOLERATE = [{"operator": "Exists", "key": k} for k in ("node.kubernetes.io/unreachable",
                                                        "node.kubernetes.io/not-ready")]


def parallel(fn: Any, items: list[Any], workers: int = 32) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def now_rfc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelets:
    """The kubelets' part of pod deletion: a graceful delete is confirmed at once (grace 0)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core, self.stop = core, threading.Event()
        self.pool = ThreadPoolExecutor(16)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        rv = self.core.list_namespaced_pod(NS, limit=1).metadata.resource_version
        while not self.stop.is_set():
            try:
                for ev in watch.Watch().stream(self.core.list_namespaced_pod, NS, resource_version=rv,
                                               timeout_seconds=60):
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    if pod.metadata.deletion_timestamp and ev["type"] != "DELETED":
                        self.pool.submit(self._confirm, pod.metadata.name, pod.metadata.uid)
            except Exception:  # noqa: BLE001 - the cluster going away at the end
                if self.stop.is_set():
                    return
                rv = self.core.list_namespaced_pod(NS, limit=1).metadata.resource_version

    def _confirm(self, name: str, uid: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, NS, body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
        except client.exceptions.ApiException as err:
            if err.status not in (404, 409):
                raise


def setup(core: client.CoreV1Api, custom: client.CustomObjectsApi, n: int, mode: str, name: str) -> Any:
    """Nodes, the job and its running attempt-1 gang, as the operator would have left them."""
    from conftest import job_manifest
    from reprieve_operator.models import TrainingJob
    from reprieve_operator.policy import builders

    def node(i: int) -> None:
        nm = f"{name}-n{i:05d}"
        core.create_node({"metadata": {"name": nm, "labels": {"bench": name}}, "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}})
        core.patch_node_status(nm, {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                                "reason": "KubeletReady", "message": "bench",
                                                                "lastHeartbeatTime": now_rfc(),
                                                                "lastTransitionTime": now_rfc()}]}})

    parallel(node, list(range(n)))
    m = job_manifest(name, NS, replicas=n, restartMode="InPlace" if mode == "inplace" else "Recreate")
    m["spec"]["terminationGracePeriodSeconds"] = 600  # no straggler rule while the client writes the exits
    pod_spec = m["spec"]["template"]["spec"]
    pod_spec["tolerations"] = TOLERATE
    pod_spec["nodeSelector"] = {"bench": name}
    pod_spec["serviceAccountName"] = "default"
    body = custom.create_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs", m)
    job = TrainingJob.from_body(body)

    def pod(i: int) -> None:
        p = builders.build_worker_pod(job, i, 1)
        p["spec"]["nodeName"] = f"{name}-n{i:05d}"
        core.create_namespaced_pod(NS, p)
        core.patch_namespaced_pod_status(p["metadata"]["name"], NS, {"status": {
            "phase": "Running", "podIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            "conditions": [{"type": "Ready", "status": "True"}]}})

    parallel(pod, list(range(n)))
    if mode == "inplace":
        core.create_namespaced_config_map(NS, builders.build_assignment(
            job, 1, {builders.pod_name(job, i): i for i in range(n)}, f"10.0.0.0:{job.spec.coordinator_port}"))
    custom.patch_namespaced_custom_object_status("reprieve.dev", "v1alpha1", NS, "trainingjobs", name, {
        "status": {"phase": "Running", "attempt": 1, "startTime": "2026-01-01T00:00:00Z",
                   "attemptStartTime": "2026-01-01T00:00:00Z", "ready": f"{n}/{n}"}})
    return job


def measure_inplace(core: client.CoreV1Api, name: str, n: int) -> float:
    got = threading.Event()
    seen: dict[str, float] = {}

    def watch_assignment() -> None:
        for ev in watch.Watch().stream(core.list_namespaced_config_map, NS, field_selector=f"metadata.name={name}"
                                       "-assignment", timeout_seconds=300):
            if (ev["object"].data or {}).get("attempt") == "2":
                seen["t"] = time.monotonic()
                got.set()
                return

    threading.Thread(target=watch_assignment, daemon=True).start()
    time.sleep(0.5)
    report = json.dumps({"attempt": 1, "code": 42, "time": now_rfc()})
    t0 = time.monotonic()
    parallel(lambda i: core.patch_namespaced_pod(f"{name}-{i}", NS, {"metadata": {"annotations": {
        "reprieve.dev/exit": report}}}), list(range(n)))
    t_last = time.monotonic()
    print(f"inplace {n}: {n} exit reports written in {t_last - t0:.2f}s", flush=True)
    if not got.wait(300):
        raise TimeoutError("the assignment of attempt 2 never came")
    return seen["t"] - t_last


def measure_recreate(core: client.CoreV1Api, name: str, n: int) -> float:
    bound: set[str] = set()
    done = threading.Event()
    t_end: dict[str, float] = {}

    def watch_pods() -> None:
        rv = core.list_namespaced_pod(NS, limit=1).metadata.resource_version
        while not done.is_set():
            for ev in watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=60,
                                           label_selector=f"reprieve.dev/job-name={name},reprieve.dev/attempt=2"):
                p = ev["object"]
                rv = p.metadata.resource_version
                if ev["type"] != "DELETED" and p.spec.node_name:
                    bound.add(p.metadata.name)
                if len(bound) == n:
                    t_end["t"] = time.monotonic()
                    done.set()
                    return

    threading.Thread(target=watch_pods, daemon=True).start()
    time.sleep(0.5)
    status = {"status": {"phase": "Failed", "containerStatuses": [{
        "name": "trainer", "image": "python:3.11", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 42, "reason": "Error", "startedAt": now_rfc(),
                                 "finishedAt": now_rfc()}}}]}}
    t0 = time.monotonic()
    parallel(lambda i: core.patch_namespaced_pod_status(f"{name}-{i}", NS, status), list(range(n)))
    t_last = time.monotonic()
    print(f"recreate {n}: {n} exits written in {t_last - t0:.2f}s", flush=True)
    if not done.wait(900):
        raise TimeoutError(f"only {len(bound)}/{n} pods of attempt 2 were bound")
    return t_end["t"] - t_last


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--modes", nargs="+", default=["inplace", "recreate"], choices=["inplace", "recreate"])
    args = ap.parse_args()

    from localcluster import Cluster
    from localcluster.stack import OPERATOR_SA, RELEASE_NS, bench_namespace

    results: dict[str, dict[int, float]] = {m: {} for m in args.modes}
    work = Path(tempfile.mkdtemp(prefix="reprieve-restart-bench-"))
    for n in args.replicas:
        for mode in args.modes:
            # API-only Nodes have no kubelet heartbeat: without this the node lifecycle controller marks all of
            # them NotReady ~40 s in (5,000 Node writes during the measurement: it measured 62 s, not the restart).
            with Cluster.start(work / f"cluster-{mode}-{n}",
                               controller_manager_args=("--controllers=*,-node-lifecycle-controller",)) as cluster:
                api = bench_namespace(cluster, NS, pool=64)  # the operator runs here as a local process
                core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
                name = f"g{n}"
                t = time.monotonic()
                setup(core, custom, n, mode, name)
                print(f"{mode} {n}: set up {n} nodes and a running gang in {time.monotonic() - t:.0f}s", flush=True)
                kubelets = Kubelets(core) if mode == "recreate" else None
                env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
                env["KUBECONFIG"] = str(cluster.token_kubeconfig(RELEASE_NS, OPERATOR_SA))
                log = open(work / f"operator-{mode}-{n}.log", "wb")  # noqa: SIM115
                op = subprocess.Popen([sys.executable, "-m", "reprieve_operator", "--namespace", NS,
                                       "--metrics-port", "0"], stdout=log, stderr=subprocess.STDOUT, env=env)
                try:
                    t = time.monotonic()
                    while True:  # the operator has the gang in hand: its status was reconciled
                        st = custom.get_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs",
                                                                 name).get("status") or {}
                        if st.get("selector"):
                            break
                        if op.poll() is not None or time.monotonic() - t > 600:
                            raise RuntimeError(f"operator not ready; see {log.name}")
                        time.sleep(0.5)
                    time.sleep(2)
                    took = (measure_inplace if mode == "inplace" else measure_recreate)(core, name, n)
                    results[mode][n] = took
                    print(f"{mode} {n}: {took:.2f}s", flush=True)
                finally:
                    op.terminate()
                    op.wait(30)
                    log.close()
                    if kubelets is not None:
                        kubelets.stop.set()
                # Refuse a run that measured something else: the straggler path (not every exit was written
                # yet), or a reconcile that failed and was retried later (its retry measured as restart time).
                lines = Path(log.name).read_text().splitlines()
                stragglers = [line for line in lines if "stopped by their supervisors" in line]
                if stragglers:
                    raise RuntimeError(f"{mode} {n}: the operator took the straggler path, not a restart of a gang "
                                       f"that all reported ({stragglers[0]}); see {log.name}")
                failed = [line for line in lines if "reconcile failed" in line]
                if failed:
                    raise RuntimeError(f"{mode} {n}: the operator's reconcile failed ({failed[0]}); see {log.name}")
    print(json.dumps({m: {str(k): round(v, 3) for k, v in r.items()} for m, r in results.items()}, indent=1))
    for n in args.replicas:
        line = [f"{n} pods:"]
        if n in results.get("inplace", {}):
            line.append(f"in place {results['inplace'][n]:.2f}s (target < 5 s at 5,000: "
                        f"{'PASS' if results['inplace'][n] < 5 else 'FAIL'})" if n >= 5000 else
                        f"in place {results['inplace'][n]:.2f}s")
        if n in results.get("recreate", {}):
            line.append(f"recreate-all {results['recreate'][n]:.2f}s")
        if n in results.get("inplace", {}) and n in results.get("recreate", {}):
            line.append(f"ratio {results['inplace'][n] / results['recreate'][n]:.3f}x")
        print(", ".join(line))
    if "inplace" in results and len(results["inplace"]) == 2:
        a, b = sorted(results["inplace"])
        print(f"in place grows {results['inplace'][b] / results['inplace'][a]:.2f}x from {a} to {b} pods")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
