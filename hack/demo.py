"""``make demo``: a GKE spot preemption and a node lost without notice, of a 2-worker JAX job on a local cluster.

1. start the local control plane and four real nodes (upstream kubelet, containerd, runc; the images are built
   here from operator/Dockerfile and examples/Dockerfile, once): one for the operator, three spot workers;
2. ``helm install`` the chart: the operator runs as the chart's Deployment from its image, in a namespace that
   enforces restricted Pod Security;
3. apply ``examples/trainingjob.yaml`` (2 workers, a data-parallel flax NNX transformer LM) with
   ``restartMode: InPlace`` and one warm spare;
4. once training is under way, put the GKE spot taint on one worker's node and delete the node 30 s later;
5. follow the notice, the agreed step, the commit, the exit with the restart code, the in-place restart (the
   survivor keeps its pod, the spare takes the doomed worker's index, already imported and waiting), the restore;
6. then lose worker 0's node WITHOUT notice (``--hard-kill-at-step``): no save is possible; with the memory tier
   (``spec.checkpoint.memory``, on in this run) the gang restores the lost worker's shards from its peer pod's
   memory and loses only the steps since the last memory save;
7. then the zone runs out of capacity (``--stockout-seconds``): worker 1's node is lost too, without notice, while no
   spare is ready and no node has room (one worker or spare per node); the job is elastic (``spec.elastic``: at
   least 1 worker, 4 virtual shards in canonical order, ``reprieve.VirtualStep`` in the example), so after
   ``unschedulableSeconds`` it shrinks onto its survivor instead of waiting and keeps training, degraded; when a
   node is added it grows back at an agreed step, from memory; follow it to completion and end with lost steps,
   each restart's restore source, downtime, goodput, ``kubectl get tj`` and the final parameters' sha256 beside an
   uninterrupted one-process run of the same virtual shards (started beside the demo): bit for bit the same;
8. run the same job and the same losses with ``restartMode: Recreate`` and no memory tier (every pod created
   again; the hard kill costs the steps since the last periodic checkpoint, restored from storage; at the stockout
   it waits for the node, as a job without ``spec.elastic``) on the same kind of nodes, and print both runs side by
   side (``--no-compare`` skips it; ``--hard-kill-at-step 0`` skips the
   unwarned loss in both): goodput after the first start beside the whole run's (the first start, apply -> first
   step, is mostly the same work in both modes and dominates a short job's whole-run figure;
   ``first_start_seconds`` of ``localcluster/goodput.py``, as benchmarks/goodput.py prints it), what the first
   start is, and the phases in which the two first starts differ (pods created, scheduled, containers running,
   imports and jax.distributed, the initial state, the step's compile and first step: from the demo's poll and the
   trainers' log lines).

``--real-pulls`` (real nodes) pushes the example image to the cluster's own registry (TLS, basic auth) and starts
the spot nodes cold, so each node's kubelet pulls the image when its first pod lands there (the pull times and sizes
from the kubelet's events are printed at the end); without it the image is imported into every node beforehand (no
pull). ``--process-nodes`` runs the same story on process kubelets with the operator as a local process (seconds instead
of minutes to start); it is also what the demo falls back to, saying why, where real nodes cannot be set up.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcluster import Cluster, ClusterError
from localcluster.costs import EmulatedCosts
from localcluster.goodput import GoodputReport, analyse, read_step_log
from localcluster.realnodes import RealNodeError
from localcluster.realpulls import describe, node_pulls, pull_line, push_example
from localcluster.restores import Restore, for_resume, parse
from localcluster.stack import (
    SYSTEM_POOL,
    DeployedOperator,
    OperatorProcess,
    example_job,
    install_chart,
    install_operator,
    reference_run,
)
from localcluster.testing import taint_node, wait_for

NS = "demo"
JOB = "lm"
SPOT_TAINT = "cloud.google.com/impending-node-termination"
HOST = "reprieve.demo/host"  # every spot node's own name: one worker or spare per node (required anti-affinity)
VIRTUAL_SHARDS = 4  # the elastic job's (spec.elastic.virtualShards): 2 workers x 2 devices, or 1 x 2 when shrunk
MEMORY_SIZE_LIMIT = "256Mi"  # the memory tier's volume: 3 copies of one process's shards (the example's: ~1 MiB)
INTERESTING = ("starting at step", "notice", "agreed", "committed", "exiting with code", "restored", "finished",
               "ERROR", "CRITICAL", "Traceback")

T0 = time.monotonic()

# The first start's milestones in order, each with the phase that ends there; a milestone is the moment the *last*
# of the gang's workers reached it (the gang waits for its slowest). Pods created, scheduled and their trainer
# container running: as the demo's poll saw them; then from the trainers' own log lines (their timestamps):
# reprieve's start line (imports done, jax.distributed joined), the example's "starting at step" (its state built).
START_PHASES = (("created", "pods created"), ("scheduled", "scheduling"), ("running", "image + container start"),
                ("joined", "imports + jax.distributed"), ("ready", "initial state"))
FIRST_STEP_PHASE = "step compile + first step"
LOG_MARKS = ((re.compile(r"reprieve: process \d+/\d+"), "joined"),
             (re.compile(r"process \d+/\d+ starting at step"), "ready"))  # not reprieve's "...: starting at step 0"
CRI_PREFIX = re.compile(r"(\S+) (?:stdout|stderr) [PF] ")  # a real node's log line: containerd's time, stream, tag
STARTUP = ("first start = apply -> the first step begins: pods created and scheduled, image and container start, "
           "imports, jax.distributed, the first compile; both modes pay it once (the whole-run goodput carries it; "
           "'after the first start' leaves it out, docs/goodput.md)")


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


class Follower(threading.Thread):
    """Prints the interesting lines of every incarnation of the job's pods as they are written."""

    def __init__(self, cluster: Cluster, job: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.job = cluster, job
        self.offsets: dict[Path, int] = {}
        self.seen: set[str] = set()
        self.restore_lines: list[str] = []  # every "restored step ..." line of every pod (the restore sources)
        self.marks: dict[str, dict[str, float]] = {}  # pod -> start milestone (START_PHASES) -> wall time, first seen
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.3):
            self.poll()

    def mark(self, pod: str, mark: str, t: float) -> None:
        self.marks.setdefault(pod, {}).setdefault(mark, t)

    def pods(self) -> list[str]:
        out = self.cluster.kubectl("get", "pods", "-n", NS, "-l", f"reprieve.dev/job-name={self.job}", "-o", "json",
                                   check=False).stdout
        now = time.time()
        try:
            items = json.loads(out)["items"] if out.strip() else []
        except (ValueError, KeyError):
            items = []
        for item in items:
            self.mark(item["metadata"]["name"], "created", now)
            if item.get("spec", {}).get("nodeName"):
                self.mark(item["metadata"]["name"], "scheduled", now)
            if any(c.get("name") == "trainer" and "running" in (c.get("state") or {})
                   for c in item.get("status", {}).get("containerStatuses") or []):
                self.mark(item["metadata"]["name"], "running", now)
        return sorted({item["metadata"]["name"] for item in items} | self.seen)

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
                    mark = log_mark(line)
                    if mark is not None:
                        self.mark(pod, *mark)
                    if "restored step" in line:
                        self.restore_lines.append(line)
                    if any(k in line for k in INTERESTING):
                        text = line.split(": ", 1)[-1] if ": " in line else line
                        say(f"  {pod} | {text[:150]}")


SPOT_IMAGES = ["example"]  # what the spot nodes import; [] with --real-pulls: they pull the example image
EXAMPLE_REF = ""  # with --real-pulls: the example image in the cluster's registry, by digest


def start_real_pulls(cluster: Cluster) -> None:
    """--real-pulls: the cluster's registry, the example image pushed to it; spot nodes started from now are cold."""
    global EXAMPLE_REF
    EXAMPLE_REF = push_example(cluster, "demo/reprieve-example", "demo")
    SPOT_IMAGES.clear()
    say(f"pushed {EXAMPLE_REF} to the cluster's registry; the spot nodes start cold and pull it")


def pulls_said() -> str:
    return describe(EXAMPLE_REF, "cold spot nodes")


def print_pulls(cluster: Cluster) -> None:
    """The kubelets' pulls of the example image in the demo's namespace (Pulled events: time, size)."""
    for node, pull in node_pulls(cluster, NS, EXAMPLE_REF):
        print(f"  {pull_line(node, pull)}")


def add_spot(cluster: Cluster, name: str, *, real: bool, costs: EmulatedCosts | None) -> None:
    """A spot node (real, or a process kubelet with ``costs``), labelled with its own name (``HOST``)."""
    labels = {"cloud.google.com/gke-spot": "true", HOST: name}
    if real:
        cluster.add_node(name, labels, kind="real", images=SPOT_IMAGES)
    else:
        cluster.add_node(name, labels, costs=costs)


def next_spot(cluster: Cluster) -> str:
    """A spot node name not used yet (node-e, node-f, ...)."""
    used = set(cluster.node_names())
    return next(f"node-{c}" for c in "efghijklmnopqrstuvwxyz" if f"node-{c}" not in used)


def stockout_due(*, stockout_seconds: float, hard_killed: bool, phase: str | None, attempt: int,
                 hard_kill_attempt: int, step: int, hard_kill_step: int, after: int = 30) -> bool:
    """Whether the zone runs out now (pure): once the unwarned loss's restart is done (a newer attempt running) and
    ``after`` steps were trained since it."""
    return (stockout_seconds > 0 and hard_killed and phase == "Running" and attempt > hard_kill_attempt
            and step >= hard_kill_step + after)


def tj(cluster: Cluster, job: str = JOB) -> dict:
    return json.loads(cluster.kubectl("get", "tj", job, "-n", NS, "-o", "json").stdout)


def main() -> int:
    # a SIGTERM (a CI job's timeout, `kill`) unwinds like Ctrl-C: the cluster and its nodes are stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--preempt-at-step", type=int, default=150)
    parser.add_argument("--notice-seconds", type=float, default=30.0, help="taint -> node deletion")
    parser.add_argument("--hard-kill-after-checkpoint", type=int, default=50, metavar="STEPS",
                        help="once the preemption's restart is done, lose worker 0's node without notice this many "
                             "steps after the last storage checkpoint (0: no unwarned loss)")
    parser.add_argument("--stockout-seconds", type=float, default=40.0,
                        help="after the unwarned loss's restart, lose worker 1's node too with no node left with room, "
                             "and add one this many seconds later (0: no stockout)")
    parser.add_argument("--unschedulable-seconds", type=int, default=10,
                        help="spec.elastic.unschedulableSeconds of the in-place job: how long its lost worker's "
                             "replacement may stay unschedulable before it shrinks")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds for the whole demo")
    parser.add_argument("--process-nodes", action="store_true", help="process kubelets instead of real nodes")
    parser.add_argument("--no-compare", dest="compare", action="store_false",
                        help="skip the second run with restartMode Recreate")
    parser.add_argument("--pull-seconds", type=float, default=20.0,
                        help="process nodes only: emulated image pull (once per node and image)")
    parser.add_argument("--start-seconds", type=float, default=1.0,
                        help="process nodes only: emulated container start (every pod)")
    parser.add_argument("--real-pulls", action="store_true",
                        help="real nodes only: cold spot nodes pull the example image from the cluster's registry "
                             "(default: imported into every node, no pull)")
    args = parser.parse_args()
    if args.real_pulls and args.process_nodes:
        parser.error("--real-pulls needs real nodes (process nodes emulate the pull: --pull-seconds)")
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
                    "kubelet + containerd + runc each, " + ("the spot nodes cold (they pull the example image from "
                    "the cluster's registry)" if args.real_pulls else "images imported into every node's containerd"))
                cluster.real.ensure()
                if args.real_pulls:
                    start_real_pulls(cluster)
                cluster.add_node("system-0", {"reprieve.test/pool": SYSTEM_POOL}, kind="real", images=["operator"])
                for name in ("node-a", "node-b", "node-c", "node-d"):
                    add_spot(cluster, name, real=True, costs=None)
            except (RealNodeError, ClusterError) as err:
                say(f"REAL NODES NOT AVAILABLE: {err}\n  -> falling back to process nodes (--process-nodes)")
                for name in list(cluster.node_names()):
                    cluster.kill_node(name)
                real = False
        costs = EmulatedCosts(args.pull_seconds, args.start_seconds) if not real else None
        if not real:
            for name in ("node-a", "node-b", "node-c", "node-d"):
                add_spot(cluster, name, real=False, costs=costs)
        say(f"control plane at {cluster.server}; nodes: {', '.join(cluster.node_names())}"
            f" ({'real' if real else 'process'} nodes)")
        say("start costs: " + (costs.describe() if costs else "real containers (upstream kubelet, containerd, runc); "
                               "no emulated cost; " + pulls_said()))
        if real:
            image = cluster.real.images["operator"].ref
            pod = install_operator(cluster, image, node_selector={"reprieve.test/pool": SYSTEM_POOL})
            say(f"helm install: the operator runs as the chart's Deployment ({pod}, image {image}) on system-0, "
                "restricted Pod Security enforced on its namespace")
            rc = run(cluster, DeployedOperator(cluster), work, args, real=True, costs=None)
            if EXAMPLE_REF:
                print_pulls(cluster)
            return rc
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
    reference = reference_run(work, args.steps, VIRTUAL_SHARDS)
    say(f"started the uninterrupted reference beside the demo: the same example over the same {VIRTUAL_SHARDS} "
        f"virtual shards, one process here (pid {reference.pid}; log {work / 'reference.log'})")
    say(">>> run 1: restartMode InPlace with 1 warm spare, the memory tier and spec.elastic")
    ok, report, sources, start1, out1 = run_job(cluster, operator, work, args, JOB, real=real, in_place=True,
                                                costs=costs)
    ok = same_as_reference(work, JOB, reference) and ok
    if not ok or not args.compare:
        return 0 if ok else 1
    spot = [n for n in cluster.node_names() if n.startswith("node-")]
    for node in [f"node-{c}" for c in "efgh" if f"node-{c}" not in spot][:max(0, 4 - len(spot))]:
        # the first run's losses deleted nodes: bring the pool back to four
        say(f"adding {node} so the second run has as many nodes as the first")
        add_spot(cluster, node, real=real, costs=costs)
    say(">>> run 2, for comparison: the same job and losses with restartMode Recreate (every pod created again) "
        "and no memory tier (a memory copy needs a pod that survives the restart)")
    ok2, report2, sources2, start2, out2 = run_job(cluster, operator, work, args, f"{JOB}-recreate", real=real,
                                                   in_place=False, costs=costs)
    ok2 = same_as_reference(work, f"{JOB}-recreate", reference) and ok2
    print("\n" + "\n".join(side_by_side((report, report2), (sources, sources2), (start1, start2),
                                        costs.describe() if costs else "real containers, " + pulls_said(),
                                        (out1, out2))))
    return 0 if ok and ok2 else 1


def same_as_reference(work: Path, job: str, reference: subprocess.Popen[bytes]) -> bool:
    """Print the job's final parameters' sha256 beside the uninterrupted reference's; whether they are equal."""
    try:
        reference.wait(900)
    except subprocess.TimeoutExpired:
        reference.kill()
    ours = json.loads((work / f"shared-storage-{job}" / "result.json").read_text())["sha256"]
    try:
        theirs = json.loads((work / "reference.json").read_text())["sha256"]
    except (OSError, ValueError, KeyError):
        print(f"  sha256         {ours}; the reference run did not finish (exit {reference.returncode}; "
              f"{work / 'reference.log'})")
        return False
    same = ours == theirs
    print(f"  sha256         {ours} {'==' if same else '!='} the uninterrupted reference's "
          f"({'bit for bit the same parameters' if same else 'DIFFERENT parameters'})")
    return same


def lost_at(report: GoodputReport, i: int) -> str:
    return str(report.interruptions[i].lost_steps) if i < len(report.interruptions) else "-"


def source_at(sources: list[Restore | None], i: int) -> str:
    """Where restart ``i`` restored from, in a table cell: ``own+peer memory``, ``storage``, ``mixed``."""
    if i >= len(sources):
        return "-"
    r = sources[i]
    if r is None:
        return "?"
    if r.kind != "memory":
        return r.kind
    kinds = sorted({"own" if s == "memory" else "peer" for s in r.sources.values()})
    return "+".join(kinds) + " memory"


def log_mark(line: str) -> tuple[str, float] | None:
    """A trainer log line's start milestone (``LOG_MARKS``) and its time: on a real node, containerd's (the log
    file's ``<RFC 3339 UTC> <stream> <tag>`` prefix); on a process node, the line's own ``%(asctime)s`` (this
    machine's local time: the trainer runs here). None for any other line."""
    mark = next((mark for pattern, mark in LOG_MARKS if pattern.search(line)), None)
    if mark is None:
        return None
    cri = CRI_PREFIX.match(line)
    try:
        if cri:
            return mark, datetime.fromisoformat(cri.group(1)).timestamp()
        return mark, datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class FirstStart:
    """A job's first start split into phases (``START_PHASES``, then the first step), seconds each, and when other
    things of the job were first seen, in seconds after the apply (``spare ready``, ``memory tier paired``)."""

    phases: list[tuple[str, float]]
    beside: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.phases)

    def beside_text(self) -> str:
        return ", ".join(f"{k} at {v:.1f}s" for k, v in self.beside.items())


def first_start(applied: float, report: GoodputReport, marks: dict[str, dict[str, float]], workers: list[str],
                beside: dict[str, float] | None = None) -> FirstStart:
    """The first start (``applied`` -> the first step began: ``report.first_start_seconds``) in phases, each ending
    when the last of ``workers`` reached its milestone in ``marks`` (pod -> milestone -> wall time); a milestone
    some worker lacks is left out (its phase joins the next), and the last phase ends when the first step began."""
    began = applied + report.first_start_seconds
    phases, prev = [], applied
    for mark, name in START_PHASES:
        times = [marks.get(w, {}).get(mark) for w in workers]
        if times and all(t is not None for t in times):
            t = min(max(max(t for t in times if t is not None), prev), began)
            phases.append((name, t - prev))
            prev = t
    phases.append((FIRST_STEP_PHASE, began - prev))
    return FirstStart(phases, {k: v - applied for k, v in (beside or {}).items()})


def start_difference(a: FirstStart, b: FirstStart, *, what: tuple[str, str] = ("in place", "recreate-all"),
                     noise: float = 0.5) -> str:
    """One line: how much longer (or shorter) ``a``'s first start was than ``b``'s, the phases that differ by more
    than ``noise`` seconds, largest first, and what ``a`` started beside its gang (``a.beside``)."""
    diff = a.seconds - b.seconds
    theirs = dict(b.phases)
    deltas = sorted(((name, s - theirs[name]) for name, s in a.phases if name in theirs),
                    key=lambda d: -abs(d[1]))
    named = [f"{name} {d:+.1f}s" for name, d in deltas if abs(d) > noise]
    line = (f"{what[0]}'s first start: {a.seconds:.1f}s vs {b.seconds:.1f}s ({diff:+.1f}s): "
            + (", ".join(named) if named else f"no phase differs by more than {noise:.1f}s"))
    if a.beside:
        line += "; beside its gang: " + a.beside_text()
    return line


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def side_by_side(reports: tuple[GoodputReport, GoodputReport], sources: tuple[list[Restore | None], ...],
                 starts: tuple[FirstStart, FirstStart], costs: str,
                 outages: tuple[int | None, int | None] = (None, None)) -> list[str]:
    """The comparison's lines: restart gaps, goodput after the first start beside the whole run's (the first start,
    the same work in both modes, dominates a short job's whole-run figure), the first start in one line and where
    the two first starts differ, lost steps and restore sources per loss."""
    a, b = reports

    def row(label: str, x: object, y: object, r: str = "") -> str:
        return f"  {label:36} {x!s:>26} {y!s:>14} {r:>7}".rstrip()

    lines = [f"In place + spare + memory tier vs recreate-all without it (same nodes, same losses; start costs: {costs})",
             row("", "in place + spare + memory", "recreate-all", "ratio"),
             row("mean gap, last step -> first after", f"{a.mean_gap:.1f}s", f"{b.mean_gap:.1f}s",
                 ratio(a.mean_gap, b.mean_gap)),
             row("goodput after the first start", f"{a.goodput_after_start:.1%}", f"{b.goodput_after_start:.1%}",
                 ratio(a.goodput_after_start, b.goodput_after_start)),
             row("goodput, whole run (step log)", f"{a.goodput:.1%}", f"{b.goodput:.1%}", ratio(a.goodput, b.goodput)),
             row("first start (apply -> first step)", f"{a.first_start_seconds:.1f}s", f"{b.first_start_seconds:.1f}s"),
             row("lost steps (all restarts)", a.lost_steps, b.lost_steps)]
    for i, kind in enumerate(("noticed preemption", "node lost without notice", "stockout")):
        lines.append(row("lost steps, " + kind, lost_at(a, i), lost_at(b, i)))
        lines.append(row("  restored from", source_at(sources[0], i), source_at(sources[1], i)))
    if outages != (None, None):
        lines.append(row("steps trained while out of capacity", "-" if outages[0] is None else outages[0],
                         "-" if outages[1] is None else outages[1]))
    return [*lines, f"  {STARTUP}", f"  {start_difference(*starts)}"]


def spares_ready(spares: str | None) -> bool:
    """Whether ``status.spares`` (``ready/desired``) says a spare is ready."""
    return spares is not None and spares.split("/")[0] not in ("", "0")


def hard_kill_due(*, after_checkpoint: int, notice_node_deleted: bool, phase: str | None, attempt: int,
                  notice_attempt: int, step: int, checkpoint_step: int | None, spares: str | None = None) -> bool:
    """Whether to lose worker 0's node without notice now (pure): once the preemption's restart is done (its node
    deleted, a newer attempt running, a replacement spare ready where the job has spares: ``status.spares``
    ``ready/desired``) and training is ``after_checkpoint`` steps past the newest storage checkpoint the job's
    status names, so that a run without the memory tier has that many steps to lose."""
    spare_ready = spares is None or spares_ready(spares)
    return (after_checkpoint > 0 and notice_node_deleted and phase == "Running" and attempt > notice_attempt
            and spare_ready and checkpoint_step is not None and step >= checkpoint_step + after_checkpoint)


def run_job(cluster: Cluster, operator: OperatorProcess | DeployedOperator, work: Path, args: argparse.Namespace,
            job: str, *, real: bool, in_place: bool, costs: EmulatedCosts | None = None,
            ) -> tuple[bool, GoodputReport, list[Restore | None], FirstStart, int | None]:
    """One run; returns whether it did what the demo shows, its goodput report, each restart's restore, its first
    start and the steps it trained while the zone was out of capacity (None: no stockout)."""
    ckpt = work / f"shared-storage-{job}"
    steplog = ckpt / "steps.jsonl"
    # the same maths in both runs: the in-place job declares its virtual shards (spec.elastic), the Recreate one
    # (which cannot be elastic: it recreates every pod) sets them itself
    shards_env = {} if in_place else {"REPRIEVE_VIRTUAL_SHARDS": str(VIRTUAL_SHARDS)}
    body = example_job(job, replicas=2, steps=args.steps, step_sleep=args.step_sleep, interval=100,
                       checkpoint_dir=ckpt, extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl", **shards_env},
                       node_selector={"cloud.google.com/gke-spot": "true"},
                       image=(EXAMPLE_REF or cluster.real.images["example"].ref) if real else None,
                       requests={"cpu": "500m", "memory": "1Gi"} if real else None)
    body["spec"]["restartMode"] = "InPlace" if in_place else "Recreate"
    body["spec"]["spares"] = 1 if in_place else 0
    if in_place:  # the memory tier needs a pod that survives the restart: InPlace only (docs/memory.md)
        # a copy every 10 steps: the default (spaced to cost <= 1 % of the step time) spaces this small, fast
        # model's copies up to 50 steps apart on a loaded 2-core machine, as far as its periodic checkpoint
        body["spec"]["checkpoint"]["memory"] = {"sizeLimit": MEMORY_SIZE_LIMIT, "intervalSteps": 10}
        body["spec"]["elastic"] = {"minReplicas": 1, "unschedulableSeconds": args.unschedulable_seconds,
                                   "minResizeIntervalSeconds": 0, "virtualShards": VIRTUAL_SHARDS}
    body["spec"]["template"]["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"reprieve.dev/job-name": job}}, "topologyKey": HOST}]}}
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(body))
    start = time.time()
    say(f"TrainingJob {NS}/{job} applied: 2 workers x 2 devices, {args.steps} steps, periodic save every 100, "
        f"restartMode {body['spec']['restartMode']}"
        + (", 1 spare, memory tier (a copy every 10 steps, a replica on a peer pod), "
           f"elastic (at least 1 worker, {VIRTUAL_SHARDS} virtual shards, canonical order)"
           if in_place else f", no memory tier, {VIRTUAL_SHARDS} virtual shards (not elastic)")
        + "; one worker or spare per node")
    follower = Follower(cluster, job)
    follower.start()
    workers = [f"{job}-{i}" for i in range(2)]  # the first attempt's pods (a later one's lines come after theirs)
    api = cluster.api_client()
    last_phase = None
    beside: dict[str, float] = {}  # what the job starts beside its gang -> when first seen (wall time)

    def show_status() -> dict:
        nonlocal last_phase
        status = tj(cluster, job).get("status", {})
        if in_place and spares_ready(status.get("spares")):
            beside.setdefault("spare ready", time.time())
        if any(c.get("type") == "MemoryPaired" and c.get("status") == "True" for c in status.get("conditions") or []):
            beside.setdefault("memory tier paired", time.time())
        degraded = next((c for c in status.get("conditions") or [] if c.get("type") == "Degraded"), {})
        key = (status.get("phase"), status.get("attempt"), status.get("ready"), status.get("spares"),
               status.get("currentWorkers"), degraded.get("reason"))
        if key != last_phase:
            say(f"TrainingJob phase={key[0]} attempt={key[1]} ready={key[2]}"
                + (f" spares={key[3]}" if in_place else "")
                + (f" workers={key[4]}/{status.get('desiredWorkers')}" if key[4] is not None else "")
                + (f" Degraded={degraded.get('status')}/{key[5]}: {degraded.get('message')}" if key[5] else "")
                + f" restarts={status.get('restarts')} lastCheckpointStep={status.get('lastCheckpointStep')}")
            last_phase = key
        return status

    def newest_step() -> int:
        return max((r.step for r in read_step_log(steplog)), default=-1) if steplog.exists() else -1

    def reached(step: int) -> bool:
        show_status()
        return newest_step() >= step

    wait_for(lambda: reached(args.preempt_at_step), args.timeout, f"training to reach step {args.preempt_at_step}",
             interval=0.3)
    worker1 = f"{job}-1"
    node = json.loads(cluster.kubectl("get", "pod", worker1, "-n", NS, "-o", "json").stdout)["spec"]["nodeName"]
    say(f">>> GKE spot preemption: tainting {node} (worker 1) with {SPOT_TAINT}; the node will be deleted in "
        f"{args.notice_seconds:.0f}s")
    notice_attempt = int(show_status().get("attempt") or 0)
    taint_node(api, node, SPOT_TAINT, "true", "NoSchedule")
    taint_time = time.monotonic()
    deleted, hard_killed = False, False
    hard_kill_attempt = hard_kill_step = 0
    stocked_out: float | None = None  # when the zone ran out (wall time)
    returned: float | None = None  # when a node with room came back
    while True:
        status = show_status()
        if not deleted and time.monotonic() - taint_time >= args.notice_seconds:
            say(f">>> {node} is reclaimed: the node is gone (every container on it killed) and its Node deleted")
            cluster.remove_node(node)
            deleted = True
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        step, checkpoint = newest_step(), status.get("lastCheckpointStep")
        if not hard_killed and hard_kill_due(after_checkpoint=args.hard_kill_after_checkpoint,
                                             notice_node_deleted=deleted, phase=status.get("phase"),
                                             attempt=int(status.get("attempt") or 0), notice_attempt=notice_attempt,
                                             step=step, checkpoint_step=checkpoint,
                                             spares=status.get("spares") if in_place else None):
            doomed = cluster.kubectl("get", "pod", f"{job}-0", "-n", NS, "-o", "jsonpath={.spec.nodeName}",
                                     check=False).stdout.strip()
        else:
            doomed = ""
        if doomed:
            say(f">>> {doomed} (worker 0) is lost WITHOUT notice at step {step}, {step - checkpoint} steps after the "
                f"last storage checkpoint (step {checkpoint}): no save is possible; "
                + ("its shards' newest copy is in its peer pod's memory" if in_place else
                   "the job resumes from that checkpoint"))
            cluster.remove_node(doomed)
            hard_killed = True
            hard_kill_attempt, hard_kill_step = int(status.get("attempt") or 0), step
        if stocked_out is None and stockout_due(stockout_seconds=args.stockout_seconds, hard_killed=hard_killed,
                                                phase=status.get("phase"), attempt=int(status.get("attempt") or 0),
                                                hard_kill_attempt=hard_kill_attempt, step=step,
                                                hard_kill_step=hard_kill_step):
            victim = worker_pod(cluster, job, 1, in_place)
            lost = cluster.kubectl("get", "pod", victim, "-n", NS, "-o", "jsonpath={.spec.nodeName}",
                                   check=False).stdout.strip()
            if lost:
                left = [n for n in cluster.node_names() if n.startswith("node-") and n != lost]
                say(f">>> the zone is out of capacity: {lost} (worker 1) is lost WITHOUT notice at step {step} and no "
                    f"node has room for its replacement (left: {', '.join(left)}, each with a worker or a spare of "
                    f"the job); a node comes back in {args.stockout_seconds:.0f}s"
                    + ("; the job may shrink onto its survivor after "
                       f"{args.unschedulable_seconds}s of its replacement unschedulable" if in_place else
                       "; recreate-all waits for it, as any job without spec.elastic"))
                cluster.remove_node(lost)
                stocked_out = time.time()
        if stocked_out is not None and returned is None and time.time() - stocked_out >= args.stockout_seconds:
            node = next_spot(cluster)
            say(f">>> capacity returns: adding {node}")
            add_spot(cluster, node, real=real, costs=costs)
            returned = time.time()
        if time.monotonic() - T0 > args.timeout:
            say("demo timed out")
            print(operator.tail(40))
            follower.stop.set()
            report = analyse(read_step_log(steplog), start=start, end=time.time())
            return False, report, [], first_start(start, report, follower.marks, workers, beside), None
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
    started = first_start(start, report, follower.marks, workers, beside)
    status = tj(cluster, job)["status"]
    print(f"Summary of {job}")
    print(f"  outcome        {status.get('phase')} after {len(report.interruptions)} gang restart(s); "
          f"restarts by cause {status.get('restarts')}")
    last = status.get("lastRestart") or {}
    if in_place and last:
        print(f"  in place       attempt {last.get('attempt')}: {last.get('inPlace')} worker(s) restarted in place; "
              + "; ".join(f"worker {r.get('index')} replaced ({r.get('reason')})" for r in last.get("replaced", [])))
    sources = [for_resume(parse(follower.restore_lines), i.resumed_at) for i in report.interruptions]
    what_was = ("preemption", "node lost", "stockout", "grow")
    for n, (i, r) in enumerate(zip(report.interruptions, sources, strict=True)):
        what = what_was[n] if n < len(what_was) else "restart"
        print(f"  {what:14} attempt {i.from_attempt}: last step {i.last_step}, resumed at step {i.resumed_at}: "
              f"{i.lost_steps} lost step(s), {i.gap_seconds:.1f}s from last step to first step after restore; "
              f"restored {r.describe() if r is not None else 'from ? (no restore line seen)'}")
    if args.hard_kill_after_checkpoint and not hard_killed:
        print("  node lost      never: the job finished before the unwarned loss was due (raise --steps)")
    outage = None
    if stocked_out is not None:
        until = returned if returned is not None else end
        outage = len({r.step for r in read_step_log(steplog) if stocked_out <= r.t <= until})
        print(f"  stockout       {until - stocked_out:.0f}s without a node with room: {outage} step(s) trained "
              + ("(on the survivor: elastic)" if in_place else "(recreate-all waits)"))
    elif args.stockout_seconds:
        print("  stockout       never: the job finished before it was due (raise --steps)")
    print(f"  goodput        {report.goodput:.1%} (productive {report.productive_seconds:.1f}s of "
          f"{report.wall_seconds:.1f}s wall, from the step log; definition in docs/goodput.md); "
          f"{report.goodput_after_start:.1%} after the first start")
    print(f"  first start    {started.seconds:.1f}s: " + ", ".join(f"{n} {t:.1f}s" for n, t in started.phases)
          + (f"; {started.beside_text()}" if started.beside else ""))
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
    ok = (status.get("phase") == "Succeeded" and len(report.interruptions) >= 1
          and report.interruptions[0].lost_steps == 0  # the noticed preemption loses nothing
          and (not in_place or outage is None or outage > 0))  # elastic: it trained while out of capacity
    return ok, report, sources, started, outage


def worker_pod(cluster: Cluster, job: str, index: int, in_place: bool) -> str:
    """The pod of worker ``index`` now (in place, a replacement has a generated name: the assignment says)."""
    if not in_place:
        return f"{job}-{index}"
    data = json.loads(cluster.kubectl("get", "configmap", f"{job}-assignment", "-n", NS, "-o", "json").stdout)["data"]
    return next(n for n, i in json.loads(data["processes"]).items() if i == index)


if __name__ == "__main__":
    sys.exit(main())
