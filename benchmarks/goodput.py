"""Goodput under a seeded preemption schedule: Reprieve vs periodic-only checkpointing, side by side.

The same 2-worker job (examples/train_lm.py) runs twice on the local cluster through the operator, under the
same seeded schedule of node losses:

* **reprieve**: the TrainingJob as shipped: noticed preemptions reach the pods (annotation) and the runtime
  saves at an agreed step and exits with the restart code; periodic saves every ``--interval`` steps are the
  safety net for the hard kill.
* **baseline**: what a user has today: the same job and gang restarts, saving only every ``--interval``
  steps (``spec.preemption.enabled: false``), so each reclaimed node takes its pods down at the deadline and
  the job resumes from its last periodic checkpoint.

A noticed preemption puts the GKE spot taint on a worker's node and deletes the node ``--notice`` seconds
later; a hard kill deletes a worker's node without warning. Events happen one at a time: an event fires at its
step once the previous one is absorbed (node deleted, job running again), or at once if that step has passed. Goodput, lost steps and gaps are defined in
``docs/goodput.md`` (``hack/localcluster/goodput.py``); each run also prints the operator's own figure
(``status.goodput``, ``policy/goodput.py``) beside the step log's over the same wall time.

    python benchmarks/goodput.py                       # 600 steps, 3 noticed preemptions (30 s), 1 hard kill
    python benchmarks/goodput.py --step-sleep 0.5      # longer steps: overheads weigh less
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))

from localcluster import Cluster
from localcluster.goodput import GoodputReport, analyse, read_step_log
from localcluster.stack import OperatorProcess, example_job, install_chart
from localcluster.testing import taint_node

SPOT_TAINT = "cloud.google.com/impending-node-termination"


@dataclass(frozen=True)
class Event:
    at_step: int
    kind: str        # "notice" or "hard"
    worker: int      # which worker's node is reclaimed


def schedule(seed: int, steps: int, notices: int, hard: int) -> list[Event]:
    """Seeded, well-spread event steps (at least steps/(n+2) apart), in order."""
    rng = random.Random(seed)
    n = notices + hard
    slot = steps // (n + 1)
    at = [slot * (i + 1) + rng.randrange(-slot // 4, slot // 4 + 1) for i in range(n)]
    kinds = ["notice"] * notices + ["hard"] * hard
    rng.shuffle(kinds)
    return [Event(a, k, rng.randrange(2)) for a, k in zip(at, kinds)]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cluster: Cluster, api: object, work: Path, variant: str, events: list[Event],
        args: argparse.Namespace) -> GoodputReport:
    ns = f"bench-{variant}"
    cluster.kubectl("create", "namespace", ns)
    nodes = [cluster.add_node(f"{variant}-{i}", {"reprieve.bench/pool": variant})
             for i in range(2 + len(events))]
    ckpt = work / variant
    body = example_job("bench", replicas=2, steps=args.steps, step_sleep=args.step_sleep, interval=args.interval,
                       checkpoint_dir=ckpt, node_selector={"reprieve.bench/pool": variant},
                       extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl"})
    body["spec"]["restartPolicy"]["maxFailures"] = 10
    if variant == "baseline":
        body["spec"]["preemption"] = {"enabled": False}
    operator = OperatorProcess(cluster, work / f"operator-{variant}", namespaces=[ns]).start()
    steplog = ckpt / "steps.jsonl"
    try:
        start = time.time()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
        pending_deletes: list[tuple[float, str]] = []
        busy_attempt = 0
        todo = list(events)
        while True:
            now = time.monotonic()
            for when, node in list(pending_deletes):
                if now >= when:
                    pending_deletes.remove((when, node))
                    if node in cluster.node_names():  # a hard kill may have taken it already
                        log(f"{variant}: deleting {node} (deadline reached)")
                        cluster.remove_node(node)
            status = json.loads(cluster.kubectl("get", "tj", "bench", "-n", ns, "-o", "json").stdout).get("status", {})
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            step = max((r.step for r in read_step_log(steplog)), default=-1) if steplog.exists() else -1
            attempt = int(status.get("attempt") or 0)
            # One event at a time: the next waits until the last one is absorbed (its node deleted and the
            # job running again on a newer attempt), so both variants see the same sequence of disruptions.
            absorbed = not pending_deletes and attempt > busy_attempt and status.get("phase") == "Running"
            if todo and absorbed and step >= todo[0].at_step:
                busy_attempt = attempt
                ev = todo.pop(0)
                on = [cluster.kubectl("get", "pod", f"bench-{w}", "-n", ns, "-o", "jsonpath={.spec.nodeName}").stdout
                      for w in range(2)]
                doomed = {n for _, n in pending_deletes}
                # A worker still training on an already-doomed node (Reprieve keeps training until shortly
                # before the deadline) is not a fresh target: reclaim the other worker's node instead.
                node = on[ev.worker] if on[ev.worker] not in doomed or on[1 - ev.worker] in doomed \
                    else on[1 - ev.worker]
                if ev.kind == "notice":
                    log(f"{variant}: step {step}: spot notice on {node} (worker {ev.worker}), deleted in {args.notice}s")
                    taint_node(api, node, SPOT_TAINT, "true", "NoSchedule")
                    pending_deletes.append((now + args.notice, node))
                else:
                    log(f"{variant}: step {step}: hard kill of {node} (worker {ev.worker})")
                    cluster.remove_node(node)
            if time.monotonic() - now < 0.2:
                time.sleep(0.2)
        end = time.time()
        if status.get("phase") != "Succeeded":
            raise SystemExit(f"{variant}: job ended {status.get('phase')}: {status.get('conditions')}")
        report = analyse(read_step_log(steplog), start=start, end=end)
        log(f"{variant}: done, restarts {status.get('restarts')}\n{report.summary()}")
        gp = status.get("goodput") or {}
        if gp.get("goodput") is not None:  # the operator's own figure (policy/goodput.py), same definitions
            wall = float(gp.get("wallSeconds") or 0.0)
            own = analyse(read_step_log(steplog), start=0.0, end=wall)
            log(f"{variant}: operator status.goodput {gp['goodput']:.1%} of {wall:.1f}s (step log over the same "
                f"wall: {own.goodput:.1%}); badput {gp.get('badputSeconds')}, lost steps {gp.get('lostSteps')}")
        return report
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for node in nodes:
            if node in cluster.node_names():
                cluster.remove_node(node)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds added to each training step")
    parser.add_argument("--interval", type=int, default=100, help="periodic checkpoint interval (both variants)")
    parser.add_argument("--notice", type=float, default=30.0, help="seconds from taint to node deletion")
    parser.add_argument("--notices", type=int, default=3)
    parser.add_argument("--hard-kills", type=int, default=1)
    args = parser.parse_args()
    events = schedule(args.seed, args.steps, args.notices, args.hard_kills)
    log(f"schedule (seed {args.seed}): " + ", ".join(f"{e.kind}@{e.at_step}/w{e.worker}" for e in events))
    work = Path(tempfile.mkdtemp(prefix="reprieve-goodput-"))
    with Cluster.start(work / "cluster") as cluster:
        install_chart(cluster)
        api = cluster.api_client()
        reports = {v: run(cluster, api, work, v, events, args) for v in ("reprieve", "baseline")}
    r, b = reports["reprieve"], reports["baseline"]
    noticed = [i for i, e in enumerate(events) if e.kind == "notice"]

    def lost(rep: GoodputReport, idx: list[int]) -> str:
        return ", ".join(str(rep.interruptions[i].lost_steps) for i in idx if i < len(rep.interruptions))

    hard = [i for i, e in enumerate(events) if e.kind == "hard"]
    print()
    print(f"{'':34}{'reprieve':>12}{'baseline':>12}{'ratio':>9}")
    print(f"{'goodput':34}{r.goodput:>12.1%}{b.goodput:>12.1%}{r.goodput / b.goodput:>9.2f}")
    print(f"{'wall seconds':34}{r.wall_seconds:>12.1f}{b.wall_seconds:>12.1f}{r.wall_seconds / b.wall_seconds:>9.2f}")
    print(f"{'productive seconds':34}{r.productive_seconds:>12.1f}{b.productive_seconds:>12.1f}")
    print(f"{'lost steps per noticed preemption':34}{lost(r, noticed):>12}{lost(b, noticed):>12}")
    print(f"{'lost steps at the hard kill':34}{lost(r, hard):>12}{lost(b, hard):>12}")
    gaps_r = [i.gap_seconds for i in r.interruptions]
    gaps_b = [i.gap_seconds for i in b.interruptions]
    print(f"{'mean gap, last step -> first step':34}{sum(gaps_r) / max(1, len(gaps_r)):>11.1f}s"
          f"{sum(gaps_b) / max(1, len(gaps_b)):>11.1f}s")
    print(f"(seed {args.seed}, {args.steps} steps, step sleep {args.step_sleep}s, interval {args.interval}, "
          f"notice {args.notice}s; logs in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
