"""Notice latency at scale: node taint -> `reprieve.dev/notice` on every pod of each affected job.

Against the local control plane (real kube-apiserver/etcd/controllers, no kubelets): 1,000 Node objects,
500 TrainingJobs x 20 pods = 10,000 pods as plain API objects (bound with nodeName, never run). The operator
runs as a local process with the chart's ServiceAccount token. Job k's pod j sits on node (20k + j) % 1000,
so each node hosts 10 pods of 10 different jobs, and tainting node 20t (t = 0..49) hits 10 fresh jobs.

Reported: p50/p99/max over the 500 jobs of (time all 20 pods carry the notice) - (time the taint was
written), the operator's RSS (with goodput accounting on: every job's pod 0 carries a live progress report
and every job's status.goodput is kept), and the same latency for the peer "the benchmark patches the 20 pods itself
right after the taint" (the API floor for delivering to one job), as a ratio.
Targets: p99 < 1 s, RSS < 300 MB.

    python benchmarks/notice_latency.py [--nodes 1000 --jobs 500 --replicas 20 --trials 50]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "tests" / "operator")]

from kubernetes import client, watch

NS = "bench"
TAINT = "cloud.google.com/impending-node-termination"
TOLERATE = [{"key": k, "operator": "Exists", "effect": "NoExecute"}
            for k in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def parallel(fn: Any, items: list[Any], workers: int = 16) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class Annotations:
    """Watch the namespace's pods; record when each pod first shows a notice."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core, self.seen, self.cond = core, {}, threading.Condition()
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        rv = self.core.list_namespaced_pod(NS, limit=1).metadata.resource_version
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=60):
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    if (pod.metadata.annotations or {}).get("reprieve.dev/notice"):
                        with self.cond:
                            self.seen.setdefault(pod.metadata.name, time.monotonic())
                            self.cond.notify_all()
            except Exception:
                if not self.stop.is_set():  # the cluster going away at the end is not an error
                    raise

    def wait(self, names: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.seen for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.seen]
                    raise TimeoutError(f"{len(missing)} pod(s) never got the notice, e.g. {missing[:3]}")
                self.cond.wait(left)
            return {n: self.seen[n] for n in names}


def wait_statuses(custom: Any, op: subprocess.Popen[bytes], field: str, jobs: int, limit_s: float, what: str) -> None:
    """Until every one of the ``jobs`` TrainingJobs has ``status.<field>``; fails after ``limit_s`` or when the
    operator ``op`` has ended (``what``: how the count is named in that error)."""
    t0 = time.monotonic()
    while True:
        items = custom.list_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs")["items"]
        done = sum(1 for i in items if (i.get("status") or {}).get(field))
        if done == jobs:
            return
        if op.poll() is not None or time.monotonic() - t0 > limit_s:
            raise RuntimeError(f"after {time.monotonic() - t0:.0f}s: {done}/{jobs} {what}")
        time.sleep(1)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cluster is stopped on `timeout`
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--trials", type=int, default=50)
    args = ap.parse_args()
    if args.nodes % args.replicas or args.jobs * args.replicas % args.nodes:
        ap.error("need nodes % replicas == 0 and jobs*replicas % nodes == 0")

    from conftest import job_manifest
    from localcluster import Cluster
    from localcluster.stack import OPERATOR_SA, RELEASE_NS, bench_namespace

    work = Path(tempfile.mkdtemp(prefix="reprieve-bench-"))
    with Cluster.start(work / "cluster") as cluster:
        t0 = time.monotonic()
        api = bench_namespace(cluster, NS, pool=32)  # the operator runs here as a local process
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

        parallel(lambda i: core.create_node({"metadata": {"name": f"n{i:04d}", "labels": {"bench": "1"}}}),
                 list(range(args.nodes)))
        uids: dict[int, str] = {}

        def make_job(k: int) -> None:
            m = job_manifest(f"j{k:03d}", NS, replicas=args.replicas)
            m["spec"]["template"]["spec"]["tolerations"] = TOLERATE
            m["spec"]["template"]["spec"]["serviceAccountName"] = "default"  # no per-job identity objects
            uids[k] = custom.create_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs",
                                                             m)["metadata"]["uid"]

        parallel(make_job, list(range(args.jobs)))

        # The operator's own builder makes the pods, exactly as it would; we only bind them to nodes.
        from reprieve_operator.models import TrainingJob
        from reprieve_operator.policy.builders import build_worker_pod

        def make_pods(k: int) -> None:
            body = custom.get_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs", f"j{k:03d}")
            job = TrainingJob.from_body(body)
            for j in range(args.replicas):
                pod = build_worker_pod(job, j, 1)
                pod["spec"]["nodeName"] = f"n{(args.replicas * k + j) % args.nodes:04d}"
                core.create_namespaced_pod(NS, pod)
            custom.patch_namespaced_custom_object_status(
                "reprieve.dev", "v1alpha1", NS, "trainingjobs", f"j{k:03d}",
                {"status": {"phase": "Pending", "attempt": 1, "startTime": "2026-01-01T00:00:00Z"}})

        parallel(make_pods, list(range(args.jobs)))
        print(f"created {args.nodes} nodes, {args.jobs} jobs, {args.jobs * args.replicas} pods "
              f"in {time.monotonic() - t0:.0f}s")

        kubeconfig = cluster.token_kubeconfig(RELEASE_NS, OPERATOR_SA)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(kubeconfig)
        log = open(work / "operator.log", "wb")  # noqa: SIM115
        op = subprocess.Popen([sys.executable, "-m", "reprieve_operator", "--namespace", NS, "--metrics-port", "0"], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            t1 = time.monotonic()  # ready: every job reconciled once (status.ready written)
            wait_statuses(custom, op, "ready", args.jobs, 900, f"jobs reconciled; see {log.name}")
            print(f"operator reconciled all jobs in {time.monotonic() - t1:.0f}s; RSS {rss_mb(op.pid)[0]:.0f} MB")
            # Goodput accounting on for every job: process 0's live progress report (docs/contract.md) on each
            # job's pod 0, as a running job has it; wait until every status carries status.goodput.
            t2 = time.monotonic()
            now = time.time()

            def report(k: int) -> None:
                value = {"attempt": 1, "step": 500, "committedStep": -1, "time": "2026-01-01T00:00:00Z",
                         "stepAt": now, "stepSeconds": 0.1, "firstStep": 0, "firstStepAt": now - 50.0,
                         "restoreSeconds": 0.0, "saveBlockingSeconds": 0.0}
                core.patch_namespaced_pod(f"j{k:03d}-0", NS, {"metadata": {"annotations": {
                    "reprieve.dev/progress": json.dumps(value)}}})

            parallel(report, list(range(args.jobs)))
            wait_statuses(custom, op, "goodput", args.jobs, 600, f"jobs with goodput accounting; see {log.name}")
            print(f"goodput accounting on for all {args.jobs} jobs in {time.monotonic() - t2:.0f}s; "
                  f"RSS {rss_mb(op.pid)[0]:.0f} MB")
            time.sleep(3)
            watcher = Annotations(core)
            time.sleep(1)
            per_job: list[float] = []
            for t in range(args.trials):
                node = (args.replicas * t) % args.nodes
                jobs = sorted({(node + args.nodes * m) // args.replicas
                               for m in range(args.jobs * args.replicas // args.nodes)})
                names = {k: [f"j{k:03d}-{j}" for j in range(args.replicas)] for k in jobs}
                start = time.monotonic()
                core.patch_node(f"n{node:04d}", {"spec": {"taints": [{"key": TAINT, "value": "true",
                                                                      "effect": "NoSchedule"}]}})
                got = watcher.wait([n for ns in names.values() for n in ns], 30)
                per_job += [max(got[n] for n in names[k]) - start for k in jobs]
            rss, peak = rss_mb(op.pid)
            watcher.stop.set()

            # Peer: the same deliveries done by hand, straight after a taint: patch every pod of the jobs on
            # one node (32 threads, job by job, like the operator's pool), time per job from the taint.
            peer: list[float] = []
            for t in range(min(5, args.trials)):
                node = (args.replicas * t) % args.nodes
                jobs = sorted({(node + args.nodes * m) // args.replicas
                               for m in range(args.jobs * args.replicas // args.nodes)})
                start = time.monotonic()
                core.patch_node(f"n{node:04d}", {"metadata": {"labels": {"bench-peer": str(t)}}})
                finished: dict[int, float] = {}

                def patch(kj: tuple[int, int], t: int = t, finished: dict[int, float] = finished) -> None:
                    k, j = kj
                    core.patch_namespaced_pod(f"j{k:03d}-{j}", NS, {"metadata": {"annotations": {
                        "bench/peer": str(t)}}})
                    finished[k] = max(finished.get(k, 0.0), time.monotonic())

                parallel(patch, [(k, j) for k in jobs for j in range(args.replicas)], workers=32)
                peer += [finished[k] - start for k in jobs]
        finally:
            op.terminate()
            op.wait(30)
            log.close()
        p50, p99 = statistics.median(per_job), pct(per_job, 0.99)
        print(json.dumps({"jobs_measured": len(per_job), "p50_s": round(p50, 4), "p99_s": round(p99, 4),
                          "max_s": round(max(per_job), 4), "operator_rss_mb": round(rss, 1),
                          "operator_peak_rss_mb": round(peak, 1),
                          "peer_direct_patch_p50_s": round(statistics.median(peer), 4),
                          "peer_direct_patch_p99_s": round(pct(peer, 0.99), 4)}, indent=1))
        print(f"taint -> notice on all {args.replicas} pods of a job: p50 {p50 * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms (target < 1000 ms: {'PASS' if p99 < 1 else 'FAIL'}); "
              f"p50 {p50 / statistics.median(peer):.2f}x, p99 {p99 / pct(peer, 0.99):.2f}x the peer "
              "(the same patches sent directly by the benchmark)")
        print(f"operator RSS {rss:.0f} MB, peak {peak:.0f} MB (target < 300 MB: {'PASS' if peak < 300 else 'FAIL'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
