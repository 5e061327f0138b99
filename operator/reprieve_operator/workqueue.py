"""The owner of when reconciles run: per-job locks, coalescing, requeues, the create backoff and the resync.

The reconcile function is injected (``ReconcileQueue(reconcile)``), so every path runs it the same way: the kopf
handler of a spec change awaits :meth:`run`; a pod event, a requeue's timer and the resync :meth:`kick` it.
Reconciles of one job never overlap (a per-job lock, which notice delivery takes too); a burst of kicks of one
job coalesces into one run plus one follow-up; at most ``slots`` reconciles run at once, kicked or awaited by a
handler (memory and API load in event storms: at start every job's handler runs, and 2,500 reconciles at once held
their bodies, models and plans together). A failed kicked reconcile is counted and logged; the resync runs it again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import kopf

from . import metrics
from .cache import Key
from .clock import SYSTEM, Clock, Timer
from .policy.create import retry_seconds

log = logging.getLogger("reprieve_operator")
FRESH_LISTS_PER_SECOND = 5.0  # the resync's LISTs of a job's pods, at most (``fresh_this_round``)
Reconcile = Callable[[str, str, bool], Awaitable[Any]]  # (namespace, name, fresh) -> whatever it returns


class ReconcileQueue:
    def __init__(self, reconcile: Reconcile, clock: Clock = SYSTEM, slots: int = 16,
                 retry: Callable[[int], float] = retry_seconds) -> None:
        self._reconcile = reconcile
        self._clock = clock
        self._retry = retry
        self._locks: defaultdict[Key, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._pending: dict[Key, bool] = {}  # kicked: queued or running -> kicked again meanwhile
        self._fresh: set[Key] = set()  # the next run of these LISTs the job's pods (the resync)
        self._requeues: dict[Key, Timer] = {}  # job -> the timer of its next reconcile
        self._backoff: dict[Key, tuple[int, float]] = {}  # job -> (refused creates in a row, monotonic due)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._slots = asyncio.Semaphore(slots)

    # --- running ---
    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        """The job's lock: held by every reconcile of it and by notice delivery to it."""
        return self._locks[(namespace, name)]

    async def run(self, namespace: str, name: str, fresh: bool = False) -> Any:
        """Reconcile the job as soon as a slot is free, under its lock; errors are the caller's. Counted once it has
        ended (``reprieve_reconciles_total``): whatever it decided is applied by then."""
        async with self._slots:
            return await self._run(namespace, name, fresh)

    async def _run(self, namespace: str, name: str, fresh: bool) -> Any:
        async with self._locks[(namespace, name)]:
            try:
                return await self._reconcile(namespace, name, fresh)
            finally:
                metrics.RECONCILES.labels(namespace, metrics.job(name)).inc()

    def kick(self, namespace: str, name: str, fresh: bool = False) -> None:
        """Schedule a reconcile of one job; bursts coalesce into one run plus one follow-up."""
        key = (namespace, name)
        if fresh:
            self._fresh.add(key)
        if key in self._pending:
            self._pending[key] = True
            return
        self._pending[key] = False
        self.spawn(self._drain(key))

    async def _drain(self, key: Key) -> None:
        namespace, name = key
        try:
            while True:
                try:
                    async with self._slots:
                        fresh = key in self._fresh
                        self._fresh.discard(key)
                        await self._run(namespace, name, fresh)
                except kopf.PermanentError:
                    pass  # already on the job's status and Events
                except Exception:  # logged and counted; the resync retries
                    metrics.RECONCILE_ERRORS.labels("pod-event").inc()
                    log.exception("TrainingJob %s/%s: reconcile failed", namespace, name)
                if not self._pending.get(key):
                    break
                self._pending[key] = False
        finally:
            self._pending.pop(key, None)

    def requeue(self, namespace: str, name: str, delay: float) -> None:
        """Kick the job after ``delay`` seconds (one pending timer per job: the latest wins)."""
        key = (namespace, name)
        old = self._requeues.pop(key, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._requeues.pop(key, None)
            self.kick(namespace, name)

        self._requeues[key] = self._clock.call_later(max(0.0, delay), fire)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, holding on to its task until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def busy(self) -> int:
        """Jobs kicked and not yet reconciled."""
        return len(self._pending)

    # --- the backoff of refused creates (``policy.create.retry_seconds``) ---
    def backoff_left(self, key: Key) -> float | None:
        """Seconds until the job's next create may be tried; None when it may be tried now."""
        tries, due = self._backoff.get(key, (0, 0.0))
        left = due - self._clock.monotonic()
        return left if tries and left > 0 else None

    def backoff_failed(self, key: Key) -> tuple[int, float]:
        """A create was refused again: (refusals in a row, seconds until the next try)."""
        tries = self._backoff.get(key, (0, 0.0))[0] + 1
        wait = self._retry(tries)
        self._backoff[key] = (tries, self._clock.monotonic() + wait)
        return tries, wait

    def backoff_clear(self, key: Key) -> None:
        self._backoff.pop(key, None)

    # --- the safety net ---
    async def resync(self, interval: float, keys: Callable[[], list[Key]],
                     each_round: Callable[[], None] = lambda: None) -> None:
        """Every ``interval / 2``: ``each_round()``, then kick every job of ``keys()``, spread over the next
        ``interval / 2`` (a steady trickle, never a burst that delays notices). At most ``FRESH_LISTS_PER_SECOND``
        of those kicks LIST the job's pods afresh (``fresh_this_round``): every job, each round, up to that many;
        beyond it each job in turn, once in so many rounds. A LIST with a label selector is a scan of the
        namespace's pods in the API server's watch cache, so one a job a round grew as jobs x pods (2,500 jobs of
        50,000 pods: 42 scans of 50,000 pods a second); the watch itself never misses an event (a broken watch
        resumes, an expired one re-lists), and the fresh LIST only repairs what a defect might have left.

        A loop over the cached jobs rather than a per-object kopf timer, because kopf protects timers with a
        finalizer, and a finalizer would keep deleted jobs (and their pods) alive while the operator is down.
        """
        for rnd in itertools.count():
            await self._clock.sleep(interval / 2)
            each_round()
            try:
                jobs = keys()
                gap = interval / 2 / max(1, len(jobs))
                budget = max(1, int(FRESH_LISTS_PER_SECOND * interval / 2))
                for i, (namespace, name) in enumerate(jobs):
                    self.kick(namespace, name, fresh=fresh_this_round(i, len(jobs), rnd, budget))
                    await self._clock.sleep(gap)
            except Exception:  # never let the safety net die
                metrics.RECONCILE_ERRORS.labels("resync").inc()
                log.exception("resync failed")


def fresh_this_round(index: int, jobs: int, rnd: int, budget: int) -> bool:
    """Whether the resync's kick of the ``index``-th of ``jobs`` LISTs its pods in round ``rnd`` (pure): all of
    them while ``jobs <= budget``; beyond, every ``ceil(jobs / budget)``-th job, a different share each round, so
    each job in turn and at most ``budget`` a round."""
    stride = max(1, -(-jobs // max(1, budget)))
    return index % stride == rnd % stride
