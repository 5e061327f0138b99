"""``make demo``: a GKE spot preemption of a 2-worker JAX job on a local 3-node cluster, shown as it happens.

1. start the local control plane and four real nodes (upstream kubelet, containerd, runc; the images are built
   here from operator/Dockerfile and examples/Dockerfile, once): one for the operator, three spot workers;
2. ``helm install`` the chart: the operator runs as the chart's Deployment from its image, in a namespace that
   enforces restricted Pod Security;
3. apply ``examples/trainingjob.yaml`` (2 workers, a data-parallel flax NNX transformer LM) with
   ``restartMode: InPlace`` and one warm spare;
4. once training is under way, put the GKE spot taint on one worker's node and delete the node 30 s later;
5. follow the notice, the agreed step, the commit, the exit with the restart code, the in-place restart (the
   survivor keeps its pod, the spare takes the doomed worker's index, already imported and waiting), the restore
   and the run to completion; end with lost steps, downtime, goodput and ``kubectl get tj``;
6. run the same job and the same preemption with ``restartMode: Recreate`` (every pod created again) on the same
   kind of nodes, and print both restart gaps side by side (``--no-compare`` skips it).

``--process-nodes`` runs the same story on process kubelets with the operator as a local process (seconds instead
of minutes to start); it is also what the demo falls back to, saying why, where real nodes cannot be set up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcluster import Cluster, ClusterError
from localcluster.costs import EmulatedCosts
from localcluster.goodput import GoodputReport, analyse, read_step_log
from localcluster.realnodes import RealNodeError
from localcluster.stack import (
    SYSTEM_POOL,
    DeployedOperator,
    OperatorProcess,
    example_job,
    install_chart,
    install_operator,
)
from localcluster.testing import taint_node, wait_for

NS = "demo"
JOB = "lm"
SPOT_TAINT = "cloud.google.com/impending-node-termination"
INTERESTING = ("starting at step", "notice", "agreed", "committed", "exiting with code", "restored", "finished",
               "ERROR", "CRITICAL", "Traceback")

T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


class Follower(threading.Thread):
    """Prints the interesting lines of every incarnation of the job's pods as they are written."""

    def __init__(self, cluster: Cluster, job: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.job = cluster, job
        self.offsets: dict[Path, int] = {}
        self.seen: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.3):
            self.poll()

    def pods(self) -> list[str]:
        out = self.cluster.kubectl("get", "pods", "-n", NS, "-l", f"reprieve.dev/job-name={self.job}", "-o",
                                   "jsonpath={.items[*].metadata.name}", check=False).stdout
        return sorted(set(out.split()) | self.seen)

    def poll(self) -> None:
        for pod in self.pods():
            self.seen.add(pod)
            for path in self.cluster.pod_logs(NS, pod, "trainer"):
                pos = self.offsets.get(path, 0)
                with open(path, errors="replace") as f:
                    f.seek(pos)
                    chunk = f.read()
                    self.offsets[path] = pos + len(chunk.encode())
                for line in chunk.splitlines():
                    if any(k in line for k in INTERESTING):
                        text = line.split(": ", 1)[-1] if ": " in line else line
                        say(f"  {pod} | {text[:150]}")


def tj(cluster: Cluster, job: str = JOB) -> dict:
    return json.loads(cluster.kubectl("get", "tj", job, "-n", NS, "-o", "json").stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--preempt-at-step", type=int, default=150)
    parser.add_argument("--notice-seconds", type=float, default=30.0, help="taint -> node deletion")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--process-nodes", action="store_true", help="process kubelets instead of real nodes")
    parser.add_argument("--no-compare", dest="compare", action="store_false",
                        help="skip the second run with restartMode Recreate")
    parser.add_argument("--pull-seconds", type=float, default=20.0,
                        help="process nodes only: emulated image pull (once per node and image)")
    parser.add_argument("--start-seconds", type=float, default=1.0,
                        help="process nodes only: emulated container start (every pod)")
    args = parser.parse_args()
    remaining = (args.steps - args.preempt_at_step) * args.step_sleep
    if remaining < args.notice_seconds + 10:
        # With less work left than the notice window the runtime rightly trains to the end inside the window
        # (no restart at all), and the demo would not show the preemption path it is here to show.
        parser.error(f"--steps {args.steps} after --preempt-at-step {args.preempt_at_step} at >= "
                     f"{args.step_sleep}s per step is only ~{remaining:.0f}s of work: the job would finish inside "
                     f"the {args.notice_seconds:.0f}s notice window; give it at least "
                     f"{args.notice_seconds + 10:.0f}s of work after the preemption")
    work = Path(tempfile.mkdtemp(prefix="reprieve-demo-"))
    say("starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler)")
    with Cluster.start(work / "cluster") as cluster:
        real = not args.process_nodes
        if real:
            try:
                say("building or reusing the images (hack/build-images.sh) and starting 4 real nodes: upstream "
                    "kubelet + containerd + runc each, images imported into every node's containerd")
                cluster.add_node("system-0", {"reprieve.test/pool": SYSTEM_POOL}, kind="real", images=["operator"])
                for name in ("node-a", "node-b", "node-c", "node-d"):
                    cluster.add_node(name, {"cloud.google.com/gke-spot": "true"}, kind="real", images=["example"])
            except (RealNodeError, ClusterError) as err:
                say(f"REAL NODES NOT AVAILABLE: {err}\n  -> falling back to process nodes (--process-nodes)")
                for name in list(cluster.node_names()):
                    cluster.kill_node(name)
                real = False
        costs = EmulatedCosts(args.pull_seconds, args.start_seconds) if not real else None
        if not real:
            for name in ("node-a", "node-b", "node-c", "node-d"):
                cluster.add_node(name, {"cloud.google.com/gke-spot": "true"}, costs=costs)
        say(f"control plane at {cluster.server}; nodes: {', '.join(cluster.node_names())}"
            f" ({'real' if real else 'process'} nodes)")
        say("start costs: " + (costs.describe() if costs else "real containers (upstream kubelet, containerd, runc); "
                               "no emulated cost; the images are already in every node's containerd (no pull)"))
        if real:
            image = cluster.real.images["operator"].ref
            pod = install_operator(cluster, image, node_selector={"reprieve.test/pool": SYSTEM_POOL})
            say(f"helm install: the operator runs as the chart's Deployment ({pod}, image {image}) on system-0, "
                "restricted Pod Security enforced on its namespace")
            return run(cluster, DeployedOperator(cluster), work, args, real=True, costs=None)
        install_chart(cluster)
        say("helm chart installed (CRD, ServiceAccount, ClusterRole); starting the operator with its token")
        operator = OperatorProcess(cluster, work / "operator", namespaces=[NS]).start()
        try:
            return run(cluster, operator, work, args, real=False, costs=costs)
        finally:
            operator.stop()
            say(f"logs kept in {work}")


def run(cluster: Cluster, operator: OperatorProcess | DeployedOperator, work: Path, args: argparse.Namespace, *,
        real: bool, costs: EmulatedCosts | None) -> int:
    cluster.kubectl("create", "namespace", NS)
    say(">>> run 1: restartMode InPlace with 1 warm spare")
    ok, report = run_job(cluster, operator, work, args, JOB, real=real, in_place=True)
    if not ok or not args.compare:
        return 0 if ok else 1
    if len([n for n in cluster.node_names() if n.startswith("node-")]) < 4:
        node = "node-e"  # the first run's preemption deleted a node: bring the pool back to four
        say(f"adding {node} so the second run has as many nodes as the first")
        cluster.add_node(node, {"cloud.google.com/gke-spot": "true"},
                         **({"kind": "real", "images": ["example"]} if real else {"costs": costs}))
    say(">>> run 2, for comparison: the same job and preemption with restartMode Recreate (every pod created "
        "again)")
    ok2, report2 = run_job(cluster, operator, work, args, f"{JOB}-recreate", real=real, in_place=False)
    print("\nIn place + spare vs recreate-all (same nodes, same preemption; start costs: "
          + (costs.describe() if costs else "real containers, images already on the nodes") + ")")
    print(f"  {'':34} {'in place + 1 spare':>20} {'recreate-all':>14} {'ratio':>7}")
    gap, gap2 = report.mean_gap, report2.mean_gap
    print(f"  {'gap, last step -> first step after':34} {gap:>19.1f}s {gap2:>13.1f}s {gap / gap2 if gap2 else 0:>6.2f}x")
    print(f"  {'goodput (step log)':34} {report.goodput:>20.1%} {report2.goodput:>14.1%} "
          f"{report.goodput / report2.goodput if report2.goodput else 0:>6.2f}x")
    print(f"  {'lost steps':34} {report.lost_steps:>20} {report2.lost_steps:>14}")
    return 0 if ok and ok2 else 1


def run_job(cluster: Cluster, operator: OperatorProcess | DeployedOperator, work: Path, args: argparse.Namespace,
            job: str, *, real: bool, in_place: bool) -> tuple[bool, GoodputReport]:
    ckpt = work / f"shared-storage-{job}"
    steplog = ckpt / "steps.jsonl"
    body = example_job(job, replicas=2, steps=args.steps, step_sleep=args.step_sleep, interval=100,
                       checkpoint_dir=ckpt, extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl"},
                       node_selector={"cloud.google.com/gke-spot": "true"},
                       image=cluster.real.images["example"].ref if real else None,
                       requests={"cpu": "500m", "memory": "1Gi"} if real else None)
    body["spec"]["restartMode"] = "InPlace" if in_place else "Recreate"
    body["spec"]["spares"] = 1 if in_place else 0
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(body))
    start = time.time()
    say(f"TrainingJob {NS}/{job} applied: 2 workers x 2 devices, {args.steps} steps, periodic save every 100, "
        f"restartMode {body['spec']['restartMode']}" + (", 1 spare" if in_place else ""))
    follower = Follower(cluster, job)
    follower.start()
    api = cluster.api_client()
    last_phase = None

    def show_status() -> dict:
        nonlocal last_phase
        status = tj(cluster, job).get("status", {})
        key = (status.get("phase"), status.get("attempt"), status.get("ready"), status.get("spares"))
        if key != last_phase:
            say(f"TrainingJob phase={key[0]} attempt={key[1]} ready={key[2]}"
                + (f" spares={key[3]}" if in_place else "")
                + f" restarts={status.get('restarts')} lastCheckpointStep={status.get('lastCheckpointStep')}")
            last_phase = key
        return status

    def reached(step: int) -> bool:
        show_status()
        return steplog.exists() and any(r.step >= step for r in read_step_log(steplog))

    wait_for(lambda: reached(args.preempt_at_step), args.timeout, f"training to reach step {args.preempt_at_step}",
             interval=0.3)
    worker1 = f"{job}-1"
    node = json.loads(cluster.kubectl("get", "pod", worker1, "-n", NS, "-o", "json").stdout)["spec"]["nodeName"]
    say(f">>> GKE spot preemption: tainting {node} (worker 1) with {SPOT_TAINT}; the node will be deleted in "
        f"{args.notice_seconds:.0f}s")
    taint_node(api, node, SPOT_TAINT, "true", "NoSchedule")
    taint_time = time.monotonic()
    deleted = False
    while True:
        status = show_status()
        if not deleted and time.monotonic() - taint_time >= args.notice_seconds:
            say(f">>> {node} is reclaimed: the node is gone (every container on it killed) and its Node deleted")
            cluster.remove_node(node)
            deleted = True
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        if time.monotonic() - T0 > args.timeout:
            say("demo timed out")
            print(operator.tail(40))
            follower.stop.set()
            return False, analyse(read_step_log(steplog), start=start, end=time.time())
        time.sleep(0.3)
    if not deleted:
        cluster.remove_node(node)
    end = time.time()
    follower.stop.set()
    follower.poll()
    pods = cluster.kubectl("get", "pods", "-n", NS, "-l", f"reprieve.dev/job-name={job}", "-o",
                           "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,"
                           "ATTEMPT:.metadata.labels.reprieve\\.dev/attempt,PHASE:.status.phase").stdout
    print("\n" + pods)
    report = analyse(read_step_log(steplog), start=start, end=end)
    status = tj(cluster, job)["status"]
    print(f"Summary of {job}")
    print(f"  outcome        {status.get('phase')} after {len(report.interruptions)} gang restart(s); "
          f"restarts by cause {status.get('restarts')}")
    last = status.get("lastRestart") or {}
    if in_place and last:
        print(f"  in place       attempt {last.get('attempt')}: {last.get('inPlace')} worker(s) restarted in place; "
              + "; ".join(f"worker {r.get('index')} replaced ({r.get('reason')})" for r in last.get("replaced", [])))
    for i in report.interruptions:
        print(f"  preemption     attempt {i.from_attempt}: saved at step {i.last_step}, resumed at step "
              f"{i.resumed_at}: {i.lost_steps} lost step(s), {i.gap_seconds:.1f}s from last step to first step "
              f"after restore")
    print(f"  goodput        {report.goodput:.1%} (productive {report.productive_seconds:.1f}s of "
          f"{report.wall_seconds:.1f}s wall, from the step log; definition in docs/goodput.md)")
    gp = status.get("goodput") or {}
    if gp.get("goodput") is not None:
        print(f"  operator       goodput {gp['goodput']:.1%} of {gp.get('wallSeconds', 0):.1f}s (status.goodput, from "
              f"the runtime's progress reports); badput {gp.get('badputSeconds')}")
    print()
    print(cluster.kubectl("get", "tj", job, "-n", NS).stdout)
    from reprieve_operator.timeline import main as draw

    out = work / f"report-{job}"
    print("Timeline of the job (python -m reprieve_operator.timeline):")
    draw([job, "-n", NS, "-o", str(out), "--kubeconfig", str(cluster.kubeconfig)])
    ok = status.get("phase") == "Succeeded" and report.lost_steps == 0 and len(report.interruptions) >= 1
    return ok, report


if __name__ == "__main__":
    sys.exit(main())
