"""The chaos soak's pure core: the fault catalogue, the seeded schedule, and validation before anything starts.

No I/O here (``benchmarks/soak.py`` and :mod:`localcluster.injectors` act on the cluster); the per-fault records
and totals are :mod:`localcluster.soakrecord`. ``docs/soak.md`` says what each fault does and how it is counted.

Every noticed-preemption kind is generated from the operator's ``BUILTIN_SIGNALS`` (``notice-<signal name>``), so
a signal added there is a fault kind here, with the same key, value and notice window.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from reprieve_operator.policy.signals import BUILTIN_SIGNALS, Signal

# What a fault needs of the cluster (Capabilities.has): checked by validate() before anything starts.
REAL_NODES = "real nodes"            # containers in cgroups and network namespaces (not process nodes)
OPERATOR_DEPLOYMENT = "the operator as the chart's Deployment with two replicas"
SPARE = "a warm spare (spec.spares >= 1)"
ROOT = "root (the soak mounts the job's checkpoint storage as a tmpfs)"
IPTABLES = "iptables-restore on PATH (Debian's iptables package: the partition's DROP rules)"
NOTICE_PREFIX = "notice-"


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: what it does, whether it ends the running attempt, what it needs of the cluster."""

    name: str
    what: str
    interrupts: bool                 # expected to end the running attempt (a gang restart follows)
    needs: tuple[str, ...] = ()
    implemented: bool = True
    signal: Signal | None = None     # notice kinds: the node signal put on the node
    nodes: int = 1                   # worker nodes it dooms (two-nodes-doomed: 2)


def _notice(sig: Signal) -> FaultKind:
    window = f"{sig.notice_seconds} s" if sig.notice_seconds else "its deadline"
    return FaultKind(f"{NOTICE_PREFIX}{sig.name}", f"{sig.kind} {sig.key or 'spec.unschedulable'} on a worker's "
                     f"node, the node deleted after {window}", True, signal=sig)


CATALOGUE: tuple[FaultKind, ...] = (
    *(_notice(s) for s in BUILTIN_SIGNALS),
    FaultKind("node-lost", "a worker's node vanishes without notice (containers, kubelet and Node gone)", True),
    FaultKind("kill-trainer", "SIGKILL of a worker's trainer process (the supervisor lives on)", True,
              (REAL_NODES,)),
    FaultKind("kill-supervisor", "SIGKILL of a worker's supervisor (reprieve-run, the container's PID 1)", True,
              (REAL_NODES,)),
    FaultKind("kill-spare", "SIGKILL of the warm spare's supervisor (no attempt ends; the spare is replaced)", False,
              (REAL_NODES, SPARE)),
    FaultKind("kill-operator-leader", "SIGKILL of the operator pod holding the leader Lease (the standby takes "
              "over)", False, (REAL_NODES, OPERATOR_DEPLOYMENT)),
    FaultKind("notice-during-restart", "a GKE spot notice on the other worker's node while a restart is under way "
              "(a hard kill first, the notice as soon as the attempt ends)", True),
    FaultKind("two-nodes-doomed", "GKE spot notices on both workers' nodes at once, both deleted at the deadline",
              True, nodes=2),
    FaultKind("apiserver-restart", "the kube-apiserver stopped (SIGTERM), kept down 5-15 s and started again on "
              "the same etcd (every object kept)", False),
    FaultKind("partition", "one worker pod cut off the network for 10-30 s (DROP rules in its network namespace "
              "but loopback; its interfaces kept), then healed", True, (REAL_NODES, IPTABLES)),
    FaultKind("storage-unavailable", "the checkpoint storage (a tmpfs) not writable for 10 s (real nodes: its "
              "directories' write bits off; process nodes: remounted read-only)", False,
              (ROOT,)),
    FaultKind("storage-full", "the checkpoint storage (a tmpfs) filled with a ballast file for 10-20 s",
              False, (ROOT,)),
)
STORAGE_KINDS = ("storage-unavailable", "storage-full")
KINDS = {k.name: k for k in CATALOGUE}


class SoakConfigError(ValueError):
    """A soak that cannot run as asked; raised before anything starts, with what to change."""


@dataclass(frozen=True)
class Capabilities:
    """What the chosen cluster can do, and why not where it cannot (for the error)."""

    has: frozenset[str]
    why_not: str = ""


@dataclass(frozen=True)
class PlannedFault:
    at: float          # seconds after the soak's faults begin
    kind: str
    cycle: int         # every selected kind appears once in each cycle


def parse_seed(text: str) -> int:
    """``--seed``: a whole number (any size), else :class:`SoakConfigError`."""
    try:
        return int(str(text).strip(), 10)
    except ValueError:
        raise SoakConfigError(f"--seed must be a whole number (e.g. 1), got {text!r}") from None


def parse_kinds(text: str | None) -> list[str]:
    """``--faults``: comma-separated kind names; ``None``/empty: every implemented kind. Unknown names are an
    error naming every known kind."""
    if not text:
        return [k.name for k in CATALOGUE if k.implemented]
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise SoakConfigError(f"--faults: unknown fault kind(s) {', '.join(unknown)}; known kinds: "
                              f"{', '.join(KINDS)}")
    if not names:
        raise SoakConfigError(f"--faults {text!r} names no fault kind; known kinds: {', '.join(KINDS)}")
    return list(dict.fromkeys(names))


def validate(kinds: Sequence[str], caps: Capabilities, *, minutes: float, fault_every: float,
             explicit: bool = True) -> list[str]:
    """The kinds the soak will inject on this cluster, or :class:`SoakConfigError` naming every problem.

    ``explicit``: the kinds were asked for (``--faults``): one the cluster cannot do is an error. Otherwise (the
    default list) such kinds are dropped, and the caller reports them."""
    problems = []
    if minutes <= 0:
        problems.append(f"--minutes must be > 0, got {minutes}")
    if fault_every < 5:
        problems.append(f"--fault-every must be >= 5 seconds (a fault needs time to land), got {fault_every}")
    chosen = []
    for name in kinds:
        kind = KINDS[name]
        if not kind.implemented:
            problems.append(f"fault kind {name} ({kind.what}) is not implemented yet")
            continue
        missing = [n for n in kind.needs if n not in caps.has]
        if missing:
            if explicit:
                problems.append(f"fault kind {name} needs {' and '.join(missing)}, which this cluster lacks"
                                + (f" ({caps.why_not})" if caps.why_not else ""))
            continue
        chosen.append(name)
    if not problems and not chosen:
        problems.append("no selected fault kind can run on this cluster" + (f" ({caps.why_not})" if caps.why_not
                                                                            else ""))
    if not problems and minutes * 60 < fault_every:
        problems.append(f"--minutes {minutes} is shorter than one --fault-every {fault_every} s: no fault would be "
                        "injected")
    if problems:
        raise SoakConfigError("the soak cannot run as asked:\n  - " + "\n  - ".join(problems))
    return chosen


def dropped(kinds: Iterable[str], caps: Capabilities) -> list[str]:
    """Implemented kinds the cluster cannot do (left out of a default schedule, and said so)."""
    return [n for n in kinds if KINDS[n].implemented and any(x not in caps.has for x in KINDS[n].needs)]


def schedule(kinds: Sequence[str], *, minutes: float, fault_every: float, seed: int) -> list[PlannedFault]:
    """One fault about every ``fault_every`` seconds for ``minutes``: cycles of every kind once in a seeded random
    order, each time jittered by up to a quarter of ``fault_every`` (never before the previous one). The same
    arguments give the same schedule."""
    if not kinds:
        return []
    rng = random.Random(seed)
    count = int(minutes * 60 // fault_every)
    out: list[PlannedFault] = []
    order: list[str] = []
    for i in range(count):
        if not order:
            order = list(kinds)
            rng.shuffle(order)
        at = (i + 1) * fault_every + rng.uniform(-0.25, 0.25) * fault_every
        at = max(at, out[-1].at + 1.0 if out else 1.0)
        out.append(PlannedFault(round(at, 3), order.pop(0), i // len(kinds)))
    return out


def apiserver_down_seconds(rng: random.Random) -> float:
    """How long an ``apiserver-restart`` keeps the kube-apiserver down: 5-15 s, drawn from the soak's rng."""
    return round(rng.uniform(5.0, 15.0), 1)


def notice_patch(sig: Signal, now: float) -> tuple[str, str, str | None, float]:
    """How to put ``sig`` on a node at wall time ``now``: (field kind, key, value, seconds until the node is
    deleted). An epoch label carries its own deadline (30 s ahead); a zero window deletes the node at once."""
    if sig.kind == "LabelEpoch":
        deadline = int(now) + 30
        return sig.kind, sig.key, str(deadline), float(deadline - now)
    value = sig.value if sig.value is not None else ("True" if sig.kind == "Condition" else "true")
    return sig.kind, sig.key, value, float(sig.notice_seconds)


def partition_seconds(rng: random.Random) -> float:
    """How long a ``partition`` cuts its pod off: 10-30 s, drawn from the soak's rng."""
    return round(rng.uniform(10.0, 30.0), 1)


STORAGE_UNAVAILABLE_SECONDS = 10.0
STORAGE_SLACK_BYTES = 1 << 20  # fences, a checkpoint's reprieve.json rewrite, TensorStore's lock files


STORAGE_TMPFS_START_BYTES = 1 << 30  # until the fault-free run has measured a checkpoint (tmpfs charges what is used)


def storage_tmpfs_needed(kinds: Sequence[str]) -> bool:
    """Whether the soak mounts its checkpoint-storage tmpfs: some planned fault is a storage fault. It is mounted
    before the nodes start (at ``STORAGE_TMPFS_START_BYTES``; a real node's mount namespace copies the host's at
    its start: ``injectors.mount_tmpfs``) and resized by ``storage_tmpfs_bytes`` after the fault-free run."""
    return any(k in STORAGE_KINDS for k in kinds)


def storage_fault_seconds(kind: str, rng: random.Random) -> float:
    """How long a storage fault lasts: ``storage-unavailable`` 10 s, ``storage-full`` 10-20 s (the soak's rng)."""
    return STORAGE_UNAVAILABLE_SECONDS if kind == "storage-unavailable" else round(rng.uniform(10.0, 20.0), 1)


def storage_tmpfs_bytes(checkpoint_bytes: Sequence[int], keep: int, page: int = 4096) -> int:
    """The size of the tmpfs the soak mounts as the job's checkpoint storage when storage faults are scheduled:
    room for ``keep + 2`` of the largest checkpoint measured (``keep`` committed, one more that a restart's deferred
    retention leaves, one being written) and ``STORAGE_SLACK_BYTES``, in whole pages. ``checkpoint_bytes``: the
    sizes of the fault-free run's checkpoints, each counted in whole pages per file (what tmpfs charges)."""
    if not checkpoint_bytes or max(checkpoint_bytes) <= 0:
        raise SoakConfigError("the fault-free run left no checkpoint to size the checkpoint storage by")
    need = (keep + 2) * max(checkpoint_bytes) + STORAGE_SLACK_BYTES
    return -(-need // page) * page


def storage_recovered(until: float, committed: Sequence[tuple[float, int | None]]) -> float | None:
    """When the job was seen, after a storage fault that ended at ``until``, with a checkpoint newer than every
    one seen until then (nothing commits while the storage is read-only or full, and a step first reported during
    the fault was committed before it): the next due save after the fault committed. ``committed``: ``(time, the
    status's lastCheckpointStep)`` of each observation, in order. None: never."""
    before = max((step for t, step in committed if t < until and step is not None), default=-1)
    return next((t for t, step in committed if t >= until and step is not None and step > before), None)


# The CI smoke soak (tests/e2e/test_soak_smoke_e2e.py, docs/soak.md "In CI"): one short run per `make test`, its seed
# rotated over SMOKE_ROTATION by the UTC day (or REPRIEVE_SOAK_SEED). Each seed has a group of kinds of its own, and
# the smoke's schedule (SMOKE_MINUTES at one fault per SMOKE_FAULT_EVERY s) is one cycle: every kind of the group
# exactly once. Over the rotation's seeds every kind in CATALOGUE is injected (a kind added there and not here fails
# tests/localcluster/test_chaos_unit.py). The groups spread the costly kinds (two restarts, a partition's wait, a
# node lost from its last checkpoint, the API server away) one per seed, the storage kinds over two seeds (the
# only runs that mount the tmpfs), and no seed has more than two notices with a 30 s window.
SMOKE_MINUTES = 1.25
SMOKE_FAULT_EVERY = 15.0
SMOKE_ROTATION: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, ("partition", "notice-cordon", "storage-full", "notice-gke-spot", "notice-aws-spot-itn")),
    (2, ("notice-during-restart", "kill-spare", "storage-unavailable", "notice-gke-maintenance-ongoing",
         "notice-aws-rebalance")),
    (3, ("two-nodes-doomed", "kill-operator-leader", "notice-gke-scheduled-maintenance",
         "notice-karpenter-disrupted", "notice-aks-scheduled-event")),
    (4, ("node-lost", "kill-supervisor", "notice-gke-maintenance-window", "notice-cluster-autoscaler",
         "notice-aks-remediator")),
    (5, ("apiserver-restart", "notice-aws-scheduled-maintenance", "notice-aws-asg-lifecycle", "kill-trainer",
         "notice-out-of-service")),
)
# Worker nodes of the smoke's cluster: 2 workers, 1 spare and 2 free. A noticed node stays until its deadline (up to
# 30 s) and its replacement starts after that, so three notices 15 s apart leave no worker on a live node with 4
# (seed 5's fifth fault found no target twice, with 4 nodes and three 30 s notices in its group).
SMOKE_NODES = 5


def smoke_seed(env: str | None, utc_day: int) -> int:
    """The CI smoke's seed: ``REPRIEVE_SOAK_SEED`` (``env``) when set, which must be one of SMOKE_ROTATION's seeds
    (its kinds come with it), else the rotation's entry for ``utc_day`` (days since the epoch) modulo its length."""
    seeds = [s for s, _ in SMOKE_ROTATION]
    if env is None or not env.strip():
        return seeds[utc_day % len(seeds)]
    seed = parse_seed(env)
    if seed not in seeds:
        raise SoakConfigError(f"REPRIEVE_SOAK_SEED={env!r}: the CI smoke's seeds are {', '.join(map(str, seeds))} "
                              "(each with its own fault kinds: chaos.SMOKE_ROTATION); for any other seed run "
                              "benchmarks/soak.py by hand")
    return seed


def smoke_plan(seed: int) -> tuple[list[str], list[PlannedFault]]:
    """The kinds of the rotation's ``seed`` and the smoke's schedule of them (``schedule`` at SMOKE_MINUTES and
    SMOKE_FAULT_EVERY: what ``benchmarks/soak.py --faults <kinds> --seed <seed>`` with those will inject)."""
    kinds = list(dict(SMOKE_ROTATION)[seed])
    return kinds, schedule(kinds, minutes=SMOKE_MINUTES, fault_every=SMOKE_FAULT_EVERY, seed=seed)


TARGET_WAIT_SECONDS = 10.0  # how long a fault that finds no target now is tried again (benchmarks/soak.py)


def retry_for_target(error: str, waited: float, limit: float = TARGET_WAIT_SECONDS) -> bool:
    """Whether a fault the injector could not carry out is tried again a second later: only when it found no
    target at that moment (the workers' new pods not running yet, every worker on a node already doomed: a
    restart under way), for up to ``limit`` seconds. Any other error is recorded at once."""
    retryable = error.startswith(("no target:", "two-nodes-doomed needs workers on two live nodes"))
    return retryable and waited < limit
