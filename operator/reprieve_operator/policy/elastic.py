"""Elastic training's decisions (pure): when a job with ``spec.elastic`` shrinks to its survivors instead of waiting
for a replacement the scheduler cannot place, when it grows back, to which size, which pod takes which process
index, and the ``Degraded`` condition and Events that say so (docs/elastic-operator.md, "The decisions";
``policy.inplace`` acts on them: a shrink at a restart, a grow while training).

- **Shrink** when the current attempt lost a worker, no ready pod (spare, standby, replacement) covers the loss
  and no replacement is on its way, and a replacement has carried the scheduler's own
  ``PodScheduled=False/Unschedulable`` for at least ``unschedulableSeconds``. The new size is the largest allowed
  size (``sizes``) the survivors and the ready pods can fill; below ``minReplicas``, or with no allowed size, the
  job waits as without the block (``Wait``, condition ``Degraded`` saying why).
- **Grow** when no worker is lost, ``growBack`` is set, the job runs below ``replicas``, no size change is in flight,
  ``minResizeIntervalSeconds`` passed since the last one, and ready pods can fill a larger allowed size.
- Never both: a loss is judged first, and a grow only when nothing is lost.

Process ids stay contiguous, ``0..size-1``: at a shrink the surviving workers keep their order (old index -> its
rank among the survivors, so process 0 stays 0 while it lives); ready pods take the indices after them. At a grow
every worker keeps its index and the newcomers take ``size..n-1``. Survivors an allowed size leaves out stand by:
their pods are kept as warm spares, the first to take a lost index or rejoin.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from ..models import ElasticSpec, TrainingJob
from .events import Event
from .podsready import SchedulerVerdict, unschedulable
from .restart import Condition
from .times import parse_time, rfc3339
from .views import PodView

DEGRADED = "Degraded"
SHRINKING, GROWING = "Shrinking", "Growing"  # the Events' reasons
MAX_NAMED = 10  # pods and index moves named in a message before "and N more"


class Reason(str, Enum):
    """The ``Degraded`` condition's reasons."""

    SHRUNK = "Shrunk"  # True: training on fewer workers than replicas
    BELOW_MIN = "BelowMinReplicas"  # True: waiting for capacity, the survivors are fewer than minReplicas
    NO_SIZE = "NoAllowedSize"  # True: waiting for capacity, no size the virtual shards allow fits the survivors
    FULL_SIZE = "FullSize"  # False: training on every worker


class Role(str, Enum):
    """What a pod that could take a process index is; the order is who joins first."""

    STANDBY = "standby"  # a survivor a shrink left out (its size was not allowed): warm, holds its memory copy
    REPLACEMENT = "replacement"  # a new pod made for a lost worker's index
    SPARE = "spare"  # a warm spare (spec.spares)


class Direction(str, Enum):
    SHRINK = "Shrink"
    GROW = "Grow"


@dataclass(frozen=True)
class Candidate:
    """A pod outside the current attempt's workers that could take a process index at the next attempt."""

    pod: str
    role: Role
    ready: bool  # running under reprieve-supervisor: it takes an index without waiting for a node or an image
    unschedulable: SchedulerVerdict | None = None  # the scheduler's PodScheduled=False/Unschedulable, if any


@dataclass(frozen=True)
class ElasticView:
    """What the decisions read: the job's elastic spec and sizes, its workers, the pods that could join, time."""

    spec: ElasticSpec
    replicas: int  # the full size (spec.replicas)
    size: int  # the current attempt's world size (process ids 0..size-1)
    alive: tuple[int, ...]  # the current attempt's process ids whose worker runs on (pod kept, node healthy)
    now: datetime
    candidates: tuple[Candidate, ...] = ()
    last_resize: datetime | None = None  # when the size last changed (status.lastResizeTime)
    resizing: bool = False  # the current attempt is a size change that has not started training yet


@dataclass(frozen=True)
class Resize:
    """Start the next attempt, in place, on ``size`` workers."""

    direction: Direction
    size_from: int
    size: int
    keep: tuple[tuple[int, int], ...]  # (old process id, new process id) of the workers that go on
    join: tuple[tuple[str, int], ...]  # (pod, new process id) of the ready pods that take the other ids
    stand_by: tuple[int, ...]  # old process ids of living workers the new size leaves out
    condition: Condition
    event: Event


@dataclass(frozen=True)
class Wait:
    """No size change: the job waits for capacity, as without the block; ``condition`` says why."""

    condition: Condition


def sizes(spec: ElasticSpec, replicas: int) -> tuple[int, ...]:
    """The world sizes the job may train on, ascending: ``minReplicas..replicas``, only those that divide
    ``virtualShards`` when it is set (every process owns the same number of virtual shards)."""
    shards = spec.virtual_shards
    return tuple(n for n in range(spec.min_replicas, replicas + 1) if shards is None or shards % n == 0)


def decide_resize(view: ElasticView) -> Resize | Wait | None:
    """What the job should do about its size now; None: nothing (train on, or let today's restart fill the gang)."""
    lost = view.size - len(view.alive)
    if lost > 0:
        return _after_loss(view, lost)
    return _grow(view)


def _waited(c: Candidate, now: datetime) -> float:
    since = c.unschedulable.since if c.unschedulable is not None else None
    return 0.0 if since is None else (now - since).total_seconds()


def _on_its_way(c: Candidate) -> bool:
    """A pod that would fill a lost index once it runs: a replacement, or a spare still starting (the restart puts a
    spare made after the last restart in the lost index before it makes a new pod: docs/operator.md)."""
    return c.role in (Role.REPLACEMENT, Role.SPARE) and not c.ready


def _overdue(view: ElasticView) -> list[Candidate]:
    """Pods on their way that the scheduler has refused for at least unschedulableSeconds."""
    return [c for c in view.candidates if _on_its_way(c) and c.unschedulable is not None
            and _waited(c, view.now) >= view.spec.unschedulable_seconds]


def _ready(view: ElasticView) -> list[Candidate]:
    order = list(Role)
    return sorted((c for c in view.candidates if c.ready), key=lambda c: (order.index(c.role), c.pod))


def _after_loss(view: ElasticView, lost: int) -> Resize | Wait | None:
    overdue = _overdue(view)
    ready = _ready(view)
    coming = [c for c in view.candidates if _on_its_way(c) and c not in overdue]
    if not overdue or len(ready) + len(coming) >= lost:
        return None  # the scheduler has not given up on a replacement yet, or the restart fills the gang
    capacity = len(view.alive) + len(ready)
    why = _stuck_words(view, overdue)
    if capacity < view.spec.min_replicas:
        return Wait(Condition(DEGRADED, "True", Reason.BELOW_MIN.value,
                              f"waiting for capacity: {capacity} worker(s) could train, fewer than "
                              f"spec.elastic.minReplicas {view.spec.min_replicas}; {why}"[:2000]))
    fits = [n for n in sizes(view.spec, view.replicas) if n <= capacity]
    if not fits:
        shards = view.spec.virtual_shards
        allowed = ", ".join(map(str, sizes(view.spec, view.replicas)))
        return Wait(Condition(DEGRADED, "True", Reason.NO_SIZE.value,
                              f"waiting for capacity: the data-parallel axis of {shards} virtual shards "
                              f"(spec.elastic.virtualShards) cannot be split over the {capacity} worker(s) that "
                              f"could train; the sizes from minReplicas {view.spec.min_replicas} to replicas "
                              f"{view.replicas} that divide {shards} are {allowed}; {why}"[:2000]))
    size = fits[-1]
    survivors = sorted(view.alive)
    keep = tuple((old, new) for new, old in enumerate(survivors[:size]))
    join = tuple((c.pod, len(keep) + i) for i, c in enumerate(ready[:size - len(keep)]))
    stand_by = tuple(survivors[size:])
    since = rfc3339(view.now)
    condition = Condition(DEGRADED, "True", Reason.SHRUNK.value,
                          f"training on {size} of {view.replicas} workers since {since}: {why}"[:2000])
    text = f"shrinking from {view.size} to {size} workers: {_stuck_words(view, overdue, True)}; " \
           f"{_moves(keep, join, stand_by)}"
    return Resize(Direction.SHRINK, view.size, size, keep, join, stand_by, condition,
                  Event(SHRINKING, text[:1000], "Warning"))


def _grow(view: ElasticView) -> Resize | None:
    if not view.spec.grow_back or view.size >= view.replicas or view.resizing or _interval_left(view) > 0:
        return None
    ready = _ready(view)
    fits = [n for n in sizes(view.spec, view.replicas) if view.size < n <= view.size + len(ready)]
    if not fits:
        return None
    size = fits[-1]
    keep = tuple((i, i) for i in range(view.size))
    join = tuple((c.pod, view.size + i) for i, c in enumerate(ready[:size - view.size]))
    since = rfc3339(view.now)
    if size == view.replicas:
        condition = Condition(DEGRADED, "False", Reason.FULL_SIZE.value,
                              f"training on all {size} workers again since {since}")
    else:
        condition = Condition(DEGRADED, "True", Reason.SHRUNK.value,
                              f"training on {size} of {view.replicas} workers since {since}: capacity returned "
                              "for some of them")
    named = ", ".join(f"pod {pod} ({_role(view, pod)}) takes process {i}" for pod, i in join[:MAX_NAMED])
    more = f", and {len(join) - MAX_NAMED} more" if len(join) > MAX_NAMED else ""
    text = f"growing from {view.size} to {size} workers: capacity returned; {named}{more}"
    return Resize(Direction.GROW, view.size, size, keep, join, (), condition,
                  Event(GROWING, text[:1000]))


def _role(view: ElasticView, pod: str) -> str:
    return next(c.role.value for c in view.candidates if c.pod == pod)


def _interval_left(view: ElasticView) -> float:
    if view.last_resize is None:
        return 0.0
    return view.spec.min_resize_interval_seconds - (view.now - view.last_resize).total_seconds()


def _stuck_words(view: ElasticView, overdue: list[Candidate], waited: bool = False) -> str:
    """``pod llama-r7 (replacement for a lost worker) unschedulable since <t>: 0/4 nodes are available: ...``;
    ``waited``: with the seconds so far (an Event's words; a condition's stay the same while nothing changes)."""
    parts = []
    for c in overdue[:MAX_NAMED]:
        verdict = c.unschedulable
        assert verdict is not None  # _overdue keeps only pods with the scheduler's verdict
        since = f" since {rfc3339(verdict.since)}" if verdict.since is not None else ""
        so_far = f" for {_waited(c, view.now):.0f} s" if waited else ""
        parts.append(f"pod {c.pod} ({c.role.value} for a lost worker) unschedulable{so_far}{since}: "
                     f"{verdict.message}")
    more = f"; and {len(overdue) - MAX_NAMED} more" if len(overdue) > MAX_NAMED else ""
    return "; ".join(parts) + more


def _moves(keep: tuple[tuple[int, int], ...], join: tuple[tuple[str, int], ...], stand_by: tuple[int, ...]) -> str:
    """The process ids that change (``process 2 -> 1``), the pods that join, the workers that stand by."""
    moved = [f"process {old} -> {new}" for old, new in keep if old != new]
    out = ", ".join(moved[:MAX_NAMED]) + (f", and {len(moved) - MAX_NAMED} more" if len(moved) > MAX_NAMED else "")
    out = out or "every surviving process keeps its id"
    if join:
        out += "; " + ", ".join(f"pod {pod} takes process {i}" for pod, i in join[:MAX_NAMED])
    if stand_by:
        out += f"; process(es) {', '.join(map(str, stand_by[:MAX_NAMED]))} stand by (no allowed size fits them)"
    return out


def settled(view: ElasticView, current: Condition | None) -> Condition | None:
    """``Degraded=False/FullSize`` once a job that carried ``Degraded=True`` trains on every worker again with none
    lost (a wait below the minimum that ended when capacity returned); ``Degraded=True/Shrunk`` once a wait (below
    the minimum, or for an allowed size) ended on fewer workers than ``replicas`` (capacity back for some: the job
    trains, it no longer waits); None: nothing to write (a job that was never degraded carries no ``Degraded``; a
    shrunk job keeps the words of its last resize)."""
    if current is None or current.status != "True" or len(view.alive) < view.size:
        return None
    if view.size >= view.replicas:
        return Condition(DEGRADED, "False", Reason.FULL_SIZE.value, f"training on all {view.size} workers")
    if current.reason in (Reason.BELOW_MIN.value, Reason.NO_SIZE.value):
        return Condition(DEGRADED, "True", Reason.SHRUNK.value,
                         f"training on {view.size} of {view.replicas} workers: capacity returned for some of them")
    return None


def next_look(view: ElasticView) -> float | None:
    """Seconds until a decision may change with no event to say so (a replacement reaching unschedulableSeconds,
    the resize interval ending while capacity waits); None: only a pod or job event can change it."""
    due: list[float] = []
    if view.size > len(view.alive):
        due += [view.spec.unschedulable_seconds - _waited(c, view.now) for c in view.candidates
                if _on_its_way(c) and c.unschedulable is not None]
    elif view.spec.grow_back and view.size < view.replicas and _ready(view):
        due.append(_interval_left(view))
    due = [d for d in due if d > 0]
    return min(due) if due else None


def candidate(pod: Mapping[str, Any], role: Role, ready: bool) -> Candidate:
    """A pod (an API object or the cache's compact pod) as a candidate, with the scheduler's verdict on it."""
    return Candidate(str((pod.get("metadata") or {}).get("name")), role, ready, unschedulable(pod))


def elastic_view(job: TrainingJob, alive: Iterable[int], candidates: Iterable[Candidate], now: datetime,
                 resizing: bool = False, size: int | None = None) -> ElasticView | None:
    """The job's view for ``decide_resize``: its size ``size`` (the assignment's processes), else from
    ``status.currentWorkers`` (``spec.replicas`` before the first resize), the last change from
    ``status.lastResizeTime``; None for a job without ``spec.elastic``."""
    spec = job.spec.elastic
    if spec is None:
        return None
    st = job.status
    return ElasticView(spec=spec, replicas=job.spec.replicas,
                       size=size or st.current_workers or job.spec.replicas, alive=tuple(sorted(alive)), now=now,
                       candidates=tuple(candidates), last_resize=parse_time(st.last_resize_time), resizing=resizing)


def pod_candidates(pods: Iterable[PodView], workers: Collection[str], attempt: int, doomed: Collection[str],
                   stuck: Mapping[str, SchedulerVerdict]) -> tuple[Candidate, ...]:
    """The in-place job's pods outside ``workers`` (the assignment of ``attempt``) that could take a process id:
    spares; worker pods made for a lost worker (a replacement, or the capacity probe a shrink kept pending: made for
    ``attempt`` or later, not running yet, or that never ran a trainer); ready worker pods of an earlier attempt that
    ran a trainer and a shrink left out (standbys). Pods being deleted, on lost or doomed nodes, or ended are none. ``stuck``: pod -> the scheduler's
    ``PodScheduled=False/Unschedulable`` verdict (``podsready.unschedulable``)."""
    out = []
    for p in pods:
        if p.name in workers or p.deleting or p.node_lost or (p.node and p.node in doomed) or \
                p.phase not in ("Pending", "Running"):
            continue
        if p.role == "spare":
            role = Role.SPARE
        elif p.role == "worker":
            # a standby ran a trainer (it was a worker until a shrink left it out); a pod made for a lost worker
            # at an earlier restart that never joined (a probe a later restart left pending) never did
            role = Role.REPLACEMENT if p.attempt >= attempt or not p.ready or p.exit_attempt is None \
                else Role.STANDBY
        else:
            continue
        out.append(Candidate(p.name, role, p.ready, stuck.get(p.name)))
    return tuple(out)
