"""The operator's process state: one owner per piece, each the only writer of what it holds.

Everything here can be re-derived from the cluster after a restart. ``State`` itself is frozen: it only names
the owners, and nothing writes to it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import InitVar, dataclass, field
from typing import Any, TypeVar

from . import apply
from .assignment import Assignments
from .cache import Cache, Key
from .eventsink import EventSink
from .nodesignals import NodeSignals
from .policy.restart import PEER_LOST_WAIT_SECONDS
from .workqueue import ReconcileQueue

T = TypeVar("T")
OBJECT_THREADS = 32  # the notice objects' writes' own threads (``Lanes.objects``)
POD_THREADS = 32  # the per-pod notice writes' own threads (``Lanes.pods``)


IDLE_SECONDS = 5.0  # a lane's thread with nothing queued for this long ends (the next batch starts threads again)
YIELD_SECONDS = 1.0  # a lane that yields to another waits at most this long for it before each call


class _Batch:
    """One ``BatchLane.gather``'s calls: their results by position, and the loop's future the last one completes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop, self.future = loop, loop.create_future()
        self.results: list[Any] = [None] * size
        self._left, self._lock = size, threading.Lock()

    def done(self, i: int, value: Any) -> None:
        self.results[i] = value
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.future.done():  # its awaiter may have been cancelled
            self.future.set_result(self.results)


class BatchLane:
    """Threads of their own fed by one queue: :meth:`gather` queues a batch of blocking calls (a job's pods'
    annotations) and awaits one future for the batch. A burst's thousands of calls wait in the queue as a tuple each,
    not as an executor future and an asyncio future each (~3.2 KB a call: the 23,000 pods' annotations of a burst of
    1,150 jobs held ~70 MB while queued). Threads start as calls are queued (at most ``threads``) and end when idle.

    A lane that ``yield_to`` another waits, before each call, until that one has nothing queued or running (at most
    ``YIELD_SECONDS``): the per-pod fallback's 20 writes a job yield the API server to the jobs' one write each.
    Calls queued with ``first`` run before every call queued without it (the objects pods hear now before those
    kept for a process that starts later), each kind in the order queued."""

    def __init__(self, threads: int, name: str, idle_s: float = IDLE_SECONDS,
                 yield_to: BatchLane | None = None) -> None:
        self.threads, self.name, self.idle_s, self.yield_to = threads, name, idle_s, yield_to
        self._queue: queue.PriorityQueue[tuple[int, int, _Batch, int, Callable[[], Any]]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._lock = threading.Lock()
        self.running = 0  # threads started and not ended
        self._busy = 0  # calls queued or running
        self.idle = threading.Event()  # set while no call is queued or running
        self.idle.set()

    async def gather(self, calls: Iterable[Callable[[], T]], first: bool = True) -> list[T]:
        """Run ``calls`` on the lane's threads (before any call queued with ``first`` False, when ``first``);
        their results in order. The first error is raised after all end."""
        listed = list(calls)
        if not listed:
            return []
        batch = _Batch(asyncio.get_running_loop(), len(listed))
        with self._lock:
            self._busy += len(listed)
            self.idle.clear()
        rank = 0 if first else 1
        for i, call in enumerate(listed):
            self._queue.put((rank, next(self._order), batch, i, call))
        with self._lock:
            start = min(self.threads - self.running, self._queue.qsize())
            self.running += max(start, 0)
        for _ in range(start):
            threading.Thread(target=self._work, name=f"{self.name}-{self.running}", daemon=True).start()
        results: list[Any] = await batch.future
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    def _work(self) -> None:
        while True:
            if self.yield_to is not None:
                self.yield_to.idle.wait(YIELD_SECONDS)
            try:
                _, _, batch, i, call = self._queue.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:  # a batch queued after this check sees this thread gone and starts one
                    if self._queue.empty():
                        self.running -= 1
                        return
                continue
            try:
                value: Any = call()
            except Exception as err:  # noqa: BLE001 - raised to the batch's awaiter
                value = err
            with self._lock:
                self._busy -= 1
                if not self._busy:
                    self.idle.set()
            batch.done(i, value)


@dataclass(frozen=True)
class Lanes:
    """The threads a notice's writes run on, apart from the loop's executor (reconciles, every other call): a burst's
    one write per job on threads of its own, the fallback's per-pod writes (20 a job) on theirs, which yield to the
    objects' (``BatchLane.yield_to``), and the reconciles each delivery kicks never queue in front of the next job's
    write. A job no pod of which watches its object yet has its pods annotated first and the object written after
    (``delivery._deliver``), queued behind every object pods hear now (``gather(first=False)``)."""

    objects: BatchLane
    pods: BatchLane

    @classmethod
    def make(cls) -> Lanes:
        objects = BatchLane(OBJECT_THREADS, "reprieve-objects")
        return cls(objects, BatchLane(POD_THREADS, "reprieve-pods", yield_to=objects))


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
