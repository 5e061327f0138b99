"""The operator's process state: one owner per piece, each the only writer of what it holds.

Everything here can be re-derived from the cluster after a restart. ``State`` itself is frozen: it only names
the owners, and nothing writes to it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import InitVar, dataclass, field
from typing import Any

from . import apply
from .assignment import Assignments
from .cache import Cache, Key
from .eventsink import EventSink
from .nodesignals import NodeSignals
from .policy.restart import PEER_LOST_WAIT_SECONDS
from .workqueue import ReconcileQueue

OBJECT_THREADS = 32  # the notice objects' writes' own threads (``Lanes.objects``)
POD_THREADS = 32  # the per-pod notice writes' own threads (``Lanes.pods``)


@dataclass(frozen=True)
class Lanes:
    """The threads a notice's writes run on, apart from the loop's executor (reconciles, every other call): a burst's
    one write per job on threads of its own, the fallback's per-pod writes (20 a job) on theirs, so neither queues in
    front of the other, and the reconciles each delivery kicks never queue in front of the next job's write."""

    objects: ThreadPoolExecutor
    pods: ThreadPoolExecutor

    @classmethod
    def make(cls) -> Lanes:
        return cls(ThreadPoolExecutor(OBJECT_THREADS, thread_name_prefix="reprieve-objects"),
                   ThreadPoolExecutor(POD_THREADS, thread_name_prefix="reprieve-pods"))


class CommitEvents:
    """The owner of when each job's last ``CheckpointCommitted`` Event was posted (``policy.events`` throttles
    on it)."""

    def __init__(self) -> None:
        self._posted: dict[Key, float] = {}

    def last(self, key: Key) -> float | None:
        return self._posted.get(key)

    def posted(self, key: Key, at: float) -> None:
        self._posted[key] = at

    def forget(self, key: Key) -> None:
        self._posted.pop(key, None)


@dataclass(frozen=True)
class State:
    api: apply.Api
    cache: Cache  # pods, jobs and nodes as watched (``cache.py``)
    nodes: NodeSignals  # node signals: first seen, held notices, deliveries; doomed/avoid
    reconcile: InitVar[Callable[[State, str, str, bool], Awaitable[Any]]]
    queue: ReconcileQueue = field(init=False)  # locks, coalescing, requeues, create backoff, resync
    events: EventSink = field(init=False)  # a notice burst's Events, queued and posted off the notices' path
    lanes: Lanes = field(init=False)  # a notice's writes on threads of their own
    assignments: Assignments = field(default_factory=Assignments)  # in-place jobs' assignments as written
    commits: CommitEvents = field(default_factory=CommitEvents)
    kueue: bool = False  # --kueue: jobs with kueue.x-k8s.io/queue-name wait for Kueue's admission (kueue.py)
    peer_lost_wait_s: float = PEER_LOST_WAIT_SECONDS  # --peer-lost-wait-seconds (policy/restart.py)

    def __post_init__(self, reconcile: Callable[[State, str, str, bool], Awaitable[Any]]) -> None:
        # The queue runs the one reconcile function of this state, for every path (frozen: set once, here).
        object.__setattr__(self, "queue", ReconcileQueue(functools.partial(reconcile, self)))
        object.__setattr__(self, "events", EventSink(self.api))
        object.__setattr__(self, "lanes", Lanes.make())
