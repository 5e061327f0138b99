"""The trainer's side of the memory tier: saving copies (this module) and restoring them (:mod:`.restore_round`).

A save blocks the loop only for the host copy, the storage tier's own (``checkpoint.save.snapshot`` into reused
staging buffers). A background thread then computes every shard's crc32c, writes the copy into the pod's memory
directory (one copy in flight per pod: :meth:`.store.MemoryDir.in_flight`), commits it by a rename, deletes the
copy it replaces, and sends it to the peer's replica server. A save that is due while the previous one is still
in the background is skipped (logged), never waited for: the memory tier never slows the loop beyond its copy.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from .. import topology
from ..coordination import CoordinationTimeout, Coordinator
from ..env import Env
from . import decide, gang, layout, schedule, wire
from .config import MemoryConfig
from .layout import CopyName
from .manifest import Manifest, Shard, crc32c
from .server import ReplicaServer
from .store import CopyBusyError, CopyRefusedError, MemoryDir

log = logging.getLogger(__name__)

_KV = "reprieve/mem"
SEND_TIMEOUT_S = 120.0
# test-only: "<step>:<seconds>[,...]" holds the copy of <step> that long before it is sent (a copy slower than a step)
SLOW_COPY_ENV = "REPRIEVE_MEMTIER_TEST_SLOW_COPY"
CLOSE_WAIT_S = 5.0


class MemoryLimitError(ValueError):
    """The state does not fit the memory limit (own copy, the peer's copy and one in flight)."""


def required_bytes(own_bytes: int) -> int:
    """What a pod's memory directory must hold for a process whose shards take ``own_bytes``: its own copy, the
    copy it holds for its peer (assumed the same size: shards are spread evenly) and one copy in flight."""
    return 3 * own_bytes


def own_bytes(state: Any, process_id: int) -> int:
    """Bytes this process's copy of ``state`` takes: its replica-0 shards (and numpy leaves on process 0)."""
    import jax

    total = 0
    for leaf in jax.tree.leaves(state):
        if isinstance(leaf, jax.Array):
            total += sum(int(s.data.nbytes) for s in leaf.addressable_shards if s.replica_id == 0)
        elif isinstance(leaf, np.ndarray | np.generic) and process_id == 0:
            total += int(np.asarray(leaf).nbytes)
    return total


def limit_problem(own: int, limit: int | None) -> str | None:
    """Why a process whose copy takes ``own`` bytes cannot use the memory tier under ``limit`` (pure)."""
    need = required_bytes(own)
    if limit is None or need <= limit:
        return None
    return (f"this process's shards take {_size(own)}, so its pod's memory directory must hold {_size(need)} (its "
            f"own copy, its peer's copy and one in flight), but REPRIEVE_MEMORY_LIMIT_BYTES is {_size(limit)}: raise "
            f"the limit (spec.checkpoint.memory) to at least {_size(need)}, or spread the state over more processes")


def leaf_dicts(leaves: list[Any]) -> list[dict[str, Any]]:
    """``LeafMeta`` records as the manifest stores them (optional fields only when used, as reprieve.json). A
    shallow copy: ``dataclasses.asdict`` deep-copied every shape and sharding record, the larger part of a small
    state's save (15 ms of the background thread's CPU per save for the goodput example's 120 leaves)."""
    out = []
    for leaf in leaves:
        d = dict(vars(leaf)) if dataclasses.is_dataclass(leaf) else dict(leaf)
        for key in ("stored_as", "key_impl"):
            if d.get(key) is None:
                d.pop(key, None)
        out.append(d)
    return out


class MemoryTier:
    """One process's memory tier. Built by :func:`reprieve.init` when ``REPRIEVE_MEMORY_DIR`` is set."""

    def __init__(self, cfg: MemoryConfig, *, coordinator: Coordinator, attempt: int, pod_ip: str | None = None,
                 token: str | None = None, serve: bool = True, root: str | None = None) -> None:
        from ..checkpoint import save as save_mod

        self.cfg = cfg
        # the storage root (REPRIEVE_CHECKPOINT_URI) every copy records: a restore reads only its own root's copies
        self.root = None if root is None else storage_root(root)
        self.coord = coordinator
        self.attempt = attempt
        self.pid, self.nproc = coordinator.process_id, coordinator.num_processes
        self.token = token
        self.dir = MemoryDir(cfg.directory, limit_bytes=cfg.limit_bytes)
        self.server: ReplicaServer | None = None
        if cfg.server is not None:
            self.location = cfg.server  # reprieve-supervisor serves this pod's directory
        elif serve:
            try:
                self.server = ReplicaServer(self.dir, host=pod_ip or "127.0.0.1", port=cfg.port, token=token).start()
                self.location = self.server.address
            except OSError as err:
                log.warning("memory: cannot serve %s on port %d (%s): other processes cannot read this pod's copies",
                            cfg.directory, cfg.port, err)
                self.location = f"local:{self.pid}"
        else:
            self.location = f"local:{self.pid}"
        self.peer = cfg.peer
        # the peer's node: the assignment's (REPRIEVE_MEMORY_PEER_NODE), else learned from the restore round's
        # reports (the first attempt's pods are made before their peers' nodes are known)
        self.peer_node = cfg.peer_node
        self._staging = save_mod.Staging()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._disabled: str | None = None
        self._checked = False  # the state was checked against the limit (at the first save)
        self.base: tuple[int, int] | None = None  # what this attempt restored from (set by the restore)
        # the schedules in force and published ahead (time/budget: process 0 publishes, a watcher thread reads)
        self._plans: tuple[schedule.Schedule, ...] = (
            (schedule.Schedule(cfg.interval_steps, cfg.interval_steps - 1),) if cfg.interval_steps else ())
        self._plans_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._first: int | None = None  # the bootstrap save's step (time/budget schedules)
        self._step_s: float | None = None  # the job's moving average (a fallback before process 0 measured)
        self._storage = (0, 0.0)  # the storage tier's periodic interval (steps, seconds): caps the schedule
        self._measured = schedule.Measurements()  # process 0's
        self._published: schedule.Schedule | None = None  # the newest schedule process 0 published
        self._saves_since = 0  # process 0's saves since it published
        self._cap_told = False
        self._skips = schedule.SkipNotice()  # says once that copies are slower than the interval
        self._running_step: int | None = None  # the step whose copy the background thread writes or sends
        self._here = threading.Event()  # set once that copy is committed in this pod (or failed to be)
        self._here.set()
        self._leaving: tuple[int, frozenset[str | None]] | None = None  # (agreed step, noticed nodes): a restart
        self._loop_step: int | None = None  # the newest step the loop asked about (process 0 plans from it)
        # what this process publishes after each copy (memtier.gang): the steps it replicated lately and the newest
        # save it skipped; and the newest gang step it has seen (only grows)
        self._replicated: tuple[int, ...] = ()
        self._skip: tuple[int, int] | None = None
        self._gang: int | None = None
        self._floor = 1  # process 0: the interval skipped saves widened the schedule to (a re-plan keeps above it)
        # what the loop and the operator read (progress report)
        self.saved_step: int | None = None  # newest own copy committed
        self.replicated_step: int | None = None  # newest own copy the peer committed
        self._no_put: int | None = None  # a step whose copy is not sent to the peer (:meth:`keep_here`)
        self.saves = self.skipped = self.failures = 0
        self.last_blocking_s = self.last_background_s = 0.0  # the copy's stall; the background thread's CPU
        self.last_ready_s = 0.0  # the wait for the state's computation before the copy (not the tier's cost)
        self.last_span_s = self._copy_t0 = 0.0  # the newest copy's span: its save to its last byte at the peer
        self.restored_from: dict[str, Any] | None = None
        log.info("memory tier: %s, %s, replica to %s", self.dir.path, self._interval_text(),
                 self.peer or "nobody (own copies only)")

    def _interval_text(self) -> str:
        if self.cfg.interval_steps:
            return f"every {self.cfg.interval_steps} steps"
        if self.cfg.interval_seconds:
            return f"about every {self.cfg.interval_seconds:g} s"
        if self.cfg.loss_every_seconds:
            return (f"spaced to cost at most {self.cfg.budget:.0%} of the training time or, closer, for a loss without "
                    f"notice every {self.cfg.loss_every_seconds:g} s (Young/Daly)")
        return f"spaced to cost at most {self.cfg.budget:.0%} of the training time"

    # -- when -----------------------------------------------------------------------------------------------------
    @property
    def newest_schedule(self) -> schedule.Schedule | None:
        """The newest schedule this process knows (in force or published ahead)."""
        plans = self._plans
        return max(plans, key=lambda p: p.version) if plans else None

    def begin(self, start: int, *, storage_steps: int = 0, storage_seconds: float = 0.0) -> None:
        """The loop starts at ``start`` (time and budget schedules bootstrap with one save a few steps in). The
        storage tier's periodic interval caps the memory schedule (docs/memory.md, "Interval")."""
        self._storage = (storage_steps, storage_seconds)
        if self.pid == 0:
            log.info("%s", schedule.startup_line(self.cfg, start))
        if self.cfg.interval_steps:
            cap = schedule.storage_cap(storage_steps=storage_steps, storage_seconds=0.0, step_s=1.0)
            if cap is not None and self.cfg.interval_steps > 2 * cap:
                log.warning("memory: REPRIEVE_MEMORY_INTERVAL_STEPS=%d is sparser than the storage tier's periodic "
                            "interval (%d steps): the newest memory copy is often older than the newest storage "
                            "checkpoint; set it to at most %d", self.cfg.interval_steps, storage_steps, cap)
        else:
            self._first = schedule.first_save(start)
        # every process but 0 follows process 0's schedules: a steps interval too, once skipped saves widen it
        if self.pid != 0 and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_schedules, name="reprieve-memory-schedule",
                                             daemon=True)
            self._watcher.start()

    @property
    def every(self) -> int | None:
        """The newest schedule's interval in steps (None before the first schedule)."""
        plans = self._plans
        return plans[-1].every if plans else None

    def due(self, step: int, step_seconds: float | None) -> bool:
        """Whether to save after ``step`` (the loop calls it every step: no I/O, a few attribute reads)."""
        if self._disabled is not None:
            return False
        if step_seconds is not None:
            self._step_s = step_seconds
        self._loop_step = step
        if self.pid == 0 and not self.cfg.interval_steps:
            measured = self._measured
            measured.step(step, time.perf_counter(), measured.measuring and self.busy())
        plans = self._plans
        if len(plans) > 1 and step >= plans[1].start:  # a newer schedule starts: the older one is done
            with self._plans_lock:
                current, self._plans = schedule.in_force(self._plans, step)
        else:
            current = plans[0] if plans and step >= plans[0].start else None
        return (current is not None and current.due(step)) or step == self._first

    def _adopt(self, plan: schedule.Schedule) -> None:
        with self._plans_lock:
            self._plans = tuple(sorted((*self._plans, plan), key=lambda p: p.version))

    # -- save -----------------------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, *, extra: dict[str, Any], process_extra: Any = None) -> bool:
        """Copy this process's shards off the devices and write them in the background; False when skipped."""
        if self._disabled is not None:
            return False
        if self._thread is not None and self._thread.is_alive():
            self.skipped += 1
            current, _ = schedule.in_force(self._plans, step)
            self._skip = (0 if current is None else current.version, step)  # published after the copy in flight
            log.info("memory save of step %d skipped: the copy of step %s is still being written or sent", step,
                     self.saved_step if self.saved_step is not None else "(first)")
            line = self._skips.line(step=step, running_step=self._running_step, every=self.every,
                                    step_s=self._step_s, cfg=self.cfg)
            if line is not None:
                log.warning("%s", line)
            return False
        from ..checkpoint import save as save_mod

        if not self._checked:
            self._checked = True
            problem = limit_problem(own_bytes(state, self.pid), self.cfg.limit_bytes)
            if problem:
                self._disable(problem)
                return False
        # The step's own asynchronous computation (and, across processes, its collectives waiting for the slowest
        # process) is not the tier's cost: the next step would wait for it as well. Measured apart, so that the
        # budget schedule counts the copy only (on the goodput example the wait was most of a "save": 0.02-0.2 s).
        t_ready = time.perf_counter()
        _ready(state)
        t0 = time.perf_counter()
        self.last_ready_s = t0 - t_ready
        self._copy_t0 = t0
        snap = save_mod.snapshot(state, host_copy="staged", staging=self._staging, max_chunk_bytes=None)
        host = {i: a for i, a in snap.host_leaves.items() if self.pid == 0}
        self.last_blocking_s = time.perf_counter() - t0
        if self.pid == 0 and not self.cfg.interval_steps:
            self._measured.saving(self.last_blocking_s)
        name = CopyName(step, self.attempt, self.pid)
        self._running_step = step
        self._here = threading.Event()
        self._thread = threading.Thread(target=self._background, args=(name, snap, host, extra, process_extra),
                                        name=f"reprieve-memory-save-{step}", daemon=True)
        self._thread.start()
        return True

    @property
    def off(self) -> str | None:
        """Why the tier switched itself off (its limit below the state), None while it is on."""
        return self._disabled

    def _disable(self, why: str) -> None:
        self._disabled = why
        log.error("memory tier OFF: %s. Training goes on with the storage tier only.", why)

    def _background(self, name: CopyName, snap: Any, host: dict[int, np.ndarray], extra: dict[str, Any],
                    process_extra: Any) -> None:
        t0, cpu0 = time.perf_counter(), time.thread_time()
        try:
            manifest, keep = self._write_own(name, snap, host, extra, process_extra)
            self.saves += 1
            self.saved_step = name.step
        except (CopyBusyError, CopyRefusedError, OSError) as err:
            self.failures += 1
            log.warning("memory copy of step %d not written: %s", name.step, err)
            return
        finally:
            self._staging.give_back([sc.data for sc in snap.shards])
            snap.shards.clear()
            self._here.set()  # committed in this pod, or failed: nothing more to wait for here
        time.sleep(_test_slow_copy(name.step))
        if self.peer is not None and name.step == self._no_put:
            log.info("memory copy of step %d not sent to the peer %s: its node is noticed (the restart reads this "
                     "pod's copy)", name.step, self.peer)
        elif self.peer is not None:
            self._send(name, manifest, keep)
        if self.peer is not None or self.nproc > 1:
            self._publish_progress()
        if self.pid == 0 and self.nproc > 1:
            self._widen_on_skips(name.step)
        self.last_background_s = time.thread_time() - cpu0
        self.last_span_s = time.perf_counter() - self._copy_t0  # from the loop's save to the last byte at the peer
        log.debug("memory copy of step %d: %d bytes, waited %.3fs for the state, the loop %.3fs for the copy, "
                  "%.3fs in the background (%.3fs CPU)", name.step, manifest.data_bytes, self.last_ready_s,
                  self.last_blocking_s, time.perf_counter() - t0, self.last_background_s)
        if self.pid == 0 and not self.cfg.interval_steps:
            self._measured.cost(self.last_blocking_s + (self.last_background_s if _cpu_backend() else 0.0))
            self._saves_since += 1
            self._publish_schedule(name.step)

    def _write_own(self, name: CopyName, snap: Any, host: dict[int, np.ndarray], extra: dict[str, Any],
                   process_extra: Any) -> tuple[Manifest, list[CopyName]]:
        """Write and commit this process's copy ``name``; returns its manifest and the older copies kept beside it
        here (the put names the same ones to the holder: :meth:`_keep`)."""
        parts: list[tuple[int, tuple[tuple[int, int], ...], np.ndarray]] = [
            (sc.leaf, sc.region, np.asarray(sc.data)) for sc in snap.shards]
        parts += [(i, tuple((0, n) for n in a.shape), a) for i, a in host.items() if a.size]
        shards, offset = [], 0
        for leaf, region, arr in parts:
            offset = layout.aligned(offset)
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            shards.append(Shard(leaf, region, offset, int(raw.nbytes), crc32c(raw)))
            offset += int(raw.nbytes)
        manifest = Manifest(writer=name.writer, num_processes=self.nproc, step=name.step, attempt=name.attempt,
                            leaves=leaf_dicts(snap.leaves), shards=shards, data_bytes=offset, extra=extra,
                            process_extra=process_extra, base=self.base, created_unix=time.time(),
                            topology=topology.recorded(self.nproc), root=self.root)
        with self.dir.in_flight(timeout_s=SEND_TIMEOUT_S):
            keep = self._keep(name)
            self.dir.make_room(layout.OWN, offset, keep=keep)  # only when the limit has no room: it decides
            tmp = self.dir.begin(layout.OWN, name, offset, attempt=name.attempt)
            try:
                if offset:
                    # pwrite, not a shared mapping: the kernel copies into the volume's pages with no page fault
                    # per 4 KiB (1 GiB on the benchmark VM: 0.14 s against 0.45 s through the mapping)
                    fd = os.open(os.path.join(tmp, layout.DATA_FILE), os.O_WRONLY)
                    try:
                        for (_, _, arr), s in zip(parts, shards, strict=True):
                            _write_at(fd, np.ascontiguousarray(arr).reshape(-1).view(np.uint8), s.offset)
                    finally:
                        os.close(fd)
                self.dir.commit(layout.OWN, name, manifest, keep=keep)
            except BaseException:
                self.dir.abort(layout.OWN, name)
                raise
        return manifest, keep

    def _send(self, name: CopyName, manifest: Manifest, keep: list[CopyName]) -> None:
        path = os.path.join(self.dir.copy_dir(layout.OWN, name), layout.DATA_FILE)
        t0 = time.perf_counter()
        try:
            assert self.peer is not None
            wire.Client(self.peer, timeout_s=SEND_TIMEOUT_S, token=self.token).put(
                layout.PEER, str(name), manifest.to_bytes(), path, manifest.data_bytes,
                keep=[n.step for n in keep if n != name])
        except (wire.WireError, OSError) as err:
            self.failures += 1
            log.warning("memory copy of step %d not replicated to %s: %s", name.step, self.peer, err)
            return
        self.replicated_step = name.step
        self._replicated = gang.replicated(self._replicated, name.step)
        log.debug("memory copy of step %d replicated to %s in %.3fs", name.step, self.peer, time.perf_counter() - t0)

    # -- the schedule (time and budget) ---------------------------------------------------------------------------
    def _publish_schedule(self, step: int) -> None:
        """Process 0, after each save: publish the first schedule, or a new one when the interval it would choose
        now differs materially from the one in force (:func:`.schedule.reconsider`)."""
        step_s, cost = self._measured.step_s(self._step_s), self._measured.cost_s()
        choice = schedule.plan(cost_s=cost, step_s=step_s, interval_s=self.cfg.interval_seconds,
                               budget=self.cfg.budget, storage_steps=self._storage[0],
                               storage_seconds=self._storage[1], loss_every_s=self.cfg.loss_every_seconds)
        budgeted = self.cfg.auto and not choice.by_loss  # the loss rate's closer interval costs what it must
        newest = self._published
        if newest is not None:
            current, _ = schedule.in_force(self._plans, step)
            over_budget = (budgeted and current is not None
                           and schedule.over_budget(cost, step_s, current.every, self.cfg.budget))
            if not schedule.reconsider(current, newest=newest, step=step, every=max(self._floor, choice.every),
                                       saves_since=self._saves_since, over_budget=over_budget):
                return
        start = schedule.start_after(max(step, self._measured.last_step or 0), step_s)
        every = max(self._floor, schedule.first_every(choice.every, self.last_span_s, step_s) if newest is None
                    else choice.every)
        # a re-plan counts from this save (the one just written): its first save is an interval after it
        plan = (schedule.Schedule(every, start) if newest is None
                else schedule.Schedule(every, start, newest.version + 1, anchor=step))
        try:
            self.coord.set(_schedule_key(self.attempt, plan.version), plan.to_json())
        except Exception as err:  # noqa: BLE001 - no (new) schedule: the one in force goes on, training goes on
            log.warning("memory: could not publish the save schedule: %s", err)
            return
        self._published, self._saves_since = plan, 0
        self._adopt(plan)
        log.info("%s", schedule.interval_line(plan, choice, cost_s=cost, step_s=step_s, cfg=self.cfg,
                                              storage=self._storage, copy_s=self.last_span_s))
        over = schedule.share(cost, step_s, choice.every)
        if choice.capped and budgeted and over > self.cfg.budget and not self._cap_told:
            self._cap_told = True
            log.info("memory saves every %d steps, half the storage tier's periodic interval (%s), cost about %.2f%% "
                     "of the training time, above the tier's budget of %.2f%% (which alone would space them every %d "
                     "steps): a memory copy older than the newest storage checkpoint would be of no use",
                     choice.every, _storage_text(*self._storage), 100 * over, 100 * self.cfg.budget, choice.wanted)

    def _watch_schedules(self) -> None:
        """Every process but 0 (a thread): read each schedule process 0 publishes, in order, until the tier
        closes. A schedule starts a few steps ahead of process 0, so every process switches at the same step."""
        newest = self.newest_schedule
        version = 1 if newest is None else newest.version + 1
        while not self._closing.is_set():
            try:
                plan = schedule.Schedule.from_json(self.coord.get(_schedule_key(self.attempt, version), 1.0))
            except CoordinationTimeout:
                continue
            except Exception as err:  # noqa: BLE001 - no schedule: no further memory saves, training goes on
                if not self._closing.is_set():
                    log.warning("memory: no save schedule %d from process 0 (%s): no further memory saves", version,
                                err)
                return
            self._adopt(plan)
            log.debug("memory: schedule %d from process 0: every %d steps from step %d", plan.version, plan.every,
                      plan.start)
            version += 1

    def _widen_on_skips(self, step: int) -> None:
        """Process 0, after each copy: a process that skipped a save under the newest schedule (its copy ran late)
        may be saving other steps than the rest, so process 0 publishes a wider schedule that every process
        adopts at the same step (:func:`.schedule.widen`)."""
        records = self._records()
        records[self.pid] = gang.Record(self._replicated, self._skip)
        skips = {p: r.skip for p, r in records.items() if r.skip is not None}
        newest = self.newest_schedule
        plan = schedule.widen(newest, skips, step=max(step, self._loop_step or 0),
                              step_s=self._measured.step_s(self._step_s))
        if plan is None or newest is None:
            return
        try:
            self.coord.set(_schedule_key(self.attempt, plan.version), plan.to_json())
        except Exception as err:  # noqa: BLE001 - the schedule in force goes on (and its skips), training goes on
            log.warning("memory: could not publish the widened save schedule: %s", err)
            return
        self._published, self._saves_since, self._floor = plan, 0, plan.every
        self._adopt(plan)
        log.warning("%s", schedule.widened_line(plan, {p: s for p, s in skips.items() if s[0] == newest.version},
                                                newest.every))

    def _publish_progress(self) -> None:
        record = gang.Record(self._replicated, self._skip)
        try:
            self.coord.set(f"{_KV}/a{self.attempt}/replicated/{self.pid}", record.to_json(), overwrite=True)
        except Exception as err:  # noqa: BLE001 - progress only
            log.debug("memory: could not publish the replicated steps: %s", err)

    def _records(self) -> dict[int, gang.Record]:
        """Every process's published :class:`.gang.Record` of this attempt (those unreadable left out)."""
        prefix = f"{_KV}/a{self.attempt}/replicated/"
        try:
            got = self.coord.dir_get(prefix)
        except Exception as err:  # noqa: BLE001 - progress only: no records, no gang step
            log.debug("memory: could not read the processes' replicated steps: %s", err)
            return {}
        out = {}
        for key, value in got.items():
            try:
                out[int(key[len(prefix):] if key.startswith(prefix) else key.rsplit("/", 1)[-1])] = \
                    gang.Record.from_json(value)
            except ValueError as err:
                log.debug("memory: progress record %s is unreadable: %s", key, err)
        return out

    def _keep(self, name: CopyName) -> list[CopyName]:
        """This process's copies to keep beside ``name`` here and at its holder (:func:`.gang.keep_steps`): the
        gang step's and those that may still become it. None without a peer: no copy outlives its pod then."""
        if self.peer is None:
            return []
        lists = {p: r.steps for p, r in self._records().items()}
        lists[self.pid] = self._replicated
        self._gang = gang.newer_gang(self._gang, gang.gang_step(lists, self.nproc))
        own = [n.step for n in self.dir.names(layout.OWN) if n.attempt == self.attempt and n.writer == self.pid]
        return [CopyName(s, self.attempt, self.pid)
                for s in sorted(gang.keep_steps([*own, name.step], lists, self.nproc, self._gang))]

    def holds(self, step: int) -> bool:
        """Whether this process's copy of ``step`` is committed in its pod and, with a peer, at the peer."""
        return self.saved_step == step and (self.peer is None or self.replicated_step == step)

    def keep_here(self, step: int) -> None:
        """The copy of ``step`` (a notice's agreed step) stays in this pod, not sent to the peer: the peer's node
        is noticed, so the put would cost both pods a copy's CPU for a replica that goes with the node, and this
        pod, which stays, is where the restart reads it."""
        self._no_put = step

    def wait_here(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the copy in flight is committed in this pod, or failed; True when it
        is over either way (:meth:`committed_here` tells which)."""
        return self._here.wait(timeout_s)

    def committed_here(self, step: int) -> bool:
        """Whether this process's copy of ``step`` is committed in its pod."""
        return self.saved_step == step

    def outlives(self, doomed: Collection[str | None]) -> str | None:
        """Why a copy committed here and at the peer may not outlive the ``doomed`` nodes, as far as this process
        knows (:func:`.decide.outlives_notice`); None: it would."""
        return decide.outlives_notice(node=self.cfg.node, peer_node=self.peer_node, doomed=doomed, here=True,
                                      at_peer=self.peer is not None)

    def gang_step(self) -> int | None:
        """The newest step every process of this attempt has replicated (process 0's progress report):
        :func:`.gang.gang_step` over the processes' records, never older than one seen before."""
        lists = {p: r.steps for p, r in self._records().items()}
        self._gang = gang.newer_gang(self._gang, gang.gang_step(lists, self.nproc))
        return self._gang

    # -- end ------------------------------------------------------------------------------------------------------
    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def join_watcher(self, timeout_s: float) -> None:
        """Wait for the schedule watcher to leave the coordination client (after :meth:`close` and the distributed
        shutdown, which cancels its pending get): a thread still inside it when the interpreter exits aborts the
        process ("terminate called ... exception not rethrown", exit -6 after a finished job)."""
        if self._watcher is not None:
            self._watcher.join(timeout_s)

    def restore(self, storage: Any, abstract: Any, check: Callable[[Any, Any, str], None] | None) -> Any:
        """The restore round over this tier and the ``storage`` checkpointer (:func:`.restore_round.restore`)."""
        from . import restore_round  # imports JAX, as a restore does anyway

        return restore_round.restore(self, storage, abstract, check=check)

    def busy(self) -> bool:
        """A copy is still being written or sent in the background."""
        return self._thread is not None and self._thread.is_alive()

    def leaving(self, step: int, doomed: Collection[str | None]) -> None:
        """The agreed save of ``step`` is committed to storage and a restart follows (``doomed``: the nodes the
        notices name): from here :meth:`wait_exit` and :meth:`close` wait only for the part of the copy in flight
        that the restart reads (:func:`.decide.exit_wait`)."""
        self._leaving = (step, frozenset(doomed))

    def _exit_need(self) -> str:
        agreed, doomed = self._leaving if self._leaving is not None else (None, frozenset())
        return decide.exit_wait(agreed_step=agreed, running_step=self._running_step if self.busy() else None,
                                node=self.cfg.node, doomed=doomed)

    def wait_exit(self, timeout_s: float) -> tuple[str, bool]:
        """Wait (at most ``timeout_s``) for what the process's exit needs of the copy in flight
        (:func:`.decide.exit_wait`); returns the need and whether it is met."""
        need = self._exit_need()
        if need == decide.HERE:
            return need, self._here.wait(timeout_s)
        if need == decide.EVERYWHERE:
            self.wait(timeout_s)
        return need, need == decide.NOTHING or not self.busy()

    def close(self, *, finished: bool = False) -> None:
        """Give the copy in the background a few seconds to finish (a process on its way out does not wait for a
        slow peer: a torn copy is never used), then stop serving (outside reprieve-supervisor). After an agreed
        save that a restart follows (:meth:`leaving`) only the part of the copy the restart reads is waited for.
        ``finished``: the job finished (not a restart): its copies in this pod's directory are of no more use and
        are deleted."""
        self._closing.set()
        need, met = self.wait_exit(CLOSE_WAIT_S)
        if self._thread is not None and self._thread.is_alive():
            step = self._thread.name.rsplit("-", 1)[-1]
            if need == decide.NOTHING:
                log.info("memory: leaving with the copy of step %s unfinished: the restart reads the agreed step "
                         "(an unfinished copy is never read)", step)
            elif need == decide.HERE and met:
                log.info("memory: leaving with the copy of step %s committed in this pod, its put to the peer "
                         "unfinished: this pod stays, and the restart reads it here", step)
            else:
                log.info("memory: leaving with the copy of step %s still in the background (not used anywhere)",
                         step)
        else:
            self._staging.close()
            if finished:
                gone = self.dir.remove_root(self.root)
                log.info("memory: the job finished: deleted its %d copies in %s%s", len(gone), self.dir.path,
                         f": {', '.join(gone)}" if gone else "")
        if self.server is not None:
            self.server.close()


def storage_root(uri: str) -> str:
    """The storage root a copy records (pure): a URI as given, a local path made absolute (``./checkpoints`` from
    two working directories are two roots)."""
    return uri if "://" in uri else os.path.abspath(uri)


def _test_slow_copy(step: int) -> float:
    """Seconds :data:`SLOW_COPY_ENV` holds the copy of ``step`` after its commit here, before it is sent (0: unset,
    the default)."""
    raw = Env(os.environ).raw(SLOW_COPY_ENV)
    for item in (raw or "").split(","):
        at, _, seconds = item.partition(":")
        if at.strip() == str(step):
            return float(seconds)
    return 0.0


def _write_at(fd: int, data: np.ndarray, offset: int) -> None:
    """All of ``data`` into ``fd`` from ``offset`` (pwrite writes at most 2 GiB a call, and may write less)."""
    with memoryview(data.data) as view:
        done = 0
        while done < len(view):
            wrote = os.pwrite(fd, view[done:done + (1 << 30)], offset + done)
            if wrote <= 0:
                raise OSError(f"pwrite wrote nothing at offset {offset + done}")
            done += wrote


def _ready(state: Any) -> None:
    import jax

    jax.block_until_ready([leaf for leaf in jax.tree.leaves(state) if isinstance(leaf, jax.Array)])


def _schedule_key(attempt: int, version: int) -> str:
    return f"{_KV}/a{attempt}/schedule/v{version}"


def _storage_text(steps: int, seconds: float) -> str:
    return " and ".join(t for t in (f"{steps} steps" if steps else "", f"{seconds:g} s" if seconds else "") if t)


def _cpu_backend() -> bool:
    try:
        import jax

        return jax.default_backend() == "cpu"
    except Exception:  # noqa: BLE001
        return True


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n} bytes)" if n >= 2**30 else f"{n / 2**20:.1f} MiB ({n} bytes)"
