"""The chaos soak's pure core: the seeded schedule, the CI smoke's rotation, and validation before anything
starts.

No I/O here (``benchmarks/soak.py`` and :mod:`localcluster.injectors` act on the cluster). The fault kinds, each
with its inject, undo, detection and recovery, are :mod:`localcluster.faults` (``REGISTRY``); everything here is
computed from that registry. The per-fault records and totals are :mod:`localcluster.soakrecord`.
``docs/soak.md`` says what each fault does and how it is counted.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .faults import REGISTRY, FaultKind

KINDS = REGISTRY


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
        return [k.name for k in KINDS.values() if k.implemented]
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


STORAGE_SLACK_BYTES = 1 << 20  # fences, a checkpoint's reprieve.json rewrite, TensorStore's lock files
STORAGE_TMPFS_START_BYTES = 1 << 30  # until the fault-free run has measured a checkpoint (tmpfs charges what is used)


def storage_tmpfs_needed(kinds: Sequence[str]) -> bool:
    """Whether the soak mounts its checkpoint-storage tmpfs: some planned fault is a storage fault. It is mounted
    before the nodes start (at ``STORAGE_TMPFS_START_BYTES``; a real node's mount namespace copies the host's at
    its start: ``injectors.mount_tmpfs``) and resized by ``storage_tmpfs_bytes`` after the fault-free run."""
    return any(KINDS[k].tmpfs for k in kinds)


def storage_tmpfs_bytes(checkpoint_bytes: Sequence[int], keep: int, page: int = 4096) -> int:
    """The size of the tmpfs the soak mounts as the job's checkpoint storage when storage faults are scheduled:
    room for ``keep + 2`` of the largest checkpoint measured (``keep`` committed, one more that a restart's deferred
    retention leaves, one being written) and ``STORAGE_SLACK_BYTES``, in whole pages. ``checkpoint_bytes``: the
    sizes of the fault-free run's checkpoints, each counted in whole pages per file (what tmpfs charges)."""
    if not checkpoint_bytes or max(checkpoint_bytes) <= 0:
        raise SoakConfigError("the fault-free run left no checkpoint to size the checkpoint storage by")
    need = (keep + 2) * max(checkpoint_bytes) + STORAGE_SLACK_BYTES
    return -(-need // page) * page


# The CI smoke soak (tests/e2e/test_soak_smoke_e2e.py, docs/soak.md "In CI"): one short run per `make test`, its seed
# rotated over smoke_rotation()'s seeds by the UTC day (or REPRIEVE_SOAK_SEED). Each seed has a group of at most
# SMOKE_FAULTS kinds of its own, and its schedule (one fault per SMOKE_FAULT_EVERY s) is one cycle: every kind of the
# group exactly once; over the seeds every registered kind is injected. The groups are dealt from the registry, so a
# kind registered is in the rotation: see smoke_rotation for the rule.
SMOKE_FAULTS = 5
SMOKE_FAULT_EVERY = 15.0
SMOKE_MINUTES = SMOKE_FAULTS * SMOKE_FAULT_EVERY / 60  # a full group's run: 1.25 minutes
LONG_HOLD_SECONDS = 30.0  # a notice whose node stays this long or longer (the smoke's rotation spreads them)
# Worker nodes of the smoke's cluster: 2 workers, 1 spare and 2 free. A noticed node stays until its deadline (up to
# 30 s) and its replacement starts after that, so three notices 15 s apart leave no worker on a live node with 4
# (seed 5's fifth fault found no target twice, with 4 nodes and three 30 s notices in its group).
SMOKE_NODES = 5


def smoke_tier(kind: FaultKind) -> int:
    """Where ``kind`` is dealt in the CI smoke's rotation: costly kinds first (a long or double restart), then
    notices that hold a node for LONG_HOLD_SECONDS or more, then the kinds that need the storage tmpfs, then the
    rest."""
    if kind.costly:
        return 0
    if kind.holds_node_seconds >= LONG_HOLD_SECONDS:
        return 1
    return 2 if kind.tmpfs else 3


def smoke_rotation(kinds: Iterable[FaultKind] | None = None) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """The CI smoke's seeds and each seed's kinds, dealt from the registered kinds (``kinds``: default
    :data:`localcluster.faults.REGISTRY`): ordered by :func:`smoke_tier` (registration order within a tier) and
    dealt round-robin, like cards, into ceil(kinds / SMOKE_FAULTS) groups, the seeds 1, 2, ... So every kind is in
    exactly one group, no group has more than SMOKE_FAULTS kinds, and each tier is spread evenly over the seeds:
    no seed gets two costly kinds while another has none, the storage kinds (the only runs that mount the tmpfs)
    go to different seeds, and the long-held notices are spread (two a seed at most while there are at most
    2 x seeds of them; tests/localcluster/test_chaos_unit.py checks these on the registry). Pure."""
    ordered = sorted((k for k in (REGISTRY.values() if kinds is None else kinds) if k.implemented), key=smoke_tier)
    seeds = -(-len(ordered) // SMOKE_FAULTS)
    return tuple((i + 1, tuple(k.name for k in ordered[i::seeds])) for i in range(seeds))


SMOKE_ROTATION = smoke_rotation()


def smoke_minutes(kinds: Sequence[str]) -> float:
    """The smoke's minutes for a group of ``kinds``: one cycle, each kind once at SMOKE_FAULT_EVERY."""
    return len(kinds) * SMOKE_FAULT_EVERY / 60


def smoke_seed(env: str | None, utc_day: int) -> int:
    """The CI smoke's seed: ``REPRIEVE_SOAK_SEED`` (``env``) when set, which must be one of SMOKE_ROTATION's seeds
    (its kinds come with it), else the rotation's entry for ``utc_day`` (days since the epoch) modulo its length."""
    seeds = [s for s, _ in SMOKE_ROTATION]
    if env is None or not env.strip():
        return seeds[utc_day % len(seeds)]
    seed = parse_seed(env)
    if seed not in seeds:
        raise SoakConfigError(f"REPRIEVE_SOAK_SEED={env!r}: the CI smoke's seeds are {', '.join(map(str, seeds))} "
                              "(each with its own fault kinds: chaos.smoke_rotation()); for any other seed run "
                              "benchmarks/soak.py by hand")
    return seed


def smoke_plan(seed: int) -> tuple[list[str], list[PlannedFault]]:
    """The kinds of the rotation's ``seed`` and the smoke's schedule of them (``schedule`` at ``smoke_minutes`` and
    SMOKE_FAULT_EVERY: what ``benchmarks/soak.py --faults <kinds> --seed <seed>`` with those will inject)."""
    kinds = list(dict(SMOKE_ROTATION)[seed])
    return kinds, schedule(kinds, minutes=smoke_minutes(kinds), fault_every=SMOKE_FAULT_EVERY, seed=seed)


# How long a fault that finds no target now is tried again (benchmarks/soak.py): a restart is under way, and under a
# whole suite's load on 2 cores one can take tens of seconds (benchmarks/RESULTS.md, "CI smoke"). A later fault of
# the schedule waits behind it, as a fault lands whenever it lands.
TARGET_WAIT_SECONDS = 60.0


def retry_for_target(error: str, waited: float, limit: float = TARGET_WAIT_SECONDS) -> bool:
    """Whether a fault the injector could not carry out is tried again a second later: only when it found no
    target at that moment (the workers' new pods not running yet, every worker on a node already doomed: a
    restart under way), for up to ``limit`` seconds. Any other error is recorded at once."""
    retryable = error.startswith("no target:")
    return retryable and waited < limit
