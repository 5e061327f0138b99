"""Goodput under a seeded preemption schedule: four ways of restarting, side by side, with emulated node costs.

The same 2-worker job (examples/train_lm.py) runs once per variant on the local cluster through the operator,
under the same seeded schedule of node losses:

* **recreate**: Reprieve with ``restartMode: Recreate``: noticed preemptions reach the pods, the runtime saves
  at an agreed step and exits with the restart code, and the operator deletes and recreates every pod;
* **inplace**: the same with ``restartMode: InPlace``: the survivor's supervisor (reprieve-supervisor) starts the next
  attempt in the same pod (from a pre-warmed process), only the pod on the reclaimed node is replaced;
* **inplace+spare**: in place with ``spares: 1``: a warm spare (scheduled, image pulled, pre-warmed) takes over
  the index of the worker on the reclaimed node;
* **inplace+spare+memory**: in place with one spare and the memory tier (``spec.checkpoint.memory``, the
  default interval: saves spaced to cost at most 1 % of the step time; docs/memory.md): every process keeps a
  copy of its shards in its pod's memory and sends it to a peer pod on another node, so the hard kill costs the
  steps since the last memory save, not since the last periodic checkpoint;
* **baseline**: what a user has today: gang restarts (Recreate), saving only every ``--interval`` steps
  (``spec.preemption.enabled: false``), so each reclaimed node takes its pods down at the deadline and the job
  resumes from its last periodic checkpoint.

Every node of the runs emulates a real node's costs (``--pull-seconds``, once per node and image, and
``--start-seconds`` per container start; docs/local-cluster.md, "Emulated costs"): a process kubelet would
otherwise start a pod in 0.1 s and flatter recreating pods. The emulated costs are printed with the results.

``--real-nodes`` runs the same variants and schedule on real nodes (upstream kubelet + containerd + runc each,
``docs/local-cluster.md``) with the operator as the chart's Deployment on a system node (one for all variants):
no emulated cost, real container starts. The images are imported into every node beforehand (no pull), or with
``--real-pulls`` the example image is pushed to the cluster's own registry (TLS, basic auth) and every worker node
starts cold, so its kubelet pulls the image when the node's first pod lands; each pull (node, seconds, MB, from
the kubelets' ``Pulled`` events) is printed. A real node costs far more than a process kubelet on a small machine,
so instead of one node per worker, spare and planned replacement up front, a real variant starts with one node per
worker and spare plus one free node, and adds a fresh (cold, with ``--real-pulls``) node whenever one is deleted,
as a cloud's node pool would. Every run says in its log and under its table which pull it paid: emulated N s,
imported (no pull), or real pulls from the registry.

A noticed preemption puts the GKE spot taint on a worker's node and deletes the node ``--notice`` seconds
later; a hard kill deletes a worker's node without warning. Events happen one at a time: an event fires at its
step once the previous one is absorbed (node deleted, job running again), or at once if that step has passed
(logged as "planned at step N": steps so short that the events pile up make the schedule harsher than it was
drawn, e.g. a hard kill and the next notice 2 s apart with one spare). Goodput is printed over the whole run and
after the first start (the time before the first step: pull, imports, the first compilation, the same in every
mode; a vanishing share of a long job).
Each restart's restore source (own memory, a peer's memory, storage) is read back from the trainers' logs
(``hack/localcluster/restores.py``) and printed per interruption.
Goodput, lost steps and gaps are defined in ``docs/goodput.md`` (``hack/localcluster/goodput.py``); each run also
prints the operator's own figure (``status.goodput``, ``policy/goodput.py``) beside the step log's over the same
wall time. The run's directory (printed last) keeps the logs, the step logs and the results; its checkpoints and
the nodes' memory-tier volumes are deleted at the end unless ``--keep-data``.

    python benchmarks/goodput.py                       # 600 steps of ~0.5 s, 3 noticed preemptions (30 s), 1 hard kill
    python benchmarks/goodput.py --variants recreate,inplace+spare --steps 300
    python benchmarks/goodput.py --step-sleep 0.1      # shorter steps: the events pile up (see above)
    python benchmarks/goodput.py --variants inplace+spare,recreate --steps 3000   # a 26-min job: the same 4 events
                                                       # spread out; the first start and the hard kill amortized
    python benchmarks/goodput.py --real-nodes --real-pulls --variants recreate,inplace+spare+memory --steps 300
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))

from kubernetes import client as k8s
from localcluster import Cluster, statesize
from localcluster.costs import EmulatedCosts
from localcluster.goodput import GoodputReport, StepRecord, analyse, read_step_log
from localcluster.keeplogs import LogKeeper, real_node_logs
from localcluster.peakmem import PeakMemory
from localcluster.peakmem import in_words as peak_words
from localcluster.pulls import Pull
from localcluster.realpulls import describe, node_pulls, pull_line, push_example
from localcluster.restores import Restore, for_resume, parse
from localcluster.stack import SYSTEM_POOL, OperatorProcess, example_job, install_chart, install_operator
from localcluster.testing import taint_node

SPOT_TAINT = "cloud.google.com/impending-node-termination"
VARIANTS = ("recreate", "inplace", "inplace+spare", "inplace+spare+memory", "baseline")
# The memory tier's volume in the memory variant: 3 copies of one process's shards (the example's are ~1 MiB;
# with --state-mib, statesize.tier_size_limit).
MEMORY_SIZE_LIMIT = statesize.tier_size_limit(0)


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


def check_modes(*, real_nodes: bool, real_pulls: bool, pull_seconds: float | None) -> str | None:
    """What is wrong with this choice of nodes and pulls (pure): None where it is consistent."""
    if real_pulls and not real_nodes:
        return "--real-pulls needs --real-nodes (process nodes emulate the pull: --pull-seconds)"
    if real_nodes and pull_seconds is not None:
        return ("--pull-seconds emulates a pull on process nodes; with --real-nodes the image is imported (no pull) "
                "or, with --real-pulls, really pulled from the cluster's registry")
    return None


def nodes_up_front(*, spares: int, events: int, real: bool) -> int:
    """A variant's worker nodes at its start (pure). Process nodes: one per worker and spare and one for every
    replacement (a used spare is replaced too), all up front. Real nodes: one per worker and spare and one free
    node (Recreate's new pod and in place's new spare land there before the reclaimed node is gone); every node
    deleted is then replaced by a fresh one (:func:`replacements_due`)."""
    return 2 + spares + (1 if real else events * (1 + spares))


def replacements_due(*, live: int, up_front: int, real: bool) -> int:
    """Fresh nodes to add now (pure): real variants keep their pool at its starting size; process variants
    created every node they need up front."""
    return max(0, up_front - live) if real else 0


def drop_bulk(work: Path) -> int:
    """Delete what a finished run keeps that is not a log, under ``work``: each variant's checkpoints and the
    process nodes' pod volumes (the memory tier's copies). At ``--state-mib 1024`` they are ~8 GB a run, and a few
    runs fill the disk (the next run's saves then fail). The logs, the step logs and the results stay. Returns the
    bytes freed."""
    bulky = [*work.glob("*/checkpoints"), *work.glob("cluster/nodes/*/pods/*/*/volumes")]
    freed = sum(f.stat().st_size for d in bulky for f in d.rglob("*") if f.is_file() and not f.is_symlink())
    for d in bulky:
        shutil.rmtree(d, ignore_errors=True)
    return freed


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def kept_logs(cluster: Cluster, ns: str) -> Path:
    """Where a real-node variant keeps copies of its pods' logs (``keeplogs``: a deleted pod's logs go with it)."""
    return cluster.workdir / "kept-pod-logs" / ns


def trainer_log_lines(cluster: Cluster, ns: str) -> list[str]:
    """The trainer logs of every pod the namespace had (removed nodes' too: on process nodes the logs stay; on real
    nodes the copies :class:`LogKeeper` kept), line by line."""
    paths = sorted(cluster.workdir.glob(f"nodes/*/pods/{ns}/*/logs/trainer.log"))  # process nodes
    paths += sorted(kept_logs(cluster, ns).glob(f"*/{ns}_*/trainer/*.log"))  # real nodes
    return [line for path in paths for line in path.read_text(errors="replace").splitlines()]


def restore_sources(cluster: Cluster, ns: str, report: GoodputReport) -> list[Restore | None]:
    """Each interruption's restore, from the trainer logs."""
    restores = parse(trainer_log_lines(cluster, ns))
    return [for_resume(restores, i.resumed_at) for i in report.interruptions]


FIRST_STEP_LINE = re.compile(r"attempt (\d+): first step done [0-9.]+s after the \w+ start, ([0-9.]+)s after the "
                             r"assignment arrived")  # reprieve-supervisor's, once per process and attempt


def assigned_to_first_step(lines: Iterable[str]) -> dict[int, float]:
    """Seconds from each attempt's assignment (the operator's decision, as each supervisor received it) to its
    first step, from the supervisors' lines: the slowest process's, as a step is done when every process did it
    (pure)."""
    seconds: dict[int, float] = {}
    for line in lines:
        if m := FIRST_STEP_LINE.search(line):
            seconds[int(m[1])] = max(seconds.get(int(m[1]), 0.0), float(m[2]))
    return seconds


def run(cluster: Cluster, api: object, work: Path, variant: str, events: list[Event],
        args: argparse.Namespace, image: str) -> tuple[GoodputReport, list[Restore | None], list[tuple[str, Pull]]]:
    """One variant; ``image``: the example image's reference on real nodes ("" on process nodes)."""
    slug = variant.replace("+", "-")
    ns = f"bench-{slug}"
    cluster.kubectl("create", "namespace", ns)
    in_place, spares = variant.startswith("inplace"), 1 if "+spare" in variant else 0
    real = args.real_nodes
    costs = EmulatedCosts(args.pull_seconds, args.start_seconds)
    up_front = nodes_up_front(spares=spares, events=len(events), real=real)
    nodes: list[str] = []

    def add_node() -> None:
        name = f"{slug}-{len(nodes)}"
        nodes.append(name)
        if real:  # cold (pulls the example image) with --real-pulls, else the image imported
            cluster.add_node(name, {"reprieve.bench/pool": slug}, kind="real",
                             images=[] if args.real_pulls else ["example"])
        else:
            cluster.add_node(name, {"reprieve.bench/pool": slug}, costs=costs)

    def remove_node(node: str) -> None:
        cluster.remove_node(node)
        live = sum(n in cluster.node_names() for n in nodes)
        for _ in range(replacements_due(live=live, up_front=up_front, real=real)):
            add_node()
            log(f"{variant}: added {nodes[-1]} in place of {node} (real nodes: the pool keeps {up_front} nodes)")

    for _ in range(up_front):
        add_node()
    ckpt = work / slug
    body = example_job("bench", replicas=2, steps=args.steps, step_sleep=args.step_sleep, interval=args.interval,
                       checkpoint_dir=ckpt, node_selector={"reprieve.bench/pool": slug},
                       extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl",
                                  **({"TRAIN_STATE_MIB": f"{args.state_mib:g}"} if args.state_mib else {}),
                                  **({"REPRIEVE_NOTICE_TO_MEMORY": "1"} if args.notice_to_memory else {})},
                       image=image or None,
                       requests={"cpu": "500m", "memory": "1Gi"} if real else None)
    body["spec"]["restartPolicy"]["maxFailures"] = 10
    body["spec"]["restartMode"] = "InPlace" if in_place else "Recreate"
    if in_place:
        body["spec"]["spares"] = spares
    if variant == "baseline":
        body["spec"]["preemption"] = {"enabled": False}
    if variant.endswith("+memory"):
        # default interval: the 1 % budget, or Young/Daly's for --loss-every
        body["spec"]["checkpoint"]["memory"] = {"sizeLimit": statesize.tier_size_limit(args.state_mib),
                                                **({"lossEverySeconds": args.loss_every} if args.loss_every else {})}

    def worker_pods() -> list[str]:
        """The pods of workers 0 and 1 now (in place, replacements have generated names: the assignment says)."""
        if not in_place:
            return ["bench-0", "bench-1"]
        data = json.loads(cluster.kubectl("get", "configmap", "bench-assignment", "-n", ns, "-o", "json")
                          .stdout)["data"]
        by_index = {i: n for n, i in json.loads(data["processes"]).items()}
        return [by_index[0], by_index[1]]
    jobs = k8s.CustomObjectsApi(api)
    # Real nodes: the chart's Deployment (installed once in main) serves every variant.
    operator = None if real else OperatorProcess(cluster, work / f"operator-{variant}", namespaces=[ns]).start()
    pulled: list[tuple[str, Pull]] = []
    steplog = ckpt / "steps.jsonl"
    keeper = LogKeeper(lambda: real_node_logs(cluster.workdir, ns), kept_logs(cluster, ns)).start() if real else None
    peaks = PeakMemory(lambda cmd: "train_lm.py" in cmd).start()
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
                        remove_node(node)
            # In-process API reads, not a kubectl per poll: an exec every 0.2 s cost a fifth of a core, taken from
            # the job being measured on this 2-core VM.
            status = jobs.get_namespaced_custom_object("reprieve.dev", "v1alpha1", ns, "trainingjobs",
                                                       "bench").get("status", {})
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
                on = [cluster.kubectl("get", "pod", pod, "-n", ns, "-o", "jsonpath={.spec.nodeName}").stdout
                      for pod in worker_pods()]
                doomed = {n for _, n in pending_deletes}
                # A worker still training on an already-doomed node (Reprieve keeps training until shortly
                # before the deadline) is not a fresh target: reclaim the other worker's node instead.
                node = on[ev.worker] if on[ev.worker] not in doomed or on[1 - ev.worker] in doomed \
                    else on[1 - ev.worker]
                late = "" if step <= ev.at_step + 5 else f" (planned at step {ev.at_step}: the previous one was not absorbed)"
                if ev.kind == "notice":
                    log(f"{variant}: step {step}: spot notice on {node} (worker {ev.worker}), deleted in {args.notice}s"
                        f"{late}")
                    taint_node(api, node, SPOT_TAINT, "true", "NoSchedule")
                    pending_deletes.append((now + args.notice, node))
                else:
                    log(f"{variant}: step {step}: hard kill of {node} (worker {ev.worker}){late}")
                    remove_node(node)
            if time.monotonic() - now < 0.2:
                time.sleep(0.2)
        end = time.time()
        peaks.stop()
        log(f"{variant}: peak memory per pod (its trainer processes, VmHWM): {peak_words(peaks.by_pod())}")
        if status.get("phase") != "Succeeded":
            raise SystemExit(f"{variant}: job ended {status.get('phase')}: {status.get('conditions')}")
        report = analyse(read_step_log(steplog), start=start, end=end)
        log(f"{variant}: done, restarts {status.get('restarts')}\n{report.summary()}")
        if keeper is not None:
            keeper.stop()
        sources = restore_sources(cluster, ns, report)
        for i, (ev, r) in enumerate(zip(report.interruptions, sources, strict=True)):
            log(f"{variant}: restart {i + 1} (attempt {ev.from_attempt}, {ev.lost_steps} lost steps): restored "
                + (r.describe() if r is not None else "from ? (no restore line in the trainer logs)"))
        gp = status.get("goodput") or {}
        if gp.get("goodput") is not None:  # the operator's own figure (policy/goodput.py), same definitions
            wall = float(gp.get("wallSeconds") or 0.0)
            own = analyse(read_step_log(steplog), start=0.0, end=wall)
            log(f"{variant}: operator status.goodput {gp['goodput']:.1%} of {wall:.1f}s (step log over the same "
                f"wall: {own.goodput:.1%}); badput {gp.get('badputSeconds')}, lost steps {gp.get('lostSteps')}")
        if args.real_pulls:
            pulled = node_pulls(cluster, ns, image)
            for node, pull in pulled:
                log(f"{variant}: {pull_line(node, pull)}")
        return report, sources, pulled
    finally:
        peaks.stop()
        if keeper is not None:
            keeper.stop()
        if operator is not None:
            operator.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for node in nodes:
            if node in cluster.node_names():
                cluster.remove_node(node)


# -- the capacity stockout (issue 47): elastic vs waiting ---------------------------------------------------------
STOCKOUT_VARIANTS = ("reference", "waiting", "elastic")
HOST = "reprieve.bench/host"  # one worker per node: required anti-affinity on this label


@dataclass(frozen=True)
class StockoutFigures:
    """One stockout run's figures, from its step log and the times of the kill and of the capacity's return."""
    lost_steps: int                 # steps of the killed attempt that were computed again
    first_step_after: float | None  # seconds from the kill to the next attempt's first step
    full_rate: float                # steps/s of the attempt the kill ended (full size)
    degraded_rate: float | None     # steps/s of an attempt that began after the kill, before capacity returned
    window_steps: int               # steps finished in the window [kill, kill + window_seconds]
    window_seconds: float
    assigned_first_step: float | None = None  # the next attempt's assignment -> its first step, s (the shrink's)
    grown_first_step: float | None = None     # the same for the attempt after it (the grow's)


def attempt_rate(records: list[StepRecord], skip: int = 3) -> float | None:
    """Steps per second of one attempt's steady part (its first ``skip`` steps, which wait on compilation and the
    restore, left out); None with fewer than two steps left (pure)."""
    steady = sorted(records, key=lambda r: r.step)[skip:]
    if len(steady) < 2 or steady[-1].t <= steady[0].t:
        return None
    return (len(steady) - 1) / (steady[-1].t - steady[0].t)


def stockout_figures(records: list[StepRecord], *, kill_t: float, return_t: float, window_seconds: float,
                     assigned: Mapping[int, float] | None = None) -> StockoutFigures:
    """The stockout's figures (pure): ``kill_t`` when the worker's node went, ``return_t`` when a node with room
    came back, wall-clock seconds like the records'; ``assigned``: :func:`assigned_to_first_step`."""
    by_attempt: dict[int, list[StepRecord]] = {}
    for r in records:
        by_attempt.setdefault(r.attempt, []).append(r)
    before = [a for a, rs in by_attempt.items() if min(r.t for r in rs) < kill_t]
    killed = max(before) if before else min(by_attempt)
    after = sorted(a for a in by_attempt if a > killed)
    last_done = max((r.step for r in by_attempt[killed] if r.t <= kill_t), default=-1)
    first_next = min((r for a in after for r in by_attempt[a]), key=lambda r: r.t, default=None)
    lost = max(0, last_done + 1 - first_next.step) if first_next is not None else 0
    degraded = [a for a in after if min(r.t for r in by_attempt[a]) < return_t]
    done = {r.step for r in records if kill_t <= r.t <= kill_t + window_seconds}
    return StockoutFigures(
        lost_steps=lost,
        first_step_after=(first_next.t - kill_t) if first_next is not None else None,
        full_rate=attempt_rate(by_attempt[killed]) or 0.0,
        degraded_rate=attempt_rate([r for r in by_attempt[degraded[0]] if r.t < return_t]) if degraded else None,
        window_steps=len(done), window_seconds=window_seconds,
        assigned_first_step=(assigned or {}).get(after[0]) if after else None,
        grown_first_step=(assigned or {}).get(after[1]) if len(after) > 1 else None)


def stockout_body(variant: str, args: argparse.Namespace, ckpt: Path, pool: str) -> dict[str, object]:
    """The stockout job (pure but for the checkpoint directory): ``args.workers`` in place, no spare, the memory
    tier, one worker per node, the same virtual shards in every variant (so all three compute the same maths);
    only ``elastic`` may shrink (the others' minimum is the full size: they wait, as a job without the block)."""
    body = example_job("bench", replicas=args.workers, steps=args.steps, step_sleep=0.0, interval=args.interval,
                       checkpoint_dir=ckpt, node_selector={"reprieve.bench/pool": pool}, devices_per_process=1,
                       extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl", "TRAIN_SHARD_SLEEP": str(args.shard_sleep),
                                  "TRAIN_GLOBAL_BATCH": str(args.shards * 2)})
    spec = body["spec"]
    spec["restartPolicy"]["maxFailures"] = 10
    spec["restartMode"] = "InPlace"
    spec["checkpoint"]["memory"] = {"sizeLimit": MEMORY_SIZE_LIMIT}
    spec["elastic"] = {"minReplicas": args.workers if variant != "elastic" else max(1, args.workers - 1),
                       "unschedulableSeconds": args.unschedulable, "minResizeIntervalSeconds": args.min_resize,
                       "virtualShards": args.shards}
    spec["template"]["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"reprieve.dev/job-name": "bench"}}, "topologyKey": HOST}]}}
    return body


def run_stockout(cluster: Cluster, api: object, work: Path, variant: str,
                 args: argparse.Namespace) -> tuple[GoodputReport, StockoutFigures | None, str]:
    """One stockout variant on process nodes: the kill at ``--kill-at`` (worker 1's node, no notice), no node with
    room for ``--stockout`` seconds, then one comes back. Returns the goodput report, the figures (None for the
    reference, which loses nothing) and the final parameters' sha256."""
    ns, ckpt = f"stockout-{variant}", work / f"stockout-{variant}"
    cluster.kubectl("create", "namespace", ns)
    costs = EmulatedCosts(args.pull_seconds, args.start_seconds)
    nodes: list[str] = []

    def add_node() -> str:
        name = f"{variant}-{len(nodes)}"
        nodes.append(name)
        cluster.add_node(name, {"reprieve.bench/pool": variant, HOST: name}, costs=costs)
        return name

    for _ in range(args.workers):
        add_node()
    body = stockout_body(variant, args, ckpt, variant)
    jobs = k8s.CustomObjectsApi(api)
    operator = OperatorProcess(cluster, work / f"operator-stockout-{variant}", namespaces=[ns]).start()
    steplog = ckpt / "steps.jsonl"
    kill_t = return_t = 0.0
    try:
        start = time.time()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
        while True:
            status = jobs.get_namespaced_custom_object("reprieve.dev", "v1alpha1", ns, "trainingjobs",
                                                       "bench").get("status", {})
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            step = max((r.step for r in read_step_log(steplog)), default=-1) if steplog.exists() else -1
            if variant != "reference" and not kill_t and step >= args.kill_at:
                assignment = json.loads(cluster.kubectl("get", "configmap", "bench-assignment", "-n", ns, "-o",
                                                        "json").stdout)["data"]
                pod = {i: n for n, i in json.loads(assignment["processes"]).items()}[1]
                node = cluster.kubectl("get", "pod", pod, "-n", ns, "-o", "jsonpath={.spec.nodeName}").stdout
                log(f"{variant}: step {step}: {node} (worker 1) lost without notice; no node with room for "
                    f"{args.stockout:.0f}s")
                kill_t = time.time()
                cluster.remove_node(node)
            if kill_t and not return_t and time.time() >= kill_t + args.stockout:
                log(f"{variant}: capacity returns: {add_node()}")
                return_t = time.time()
            time.sleep(0.2)
        end = time.time()
        if status.get("phase") != "Succeeded":
            raise SystemExit(f"stockout {variant}: job ended {status.get('phase')}: {status.get('conditions')}")
        records = read_step_log(steplog)
        report = analyse(records, start=start, end=end)
        log(f"stockout {variant}: done, restarts {status.get('restarts')}\n{report.summary()}")
        figures = (stockout_figures(records, kill_t=kill_t, return_t=return_t,
                                    window_seconds=args.stockout + args.window_extra,
                                    assigned=assigned_to_first_step(trainer_log_lines(cluster, ns)))
                   if kill_t else None)
        return report, figures, json.loads((ckpt / "result.json").read_text())["sha256"]
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for node in nodes:
            if node in cluster.node_names():
                cluster.remove_node(node)


def stockout_main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="reprieve-stockout-"))
    costs = EmulatedCosts(args.pull_seconds, args.start_seconds)
    with Cluster.start(work / "cluster") as cluster:
        install_chart(cluster)
        api = cluster.api_client()
        results = {v: run_stockout(cluster, api, work, v, args) for v in STOCKOUT_VARIANTS}
    ref_sha = results["reference"][2]
    w = 16
    print()
    print(f"{'':44}" + "".join(f"{v:>{w}}" for v in STOCKOUT_VARIANTS))

    def fig(v: str, f: Callable[[StockoutFigures], str]) -> str:
        figures = results[v][1]
        return f(figures) if figures is not None else "-"

    def rate(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    def seconds(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    rows: list[tuple[str, Callable[[str], str]]] = [
        ("goodput", lambda v: f"{results[v][0].goodput:.1%}"),
        ("goodput after the first start", lambda v: f"{results[v][0].goodput_after_start:.1%}"),
        ("wall seconds", lambda v: f"{results[v][0].wall_seconds:.1f}"),
        ("lost steps at the kill", lambda v: fig(v, lambda f: str(f.lost_steps))),
        ("kill -> first step of the next attempt, s", lambda v: fig(v, lambda f: "-" if f.first_step_after is None
                                                                     else f"{f.first_step_after:.1f}")),
        ("next attempt: assignment -> first step, s", lambda v: fig(v, lambda f: seconds(f.assigned_first_step))),
        ("the grow: assignment -> first step, s", lambda v: fig(v, lambda f: seconds(f.grown_first_step))),
        ("steps/s at full size", lambda v: fig(v, lambda f: rate(f.full_rate))),
        ("steps/s degraded", lambda v: fig(v, lambda f: rate(f.degraded_rate))),
        ("degraded / full", lambda v: fig(v, lambda f: "-" if not f.degraded_rate or not f.full_rate
                                                   else f"{f.degraded_rate / f.full_rate:.3f}")),
        ("steps in the outage window", lambda v: fig(v, lambda f: str(f.window_steps))),
        ("final sha256 = reference", lambda v: str(results[v][2] == ref_sha)),
    ]
    for label, cell in rows:
        print(f"{label:44}" + "".join(f"{cell(v):>{w}}" for v in STOCKOUT_VARIANTS))
    el, wa = results["elastic"][1], results["waiting"][1]
    if el is not None and wa is not None:
        print(f"\nelastic vs waiting over the {el.window_seconds:.0f} s window from the kill: "
              f"{el.window_steps} vs {wa.window_steps} steps ("
              + (f"{el.window_steps / wa.window_steps:.2f}x" if wa.window_steps else "waiting made none") + ")")
        if el.degraded_rate and el.full_rate:
            print(f"throughput while degraded: {el.degraded_rate / el.full_rate:.3f} x full size (target >= "
                  f"{0.95 * (args.workers - 1) / args.workers:.3f}: 0.95 x {args.workers - 1}/{args.workers})")
    print(f"(process nodes, {costs.describe()}; device time emulated: {args.shard_sleep}s of sleep per virtual "
          f"shard a process computes, so a process of a shrunk job sleeps longer; {args.workers} workers, "
          f"{args.shards} virtual shards, {args.steps} steps, kill at step {args.kill_at}, stockout "
          f"{args.stockout:.0f}s, unschedulableSeconds {args.unschedulable}; logs in {work})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-sleep", type=float, default=0.5,
                        help="seconds added to each training step (0.5: the schedule's events ~60 s apart, so each "
                             "is absorbed before the next one's step; shorter steps pile them up)")
    parser.add_argument("--interval", type=int, default=100, help="periodic checkpoint interval (all variants)")
    parser.add_argument("--notice", type=float, default=30.0, help="seconds from taint to node deletion")
    parser.add_argument("--notices", type=int, default=3)
    parser.add_argument("--hard-kills", type=int, default=1)
    parser.add_argument("--pull-seconds", type=float, default=None,
                        help="process nodes: emulated image pull, once per node and image (default 20; 0: none)")
    parser.add_argument("--real-nodes", action="store_true",
                        help="real nodes (kubelet + containerd + runc) and the operator's Deployment; the images "
                             "imported into every node (no pull) unless --real-pulls")
    parser.add_argument("--real-pulls", action="store_true",
                        help="with --real-nodes: every worker node starts cold and pulls the example image from the "
                             "cluster's registry")
    parser.add_argument("--start-seconds", type=float, default=1.0, help="emulated container start, every pod")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--state-mib", type=float, default=0.0,
                        help="MiB of trained n-gram memory added to each process's state (the example's "
                             "TRAIN_STATE_MIB; 0: the example's own ~1 MiB); refused when the machine lacks the memory")
    parser.add_argument("--loss-every", type=int, default=0,
                        help="spec.checkpoint.memory.lossEverySeconds of the +memory variants: the mean seconds of "
                             "training between losses without notice, which spaces the memory copies by Young/Daly "
                             "where that is closer than the 1 %% budget's (the seeded schedule's own rate: the run's "
                             "training seconds over --hard-kills); 0: not given")
    parser.add_argument("--notice-to-memory", action="store_true",
                        help="REPRIEVE_NOTICE_TO_MEMORY=1 in the trainers: a notice's agreed step kept in the pods' "
                             "memory alone (no storage save) where every copy outlives the notice; without it, "
                             "storage with a memory copy beside it (the default)")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the checkpoints and the nodes' memory-tier volumes after the run (by default "
                             "only the logs, the step logs and the results stay)")
    stockout = parser.add_argument_group("the capacity stockout (--stockout SECONDS): the variants "
                                         f"{', '.join(STOCKOUT_VARIANTS)} instead")
    stockout.add_argument("--stockout", type=float, default=None,
                          help="seconds from the kill of worker 1's node to a node with room coming back")
    stockout.add_argument("--workers", type=int, default=4)
    stockout.add_argument("--shards", type=int, default=12,
                          help="virtual shards (divisible by --workers and --workers - 1)")
    stockout.add_argument("--kill-at", type=int, default=60)
    stockout.add_argument("--unschedulable", type=int, default=5, help="spec.elastic.unschedulableSeconds")
    stockout.add_argument("--min-resize", type=int, default=20, help="spec.elastic.minResizeIntervalSeconds")
    stockout.add_argument("--shard-sleep", type=float, default=0.1,
                          help="emulated device seconds per virtual shard a process computes in a step")
    stockout.add_argument("--window-extra", type=float, default=30.0,
                          help="the window of steps counted runs from the kill to the stockout's end plus this")
    args = parser.parse_args()
    if args.stockout is not None and args.state_mib:
        parser.error("--state-mib: not with --stockout (the stockout trains over virtual shards, which the example's "
                     "n-gram memory does not support)")
    if (why := statesize.refusal(args.state_mib, 2, 2, statesize.mem_available_mib())) is not None:
        parser.error(why)
    if args.loss_every < 0:
        parser.error(f"--loss-every must be 0 (not given) or the mean seconds between losses, got {args.loss_every}")
    if args.stockout is not None:
        if args.shards % args.workers or args.shards % (args.workers - 1):
            parser.error(f"--shards {args.shards} must divide over {args.workers} and {args.workers - 1} workers")
        args.pull_seconds = 20.0 if args.pull_seconds is None else args.pull_seconds
        return stockout_main(args)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        parser.error(f"--variants: unknown {unknown}, choose from {', '.join(VARIANTS)}")
    wrong = check_modes(real_nodes=args.real_nodes, real_pulls=args.real_pulls, pull_seconds=args.pull_seconds)
    if wrong:
        parser.error(wrong)
    if args.pull_seconds is None:
        args.pull_seconds = 20.0
    events = schedule(args.seed, args.steps, args.notices, args.hard_kills)
    costs = EmulatedCosts(args.pull_seconds, args.start_seconds)
    log(f"schedule (seed {args.seed}): " + ", ".join(f"{e.kind}@{e.at_step}/w{e.worker}" for e in events))
    work = Path(tempfile.mkdtemp(prefix="reprieve-goodput-"))
    with Cluster.start(work / "cluster") as cluster:
        image = ""
        if args.real_nodes:
            log("real nodes: building or reusing the images (hack/build-images.sh)")
            cluster.real.ensure()
            image = (push_example(cluster, "bench/reprieve-example", "bench") if args.real_pulls
                     else cluster.real.images["example"].ref)
            cluster.add_node("system-0", {"reprieve.test/pool": SYSTEM_POOL}, kind="real", images=["operator"])
            install_operator(cluster, cluster.real.images["operator"].ref,
                             node_selector={"reprieve.test/pool": SYSTEM_POOL})
            nodes_said = ("real nodes (kubelet + containerd + runc), the operator's Deployment; "
                          + describe(image if args.real_pulls else "", "cold worker nodes"))
        else:
            install_chart(cluster)
            nodes_said = f"process nodes, {costs.describe()}"
        log(f"every node: {nodes_said}")
        api = cluster.api_client()
        results = {v: run(cluster, api, work, v, events, args, image) for v in variants}
    if not args.keep_data:
        log(f"deleted the checkpoints and memory-tier volumes: {drop_bulk(work) / 1e9:.1f} GB (--keep-data keeps them)")
    reports = {v: rep for v, (rep, _, _) in results.items()}
    sources = {v: src for v, (_, src, _) in results.items()}
    noticed = [i for i, e in enumerate(events) if e.kind == "notice"]
    hard = [i for i, e in enumerate(events) if e.kind == "hard"]

    def lost(rep: GoodputReport, idx: list[int]) -> str:
        return ",".join(str(rep.interruptions[i].lost_steps) for i in idx if i < len(rep.interruptions))

    w = 22
    print()
    print(f"{'':34}" + "".join(f"{v:>{w}}" for v in variants))
    rows = [("goodput", lambda r: f"{r.goodput:.1%}"),
            ("goodput after the first start", lambda r: f"{r.goodput_after_start:.1%}"),
            ("first start seconds", lambda r: f"{r.first_start_seconds:.1f}"),
            ("wall seconds", lambda r: f"{r.wall_seconds:.1f}"),
            ("productive seconds", lambda r: f"{r.productive_seconds:.1f}"),
            ("mean gap, last step -> first", lambda r: f"{r.mean_gap:.1f}s"),
            ("gaps", lambda r: ",".join(f"{i.gap_seconds:.1f}" for i in r.interruptions)),
            ("interruptions", lambda r: str(len(r.interruptions))),
            ("lost steps per noticed preemption", lambda r: lost(r, noticed)),
            ("lost steps at the hard kill", lambda r: lost(r, hard))]
    for label, cell in rows:
        print(f"{label:34}" + "".join(f"{cell(reports[v]):>{w}}" for v in variants))
    # M: every process from memory (its own or a peer's), S: storage, X: mixed, ?: no restore line found
    codes = {"memory": "M", "storage": "S", "mixed": "X"}
    print(f"{'restored from (M mem, S storage)':34}" + "".join(
        f"{','.join(codes[r.kind] if r is not None else '?' for r in sources[v]):>{w}}" for v in variants))
    if "recreate" in reports:
        ref = reports["recreate"]
        print()
        for v in variants:
            if v != "recreate":
                r = reports[v]
                print(f"{v} vs recreate: mean gap {r.mean_gap / max(ref.mean_gap, 1e-9):.2f}x, goodput "
                      f"{r.goodput / ref.goodput:.2f}x, after the first start "
                      f"{r.goodput_after_start / max(ref.goodput_after_start, 1e-9):.2f}x")
    for v, (_, _, pulled) in results.items():
        if pulled:
            print(f"{v}: " + "; ".join(f"{n} {p.seconds:.1f}s" + (f"/{p.size_bytes / 1e6:.0f} MB" if p.size_bytes
                                                                   else "") for n, p in pulled))
    print(f"({nodes_said}; seed {args.seed}, {args.steps} steps, step sleep {args.step_sleep}s, interval "
          f"{args.interval}, notice {args.notice}s"
          f"{f', memory copies for a loss every {args.loss_every} s' if args.loss_every else ''}; logs in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
