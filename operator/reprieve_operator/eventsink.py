"""Events a notice burst posts by the thousand (one per annotated pod), off the path of the notice's own writes.

A node's notice annotates the pods of the jobs that do not watch their notice object and says so on each pod
(``PreemptionNotice``) and, when the object was refused, on the job (``NoticeFallback``). A wave over many nodes
makes tens of thousands of such posts at once; gathered on the operator's executor they queued in front of the
next jobs' notice writes and held ~3 KB each until posted. Here they go into one bounded queue posted by a few
threads of their own, as client-go's event broadcaster does (it queues at most 1,000 and drops beyond): a pod's
Event beyond ``limit`` queued is dropped and counted (``reprieve_events_dropped_total``), a job's is never
dropped (at most one a job a notice). Events are best effort in Kubernetes; the notice itself is the annotation.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any

from . import apply, metrics

log = logging.getLogger("reprieve_operator")

QUEUED_LIMIT = 1000  # droppable Events queued at most (client-go's broadcaster: maxQueuedEvents = 1000)
POSTERS = 4  # threads posting them


@dataclass(frozen=True)
class _Post:
    ref: dict[str, Any]
    reason: str
    message: str
    type_: str
    droppable: bool


class EventSink:
    """A bounded queue of Events posted by ``posters`` threads of its own; :meth:`emit` never waits."""

    def __init__(self, api: apply.Api, limit: int = QUEUED_LIMIT, posters: int = POSTERS) -> None:
        self.api, self.limit, self.posters = api, limit, posters
        self._queue: queue.Queue[_Post] = queue.Queue()
        self._lock = threading.Lock()
        self._droppable = 0  # droppable Events queued or being posted
        self._threads: list[threading.Thread] = []
        self.dropped = 0

    def emit(self, ref: dict[str, Any], reason: str, message: str, type_: str = "Normal", *,
             droppable: bool = True) -> bool:
        """Queue an Event on ``ref`` (as ``apply.post_event`` takes it); False when it was dropped."""
        with self._lock:
            if droppable:
                if self._droppable >= self.limit:
                    self.dropped += 1
                    first = self.dropped == 1
                    metrics.EVENTS_DROPPED.inc()
                    if first or self.dropped % self.limit == 0:
                        log.warning("%d Events dropped so far: more than %d pods' Events queued at once (their "
                                    "notices are delivered; only the Events are not posted)", self.dropped, self.limit)
                    return False
                self._droppable += 1
            if len(self._threads) < self.posters:
                t = threading.Thread(target=self._post_forever, name=f"reprieve-events-{len(self._threads)}",
                                     daemon=True)
                self._threads.append(t)
                t.start()
        self._queue.put(_Post(ref, reason, message, type_, droppable))
        return True

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until every queued Event is posted (tests; an operator's shutdown need not wait: best effort)."""
        done = threading.Event()

        def join() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=join, daemon=True).start()
        if not done.wait(timeout):
            raise TimeoutError(f"{self._queue.qsize()} Events still queued after {timeout:.0f}s")

    def _post_forever(self) -> None:
        while True:
            p = self._queue.get()
            try:
                apply.post_event(self.api, p.ref, p.reason, p.message, p.type_)
            except Exception:  # post_event logs refusals; anything else must not end the thread
                log.exception("posting Event %s on %s %s failed", p.reason, p.ref.get("kind"), p.ref.get("name"))
            finally:
                if p.droppable:
                    with self._lock:
                        self._droppable -= 1
                self._queue.task_done()
