"""A Kueue preemption with and without Reprieve's notice, on the same job, in one run (issue #26).

One local cluster, real Kueue (v0.17, built from its Go module: ``make kueue``), the operator with ``--kueue``. The
same training job -- the example trainer (``examples/train_lm.py``, 2 JAX processes on process nodes, periodic
checkpoints every ``--interval`` steps) queued at low priority in a ClusterQueue with quota for one job -- is
preempted by a higher-priority job at step ``--preempt-at``, twice, one variant after the other:

* **notice**: Reprieve as shipped. Kueue evicts the Workload; the operator gives the gang a notice, the gang agrees
  on a step, saves it and exits with the restart code, and only then is the quota given back.
* **without**: the same job with the notice off (``spec.preemption.enabled: false``): the eviction stops the pods
  at once, as Kueue stops a batch Job, and the trainer dies at SIGTERM as a trainer without Reprieve's handler does
  (a wrapper turns the SIGTERM into a SIGKILL of the trainer: Reprieve's runtime would otherwise take a last-resort
  save on it). It resumes from its last periodic checkpoint.

Printed per variant: lost steps (steps computed again after the resume; docs/goodput.md), eviction -> quota released
(the Workload's ``Evicted=True`` to its ``QuotaReserved=False``, both as seen by a watch of this process), how long
the readmitted job takes to start (the quota reserved again -> the resumed attempt's first step: pods, JAX, the
restore), the gap in training and the wall time; then the ratios.

    python benchmarks/kueue_preemption.py                     # 400 steps of ~0.1 s, checkpoints every 50, preempt at 90
    python benchmarks/kueue_preemption.py --preempt-at 60 --interval 25
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))

from kubernetes import client as k8s
from kubernetes import watch
from localcluster import Cluster
from localcluster.goodput import GoodputReport, analyse, read_step_log
from localcluster.kueue import cluster_queue, local_queue, priority_class, resource_flavor, start_kueue
from localcluster.stack import CHART, RELEASE, RELEASE_NS, OperatorProcess, example_job, install_chart
from localcluster.testing import wait_for

VARIANTS = ("notice", "without")
POOL = "reprieve.bench/pool"
# The trainer of the "without" variant: SIGTERM kills it at once (SIGKILL), as it kills a trainer that installs
# no handler; no last-resort save.
NO_SIGTERM_SAVE = (
    "import signal, subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, *sys.argv[1:]])\n"
    "signal.signal(signal.SIGTERM, lambda *_: (p.kill(), sys.exit(143)))\n"
    "sys.exit(p.wait())\n")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class WorkloadClock:
    """A watch of one namespace's Workloads: when this process first saw ``Evicted=True`` and, after it,
    ``QuotaReserved=False`` (monotonic seconds), and then the quota reserved again (wall time: the readmission,
    compared with the resumed attempt's first step in the step log)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.evicted: float | None = None
        self.released: float | None = None
        self.readmitted_at: float | None = None
        self.reason = ""
        self._stop = threading.Event()
        crd = k8s.CustomObjectsApi(api)
        self._fn = lambda **kw: crd.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace,
                                                                  "workloads", **kw)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for ev in watch.Watch().stream(self._fn, label_selector="reprieve.dev/job-name=victim",
                                               timeout_seconds=30):
                    conds = {c["type"]: c for c in (ev["object"].get("status") or {}).get("conditions") or []}
                    now = time.monotonic()
                    if self.evicted is None and conds.get("Evicted", {}).get("status") == "True":
                        self.evicted, self.reason = now, str(conds["Evicted"].get("reason"))
                    if self.evicted is not None and self.released is None and \
                            conds.get("QuotaReserved", {}).get("status") == "False":
                        self.released = now
                    if self.released is not None and self.readmitted_at is None and \
                            conds.get("QuotaReserved", {}).get("status") == "True":
                        self.readmitted_at = time.time()
                    if self._stop.is_set():
                        return
            except Exception as err:  # noqa: BLE001 - a dropped watch: watch again
                log(f"workload watch: {err}")
                time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()

    @property
    def seconds(self) -> float:
        if self.evicted is None or self.released is None:
            return float("nan")
        return self.released - self.evicted


def victim(name: str, ckpt: Path, args: argparse.Namespace, variant: str) -> dict[str, Any]:
    body = example_job(name, replicas=2, steps=args.steps, step_sleep=args.step_sleep, interval=args.interval,
                       checkpoint_dir=ckpt, devices_per_process=1, requests={"cpu": "1"},
                       extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl"}, compilation_cache=args.work / "xla-cache")
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "bench-low"}
    spec = body["spec"]
    spec["restartMode"] = "Recreate"
    # The window the eviction gives (the runtime trains on inside it): shorter than the rest of the job.
    spec["preemption"] = {"noticeSeconds": {"kueue-preemption": args.notice_seconds}}
    if variant == "without":
        spec["preemption"] = {"enabled": False}
        container = spec["template"]["spec"]["containers"][0]
        container["command"] = ["python", "-c", NO_SIGTERM_SAVE, *container["command"][1:]]
    return body


def preemptor(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "boss", "namespace": namespace,
                         "labels": {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "bench-high"}},
            "spec": {"replicas": 2, "restartMode": "Recreate", "checkpoint": {"uri": "/tmp/boss"},
                     "template": {"spec": {"containers": [{
                         "name": "t", "image": "python:3.11", "command": ["python", "-c", "import time; time.sleep(2)"],
                         "resources": {"requests": {"cpu": "1"}}}]}}}}


def run(cluster: Cluster, api: Any, kq: Any, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    ns = f"kueue-{variant}"
    cluster.kubectl("create", "namespace", ns)
    wait_for(lambda: cluster.read("sa", "default", ns, missing_ok=True) is not None, 60,
             f"{ns}'s default ServiceAccount", interval=0.2)
    flavor, cq = f"bench-{variant}", f"bench-{variant}"
    kq.apply(resource_flavor(flavor, {POOL: "kueue"}), cluster_queue(cq, flavor, "2"), local_queue(ns, "lq", cq))
    ckpt = args.work / variant
    clock = WorkloadClock(api, ns)
    jobs = k8s.CustomObjectsApi(api)
    operator = OperatorProcess(cluster, args.work / f"operator-{variant}", namespaces=[ns],
                               extra_args=["--kueue"]).start()
    steplog = ckpt / "steps.jsonl"
    try:
        start = time.time()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(victim("victim", ckpt, args, variant)))
        wait_for(lambda: steplog.exists() and any(r.step >= args.preempt_at for r in read_step_log(steplog)), 600,
                 f"{variant}: step {args.preempt_at}", interval=0.1)
        step = max(r.step for r in read_step_log(steplog))
        log(f"{variant}: step {step}: the higher-priority job is queued")
        cluster.kubectl("apply", "-f", "-", input=json.dumps(preemptor(ns)))

        def status() -> dict[str, Any]:
            return dict(jobs.get_namespaced_custom_object("reprieve.dev", "v1alpha1", ns, "trainingjobs", "victim")
                        .get("status") or {})

        final = wait_for(lambda: (s := status()).get("phase") in ("Succeeded", "Failed") and s, 900,
                         f"{variant}: the victim to finish", interval=0.5, describe=lambda: operator_tail(operator))
        end = time.time()
        if final.get("phase") != "Succeeded":
            raise SystemExit(f"{variant}: the victim ended {final.get('phase')}: {final.get('conditions')}")
        report = analyse(read_step_log(steplog), start=start, end=end)
        log(f"{variant}: done (attempt {final.get('attempt')}, evicted: {clock.reason})\n{report.summary()}")
        if len(report.interruptions) != 1:
            raise SystemExit(f"{variant}: expected one interruption, the step log shows "
                             f"{len(report.interruptions)}:\n{report.summary()}")
        return {"report": report, "release": clock.seconds, "attempt": final.get("attempt"),
                "start": report.interruptions[0].next_t - clock.readmitted_at if clock.readmitted_at else float("nan")}
    finally:
        clock.stop()
        operator.stop()


def operator_tail(op: OperatorProcess) -> str:
    return "\n" + op.log_path.read_text(errors="replace")[-4000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400,
                        help="long enough that the job still trains when the eviction comes (Kueue's preemption and the "
                             "preemptor's Workload take seconds on a loaded machine)")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds added to each training step")
    parser.add_argument("--interval", type=int, default=50, help="periodic checkpoint interval (both variants)")
    parser.add_argument("--preempt-at", type=int, default=90, help="the step the higher-priority job is queued at")
    parser.add_argument("--notice-seconds", type=int, default=15,
                        help="the victim's spec.preemption.noticeSeconds[kueue-preemption] (the default 60 s outlasts "
                             "the rest of this short job: the runtime trains on inside the window)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    args.work = Path(tempfile.mkdtemp(prefix="reprieve-kueue-bench-"))
    results: dict[str, dict[str, Any]] = {}
    with Cluster.start(args.work / "cluster") as cluster:
        install_chart(cluster)
        cluster.helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NS, "--reuse-values", "--set", "kueue.enabled=true",
                     "--wait", timeout=90)
        t0 = time.monotonic()
        kq = start_kueue(cluster)
        log(f"Kueue {kq.version} up in {time.monotonic() - t0:.1f}s")
        try:
            kq.apply(priority_class("bench-low", 100), priority_class("bench-high", 1000))
            for i in range(2):
                cluster.add_node(f"kueue-{i}", {POOL: "kueue"})
            api = cluster.api_client()
            for v in variants:
                results[v] = run(cluster, api, kq, v, args)
        finally:
            kq.stop()

    def cell(v: str, what: str) -> str:
        r: GoodputReport = results[v]["report"]
        cut = r.interruptions[0]
        return {"lost": str(cut.lost_steps), "release": f"{results[v]['release']:.2f}s",
                "start": f"{results[v]['start']:.1f}s",
                "resumed": f"{cut.last_step} -> {cut.resumed_at}", "gap": f"{cut.gap_seconds:.1f}s",
                "wall": f"{r.wall_seconds:.1f}s", "goodput": f"{r.goodput:.1%}"}[what]

    w = 18
    print()
    print(f"{'':36}" + "".join(f"{v:>{w}}" for v in variants))
    for label, what in (("lost steps", "lost"), ("eviction -> quota released", "release"),
                        ("readmitted -> first step resumed", "start"),
                        ("last step -> resumed at", "resumed"), ("gap in training", "gap"),
                        ("wall seconds", "wall"), ("goodput", "goodput")):
        print(f"{label:36}" + "".join(f"{cell(v, what):>{w}}" for v in variants))
    if set(VARIANTS) <= set(results):
        a, b = results["notice"], results["without"]
        la, lb = a["report"].interruptions[0].lost_steps, b["report"].interruptions[0].lost_steps
        print(f"\nwithout / with the notice: lost steps {lb} / {la}"
              + (f" = {lb / la:.1f}x" if la else " (none lost with the notice)")
              + f"; eviction -> quota released {b['release'] / a['release']:.2f}x")
    print(f"({args.steps} steps, step sleep {args.step_sleep}s, checkpoints every {args.interval} steps, preempted at "
          f"step {args.preempt_at}; logs in {args.work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
