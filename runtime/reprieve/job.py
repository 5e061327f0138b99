"""The training-loop face of the runtime: ``Job.restore_or``, ``Job.steps``, ``Job.save``, ``Job.should_stop``.

A :class:`Job` ties the notice sources, the cross-process :class:`~reprieve.agreement.Agreement` and its save
targets together: storage (a :class:`Checkpointer`, its optional capabilities checked once:
:mod:`reprieve.capabilities`) and, when configured, the memory tier (:mod:`reprieve.targets`), each deciding
with its own policy (:mod:`reprieve.policy`); it restores through :mod:`reprieve.restore`. Per step with nothing
to save the loop reads a few attributes (a few microseconds: ``benchmarks/loop_cost.py``): no RPC, no file, no
wait. At the agreed final step :meth:`Job.save` saves, waits for the commit on every process, reports progress,
leaves the distributed job and exits with ``REPRIEVE_RESTART_EXIT_CODE`` (1 if the deadline passed first); the
phases and teardowns are :mod:`reprieve.lifecycle`, the way out :mod:`reprieve.teardown`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, NoReturn, Self

from . import identity, landing, virtual
from .abstract import abstract_of, abstract_problem, require
from .agreement import FINAL, Agreement, AgreementError
from .capabilities import Capabilities, Checkpointer
from .checkpoint.faults import maybe_stop_in_agreed_save
from .compile_ahead import CompileAhead, LoweringCount, start_ahead
from .config import RuntimeConfig
from .coordination import CoordinationError, Coordinator
from .deferred import built
from .exiting import arm_deadline_timers, exit_process
from .finished import FinishedSteps
from .lifecycle import ABANDON, ABORT, FINISH, RESTART, Phase, Teardown, exit_decision
from .measures import SaveReports, StepTimes, positive
from .memtier.decide import gang_outlives
from .metrics import Metrics
from .notice import Notice
from .notice_sources import NoticeHub
from .policy import MEMORY_ONLY_REASONS, SaveContext, SavePolicy, agreed_to_memory, next_due_step
from .progress import LoopProgress, ProgressReporter
from .restore import Restored, read_latest
from .targets import (
    Held,
    MemoryTarget,
    SaveRecords,
    SaveTarget,
    StorageTarget,
    Tier,
    agreed_memory_margin,
    save_kind,
)
from .teardown import (
    Leaving,
    await_lost_peer,
    end_at_exit,
    ending_at_exit,
    log_agreed_commit,
    log_agreed_exit,
    raise_step_failure,
    warn_abandoned,
    warn_restart_code_without_save,
)

__all__ = ["Checkpointer", "Job", "Restored"]

log = logging.getLogger(__name__)

# The most a resize's agreed save waits for the memory copies (the copy in flight, then its own, then every
# process's verdict) before it saves to storage instead: the supervisor's grace (30 s by default) must hold both.
RESIZE_MEMORY_WAIT_S = 5.0
MEMORY_ATTEMPT_MIN_S = 1.5  # below this for the whole attempt a notice's agreed step goes to storage at once
DECISION_SLACK_S = 5.0  # beyond its own attempt, what a process waits for process 0's decision (its later start)


def memory_attempt_seconds(left_s: float | None, save_seconds: float) -> float | None:
    """How long an agreed step's attempt at the memory tier alone may take in all (the copy in flight, the agreed
    copy, the verdicts and process 0's decision), with ``left_s`` seconds to the deadline (None: not known, as a
    resize's), so that the storage save the gang falls back to still fits before the deadline
    (:func:`reprieve.targets.agreed_memory_margin`): at most three :data:`RESIZE_MEMORY_WAIT_S`; None when less
    than :data:`MEMORY_ATTEMPT_MIN_S` is left for it (storage at once). Pure."""
    most = 3 * RESIZE_MEMORY_WAIT_S
    if left_s is None:
        return most
    budget = min(most, left_s - agreed_memory_margin(save_seconds))
    return budget if budget >= MEMORY_ATTEMPT_MIN_S else None


class Job:
    """One process's handle on a preemption-safe training job. Build it with :func:`reprieve.init`."""

    def __init__(
        self,
        config: RuntimeConfig,
        coordinator: Coordinator,
        checkpointer: Checkpointer,
        agreement: Agreement,
        hub: NoticeHub,
        *,
        policy: SavePolicy | None = None,
        metrics: Metrics | None = None,
        progress: ProgressReporter | None = None,
        closers: list[Callable[[], None]] | None = None,
        exit_fn: Callable[[int], Any] = exit_process,
        shutdown_distributed: bool = True,
        on_first_step: Callable[[int, int | None, int | None], None] | None = None,
        on_exiting: Callable[[int], None] | None = None,
        wait_lost_peer: Callable[[str], tuple[int, ...]] | None = None,
        memory: Tier | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.coordinator, self.checkpointer = config, coordinator, checkpointer
        self.agreement = agreement
        self.caps = Capabilities.of(checkpointer)  # its optional capabilities, checked here once
        self.policy = policy or SavePolicy(interval_steps=config.checkpoint_interval_steps,
                                           interval_seconds=config.checkpoint_interval_seconds)
        self.metrics = metrics or Metrics()
        self.phase = Phase.READY
        self._hub, self._progress, self._exit_fn = hub, progress, exit_fn
        self._on_first_step = on_first_step  # reprieve-supervisor pre-warms the next attempt once it is called
        self._landing: int | None = None  # the bytes a restore of the state lands here (reprieve.landing)
        # whether the step donates the state (None: asked of the steps compiled ahead in steps()) and the bytes a
        # restore then copies into memory XLA allocates here (reprieve.landing, "Memory XLA allocates")
        self._owned: tuple[bool | None, int | None] = (False, None)
        # whether a restore here lands in that memory: the checkpointer's reads, or the memory tier's
        self._lands = self.caps.host_landing is not None or memory is not None
        self._leaving = Leaving(hub=hub, agreement=agreement, checkpointer=checkpointer, metrics=self.metrics,
                                coordinator=coordinator, progress=progress, closers=closers or [],
                                on_exiting=on_exiting, shutdown_distributed=shutdown_distributed)
        self._wait_lost_peer = wait_lost_peer  # reprieve.peers: which peer went silent, once a collective failed
        # where the loop is: all written and read by the training thread only
        self._last_step: int | None = None  # the job's last step; None: not known (a loop over a loader)
        self._current = -1  # the furthest step the loop entered
        self._decided = -1  # the last step save() or should_stop() decided about
        self._stop_step: int | None = None  # should_stop() returned True for it
        self._due_from = 0  # idle_step(): no step before it is due by the interval (0: ask save() every step)
        self._timed = coordinator.process_id == 0 and self.policy.interval_seconds > 0  # asks the clock each step
        self.loop = LoopProgress()  # read by the progress reporter and the metrics exporter's threads
        self._times = StepTimes(self.loop, agreement, self.metrics)
        self._final = False  # the agreed save has begun
        reports = SaveReports(self.loop, agreement, self.metrics, progress, position=lambda: self._current,
                              in_training=lambda: self.phase == Phase.TRAINING and not self._final)
        self.finished = FinishedSteps()  # the last step whose results exist (a survivor says it: reprieve.finished)
        # where saves go: storage always, the memory tier beside it when configured (reprieve.targets)
        self.storage = StorageTarget(checkpointer, self.caps, self.policy, metrics=self.metrics, loop=self.loop,
                                     reports=reports, max_failed_saves=config.max_failed_saves, clock=clock)
        self.memory = None if memory is None else MemoryTarget(memory, metrics=self.metrics,
                                                                 on_blocked=reports.blocked)
        self._state_checked = False  # the first save() checks the state's leaves (capabilities.StateCheck)
        self._records = SaveRecords(config.run_id, config.attempt, coordinator.process_id)
        self._ahead: list[CompileAhead] = []  # compile_ahead() threads; steps() waits for them
        # lowerings JAX did in the training thread during the first step: (count, seconds); None until known
        self.first_step_lowerings: tuple[int, float] | None = None
        self._first_lowerings: LoweringCount | None = None  # counting while the first step runs
        if progress is not None:
            progress.start(self.loop.fields)

    @property
    def process_id(self) -> int:
        return self.coordinator.process_id

    @property
    def num_processes(self) -> int:
        return self.coordinator.num_processes

    @property
    def committed_step(self) -> int | None:
        """The newest step known committed (restored or saved by this attempt), None before any."""
        return self.storage.committed

    @property
    def step_seconds(self) -> float | None:
        """Moving average of the time between steps yielded by :meth:`steps`."""
        return self._times.average

    def watch_peers(self, close: Callable[[], None], wait_lost: Callable[[str], tuple[int, ...]]) -> None:
        """The peer watch (``reprieve.peers``, built with this job): closed with the job's notice sources, and
        asked which peer went silent once a collective failed."""
        self._leaving.closers.append(close)
        self._wait_lost_peer = wait_lost

    def _targets(self) -> tuple[SaveTarget, ...]:
        return (self.storage,) if self.memory is None else (self.storage, self.memory)

    # -- restore -----------------------------------------------------------------------------------------
    def restore_or(self, init_fn: Callable[[], Any], abstract: Any = None, *, data: Any = None,
                   reshard_data: Callable[[list[Any], int, int], Any] | None = None,
                   donated: bool | None = None) -> Restored:
        """``(state, first_step)``: the latest checkpoint restored, or ``(init_fn(), 0)`` when there is none.

        Without ``abstract``, ``init_fn()`` always runs: its result gives the structure, shapes, dtypes and
        shardings to restore onto. With ``abstract`` (the state's tree of ``jax.ShapeDtypeStruct`` with
        ``sharding=``, or of arrays), ``init_fn`` runs only when there is no checkpoint yet: a restart neither
        pays for initialisation nor holds a fresh copy of the state beside the restored one in device memory.

        ``data``: this process's data pipeline. An iterator with ``set_state`` (a grain ``DataLoader``
        iterator) is put back where it was saved, in place; the saved value is also ``result.data``. With
        another process count than at the save, see :func:`reprieve.data.value_for_process` (``reshard_data``).

        The result unpacks as ``(state, first_step)`` and carries ``data``, ``extra`` and ``step``
        (:class:`Restored`). The checkpointer's ``restore(step=None)`` raising ``FileNotFoundError`` (on every
        process alike) means "no checkpoint yet". Where it reads from: :mod:`reprieve.restore`.

        ``donated``: whether the step donates the restored state (``jax.jit(..., donate_argnums=...)``); None (the
        default): whether a step given to :meth:`compile_ahead` donates any input (known once it is lowered, beside
        the restore). On CPU devices a donated state is then copied into memory XLA owns, which the donation can
        reuse (the restore's own buffers it cannot: the first step would write the whole state anew).
        """
        if abstract is None:
            state = init_fn()
            target = abstract_of(state)
        else:
            state, target = None, abstract_of(abstract)
            require(abstract_problem(target))  # on the first run too, not only at the first restart
        uri = self.config.checkpoint_uri
        t0 = time.perf_counter()
        # a step that donates the state on CPU devices: the restore puts XLA's own copies on them (when that is
        # known by the time the bytes are read), not its buffers, which a donation cannot reuse
        from .arrays import owned_copies  # (jax: imported by now)

        decide = self._donates_now if donated is None else (lambda: donated)
        try:
            with owned_copies(decide) as owned:
                read = read_latest(self.checkpointer, self.caps, target, run_id=self.config.run_id, where=uri,
                                   tiered=None if self.memory is None else self.memory.tiered_read(self.checkpointer))
        finally:
            landing.release()  # what a warm process populated ahead and the restore did not use
        if read is None:
            log.info("no checkpoint under %s: starting at step 0", uri)
            if state is None:
                state = init_fn()
                require(abstract_problem(target, abstract_of(state)))
            landing.owned_done()  # no restore, no copy: what a warm process populated for it goes back
            self.finished.prepare(state)
            self._landing = self._landing_hint(state)
            self._owned = (donated, landing.owned_bytes(state))
            return Restored(state, 0)
        step = read.step
        value = read.position(data, self.process_id, self.num_processes, reshard_data)
        self.storage.restored(step, read.committed)
        self._times.seed(read.record)
        if (notice := read.persisting_notice()) is not None:
            self.agreement.handled(notice, step)
        state = read.state
        donates = donated if donated is not None else any(ahead.donates_inputs() for ahead in self._ahead)
        if donates:
            import jax  # imported by now: a restore made these arrays

            from .arrays import owned_by_cpu_devices

            copied, when = owned.copied, "as it was put on the devices"
            if not copied:  # not known by then (the step still lowering), or another checkpointer's arrays
                state, copied = owned_by_cpu_devices(state)
                when = "after the restore"
                if copied and landing.owned_ahead():  # XLA's allocations for the copy made before the rest goes
                    jax.block_until_ready(state)
            if copied:
                log.info("the step donates the state: %d bytes of it copied into memory the CPU devices own %s "
                         "(a donation cannot reuse the restore's own buffers)", copied, when)
        landing.owned_done()
        seconds = time.perf_counter() - t0
        read.account(self.loop, self.metrics, seconds)
        read.log(uri, seconds)
        self.finished.prepare(state)
        self._landing = self._landing_hint(state)
        self._owned = (donates, landing.owned_bytes(state))
        return Restored(state, step + 1, data=value, extra=read.user_extra, step=step)

    def _donates_now(self) -> bool | None:
        """Whether a step given to :meth:`compile_ahead` donates its inputs, when every one is lowered by now;
        None: not known yet (asked while the restore puts its arrays on the devices: it must not wait)."""
        if not all(ahead.lowered() for ahead in self._ahead):
            return None
        return any(ahead.donates_inputs() for ahead in self._ahead)

    def _landing_hint(self, state: Any) -> int | None:
        """The bytes the next warm process in this pod populates for its restore (:mod:`reprieve.landing`), None
        when its restores do not land in host buffers. With the memory tier, that restore most likely reads the
        pod's own copy, whose mapped pages the first device of each distinct shard adopts: only the other replicas
        land (a restore from elsewhere lands the rest in fresh memory, as without a pool)."""
        return landing.landing_bytes(state, adopted_once=self.memory is not None) if self._lands else None

    def _owned_hint(self) -> int | None:
        """The bytes the next warm process in this pod populates in its C heap for its restore's copy into memory XLA
        allocates (:func:`reprieve.landing.reserve_owned`): the state's bytes on CPU devices when the step donates
        it (told to :meth:`restore_or`, or said by the steps compiled ahead once :meth:`steps` waited for them), else
        None."""
        donated, nbytes = self._owned
        return nbytes if donated and nbytes else None

    def compile_ahead(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Lower and compile the ``jax.jit`` function ``fn`` for ``args`` (arrays or ``jax.ShapeDtypeStruct`` with the
        real shardings, as the first call gets them) in a thread beside :meth:`restore_or`; :meth:`steps` waits for
        it. Call it after the mesh exists, before the restore; a failure is logged and the first step compiles as it
        would have (docs/restarts.md, "Compiling the step while the state is restored").

        Returns the step to call in the loop: ``fn`` itself, or, when ``reprieve.lower_ahead`` lowered ``fn`` before
        the devices, a callable that runs the program compiled from that module (``jax.jit``'s caches do not hold
        it: calling ``fn`` instead would lower it again; docs/restarts.md, "Lowering the step before the
        devices")."""
        if self.phase != Phase.READY:
            raise RuntimeError(f"Job.compile_ahead: the job is {self.phase.value}; call it before Job.steps()")
        ahead, step = start_ahead(fn, args, kwargs, self.finished.prepare_outputs)
        self._ahead.append(ahead)
        return step

    # -- loop ------------------------------------------------------------------------------------------
    def steps(self, start: int, total: int | None = None) -> Iterator[int]:
        """Yield ``start .. total-1`` (``total=None``: without end, for a loop that stops when its data does).
        Call :meth:`save` with every step (it decides whether to save).

        When the agreed preemption step has been saved and committed the process exits inside :meth:`save`; when
        the loop ends the last save is committed and the job finished. A loop with no ``total`` ends with
        ``job.save(step, state, force=True)`` and ``finish()`` (or a ``with`` block), see docs/runtime.md."""
        past = identity.past_total(start, total)
        if past is not None:
            raise ValueError(f"Job.steps: {past}")
        if start < 0:
            raise ValueError(f"Job.steps: need 0 <= start <= total, got start={start}, total={total}")
        if total is not None and start == total and start > 0:
            log.info("the checkpoint holds the last step (%d of total=%d): nothing left to train", start - 1, total)
        self._transition(Phase.TRAINING)
        self._last_step = None if total is None else total - 1
        self._due_from = 0  # the first save() decides where the interval's next save is
        self.agreement.begin(start, self._last_step)
        if self.memory is not None:  # the storage interval caps the memory schedule's
            self.memory.begin(start, self.policy)
        self.storage.begin(start, None if self.memory is None else self.memory.tier.cfg)
        for ahead in self._ahead:
            ahead.wait()
        if self._owned[0] is None:  # lowered now: whether the step donates the state it was not told
            self._owned = (any(ahead.donates_inputs() for ahead in self._ahead), self._owned[1])
        if self._owned[0] and self.caps.host_landing is not None:  # the checkpoints say so to a spare
            self.caps.host_landing.set_donated(True)
        self._ahead.clear()
        self._first_lowerings = LoweringCount()  # what the first step still lowers in this thread
        previous_t: float | None = None
        loop = self.loop
        step = start
        while total is None or step < total:
            now = time.perf_counter()
            if previous_t is not None:
                loop.last = (step - 1, now)  # the only per-step cost of progress reporting: one tuple
                if loop.first is None:
                    loop.first = loop.last
                    self._first_step_lowered()
                    self._first_step_done(step - 1)  # reprieve-supervisor starts the next attempt's process now
                    if self._progress is not None:
                        self._progress.first_step()
                self._times.observe(now - previous_t, step)
                if self._decided != step - 1 or self._stop_step == step - 1:
                    self._decide_or_exit(step - 1)  # no save() in the body, or should_stop() said stop
            previous_t = now
            self._current = step
            yield step
            step += 1
        if previous_t is not None:
            now = time.perf_counter()
            loop.last = (step - 1, now)
            if loop.first is None:
                loop.first = loop.last
            self._times.observe(now - previous_t, step)
        self._first_step_lowered()  # a loop of one step (or none) ends here
        if total is not None and total > start and (self._decided != total - 1 or self._stop_step == total - 1):
            self._decide_or_exit(total - 1)
        self.finish()

    def _first_step_lowered(self) -> None:
        """Stop counting the training thread's lowerings (once): ``first_step_lowerings``, when a step was taken."""
        counter, self._first_lowerings = self._first_lowerings, None
        if counter is not None:
            self.first_step_lowerings = counter.stop_first_step(stepped=self.loop.first is not None)

    def _first_step_done(self, step: int) -> None:
        if self._on_first_step is not None:  # once (save() calls this at every step)
            hook, self._on_first_step = self._on_first_step, None
            landing.release()  # a loop that restored without restore_or: the memory populated ahead is of no use
            landing.owned_done()
            try:
                hook(step, self._landing, self._owned_hint())
            except Exception as err:  # noqa: BLE001 - a report, never a reason to stop training
                log.debug("first-step hook failed: %s", err)

    def _transition(self, phase: Phase) -> None:
        if self.phase.terminal:
            raise RuntimeError(f"job is {self.phase.value}: cannot become {phase.value}")
        if phase == Phase.TRAINING and self.phase == Phase.TRAINING:
            raise RuntimeError("Job.steps() is already running; a job trains in one loop")
        self.phase = phase

    def _decide(self, step: int) -> str | None:
        try:
            return self.agreement.decide(step)
        except AgreementError as err:
            self._await_lost_peer(err)  # the service gone (process 0 died): named before this exit, not after
            self._abort(f"agreement failed: {err}")

    def _decide_or_exit(self, step: int) -> None:
        if self._decide(step) == FINAL and self.storage.last_saved != step:
            self._abort(f"agreed save step {step} passed without job.save({step}, state): nothing was saved")

    def should_stop(self, step: int) -> bool:
        """True when ``step`` is the agreed final step: call :meth:`save` with it (which saves and exits)."""
        kind = self._decide(step)
        self._decided = step
        if kind == FINAL:
            self._stop_step = step
        return kind == FINAL

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None, data: Any = None,
             force: bool = False) -> bool:
        """Save ``state`` after step ``step`` if the periodic policy, an agreed save or ``force`` asks for it.

        ``extra``: JSON metadata for the checkpoint. ``data``: this process's data position (an iterator
        with ``get_state``, or a JSON value), read only when a save happens; every process saves its own.
        ``state`` may be a :class:`~reprieve.deferred.DeferredState`: built only when this step is saved.
        Returns True when a save was started. At the agreed final step it does not return: it saves,
        waits for the commit on all processes, and exits (restart code, or 1 past the deadline).
        """
        self._current = max(self._current, step)
        finished_at = time.perf_counter()  # the step is done (the user's code computed it before this call)
        # the step is done, or dispatched: a probe says when it is computed (a DeferredState: its probe's leaf; the
        # state is built below only where a save, or the first step's check, reads it)
        self.finished.note(step, state, finished_at)
        if self.finished.failed is not None:  # no later step can finish: stop dispatching them
            raise_step_failure(built(state), self.finished.failed, self.process_id)
        self._first_step_done(step)
        if not self._state_checked:
            self._state_checked = True
            state = built(state)
            if self.caps.state_check is not None:  # a leaf no save can hold: reported now, not at the first save
                self.caps.state_check.check_state(state)
            virtual.require_virtual_step(self.config.virtual_shards)  # an elastic job's step sums its shards
        kind = self._decide(step)
        self._decided = step
        if kind == FINAL:
            self.loop.mark_saved(step, "storage", finished_at)
            self._final_save(step, built(state), extra, data)
            return True
        context = SaveContext(step, agreed=kind, forced=force, last_saved=self.storage.last_saved,
                              last_step=self._last_step, step_seconds=self._times.average)
        saving = [t for t in self._targets() if t.policy.should_save(context)]  # storage first: memory never
        record: tuple[dict[str, Any], Any] | None = None  # instead of it
        for target in saving:
            if record is None:
                state = built(state)
                record = self._record(step, state, extra, data)
            self.loop.mark_saved(step, target.name, finished_at)
            target.save(step, state, *record, kind=save_kind(kind, forced=force, last=step == self._last_step))
        # after a save of this step started (it restarts the interval's clock), so one interval asks for one save
        if self.process_id == 0 and self.storage.request_due():
            self.agreement.request_save("interval")  # a no-op while the previous request is being agreed
        if self.memory is None:  # the memory tier's schedule is asked every step (it measures the steps)
            self._due_from = next_due_step(step + 1, policy=self.policy, last_step=self._last_step)
        return self.storage in saving

    def idle_step(self, step: int, state: Any) -> bool:
        """:meth:`save`'s decision for ``step`` when nothing can be due at it, at a fraction of its cost: True when
        the step is decided with nothing to save (the agreement records it, the finished-step probe notes it, as
        :meth:`save` does); False when something may be due (the interval's step, the job's last, a notice or a
        save round in agreement, process 0's time-based interval, the memory tier on, the first step): nothing was
        done, call :meth:`save`. What ``reprieve.keras`` calls before :meth:`save` at every batch."""
        if step >= self._due_from or (self._timed and self.storage.request_due()) or not self.agreement.quiet(step):
            return False
        if step > self._current:  # noqa: PLR1730 - max() is a call, at every step
            self._current = step
        finished = self.finished
        finished.note(step, state)
        if finished.failed is not None:  # no later step can finish: stop dispatching them
            raise_step_failure(built(state), finished.failed, self.process_id)
        self._decided = step
        return True

    def notify(self, reason: str, deadline: float, *, notice_id: str | None = None) -> None:
        """Report a notice from user code (``deadline`` in ``time.time()`` seconds). Thread-safe."""
        now = time.time()
        self._hub.put(Notice(id=notice_id or f"user/{reason}/{deadline:.0f}", source="user", reason=reason,
                             deadline=deadline, received_at=now))

    # -- saving ------------------------------------------------------------------------------------------
    def _record(self, step: int, state: Any, extra: dict[str, Any] | None, data: Any) -> tuple[dict[str, Any], Any]:
        """``(extra, position)`` of a save of ``step``, built once for every target that saves it: the user's
        ``extra`` with the ``reprieve`` record, and this process's encoded data position (None without one)."""
        agreed = self.agreement.target
        return self._records.build(step, state, extra, data, step_seconds=self._times.average,
                                   save_seconds=self.storage.last_save_seconds,
                                   notice=None if agreed is None else (agreed.notice.id, agreed.notice.source))

    def _final_save(self, step: int, state: Any, extra: dict[str, Any] | None, data: Any) -> None:
        target = self.agreement.target
        assert target is not None
        self._final = True
        self.loop.last = (step, time.perf_counter())  # the step is done: only its save is left
        deadline = target.deadline if target.deadline_known else None
        log.info("saving agreed step %d (notice %s, %s); deadline %s", step, target.notice.id,
                 target.notice.reason, "unknown" if deadline is None else f"in {deadline - time.time():.1f}s")
        maybe_stop_in_agreed_save(target.notice.id, self.config.attempt)
        timers = arm_deadline_timers(step, deadline, self.config.shutdown_timeout_seconds)
        restart = step != self._last_step  # a restart follows: its first commit does retention, and it can
        if restart:  # read this step from memory, not storage
            self.storage.defer_retention()
        memory = in_memory = False
        doomed = self.agreement.noticed_nodes | {target.notice.node}
        to_memory = agreed_to_memory(target.notice.reason, memory_on=self.memory is not None, restart=restart,
                                     noticed_node=target.notice.node, notices_to_memory=self.config.notice_to_memory)
        try:
            record = (self._record(step, state, extra, data) if to_memory or self.storage.last_saved != step
                      else None)
            if to_memory:
                assert record is not None
                resize = target.notice.reason in MEMORY_ONLY_REASONS
                in_memory = self._held_in_memory(step, record, state, notice=None if resize else (doomed, deadline))
            if record is not None and not in_memory and self.storage.last_saved != step:
                self.storage.save(step, state, *record, kind="final")
            if restart and self.memory is not None and not in_memory and self.memory.agreed_started != step:
                record = record or self._record(step, state, extra, data)
                memory = self.memory.beside_agreed(step, state, *record, deadline=deadline,
                                                   save_seconds=positive(self.storage.last_save_seconds) or 0.0)
            self.storage.confirm()
        except Exception as err:  # noqa: BLE001 - any failure of the agreed save: exit 1, loudly
            self._abort(f"agreed checkpoint at step {step} failed: {err!r}")
        finally:
            for t in timers:
                t.cancel()
        if restart and self.memory is not None:  # the exit waits only for what the restart reads in memory
            self.memory.leaving(step, doomed)
        if memory and self.memory is not None:
            self.memory.await_agreed(step, deadline)
        now = time.time()
        since_notice = now - target.notice.received_at
        self.metrics.set("reprieve_notice_to_commit_seconds", since_notice)
        decision = exit_decision(committed=True, now=now, deadline=deadline,
                                 restart_code=self.config.restart_exit_code, last_step=step == self._last_step)
        log_agreed_commit(step, decision, self.num_processes, since_notice, deadline, now)
        if decision.code is None:
            return
        self._teardown(RESTART, code=decision.code)
        log_agreed_exit(step, decision, self.config.restart_exit_code)
        self._exit_fn(decision.code)
        raise SystemExit(decision.code)  # exit_fn must not return: the loop must not go on past the agreed step

    def _held_in_memory(self, step: int, record: tuple[dict[str, Any], Any], state: Any, *,
                        notice: tuple[Collection[str | None], float | None] | None = None) -> bool:
        """The agreed step to the memory tier alone, a resize's (``notice`` None) or a notice's (``notice``: the
        noticed nodes and the deadline; :func:`reprieve.policy.agreed_to_memory`): True when every process holds
        it there, where it outlives the notice, so no storage save is needed; False: every process saves it to
        storage as for any notice. Every process publishes its verdict (with its node, its peer's and the nodes it
        heard noticed) through the coordination service, and process 0 alone decides from them
        (:func:`reprieve.memtier.decide.gang_outlives`) and publishes the decision: a verdict that came late is
        missing from the one decision, never from some processes' and not others'. The whole attempt is bounded
        so that a storage save still fits before a notice's deadline (:func:`memory_attempt_seconds`); where it
        cannot, this process's verdict is "no" at once, without a copy."""
        assert self.memory is not None
        save_s = positive(self.storage.last_save_seconds) or 0.0
        left = None if notice is None or notice[1] is None else notice[1] - time.time()
        budget = memory_attempt_seconds(left, save_s)
        start = time.monotonic()
        end = start + (budget or 0.0)
        if budget is None:
            log.info("agreed step %d: not to memory alone (%.1fs to the deadline, %.1fs needed): saving it to storage",
                     step, left, agreed_memory_margin(save_s) + MEMORY_ATTEMPT_MIN_S)
            own = Held()
        else:  # the copies' waits leave a third of the attempt, at most 1 s, for the verdicts and the decision
            own = self.memory.save_alone(step, state, *record, wait_s=RESIZE_MEMORY_WAIT_S,
                                         until=end - min(1.0, budget / 3),
                                         doomed=None if notice is None else notice[0])
        prefix = f"reprieve/agreed-memory/a{self.config.attempt}/s{step}/"
        mine: dict[str, Any] = own._asdict()
        if notice is not None:
            mine.update(self.memory.placement(), doomed=sorted(notice[0], key=lambda n: (n is None, n or "")))
        try:
            self.coordinator.set(f"{prefix}{self.process_id}", json.dumps(mine), overwrite=True)
            if self.process_id == 0:
                verdicts: dict[int, dict[str, Any]] = {}
                for p in range(self.num_processes):
                    try:
                        verdicts[p] = json.loads(self.coordinator.get(f"{prefix}{p}", max(0.001, end - time.monotonic())))
                    except CoordinationError:
                        break  # late: missing from the decision (gang_outlives: said nothing in time)
                reasons = gang_outlives(verdicts, self.num_processes, notice=notice is not None)
                missing, why = bool(reasons), "; ".join(f"process {p}: {w}" for p, w in sorted(reasons.items()))
                self.coordinator.set(f"{prefix}decision", json.dumps({"memory": not missing, "why": why}),
                                     overwrite=True)
            else:
                wait = max(0.001, end - time.monotonic()) + DECISION_SLACK_S
                decision = json.loads(self.coordinator.get(f"{prefix}decision", wait))
                missing, why = not decision.get("memory"), str(decision.get("why") or "")
        except CoordinationError as err:  # the storage save that follows meets the same service: it decides
            log.warning("agreed step %d: the memory decision could not be exchanged (%s)", step, err)
            missing, why = True, "no decision"
        if missing:
            log.info("agreed step %d: not held in memory where the restart reads it: %s: saving it to storage", step,
                     why)
            return False
        log.info("agreed step %d held in memory by all %d process(es): no storage save (%s)", step,
                 self.num_processes, "a resize" if notice is None else "every copy outlives the notices")
        return True

    # -- end -----------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Wait for the last save's commit, report it and leave the job (called when :meth:`steps` ends)."""
        self._teardown(FINISH)

    close = finish  # the name the Checkpointer-style shutdown has elsewhere

    def abandon(self) -> None:
        """Stop the runtime's threads without saving or leaving the job; also run at interpreter exit. After an
        error a peer's loss caused, the process ends at its exit (SIGABRT), before JAX's shutdown waits for the
        lost peer (:func:`reprieve.teardown.end_at_exit`)."""
        if self.phase.terminal:
            return
        in_flight = sys.exc_info()[1]  # None at interpreter exit: the uncaught exception is sys.last_value
        committed = self.storage.newest_committed()
        lost = self._await_lost_peer(in_flight or getattr(sys, "last_value", None), then=ending_at_exit(committed))
        if not lost:
            warn_abandoned(self.process_id, committed, self.config.restart_exit_code)
        self._teardown(ABANDON)
        if lost:
            end_at_exit(now=in_flight is None)

    def _await_lost_peer(self, exc: BaseException | None, then: str = "") -> tuple[int, ...]:
        wait = self._wait_lost_peer
        return () if wait is None else await_lost_peer(wait, self.process_id, exc, then=then)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """``with reprieve.init() as job:`` finishes the job on a normal exit (also after ``break``) and
        abandons it (no distributed shutdown, which would wait for the peers) on an exception."""
        if exc_type is None:
            self.finish()
            return
        code = getattr(exc, "code", None) if isinstance(exc, SystemExit) else None
        if code == self.config.restart_exit_code and self.phase != Phase.EXITING:
            warn_restart_code_without_save(self.process_id, code, self.storage.newest_committed())
        self.abandon()

    def _abort(self, why: str) -> NoReturn:
        log.critical("process %d: %s; exiting 1 (state NOT saved by this exit)", self.process_id, why)
        self._teardown(ABORT)
        self._exit_fn(1)
        raise SystemExit(1)

    def _teardown(self, how: Teardown, *, code: int | None = None) -> None:
        """The one way out of the job; ``how`` is a row of :data:`reprieve.lifecycle.TEARDOWNS`. ``code``: the
        exit code already decided (after the agreed save's commit), announced before the teardown begins."""
        if self.phase.terminal:
            return
        self.phase = how.phase
        self._leaving.announce(how, code)
        try:
            if how.wait_for_commit:
                self.storage.confirm()
        finally:
            self._leaving.close(how, current=self._current, committed=self.storage.committed,
                                tier=None if self.memory is None else self.memory.tier)
