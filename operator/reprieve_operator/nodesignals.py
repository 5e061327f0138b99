"""The owner of what the operator knows of node signals (process-local; re-derived from the cluster on start).

It keeps when each signal on each node was first seen (a signal without a timestamp has its deadline counted
from then), which nodes carry a signal of the operator's table, which jobs bring custom signals of their own,
the timers of held notices, and the notices already delivered (with those the job's status is still to record);
and it answers the queries a reconcile asks:
``doomed(job)`` (nodes with an open notice for the job) and ``avoid(job)`` (what new pods must avoid). Nobody
else writes any of it. The compact Nodes themselves are the cache's (``Cache.put_node``), written from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from .cache import Cache, Key
from .clock import SYSTEM, Clock, Timer
from .models import TrainingJob
from .policy.notice import Delivered, first_seen_in_notices, is_open
from .policy.placement import avoid_nodes
from .policy.signals import Signal, node_notice, present_signals, signals_for_job
from .policy.views import compact_node, notice_annotation

HELD_MARGIN_SECONDS = 0.05  # a held notice's node is looked at again just after the notice opens


class NodeSignals:
    def __init__(self, table: tuple[Signal, ...], horizon_seconds: float, cache: Cache,
                 clock: Clock = SYSTEM) -> None:
        self.table = table
        self.horizon_seconds = horizon_seconds  # notices further away are held (policy.notice)
        self.clock = clock
        self.started = clock.now()  # the operator's start (signals already there count from it)
        self._cache = cache
        self._first_seen: dict[str, dict[str, datetime]] = {}  # node -> signal -> when first seen
        self._since: dict[str, float] = {}  # node -> monotonic time of its first signal (notice latency)
        self._carrying: set[str] = set()  # nodes with a signal of the operator's table
        self._custom_jobs: set[Key] = set()  # jobs with custom signals of their own
        self._held: dict[str, Timer] = {}  # node -> the timer that looks at it again when a held notice opens
        self._delivered: set[tuple[str | None, int, str]] = set()  # (job uid, attempt, notice id)
        # job uid -> (attempt, notice id) -> a delivery its status does not record yet (the job's reconcile does)
        self._unrecorded: dict[str | None, dict[tuple[int, str], Delivered]] = {}
        # job -> the notice its object <job>-notice carries (None: the object exists without one); a job missing
        # here has no object once they were listed at start (``prime_objects``), else was not read yet since this
        # operator started (delivery reads it once)
        self._objects: dict[Key, str | None] = {}
        self._objects_listed = False

    # --- what the Nodes say ---
    def prime(self, body: Mapping[str, Any]) -> None:
        """A Node listed at start: its signals were already there, first seen at the operator's start, or when an
        operator before this one saw them, as the notices on the pods there say (so list the pods first: a
        restarted operator that dated them at its own start derived a later deadline and another notice id, and
        recorded the delivery it was killed in under a second PreemptionNotice Event)."""
        node = compact_node(body)
        self._cache.put_node(node)
        self._note(node, at=self.started)

    def observe(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """A Node event: the compact node, and whether it carries a signal of the table. A signal gone is
        forgotten; a new one is dated by the notices on the pods there (an operator before this one saw it),
        else now."""
        node = compact_node(body)
        name = node["metadata"]["name"]
        self._cache.put_node(node)
        present = present_signals(node, self.table)
        seen = self._first_seen.setdefault(name, {})
        for sig in set(seen) - present:
            seen.pop(sig)
        self.remember(name, present, self._cache.jobs_on(name))
        if present:
            self._since.setdefault(name, self.clock.monotonic())
            self._carrying.add(name)
        else:
            self._since.pop(name, None)
            self._carrying.discard(name)
        return node, bool(present)

    def refresh(self, body: Mapping[str, Any]) -> bool:
        """A Node read fresh from the API by a reconcile; True if the node or the nodes carrying signals changed."""
        node = compact_node(body)
        changed = self._cache.put_node(node)
        return self._note(node) or changed

    def forget(self, name: str) -> None:
        """The Node is deleted."""
        self._cache.drop_node(name)
        self._carrying.discard(name)
        self._first_seen.pop(name, None)
        self._since.pop(name, None)

    def remember(self, name: str, signals: Iterable[str], jobs: Iterable[Key] = (),
                 at: datetime | None = None) -> Mapping[str, datetime]:
        """Record when each of ``signals`` on node ``name`` was first seen, if not yet known: by an operator before
        this one when the notices on ``jobs``' pods say so (``policy.notice.first_seen_in_notices``), else ``at``
        (default: now). Returns what is known of the node."""
        seen = self._first_seen.setdefault(name, {})
        missing = [sig for sig in signals if sig not in seen]
        if missing:
            jobs = list(jobs)
            values = [notice_annotation(p) for ns, job in jobs for p in self._cache.pods_of(ns, job)]
            values += [self._objects.get(key) for key in jobs]
            when = at or self.clock.now()
            for sig in missing:
                seen[sig] = first_seen_in_notices(values, name, sig) or when
        return seen

    def _note(self, node: Mapping[str, Any], at: datetime | None = None) -> bool:
        """Date the table's signals present on ``node``; True if the node newly carries one."""
        name = node["metadata"]["name"]
        present = present_signals(node, self.table)
        if not present:
            return False
        self.remember(name, present, self._cache.jobs_on(name), at=at)
        if name in self._carrying:
            return False
        self._carrying.add(name)
        return True

    def first_seen(self, name: str) -> Mapping[str, datetime] | None:
        return self._first_seen.get(name)

    def since(self, name: str) -> float | None:
        """Monotonic time the node's first signal was seen (None: it carries none)."""
        return self._since.get(name)

    @property
    def carrying(self) -> int:
        """How many nodes carry a signal of the table."""
        return len(self._carrying)

    # --- jobs with custom signals ---
    def track_job(self, key: Key, custom: bool) -> None:
        if custom:
            self._custom_jobs.add(key)
        else:
            self._custom_jobs.discard(key)

    def has_custom(self, key: Key) -> bool:
        return key in self._custom_jobs

    # --- held notices ---
    def hold(self, name: str, opens: datetime, look_again: Callable[[], None]) -> None:
        """Call ``look_again`` when a held notice on ``name`` opens (one timer per node: the latest wins)."""
        self.release(name)
        delay = max(0.0, (opens - self.clock.now()).total_seconds()) + HELD_MARGIN_SECONDS

        def fire() -> None:
            self._held.pop(name, None)
            look_again()

        self._held[name] = self.clock.call_later(delay, fire)

    def release(self, name: str) -> None:
        timer = self._held.pop(name, None)
        if timer is not None:
            timer.cancel()

    # --- notices delivered (the in-process guard; status and the pods' annotations are the durable record) ---
    def delivered(self, uid: str | None, attempt: int, notice_id: str) -> bool:
        return (uid, attempt, notice_id) in self._delivered

    def mark_delivered(self, uid: str | None, attempt: int, notice_id: str) -> None:
        self._delivered.add((uid, attempt, notice_id))

    def to_record(self, uid: str | None, d: Delivered) -> None:
        """``d`` is on the job's pods; its reconcile records it in the status (``policy.decide``)."""
        self._unrecorded.setdefault(uid, {})[(d.attempt, d.notice.id)] = d

    def unrecorded(self, uid: str | None) -> tuple[Delivered, ...]:
        """The job's deliveries still to record, in the order they were delivered."""
        return tuple(self._unrecorded.get(uid, {}).values())

    def recorded(self, uid: str | None, done: Iterable[Delivered]) -> None:
        """``done`` was decided on by a reconcile whose status write went through: recorded, or recorded already."""
        left = self._unrecorded.get(uid, {})
        for d in done:
            left.pop((d.attempt, d.notice.id), None)
        if not left:
            self._unrecorded.pop(uid, None)

    # --- the jobs' notice objects (one write per job per notice: docs/notices.md) ---
    def prime_objects(self, objects: Iterable[tuple[Key, str | None]]) -> None:
        """The notice objects listed at start (before the Nodes: their notices date the signals already there).
        From then on a job missing here has no object: only the leading operator writes them, so a burst of
        notices writes each job's object without reading it first."""
        self._objects.update(objects)
        self._objects_listed = True

    def notice_object(self, key: Key) -> tuple[bool, str | None]:
        """(known, value): whether the job's notice object is known (listed at start, read or written since), and
        its notice (None: no object, or one without a notice)."""
        if key in self._objects:
            return True, self._objects[key]
        return self._objects_listed, None

    def object_exists(self, key: Key) -> bool:
        """The job's notice object was listed, read or written since start (a write patches it, else creates it)."""
        return key in self._objects

    def object_written(self, key: Key, value: str | None) -> None:
        self._objects[key] = value

    def forget_job(self, key: Key) -> None:
        self._objects.pop(key, None)

    # --- queries ---
    def candidates(self, job: TrainingJob) -> list[dict[str, Any]]:
        """Cached Nodes that may carry a signal for ``job``: those with a signal of the operator's table, and
        every node when the job has custom signals of its own."""
        nodes = self._cache.nodes
        if job.spec.preemption.custom:
            return list(nodes.values())
        return [nodes[n] for n in self._carrying if n in nodes]

    def doomed(self, job: TrainingJob, now: datetime) -> set[str]:
        """Nodes with an open notice for ``job`` now (whether or not the scheduler could place pods there)."""
        sigs = signals_for_job(self.table, job.spec.preemption)
        if not sigs:
            return set()
        out = set()
        for node in self.candidates(job):
            name = node["metadata"]["name"]
            notice = node_notice(node, now, sigs, self._first_seen.get(name))
            if notice is not None and is_open(notice, now, self.horizon_seconds):
                out.add(name)
        return out

    def avoid(self, job: TrainingJob, now: datetime) -> tuple[str, ...]:
        """The nodes a new pod of ``job`` must avoid (``policy.placement``)."""
        return avoid_nodes(job, self.candidates(job), self.table, now, self.horizon_seconds, self._first_seen)
