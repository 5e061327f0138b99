"""The chaos soak (``make soak``): break a training job on real nodes, repeatedly, and prove nothing was lost.

1. check the arguments and the fault kinds against what this machine can do (``localcluster.chaos``): an unknown
   kind, a seed that is not a number, a kind the cluster cannot do or not implemented yet: an error before
   anything starts;
2. start the local control plane, a system node and ``--nodes`` worker nodes (real nodes: upstream kubelet,
   containerd, runc; process nodes with ``--process-nodes`` or where real nodes cannot start here, saying why);
3. ``helm install`` the chart with its two operator replicas (leader election) on the system node;
4. run the example LM (2 workers, ``restartMode: InPlace``, one warm spare, the memory tier) once without faults,
   then the same job under the seeded fault schedule (``--minutes``, ``--seed``, ``--fault-every``, ``--faults``);
   nodes a fault deletes are replaced by new ones in the background;
5. print a record per fault and the totals (a table; JSON in ``--out``), and the job's timeline with the faults
   marked. Ctrl-C stops the schedule, undoes the faults still pending (signals on nodes, deletions not yet due,
   partitions)
   and prints what was recorded so far.

``docs/soak.md`` says what each fault does and how it is counted.

    python benchmarks/soak.py --minutes 30 --seed 1                  # the by-hand 30-minute soak
    python benchmarks/soak.py --minutes 3 --seed 1 --fault-every 30  # a smoke run
    python benchmarks/soak.py --faults node-lost,kill-trainer --minutes 5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))

from localcluster import Cluster, ClusterError, chaos, faults, statesize
from localcluster.goodput import analyse, read_step_log
from localcluster.injectors import Injectors, assigned_pods, mount_tmpfs, resize_tmpfs, split_roles, view
from localcluster.keeplogs import LogKeeper, real_node_logs
from localcluster.peakmem import PeakMemory
from localcluster.peakmem import in_words as peak_words
from localcluster.realnodes import RealNodeError, prerequisites
from localcluster.soakrecord import (
    Injected,
    Observation,
    as_json,
    by_kind,
    committed_lost,
    kind_table,
    records,
    starts_by_attempt,
    table,
    totals,
    unexplained,
)
from localcluster.stack import (
    RELEASE,
    RELEASE_NS,
    SYSTEM_POOL,
    WORKER_POOL,
    DeployedOperator,
    OperatorProcess,
    example_job,
    install_chart,
    install_operator,
)

NS = "soak"
JOB_KEEP = 3  # the job's spec.checkpoint.keep: the operator's default (soak_job sets none)
T0 = time.monotonic()
log = logging.getLogger("soak")


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


class Observer(threading.Thread):
    """Polls the TrainingJob, its spare pods and the operator's Lease every ``interval`` seconds."""

    def __init__(self, api: Any, job: str, interval: float = 0.5) -> None:
        super().__init__(daemon=True, name="soak-observer")
        self.api, self.job, self.interval = api, job, interval
        self.obs: list[Observation] = []
        self.committed: set[int] = set()
        self.halt = threading.Event()

    def latest(self) -> Observation:
        return self.obs[-1] if self.obs else Observation(time.time())

    def run(self) -> None:
        from kubernetes import client

        custom, core, coord = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api), \
            client.CoordinationV1Api(self.api)
        while not self.halt.wait(self.interval):
            try:
                tj = cast(dict[str, Any], custom.get_namespaced_custom_object("reprieve.dev", "v1alpha1", NS,
                                                                              "trainingjobs", self.job))
                pods = core.list_namespaced_pod(NS, label_selector=f"reprieve.dev/job-name={self.job}").items
                try:
                    assigned = assigned_pods(core.read_namespaced_config_map(f"{self.job}-assignment", NS).data)
                except client.ApiException:
                    assigned = None
                holder, restarts, renewed = "", 0, 0.0
                try:
                    spec = coord.read_namespaced_lease(RELEASE, RELEASE_NS).spec
                    holder = (spec.holder_identity if spec is not None else None) or ""
                    renewed = spec.renew_time.timestamp() if spec is not None and spec.renew_time else 0.0
                    if holder:
                        statuses = core.read_namespaced_pod(holder.rsplit("_", 1)[0], RELEASE_NS).status
                        restarts = max([c.restart_count for c in statuses.container_statuses or []], default=0)
                except client.ApiException:
                    pass
            except Exception as err:  # noqa: BLE001 - the API server may be briefly away: keep polling
                log.debug("observer: %s", err)
                continue
            s: dict[str, Any] = tj.get("status") or {}
            notice = s.get("lastNotice") or {}
            step = s.get("lastCheckpointStep")
            if step is not None:
                self.committed.add(int(step))
            self.obs.append(Observation(
                time.time(), int(s.get("attempt") or 0), str(s.get("phase") or ""), str(notice.get("id") or ""),
                str(notice.get("node") or ""), step, holder, restarts, renewed,
                tuple(sorted(p.name for p in split_roles([view(p) for p in pods], assigned)[1])),
                s.get("lastRestart"), (s.get("goodput") or {}).get("lostSteps"), s.get("lastRestore")))


def soak_job(cluster: Cluster, name: str, work: Path, args: argparse.Namespace, real: bool,
             step_sleep: float | None = None) -> tuple[dict, Path]:
    """The soak's job (``step_sleep``: instead of ``--step-sleep``, for the fault-free reference)."""
    ckpt = storage_dir(work, name)
    body = example_job(name, replicas=2, steps=args.steps, interval=args.interval,
                       step_sleep=args.step_sleep if step_sleep is None else step_sleep,
                       devices_per_process=args.devices_per_process,
                       checkpoint_dir=ckpt, extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl", **(
                           {"TRAIN_STATE_MIB": f"{args.state_mib:g}"} if args.state_mib else {})},
                       node_selector={"reprieve.test/pool": WORKER_POOL},
                       image=cluster.real.images["example"].ref if real else None,
                       requests={"cpu": "250m", "memory": "1Gi"} if real else None,
                       max_failures=args.max_failures,
                       compilation_cache=args.compilation_cache or work / "xla-cache")
    spec = body["spec"]
    spec["restartMode"], spec["spares"] = "InPlace", args.spares
    # the soak's kills come from outside the program (docs/soak.md): a SIGKILL's 137 is a disruption, not a failure
    spec.setdefault("restartPolicy", {})["exitCodeRules"] = [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}}]
    if args.memory:
        spec["checkpoint"]["memory"] = {"sizeLimit": args.memory}
    # One pod per node where it can (as on GPU nodes): a node's loss then takes one worker, and the faults that
    # need the two workers on two nodes find them there.
    spec["template"]["spec"]["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
            "matchLabels": {"reprieve.dev/job-name": name}}}}]}}
    return body, ckpt


def run_job(cluster: Cluster, body: dict, ckpt: Path, timeout: float, on_running: Any = None,
            stop: threading.Event | None = None) -> dict:
    """Apply ``body`` and wait for it to end (``on_running()``, if given, runs once its first step is logged);
    returns its final status. ``stop`` set (Ctrl-C): :class:`KeyboardInterrupt`."""
    name = body["metadata"]["name"]
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(body))
    steplog = ckpt / "steps.jsonl"
    deadline = time.monotonic() + timeout
    ran = on_running is None
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if not ran and steplog.exists() and steplog.stat().st_size > 0:
            ran = True
            on_running()
        got = cluster.kubectl("get", "tj", name, "-n", NS, "-o", "json", check=False)
        if got.returncode != 0:  # the API server may be away (apiserver-restart): ask again
            time.sleep(1.0)
            continue
        status = json.loads(got.stdout).get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return dict(status)
        time.sleep(1.0)
    raise TimeoutError(f"TrainingJob {NS}/{name} did not end within {timeout:.0f}s")


def present_checkpoints(ckpt: Path) -> set[int]:
    """The steps of the complete checkpoints a restore could use (docs/contract.md, "Checkpoint layout": no
    suffix, and not fenced out by a newer attempt), as the runtime lists them."""
    from reprieve.checkpoint import fencing
    from reprieve.checkpoint.storage import open_storage

    root = ckpt / "checkpoints"
    if not root.is_dir():
        return set()
    st = open_storage(str(root), create=False)
    return {c.step for c in fencing.visible(st.list_entries(uncommitted=False), st.read_fences())}


def checkpoint_sizes(root: Path, page: int = 4096) -> list[int]:
    """Bytes of each committed checkpoint under ``root``, every file counted in whole pages (as tmpfs charges)."""
    sizes = []
    for p in (root.iterdir() if root.is_dir() else []):
        if re.fullmatch(r"step_(\d{10})_a\d+", p.name):
            sizes.append(sum(-(-f.stat().st_size // page) * page for f in p.rglob("*") if f.is_file()))
    return sizes


def storage_dir(work: Path, name: str) -> Path:
    """The job ``name``'s checkpoint directory on the host (its pods' ``/ckpt``)."""
    return work / f"storage-{name}"


def size_storage(root: Path, free_ckpt: Path, keep: int) -> None:
    """Size the soak job's checkpoint-storage tmpfs (``<ckpt>/checkpoints``, the job's ``/ckpt/checkpoints``;
    mounted before the nodes started: ``injectors.mount_tmpfs``) by the fault-free run's checkpoints
    (``chaos.storage_tmpfs_bytes``): the storage-* faults make it read-only or full."""
    size = chaos.storage_tmpfs_bytes(checkpoint_sizes(free_ckpt / "checkpoints"), keep)
    resize_tmpfs(root, size)
    say(f"checkpoint storage: a {size / 2**20:.1f} MiB tmpfs at {root} (keep {keep} + 2 of the fault-free run's "
        "checkpoints)")


def kept_logs(cluster: Cluster) -> Path:
    """Where the soak keeps copies of its pods' logs on real nodes, the job's and the operator's (``keeplogs``: a
    deleted pod's go with it)."""
    return cluster.workdir / "kept-pod-logs"


def trainer_logs(cluster: Cluster, job: str) -> list[list[str]]:
    """Every trainer log of the job's pods (workers and spares, deleted pods and nodes since deleted too), each in
    order: on real nodes the copies ``keeplogs`` kept, on process nodes the logs themselves."""
    paths = [*kept_logs(cluster).glob(f"*/{NS}_{job}-*/trainer/*.log"),
             *cluster.workdir.glob(f"nodes/*/pods/{NS}/{job}-*/logs/trainer.log")]
    return [p.read_text(errors="replace").splitlines() for p in sorted(paths, key=lambda p: p.stat().st_mtime)]


STEP_MARGIN = 1.5  # the default job is this much longer than the fault window at the expected step time
# (a quiet 2-core VM stepped at 0.177-0.215 s where 0.27 s was planned, and faults stretch the job by ~15 %)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, int, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="how long faults are injected")
    p.add_argument("--seed", default="1", help="the schedule's seed (a whole number)")
    p.add_argument("--fault-every", type=float, default=30.0, help="seconds between faults, about (±25 %%)")
    p.add_argument("--faults", default=None,
                   help=f"comma-separated fault kinds (default: every one this cluster can do): {', '.join(chaos.KINDS)}")
    p.add_argument("--process-nodes", action="store_true",
                   help="process kubelets instead of real nodes (no kill-* kinds: pods are not containers there)")
    p.add_argument("--require-real-nodes", action="store_true",
                   help="real nodes that cannot start are an error (exit 2), not a fall-back to process nodes (CI)")
    p.add_argument("--nodes", type=int, default=4, help="worker nodes (2 workers, 1 spare, 1 free)")
    p.add_argument("--steps", type=int, default=0,
                   help=f"the job's steps (default: {STEP_MARGIN:g} x --minutes at --step-seconds: the job must "
                        "outlast the faults, their restarts included)")
    p.add_argument("--step-seconds", type=float, default=0.6, help="expected seconds per step, for --steps")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--reference-step-sleep", type=float, default=None,
                   help="the fault-free run's step sleep (default: --step-sleep). The sleep changes no parameter, "
                        "so the sha256 is still the reference; but the goodput ratio and the check that the job "
                        "outlasts the schedule need the same sleep (the CI smoke, which asserts neither, uses 0)")
    p.add_argument("--devices-per-process", type=int, default=2,
                   help="simulated CPU devices per trainer process (with 1, gloo's all-reduce has half the ranks: "
                        "cheaper steps; RESULTS.md, 'Other measurements')")
    p.add_argument("--interval", type=int, default=20, help="periodic checkpoint every this many steps")
    p.add_argument("--spares", type=int, default=1)
    p.add_argument("--memory", default=None,
                   help="the memory tier's sizeLimit ('' turns the tier off; default: 256Mi, more with --state-mib)")
    p.add_argument("--state-mib", type=float, default=0.0,
                   help="MiB of trained n-gram memory added to each process's state (the example's TRAIN_STATE_MIB; "
                        "0: the example's own ~1 MiB); refused when the machine lacks the memory")
    p.add_argument("--max-failures", type=int, default=1000,
                   help="the job's maxFailures (a survivor's unattributed abort still counts: docs/soak.md)")
    p.add_argument("--out", type=Path, default=None, help="directory for soak.json and the timeline")
    p.add_argument("--compilation-cache", type=Path, default=None,
                   help="JAX compilation cache directory the jobs share (default: a fresh one in the soak's work "
                        "directory; the test suite passes the one its end-to-end jobs share)")
    p.add_argument("--timeout", type=float, default=0, help="per job (default: 4x the planned minutes + 10 min)")
    p.add_argument("--plan-only", action="store_true", help="print the schedule and exit (starts nothing)")
    args = p.parse_args(argv)
    try:
        seed = chaos.parse_seed(args.seed)
        kinds = chaos.parse_kinds(args.faults)
        if args.require_real_nodes and args.process_nodes:
            raise chaos.SoakConfigError("--require-real-nodes and --process-nodes contradict each other")
        if args.reference_step_sleep is not None and args.reference_step_sleep < 0:
            raise chaos.SoakConfigError(f"--reference-step-sleep must be >= 0, got {args.reference_step_sleep:g}")
        if args.devices_per_process < 1:
            raise chaos.SoakConfigError(f"--devices-per-process must be >= 1, got {args.devices_per_process}")
        if args.nodes < 3:
            raise chaos.SoakConfigError(f"--nodes must be >= 3 (2 workers and a spare), got {args.nodes}")
        in_storage = statesize.storage_copies(JOB_KEEP) if chaos.storage_tmpfs_needed(kinds) else 0
        if (why := statesize.refusal(args.state_mib, 2, args.devices_per_process, statesize.mem_available_mib(),
                                     in_storage=in_storage)) is not None:
            raise chaos.SoakConfigError(why)
        # Checked here with what the machine offers, before anything starts (and again if real nodes fail).
        chaos.validate(kinds, capabilities(real=not args.process_nodes, why="--process-nodes", spares=args.spares),
                       minutes=args.minutes, fault_every=args.fault_every, explicit=bool(args.faults))
    except chaos.SoakConfigError as err:
        p.error(str(err))
    if args.memory is None:
        args.memory = statesize.tier_size_limit(args.state_mib)
    args.steps = args.steps or int(args.minutes * 60 * STEP_MARGIN / args.step_seconds)
    if args.reference_step_sleep is None:
        args.reference_step_sleep = args.step_sleep
    args.timeout = args.timeout or args.minutes * 60 * 4 + 600
    return args, seed, kinds


def capabilities(*, real: bool, why: str, spares: int) -> chaos.Capabilities:
    has = {faults.SPARE} if spares > 0 else set()
    if os.geteuid() == 0:
        has.add(faults.ROOT)
    if shutil.which("iptables-restore") and shutil.which("nsenter"):
        has.add(faults.IPTABLES)
    if real:
        has |= {faults.REAL_NODES, faults.OPERATOR_DEPLOYMENT}
    return chaos.Capabilities(frozenset(has), why)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    args, seed, kinds = parse_args(argv)
    real, why = not args.process_nodes, "--process-nodes"
    if real and prerequisites():
        real, why = False, "real nodes cannot run here: " + "; ".join(prerequisites())
        if args.require_real_nodes:
            print(f"soak.py: error: {why} (--require-real-nodes)", file=sys.stderr)
            return 2
        say(f"{why} -> process nodes")
    try:
        chosen = chaos.validate(kinds, capabilities(real=real, why=why, spares=args.spares), minutes=args.minutes,
                                fault_every=args.fault_every, explicit=bool(args.faults))
    except chaos.SoakConfigError as err:
        print(f"soak.py: error: {err}", file=sys.stderr)
        return 2
    caps = capabilities(real=real, why=why, spares=args.spares)
    left_out = chaos.dropped(kinds, caps)
    plan = chaos.schedule(chosen, minutes=args.minutes, fault_every=args.fault_every, seed=seed)
    say(f"schedule (seed {seed}): {len(plan)} faults over {args.minutes:g} min, one about every "
        f"{args.fault_every:g} s, of {len(chosen)} kinds" + (f"; left out here: {', '.join(left_out)} ({why})"
                                                          if left_out else ""))
    not_impl = [k.name for k in chaos.KINDS.values() if not k.implemented]
    if not_impl:
        say(f"not implemented yet (never scheduled): {', '.join(not_impl)}")
    if args.plan_only:
        for i, f in enumerate(plan, 1):
            print(f"{i:>4} {f.at:>8.1f}s  cycle {f.cycle:<3} {f.kind}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="reprieve-soak-"))
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    # Before any node starts: a real node's mount namespace is a copy of the host's at its start (mount_tmpfs).
    storage = (mount_tmpfs(storage_dir(work, "soak") / "checkpoints", chaos.STORAGE_TMPFS_START_BYTES)
               if chaos.storage_tmpfs_needed([f.kind for f in plan]) else None)
    try:
        return run_soak(args, seed, plan, work, out, real, why, chosen, storage)
    finally:
        if storage is not None:
            subprocess.run(["umount", "-l", str(storage)], check=False)
            say(f"checkpoint storage tmpfs at {storage} unmounted (its checkpoints are gone with it)")


def run_soak(args: argparse.Namespace, seed: int, plan: list[chaos.PlannedFault], work: Path, out: Path,
             real: bool, why: str, chosen: list[str], storage: Path | None) -> int:
    with Cluster.start(work / "cluster") as cluster:
        operator: Any
        if real:
            try:
                say("starting the system node and worker nodes (real: upstream kubelet, containerd, runc)")
                # Every node gets every built image: one image set is one node template (hard-linked in seconds),
                # the same the real-node tier's nodes use, where a set per role imported each anew (minutes).
                cluster.add_node("system-0", {"reprieve.test/pool": SYSTEM_POOL}, kind="real")
                for i in range(args.nodes):
                    cluster.add_node(f"w-{i}", {"reprieve.test/pool": WORKER_POOL}, kind="real")
            except (RealNodeError, ClusterError) as err:
                if args.require_real_nodes:
                    print(f"soak.py: error: real nodes failed to start (--require-real-nodes): {err}",
                          file=sys.stderr)
                    return 2
                say(f"REAL NODES NOT AVAILABLE: {err}\n  -> process nodes")
                for name in list(cluster.node_names()):
                    cluster.kill_node(name)
                real, why = False, f"real nodes failed to start: {str(err)[:200]}"
                caps = capabilities(real=False, why=why, spares=args.spares)
                try:
                    chosen = chaos.validate(chosen, caps, minutes=args.minutes, fault_every=args.fault_every,
                                            explicit=bool(args.faults))
                except chaos.SoakConfigError as err2:
                    print(f"soak.py: error: {err2}", file=sys.stderr)
                    return 2
                plan = chaos.schedule(chosen, minutes=args.minutes, fault_every=args.fault_every, seed=seed)
        if real:
            pod = install_operator(cluster, cluster.real.images["operator"].ref,
                                   node_selector={"reprieve.test/pool": SYSTEM_POOL}, values={"replicaCount": 2})
            operator = DeployedOperator(cluster)
            say(f"chart installed: two operator replicas, leader {operator.leader() or pod}")
        else:
            for i in range(args.nodes):
                cluster.add_node(f"w-{i}", {"reprieve.test/pool": WORKER_POOL})
            install_chart(cluster)
            operator = OperatorProcess(cluster, work / "operator", namespaces=[NS]).start()
            say("process nodes; the operator runs as a local process with the chart's ServiceAccount (one replica)")
        cluster.kubectl("create", "namespace", NS)
        try:
            return soak(cluster, operator, work, out, args, real=real, seed=seed, plan=plan, storage=storage)
        finally:
            if isinstance(operator, OperatorProcess):
                operator.stop()
            say(f"work directory (logs, storage): {work}")


def job_end(ckpt: Path, seen: float) -> float:
    """When the job itself ended: process 0 writes result.json after its loop and final save (the host's
    clock, as the soak's). The soak may see the end much later (an API server down at the job's end, the
    kubelet's next status); goodput counts to the job's own end in both runs."""
    result = ckpt / "result.json"
    return min(seen, result.stat().st_mtime) if result.exists() else seen


def soak(cluster: Cluster, operator: Any, work: Path, out: Path, args: argparse.Namespace, *, real: bool,
         seed: int, plan: list[chaos.PlannedFault], storage: Path | None) -> int:
    ref_sleep = args.reference_step_sleep
    same = ref_sleep == args.step_sleep
    say(f">>> fault-free run: {args.steps} steps, 2 workers x {args.devices_per_process} device(s), InPlace, "
        f"{args.spares} spare(s), memory tier {args.memory or 'off'}"
        + ("" if same else f", each step sleeping {ref_sleep:g} s (the soak's: {args.step_sleep:g} s)"))
    body, ckpt_free = soak_job(cluster, "free", work, args, real, step_sleep=ref_sleep)
    t = time.time()
    free = run_job(cluster, body, ckpt_free, args.timeout)
    free_report = analyse(read_step_log(ckpt_free / "steps.jsonl"), start=t, end=job_end(ckpt_free, time.time()))
    say(f"fault-free: {free.get('phase')}, goodput after start {free_report.goodput_after_start:.1%}")
    window = plan[-1].at if plan else 0.0
    if not same:
        say("the fault-free run's steps slept otherwise than the soak's: its goodput ratio is not comparable, and "
            "whether the soak's job outlasts the schedule shows only in the soak (faults that never ran fail it)")
    elif free_report.wall_seconds < window:
        per_step = free_report.wall_seconds / max(1, args.steps)
        say(f"WARNING: the fault-free run took {free_report.wall_seconds:.0f} s, less than the faults' "
            f"{window:.0f} s: the soak's job outlasts its last faults only if they cost it more than "
            f"{1 - free_report.wall_seconds / window:.0%} of its time (faults that never ran fail the soak); "
            f"to be sure, give it more steps (--steps {int(window * STEP_MARGIN / max(per_step, 1e-3))})")
    cluster.kubectl("delete", "tj", "free", "-n", NS, "--wait=true", timeout=120)

    api = cluster.api_client()
    observer = Observer(api, "soak")
    injectors = Injectors(cluster, api, NS, "soak", pool_labels={"reprieve.test/pool": WORKER_POOL},
                          node_kind="real" if real else "process", rng=random.Random(seed),
                          attempt=lambda: observer.latest().attempt, operator=operator if real else None,
                          add_node_kwargs={})
    body, ckpt = soak_job(cluster, "soak", work, args, real)
    keep = int(body["spec"]["checkpoint"].get("keep", JOB_KEEP))
    if storage is not None:
        size_storage(storage, ckpt_free, keep)
        injectors.storage = storage
    return soak_faults(cluster, api, args, body, ckpt, ckpt_free, free_report, observer, injectors, out,
                       seed=seed, real=real, plan=plan)


def soak_faults(cluster: Cluster, api: Any, args: argparse.Namespace, body: dict, ckpt: Path, ckpt_free: Path,
                free_report: Any, observer: Observer, injectors: Injectors, out: Path, *, seed: int, real: bool,
                plan: list[chaos.PlannedFault]) -> int:
    keep = int(body["spec"]["checkpoint"].get("keep", JOB_KEEP))
    peaks = PeakMemory(lambda cmd: "train_lm.py" in cmd).start()  # the soak's trainers (the reference's are gone)
    injected: list[Injected] = []
    clock: list[float] = []  # when the faults' clock started (the job running)
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())

    def ended() -> bool:
        return observer.latest().phase in ("Succeeded", "Failed")

    def inject_all() -> None:
        t0 = time.time()
        clock.append(t0)
        say(f">>> faults begin: {len(plan)} planned")
        for f in plan:
            if stop.wait(max(0.0, t0 + f.at - time.time())):
                return
            if ended():
                say(f"the job ended before fault {len(injected) + 1}: {len(plan) - len(injected)} planned faults "
                    "not injected")
                return
            rec = injectors.inject(f.kind)
            began = time.monotonic()
            # no target at this moment (a restart under way): tried again each second while the job runs, up to
            # chaos.TARGET_WAIT_SECONDS
            while (rec.error and chaos.retry_for_target(rec.error, time.monotonic() - began)
                   and not stop.wait(1.0) and not ended()):
                rec = injectors.inject(f.kind)
            injected.append(rec)
            say(f"fault {len(injected)}/{len(plan)}: {f.kind} -> {rec.target or rec.error}")

    observer.start()
    # The job's pods and the operator's (a leader handover's lines outlive its pod, and the kubelet's rotation)
    keeper = LogKeeper(lambda: [*real_node_logs(cluster.workdir, NS), *real_node_logs(cluster.workdir, RELEASE_NS)],
                       kept_logs(cluster)).start()
    thread = threading.Thread(target=inject_all, daemon=True)
    start = time.time()
    status: dict = {}
    interrupted = False
    try:
        status = run_job(cluster, body, ckpt, args.timeout, on_running=thread.start, stop=stop)
    except (KeyboardInterrupt, TimeoutError) as err:
        interrupted = True
        say(f"soak stopped: {str(err) or 'Ctrl-C'}")
    finally:
        stop.set()
        for line in injectors.stop():
            say(f"undone: {line}")
        signal.signal(signal.SIGINT, previous)
        keeper.stop()
        if real:
            say(f"pod logs (deleted pods' too, up to ~1 s before they went): {kept_logs(cluster)}")
    end = time.time()
    # A fault whose recovery may come after the job's end (a leader killed near it: the standby takes the Lease
    # only after the lease duration): keep watching for it, up to a minute.
    deadline = time.monotonic() + 60
    while any(chaos.KINDS[f.kind].awaited(f, observer.obs) for f in injected) and time.monotonic() < deadline:
        time.sleep(1.0)
    observer.halt.set()
    steps = read_step_log(ckpt / "steps.jsonl") if (ckpt / "steps.jsonl").exists() else []
    # Goodput over the faults' window: the job's start to one fault interval after the last planned fault (each
    # fault has its interval to recover in), so a fault-free tail of a job sized longer than the schedule does
    # not dilute what the faults cost; the fault-free run's over its whole run (its steady rate).
    until = fault_window_end(clock[0] if clock else start, plan, args.fault_every)
    report = analyse(steps, start=start, end=job_end(ckpt, end), until=until)
    whole = analyse(steps, start=start, end=job_end(ckpt, end))
    recs = records(injected, observer.obs, report.interruptions, steps, t0=start,
                   starts=starts_by_attempt(trainer_logs(cluster, "soak")),
                   ended={**injectors.storage_until, **injectors.partition_until})
    lost = committed_lost(observer.committed, present_checkpoints(ckpt), keep)
    sha: bool | None = None
    try:
        sha = (json.loads((ckpt / "result.json").read_text())["sha256"]
               == json.loads((ckpt_free / "result.json").read_text())["sha256"])
    except (OSError, ValueError, KeyError):
        pass
    tot = totals(recs, goodput=report.goodput_after_start, goodput_fault_free=free_report.goodput_after_start,
                 lost=lost, sha256_equal=sha, unexplained=unexplained(injected, report.interruptions))
    print("\n" + table(recs, tot))
    print("\nthe cost of each kind (restarts it caused; means):\n" + kind_table(by_kind(recs)))
    unrun = 0 if interrupted else len(plan) - len(injected)
    if unrun:
        say(f"{unrun} of the {len(plan)} planned faults never ran: the job ended first ({args.steps} steps; give it "
            "more with --steps, or a smaller --step-seconds)")
    gp = status.get("goodput") or {}
    say(f"goodput over the fault window (to {until - start:.0f} s) {report.goodput_after_start:.1%}; over the whole "
        f"job ({whole.wall_seconds:.0f} s) {whole.goodput_after_start:.1%}")
    print(f"job: {status.get('phase', 'not ended')}; restarts {status.get('restarts')}; operator's lost steps "
          f"{gp.get('lostSteps')} vs the step log's {report.lost_steps}")
    peaks.stop()
    say(f"peak memory per pod (its trainer processes, VmHWM): {peak_words(peaks.by_pod())}")
    doc = as_json(recs, tot, seed=seed, minutes=args.minutes, fault_every=args.fault_every, real_nodes=real,
                  planned=len(plan), interrupted=interrupted, phase=status.get("phase"),
                  operator_lost_steps=gp.get("lostSteps"), step_log_lost_steps=report.lost_steps,
                  restarts=status.get("restarts"), steps=args.steps, committed_seen=sorted(observer.committed),
                  planned_not_run=unrun, goodput_window_seconds=round(until - start, 1),
                  goodput_whole_job=whole.goodput_after_start, step_sleep=args.step_sleep,
                  reference_step_sleep=args.reference_step_sleep, devices_per_process=args.devices_per_process,
                  state_mib=args.state_mib, peak_memory_kib_by_pod=peaks.by_pod())
    (out / "soak.json").write_text(json.dumps(doc, indent=1))
    say(f"JSON: {out / 'soak.json'}")
    draw(api, recs, start, out)
    api.close()
    failed = failures(interrupted=interrupted, phase=status.get("phase"), injected=tot.injected,
                      recovered=tot.recovered, not_injected=tot.not_injected, unrun=unrun, lost=len(lost), sha=sha)
    if failed:
        say("soak FAILED: " + "; ".join(failed))
    return 1 if failed else 0


def fault_window_end(t0: float, plan: list[chaos.PlannedFault], fault_every: float) -> float:
    """Where the faults' window ends (pure): one fault interval after the last planned fault, on the faults'
    clock ``t0``."""
    return t0 + (plan[-1].at if plan else 0.0) + fault_every


def failures(*, interrupted: bool, phase: str | None, injected: int, recovered: int, not_injected: int, unrun: int,
             lost: int, sha: bool | None) -> list[str]:
    """Why the soak fails (pure; empty: it passed)."""
    checks = [(interrupted, "interrupted"), (phase != "Succeeded", f"the job ended {phase or 'not at all'}"),
              (recovered != injected, f"{injected - recovered} of {injected} faults not recovered"),
              (bool(not_injected), f"{not_injected} faults found no target"),
              (bool(unrun), f"{unrun} planned faults never ran (the job ended first)"),
              (bool(lost), f"{lost} committed checkpoints lost"),
              (sha is not True, "the final parameters differ from the fault-free run's" if sha is False
               else "no final parameters to compare")]
    return [why for bad, why in checks if bad]


def draw(api: Any, recs: list, start: float, out: Path) -> None:
    """The job's timeline (reprieve_operator.timeline) with every fault marked."""
    from reprieve_operator import timeline as rep

    try:
        job, events = rep.collect(api, NS, "soak")
        tl = rep.timeline(job, events, time.time())
        tl.marks += [rep.Mark(start + r.injected_at - tl.start, "failure", f"fault: {r.kind} ({r.target})")
                     for r in recs]
        _svg, html = rep.write(tl, out)
        say(f"timeline: {html}")
    except Exception as err:  # noqa: BLE001 - the picture is a bonus; the records are printed already
        say(f"timeline not drawn: {err}")


if __name__ == "__main__":
    sys.exit(main())
