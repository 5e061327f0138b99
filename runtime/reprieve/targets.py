"""The two places a :class:`reprieve.Job` saves to: storage (every checkpoint) and the pods' memory (a copy beside
it, ``reprieve.memtier``). Each is a :class:`SaveTarget` with its own decision policy (:mod:`reprieve.policy`);
``Job.save`` asks each target's policy, builds the save's record once and hands it to the targets that save.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any, NamedTuple, Protocol

from . import data as data_mod
from . import identity
from .agreement import INTERVAL
from .capabilities import Capabilities, Checkpointer, RestoreCheckFn
from .measures import SaveReports, positive
from .memtier import decide
from .memtier.config import MemoryConfig
from .memtier.schedule import periodic_saves_off_line
from .metrics import Metrics
from .policy import (
    MIN_FAILING_SECONDS,
    STORAGE,
    SaveDecisionPolicy,
    SavePolicy,
    ScheduledPolicy,
    classify_save_error,
    save_failure_verdict,
    storage_policy,
    time_save_due,
)
from .progress import LoopProgress

log = logging.getLogger("reprieve.job")  # the job's save lines, under the name they always had

AGREED_MEMORY_WAIT_S = 1.0  # the most an agreed save waits for its memory copy (and the peer's) after the commit
AGREED_MEMORY_BUSY_WAIT_S = 0.25  # ... and for a periodic copy still in the background before it starts its own


def agreed_memory_margin(save_seconds: float) -> float:
    """Seconds before the deadline below which the agreed save gets no memory copy beside it (pure): the copy
    competes with the storage save for the host, so it is made only with room for both twice over."""
    return 1.0 + 2.0 * max(0.0, save_seconds) + AGREED_MEMORY_WAIT_S


LAST = "last"  # the kind of the save of the loop's last step (``reprieve ls``: "last step")


def save_kind(agreed: str | None, *, forced: bool, last: bool) -> str:
    """The kind a save records and counts under (pure). ``agreed``: the agreement's kind of this step (None: none
    agreed); ``last``: the step is the loop's last (``total - 1``), saved as the run's end, not as a periodic
    one. A notice's agreed kinds (``early``) keep theirs."""
    if last and agreed in (None, INTERVAL):
        return LAST
    return agreed or ("forced" if forced else "periodic")


NOTICE_KEYS = ("notice", "noticeSource")  # the agreed notice a storage save records (reprieve.restore reads them)


def save_record(step: int, attempt: int, run: dict[str, Any], *, step_seconds: float | None,
                save_seconds: float | None, notice: tuple[str, str] | None) -> dict[str, Any]:
    """A save's ``reprieve`` record without its kind (each target adds its own): what this attempt measured
    (the next attempt's countdown starts from it, :func:`reprieve.measures.timing_of`) and the agreed notice, if any."""
    record: dict[str, Any] = {"step": step, "attempt": attempt, "run": run}
    for key, value in (("stepSeconds", positive(step_seconds)), ("saveSeconds", positive(save_seconds))):
        if value is not None:
            record[key] = round(value, 4)
    if notice is not None:
        record.update(zip(NOTICE_KEYS, notice, strict=True))
    return record


class SaveRecords:
    """Builds a save's ``(extra, position)`` once for every target that saves it: the user's ``extra`` with the
    ``reprieve`` record (:func:`save_record`), and this process's encoded data position (None without one)."""

    def __init__(self, run_id: str | None, attempt: int, process_id: int) -> None:
        self._run_id, self._attempt, self._process_id = run_id, attempt, process_id
        self._run_cache: tuple[Any, dict[str, Any]] | None = None  # (tree and shapes, their run record)

    def build(self, step: int, state: Any, extra: dict[str, Any] | None, data: Any, *, step_seconds: float | None,
              save_seconds: float | None, notice: tuple[str, str] | None) -> tuple[dict[str, Any], Any]:
        record = save_record(step, self._attempt, self._run_record(state), step_seconds=step_seconds,
                             save_seconds=save_seconds, notice=notice)
        position = None if data is None else data_mod.encode(
            data, f"job.save(step {step}, data=...): process {self._process_id}'s data position")
        return {**(extra or {}), "reprieve": record}, position

    def _run_record(self, state: Any) -> dict[str, Any]:
        """The run identity this save records (``reprieve.identity``). Key paths cost microseconds per leaf, so
        the record is kept for as long as the state keeps its tree and shapes (the agreed save is on the
        restart path)."""
        import jax  # the state is JAX's: importing reprieve does not import it

        leaves, treedef = jax.tree_util.tree_flatten(state)
        key = (treedef, tuple(getattr(leaf, "shape", None) for leaf in leaves))
        if self._run_cache is None or self._run_cache[0] != key:
            self._run_cache = (key, identity.record(self._run_id, identity.structure(state)))
        return self._run_cache[1]


class SaveTarget(Protocol):
    """Where a save goes. ``record``: the checkpoint's ``reprieve`` record (without its ``kind``, which the
    target adds); ``position``: this process's encoded data position, or None."""

    name: str  # the kind the loop's progress and the metrics count its saves under
    policy: SaveDecisionPolicy

    def save(self, step: int, state: Any, record: dict[str, Any], position: Any, *, kind: str) -> bool:
        """Start a save of ``step``; True when one was started."""
        ...

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the save in flight (at most ``timeout_s``); True when none is left."""
        ...

    def busy(self) -> bool: ...

    @property
    def last_save_seconds(self) -> float | None:
        """Seconds from the start of the last save to its commit, None before one."""
        ...


class StorageTarget:
    """The checkpointer's saves: one in flight at a time, confirmed before the next starts; a failed one is
    counted and the job trains on until :func:`reprieve.policy.save_failure_verdict` says it is fatal.

    ``reports``: where the loop's waits, the commits and the failures are reported."""

    name: str = "storage"
    min_failing_seconds = MIN_FAILING_SECONDS  # failed saves are fatal only after this long (reprieve.policy)

    def __init__(self, checkpointer: Checkpointer, caps: Capabilities, policy: SavePolicy, *, metrics: Metrics,
                 loop: LoopProgress, reports: SaveReports, max_failed_saves: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.checkpointer, self.caps = checkpointer, caps
        self.interval = policy
        self.policy: SaveDecisionPolicy = storage_policy(policy)
        self._metrics, self._loop, self._max_failed = metrics, loop, max_failed_saves
        self._reports = reports
        self._clock = clock
        self.last_saved: int | None = None  # the last step a save started for (or was restored)
        self.committed: int | None = None  # the newest step known committed (restored or saved)
        self._pending: int | None = None  # started, not confirmed yet
        self._pending_started = 0.0
        self.last_save_at = clock()  # process 0's clock for the time-based interval
        self._failed_saves = 0  # failed in a row (REPRIEVE_MAX_FAILED_SAVES bounds it)
        self._failing_since = 0.0  # when the first of them began
        if caps.commit_callback is not None:
            caps.commit_callback.set_commit_callback(self.on_commit)

    @property
    def last_save_seconds(self) -> float | None:
        return self.checkpointer.last_save_seconds

    def busy(self) -> bool:
        return self._pending is not None

    def newest_committed(self) -> int | None:
        """The newest committed step for a line on the way out: the one this attempt restored or saved, else the
        storage's newest (an exception before or inside restore_or leaves the first unknown)."""
        if self.committed is not None:
            return self.committed
        try:
            return self.checkpointer.latest_step()
        except Exception as err:  # noqa: BLE001 - a line on the way out, never a second failure
            log.debug("listing the checkpoints for the exit line failed: %s", err)
            return None

    def begin(self, start: int, memory: MemoryConfig | None = None) -> None:
        """The loop starts at ``start``: the time-based interval counts from here. ``memory``: the memory tier's
        configuration when it is on (the start-up line then says what its copies cover)."""
        if not (self.interval.interval_steps or self.interval.interval_seconds):
            log.info("%s", periodic_saves_off_line(start, memory))
        self.last_save_at = self._clock()

    def request_due(self) -> bool:
        """Process 0's time-based decision: ask every process to agree on a save now."""
        return time_save_due(policy=self.interval, now=self._clock(), last_save_at=self.last_save_at)

    def restored(self, step: int, committed: int | None) -> None:
        self.last_saved, self.committed = step, committed

    def save(self, step: int, state: Any, record: dict[str, Any], position: Any, *, kind: str) -> bool:
        self.confirm(retry_next=kind)
        kwargs: dict[str, Any] = {}
        if position is not None:
            if self.caps.process_extra is None:
                raise TypeError(f"job.save(data=...): the checkpointer {type(self.checkpointer).__name__} does not "
                                "store per-process data positions (supports_process_extra); use the default "
                                "CheckpointManager or OrbaxCheckpointer")
            kwargs["process_extra"] = position
        saver = self.checkpointer if position is None else self.caps.process_extra
        assert saver is not None
        t0 = time.perf_counter()
        saver.save(step, state, extra={**record, "reprieve": {**record["reprieve"], "kind": kind}}, **kwargs)
        self._reports.blocked(time.perf_counter() - t0)
        self.last_saved = self._pending = step
        self.last_save_at = self._pending_started = self._clock()
        self._metrics.inc("reprieve_saves_total", kind=kind)
        log.debug("save of step %d started (%s)", step, kind)
        return True

    def wait(self, timeout_s: float | None = None) -> bool:
        self.confirm()
        return True

    def on_commit(self, step: int) -> None:
        """The checkpointer's commit callback (any thread)."""
        if self.committed is None or step > self.committed:
            self.committed = step
        self._reports.committed(step, self.last_save_seconds)

    def confirm(self, *, retry_next: str | None = None) -> None:
        """Wait for the save in flight (if any), then record it as committed. ``retry_next``: the kind of the save
        about to start, which retries a failed one (:meth:`_failed`); None: its failure is raised."""
        if self._pending is None:
            return
        t0 = time.perf_counter()
        try:
            self.checkpointer.wait()
        except Exception as err:
            self._reports.blocked(time.perf_counter() - t0)
            failed, self._pending = self._pending, None
            if retry_next is None:
                raise
            self._failed(failed, err, agreed_next=retry_next == "final")
            return
        self._reports.blocked(time.perf_counter() - t0)
        self.committed, self._pending = max(self._pending, self.committed or -1), None
        self._failed_saves = self._loop.failed_saves = 0
        self._reports.committed(self.committed, self.last_save_seconds)

    def _failed(self, step: int, err: Exception, *, agreed_next: bool) -> None:
        """The save of ``step`` failed and a next save is about to start: log, count and report it, and train on
        unless :func:`reprieve.policy.save_failure_verdict` says it is fatal (then raise, as without this rule).
        Every process sees the same failure at the same save, so all decide alike."""
        if self._failed_saves == 0:
            self._failing_since = self._pending_started
        self._failed_saves += 1
        self._loop.failed_saves = self._failed_saves
        cause = f"{type(err).__name__}: {err}"
        self._loop.last_save_error = f"step {step}: {cause}"[:500]
        self._metrics.inc("reprieve_save_failures_total")
        kind = classify_save_error(err)
        fatal = save_failure_verdict(kind, self._failed_saves, self._max_failed, agreed_next=agreed_next,
                                     failing_seconds=self._clock() - self._failing_since,
                                     min_failing_seconds=self.min_failing_seconds)
        self._reports.failed(self.committed)
        if fatal is None:
            log.error("checkpoint save of step %d failed (%d in a row, fatal at REPRIEVE_MAX_FAILED_SAVES=%d over "
                      "%.0f s or more): %s; training goes on, the next save retries (the last committed step is %s)",
                      step, self._failed_saves, self._max_failed, self.min_failing_seconds, cause,
                      "none" if self.committed is None else self.committed)
            return
        log.critical("checkpoint save of step %d failed: %s; %s", step, cause, fatal)
        if kind == STORAGE:  # the bound: say how many and why
            raise RuntimeError(f"checkpoint save of step {step} failed ({cause}): {fatal}") from err
        raise err  # fenced, or not the storage: as it came

    def defer_retention(self) -> None:
        if self.caps.deferred_retention is not None:
            self.caps.deferred_retention.defer_retention()


class Tier(Protocol):
    """What :class:`MemoryTarget` needs of the memory tier (``reprieve.memtier.tier.MemoryTier``)."""

    restored_from: dict[str, Any] | None
    cfg: MemoryConfig
    peer_node: str | None  # the peer's node, where known (the assignment's, or the restore round's reports)

    @property
    def off(self) -> str | None:
        """Why the tier switched itself off, None while it is on."""
        ...

    def begin(self, start: int, *, storage_steps: int = 0, storage_seconds: float = 0.0) -> None: ...

    def due(self, step: int, step_seconds: float | None) -> bool: ...

    def save(self, step: int, state: Any, *, extra: dict[str, Any], process_extra: Any = None) -> bool: ...

    def wait(self, timeout_s: float | None = None) -> None: ...

    def busy(self) -> bool: ...

    def restore(self, storage: Any, abstract: Any, check: RestoreCheckFn | None) -> Any: ...

    def gang_step(self) -> int | None: ...

    def holds(self, step: int) -> bool: ...

    def outlives(self, doomed: Collection[str | None]) -> str | None: ...

    def keep_here(self, step: int) -> None: ...

    def wait_here(self, timeout_s: float) -> bool: ...

    def committed_here(self, step: int) -> bool: ...

    def join_watcher(self, timeout_s: float) -> None: ...

    def leaving(self, step: int, doomed: Collection[str | None]) -> None: ...

    def wait_exit(self, timeout_s: float) -> tuple[str, bool]: ...

    def close(self, *, finished: bool = False) -> None: ...


class Held(NamedTuple):
    """Where this process's copy of an agreed step is committed in time (:meth:`MemoryTarget.save_alone`)."""

    here: bool = False  # in this pod
    at_peer: bool = False  # and at its peer


class MemoryTarget:
    """The memory tier's copies (docs/memory.md): on its own schedule, never instead of a storage save, and beside
    the agreed save before a restart when the deadline leaves room. The loop waits only for the host copy."""

    name: str = "memory"
    last_save_seconds = None  # the copy's commit is the tier's business: the countdown plans with storage's

    def __init__(self, tier: Tier, *, metrics: Metrics, on_blocked: Callable[[float], None]) -> None:
        self.tier = tier
        self.policy: SaveDecisionPolicy = ScheduledPolicy(tier.due)
        self._metrics, self._on_blocked = metrics, on_blocked
        self.agreed_started: int | None = None  # the agreed step whose copy :meth:`save_alone` started

    def begin(self, start: int, interval: SavePolicy) -> None:
        """The loop starts at ``start``; the storage interval caps the memory schedule (docs/memory.md)."""
        self.tier.begin(start, storage_steps=interval.interval_steps, storage_seconds=interval.interval_seconds)

    def save(self, step: int, state: Any, record: dict[str, Any], position: Any, *, kind: str = "memory",
             agreed: bool = False) -> bool:
        t0 = time.perf_counter()
        # A periodic copy does not carry the notice: restored, it would mark as handled a notice that no save served.
        # An agreed step's copy does (``agreed``): it is that notice's save, as storage's is.
        own = {k: v for k, v in record["reprieve"].items() if agreed or k not in NOTICE_KEYS}
        started = bool(self.tier.save(step, state, extra={**record, "reprieve": {**own, "kind": "memory"}},
                                      process_extra=position))
        if started:
            self._metrics.inc("reprieve_saves_total", kind="memory")
        self._on_blocked(time.perf_counter() - t0)
        return started

    def wait(self, timeout_s: float | None = None) -> bool:
        self.tier.wait(timeout_s)
        return not self.tier.busy()

    def busy(self) -> bool:
        return self.tier.busy()

    def beside_agreed(self, step: int, state: Any, record: dict[str, Any], position: Any, *,
                      deadline: float | None, save_seconds: float) -> bool:
        """A copy of the agreed step beside its storage save, so the restart that follows restores it from the
        pods' memory (docs/memory.md, "After a notice"); skipped when the deadline is too close to afford a second
        host copy or a periodic copy is still in the background. True when a copy was started."""
        if deadline is not None and deadline - time.time() < agreed_memory_margin(save_seconds):
            log.info("agreed step %d: no memory copy beside the storage save (%.1fs to the deadline)", step,
                     deadline - time.time())
            return False
        if not self.wait(AGREED_MEMORY_BUSY_WAIT_S):  # a periodic copy still in the background (a slow peer)
            log.info("agreed step %d: no memory copy beside the storage save (the previous copy is still being "
                     "written or sent)", step)
            return False
        try:
            return self.save(step, state, record, position, agreed=True)
        except Exception as err:  # noqa: BLE001 - the storage save is the guarantee: a memory copy never fails it
            log.warning("agreed step %d: the memory copy beside the storage save failed (%s: %s); the restart reads "
                        "storage", step, type(err).__name__, err)
            return False

    def save_alone(self, step: int, state: Any, record: dict[str, Any], position: Any, *, wait_s: float,
                   until: float | None = None, doomed: Collection[str | None] | None = None) -> Held:
        """The agreed step to the memory tier alone (no storage save beside it): where this process's copy is
        committed in time (:class:`Held`): each wait (for the copy in flight, then for this one)
        at most ``wait_s``, and all over by ``until`` (``time.monotonic()``; None: no such bound). A resize
        (``doomed`` None) waits for both. A notice (``doomed``: the nodes it and the notices this process received
        name): a copy that could not outlive them (:meth:`Tier.outlives`) is not even started; a pod that stays
        waits for its own commit only, and a copy whose peer's node is noticed is not sent there
        (:meth:`Tier.keep_here`). Whether the copies outlive every notice the gang heard of is the gang's decision
        (:func:`reprieve.memtier.decide.gang_outlives`)."""
        nowhere = Held()

        def bound() -> float:
            return wait_s if until is None else max(0.0, min(wait_s, until - time.monotonic()))

        stays = False
        if doomed is not None:
            if (why := self.tier.outlives(doomed)) is not None:
                log.info("agreed step %d: not held in memory (its copy would not outlive the notice: %s)", step, why)
                return nowhere
            stays = decide.stays(self.tier.cfg.node, doomed)
            if stays and self.tier.peer_node and not decide.stays(self.tier.peer_node, doomed):
                self.tier.keep_here(step)
        if not self.wait(bound()):
            log.info("agreed step %d: not held in memory (the previous copy is still being written or sent)", step)
            return nowhere
        try:
            started = self.save(step, state, record, position, agreed=True)
        except Exception as err:  # noqa: BLE001 - storage is the fallback: a memory failure never fails the save
            log.warning("agreed step %d: the memory copy failed (%s: %s)", step, type(err).__name__, err)
            return nowhere
        if not started:
            return nowhere
        self.agreed_started = step
        t0 = time.perf_counter()
        if stays:  # this pod stays: the restart reads the copy here; its put (if any) is not waited for
            held = Held(here=self.tier.wait_here(bound()) and self.tier.committed_here(step))
        else:
            self.wait(bound())
            held = Held(here=self.tier.committed_here(step), at_peer=self.tier.holds(step))
        log.info("agreed step %d: memory copy %s %.2fs after its start", step,
                 "committed here and at the peer" if held.at_peer else
                 "committed here (this pod stays)" if held.here and stays else "not held (storage follows)",
                 time.perf_counter() - t0)
        return held

    def placement(self) -> dict[str, str | None]:
        """This pod's node and its peer's (None: not known), for the gang's check that a notice's agreed copies
        outlive it."""
        return {"node": self.tier.cfg.node, "peer_node": self.tier.peer_node}

    def leaving(self, step: int, doomed: Collection[str | None]) -> None:
        """The agreed save of ``step`` is committed and a restart follows (``doomed``: the nodes the notices name):
        the process's exit waits only for what the restart reads of the copy in flight (docs/memory.md, "After a
        notice")."""
        self.tier.leaving(step, doomed)

    def await_agreed(self, step: int, deadline: float | None) -> None:
        """Wait (bounded) for the agreed step's copy to be committed where the restart reads it (here, or here
        and at the peer: :func:`reprieve.memtier.decide.exit_wait`): the next attempt's restore round, which may
        start as soon as this process announces its exit, sees it then."""
        limit = AGREED_MEMORY_WAIT_S if deadline is None else max(0.0, min(AGREED_MEMORY_WAIT_S,
                                                                          deadline - time.time() - 1.0))
        t0 = time.perf_counter()
        need, done = self.tier.wait_exit(limit)
        log.info("agreed step %d: memory copy %s %.2fs after the storage commit", step,
                 ("committed here (this pod stays; its put to the peer is not waited for)" if need == decide.HERE
                  else "committed") if done else "not finished (the restart reads storage where it lacks it)",
                 time.perf_counter() - t0)

    def tiered_read(self, storage: Checkpointer) -> Callable[[Any, RestoreCheckFn], Any]:
        """The restore through the tier's round (its sources: :mod:`reprieve.memtier.sources`), over ``storage``."""
        return lambda abstract, check: self.tier.restore(storage, abstract, check)

    def progress_fields(self) -> dict[str, Any]:
        """What process 0 adds to its progress report (docs/contract.md, "Progress"): where the restore read from,
        the newest step every process holds in memory (replicated, when peers are configured), and why the tier
        switched itself off (``memoryOff``)."""
        out: dict[str, Any] = {}
        if self.tier.restored_from is not None:
            out["restoredFrom"] = self.tier.restored_from
        step = self.tier.gang_step()
        if step is not None:
            out["memoryStep"] = step
        if self.tier.off is not None:
            out["memoryOff"] = self.tier.off
        return out
