"""The training-loop face of the runtime: ``Job.restore_or``, ``Job.steps``, ``Job.save``, ``Job.should_stop``.

A :class:`Job` ties the notice sources, the cross-process :class:`~reprieve.agreement.Agreement`, the
periodic :class:`~reprieve.policy.SavePolicy` and a :class:`Checkpointer` together. Per step the loop takes
one uncontended lock, reads a few attributes and dispatches one tiny probe of the state (:mod:`reprieve.finished`):
no RPC, no file system access, no wait. When the agreed final step
comes, :meth:`Job.save` saves it, waits until it is committed on every process, reports progress, shuts the
distributed client down and exits with ``REPRIEVE_RESTART_EXIT_CODE`` (or 1 if the deadline passed first).
Its phases and teardowns are :mod:`reprieve.lifecycle`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, Protocol, Self

from . import data as data_mod
from . import identity
from .abstract import abstract_of, abstract_problem, require
from .agreement import FINAL, Agreement, AgreementError
from .collective_error import collective_failed
from .compile_ahead import CompileAhead, LoweringCount
from .config import RuntimeConfig
from .coordination import Coordinator
from .exiting import exit_process
from .finished import FinishedSteps
from .lifecycle import ABANDON, ABORT, FINISH, RESTART, Phase, Teardown, exit_decision
from .metrics import Metrics
from .notice import Notice
from .notice_sources import NoticeHub
from .notice_sources import ignore_termination_signals as _ignore_termination_signals
from .policy import (
    MIN_FAILING_SECONDS,
    STORAGE,
    SavePolicy,
    classify_save_error,
    save_failure_verdict,
    should_save,
    time_save_due,
)
from .progress import LoopProgress, ProgressReporter

log = logging.getLogger(__name__)

STEP_EMA_WEIGHT = 0.1  # weight of the newest step in the step-time moving average
# Notice sources whose notice outlives the process that saved for it (a SIGTERM's id names the pod, not the event).
SOURCES_THAT_PERSIST = ("notice-file", "annotation")


AGREED_MEMORY_WAIT_S = 1.0  # the most an agreed save waits for its memory copy (and the peer's) after the commit
AGREED_MEMORY_BUSY_WAIT_S = 0.25  # ... and for a periodic copy still in the background before it starts its own


def agreed_memory_margin(save_seconds: float) -> float:
    """Seconds before the deadline below which the agreed save gets no memory copy beside it (pure): the copy
    competes with the storage save for the host, so it is made only with room for both twice over."""
    return 1.0 + 2.0 * max(0.0, save_seconds) + AGREED_MEMORY_WAIT_S


def _positive(value: Any) -> float | None:
    """``value`` as a float when it is a positive finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < float("inf") else None


def timing_of(record: Any) -> tuple[float | None, float | None]:
    """``(step_seconds, save_seconds)`` that the attempt which wrote a checkpoint measured (its ``reprieve``
    record's ``stepSeconds`` and ``saveSeconds``), each None when absent or not a positive finite number: a
    checkpoint written by an older runtime, or before any step or save was timed."""
    if not isinstance(record, dict):
        return None, None
    return _positive(record.get("stepSeconds")), _positive(record.get("saveSeconds"))


class Checkpointer(Protocol):
    """What a :class:`Job` needs from a checkpoint manager (``reprieve.checkpoint.CheckpointManager``).

    Optional, used when present: ``supports_process_extra = True`` with ``save(..., process_extra=)`` and a
    ``restore`` result carrying ``.process_extra`` (per-process data positions); ``set_commit_callback(f)``
    (``f(step)`` after every commit: metrics and the progress annotation at once, not at the next save).
    """

    last_save_seconds: float | None

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None: ...

    def wait(self) -> None: ...

    def latest_step(self) -> int | None: ...

    def restore(self, abstract_state: Any, *, step: int | None = None) -> tuple[int, Any, dict[str, Any]]: ...

    def close(self) -> None: ...


class Restored(tuple):  # type: ignore[type-arg]
    """What :meth:`Job.restore_or` returns: unpacks as ``(state, first_step)``; also carries ``data`` (this
    process's saved data position, None without one), ``extra`` (the checkpoint's ``extra``) and ``step``
    (the restored step, None on a fresh start)."""

    data: Any
    extra: dict[str, Any]
    step: int | None

    def __new__(cls, state: Any, first_step: int, *, data: Any = None, extra: dict[str, Any] | None = None,
                step: int | None = None) -> Self:
        self = super().__new__(cls, (state, first_step))
        self.data, self.extra, self.step = data, extra or {}, step
        return self


class Job:
    """One process's handle on a preemption-safe training job. Build it with :func:`reprieve.init`."""

    min_failing_seconds = MIN_FAILING_SECONDS  # failed saves are fatal only after this long (reprieve.policy)

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
        on_first_step: Callable[[int], None] | None = None,
        on_exiting: Callable[[int], None] | None = None,
        wait_lost_peer: Callable[[str], tuple[int, ...]] | None = None,
    ) -> None:
        self.config = config
        self.coordinator = coordinator
        self.checkpointer = checkpointer
        self.agreement = agreement
        self.policy = policy or SavePolicy(interval_steps=config.checkpoint_interval_steps,
                                           interval_seconds=config.checkpoint_interval_seconds)
        self.metrics = metrics or Metrics()
        self.phase = Phase.READY
        self._hub = hub
        self._progress = progress
        self._closers = closers or []
        self._exit_fn = exit_fn
        self._shutdown_distributed = shutdown_distributed
        self._on_first_step = on_first_step  # reprieve-run pre-warms the next attempt once it is called
        self._on_exiting = on_exiting  # reprieve-run reports the decided exit code before the teardown
        self._wait_lost_peer = wait_lost_peer  # reprieve.peers: which peer went silent, once a collective failed
        # where the loop is: all written and read by the training thread only
        self._last_step: int | None = None  # the job's last step; None: not known (a loop over a loader)
        self._current = -1  # the furthest step the loop entered
        self._decided = -1  # the last step save() or should_stop() decided about
        self._stop_step: int | None = None  # should_stop() returned True for it
        self._step_ema: float | None = None
        self._skip_first_step = True  # an attempt's first step holds its compilation: never in the EMA
        self.loop = LoopProgress()  # read by the progress reporter and the metrics exporter's threads
        self.finished = FinishedSteps()  # the last step whose results exist (a survivor says it: reprieve.finished)
        self._last_save_at = time.monotonic()  # process 0's clock for the time-based interval
        # saves: _last_saved started, _pending not yet confirmed; _committed is also advanced by on_commit
        self._last_saved: int | None = None
        self._pending: int | None = None
        self._committed: int | None = None
        self._final = False  # the agreed save has begun
        self._failed_saves = 0  # storage saves failed in a row (REPRIEVE_MAX_FAILED_SAVES bounds it)
        self._failing_since = 0.0  # monotonic: when the first of them began
        self._pending_started = 0.0  # monotonic: when the save _pending began
        self._state_checked = False  # the first save() checks the state's leaves (checkpointer.check_state)
        self._run_cache: tuple[Any, dict[str, Any]] | None = None  # (tree and shapes, their run record)
        self._ahead: list[CompileAhead] = []  # compile_ahead() threads; steps() waits for them
        # lowerings JAX did in the training thread during the first step: (count, seconds); None until known
        self.first_step_lowerings: tuple[int, float] | None = None
        self._first_lowerings: LoweringCount | None = None  # counting while the first step runs
        hook = getattr(checkpointer, "set_commit_callback", None)
        if callable(hook):
            hook(self.on_commit)
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
        return self._committed

    @property
    def step_seconds(self) -> float | None:
        """Moving average of the time between steps yielded by :meth:`steps`."""
        return self._step_ema

    # -- restore -----------------------------------------------------------------------------------------
    def restore_or(self, init_fn: Callable[[], Any], abstract: Any = None, *, data: Any = None,
                   reshard_data: Callable[[list[Any], int, int], Any] | None = None) -> Restored:
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
        process alike) means "no checkpoint yet".
        """
        if abstract is None:
            state = init_fn()
            target = abstract_of(state)
        else:
            state, target = None, abstract_of(abstract)
            require(abstract_problem(target))  # on the first run too, not only at the first restart
        ours = identity.structure(target)

        def check(record: Any, saved_structure: Any, where: str) -> None:
            problem = identity.mismatch(record.get("run") if isinstance(record, dict) else None,
                                        self.config.run_id, ours, saved_structure, where)
            if problem:
                raise identity.RunMismatchError(f"restore_or: {problem}")

        hook = getattr(self.checkpointer, "set_restore_check", None)
        if callable(hook):
            hook(check)  # before any array is read, on every process alike
        t0 = time.perf_counter()
        try:
            # step=None: the checkpointer picks the latest complete checkpoint once for all processes
            result = self.checkpointer.restore(target, step=None)
        except FileNotFoundError:
            log.info("no checkpoint under %s: starting at step 0", self.config.checkpoint_uri)
            if state is None:
                state = init_fn()
                require(abstract_problem(target, abstract_of(state)))
            self.finished.prepare(state)
            return Restored(state, 0)
        step, restored, extra = result
        if not callable(hook):  # a checkpointer without the hook: checked after the fact
            check(extra.get("reprieve"), None, f"{self.config.checkpoint_uri} step {step}")
        value = data_mod.value_for_process(getattr(result, "process_extra", None), self.process_id,
                                           self.num_processes, reshard_data)
        if data is not None:
            if value is None:
                log.warning("restored step %d has no data position: the data pipeline starts from its beginning",
                            step)
            data_mod.restore_into(data, value)
        # A restore from memory leaves storage's newest commit where it was: that, not the memory step, is what
        # this job reports as committed (status.lastCheckpointStep is storage's; status.memoryStep the tier's).
        self._last_saved, self._committed = step, getattr(result, "storage_step", step)
        self._seed_estimates(extra.get("reprieve"))
        raw_record = extra.get("reprieve")
        written: dict[str, Any] = raw_record if isinstance(raw_record, dict) else {}
        if written.get("noticeSource") in SOURCES_THAT_PERSIST and written.get("notice"):
            # The notice this checkpoint was the agreed save of is still in the file (on a laptop nobody clears
            # it) or on the kept pod: it must not stop the run it already stopped once.
            self.agreement.handled(str(written["notice"]), step)
        self.loop.restore_seconds = seconds = time.perf_counter() - t0
        self.loop.restored_from = getattr(result, "restored_from", None)  # memory tier hook: where it read from
        self.metrics.observe("reprieve_restore_seconds", seconds)
        self.metrics.set("reprieve_last_committed_step", -1 if self._committed is None else self._committed)
        run = written.get("run")
        run_id = run.get("id") if isinstance(run, dict) else None
        log.info("restored step %d from %s: resuming at step %d (saved by attempt %s%s)", step,
                 self.config.checkpoint_uri, step + 1, written.get("attempt", "?"),
                 "" if run_id is None else f" of run {run_id!r}")
        user_extra = {k: v for k, v in extra.items() if k != "reprieve"}
        self.finished.prepare(restored)
        return Restored(restored, step + 1, data=value, extra=user_extra, step=step)

    def _seed_estimates(self, record: Any) -> None:
        """Start the countdown's step and save times from what the attempt that wrote the restored checkpoint
        measured. Without them a notice that arrives before this attempt timed a step (a restart onto a node
        that is already doomed, a second notice right after a restart) must plan "save at the earliest step"
        and exit at once, though its deadline may leave tens of seconds of training. The first step of this
        attempt (compilation) does not enter the moving average; the next ones replace the seed, and a plan
        made with it is agreed again if the steps turn out slower (``countdown.behind_plan``)."""
        step_s, save_s = timing_of(record)
        if step_s is not None:
            self._step_ema = step_s
            self.loop.step_seconds = step_s
        self.agreement.report(step_seconds=step_s, save_seconds=save_s)
        if step_s is not None or save_s is not None:
            log.info("estimates from the checkpoint's attempt: step %s s, save %s s",
                     "?" if step_s is None else f"{step_s:.3f}", "?" if save_s is None else f"{save_s:.3f}")

    def compile_ahead(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Lower and compile the ``jax.jit`` function ``fn`` for ``args`` in a background thread, so that it
        runs beside :meth:`restore_or` instead of in the first step after it; :meth:`steps` waits for it before
        the first step. Call it after the mesh exists and before the restore, in the mesh context the loop calls
        ``fn`` in, with what the first call will get: arrays or ``jax.ShapeDtypeStruct`` with the real
        arguments' shardings (``abstract``, as given to :meth:`restore_or`). A failure is logged and the step
        compiles at its first call as it would have (docs/restarts.md, "Compiling the step while the state is
        restored")."""
        if self.phase != Phase.READY:
            raise RuntimeError(f"Job.compile_ahead: the job is {self.phase.value}; call it before Job.steps()")
        self._ahead.append(CompileAhead(fn, args, kwargs, on_compiled=self.finished.prepare_outputs))

    # -- loop ------------------------------------------------------------------------------------------
    def steps(self, start: int, total: int | None = None) -> Iterator[int]:
        """Yield ``start .. total-1`` (``total=None``: without end, for a loop that stops when its data does).
        Call :meth:`save` with every step (it decides whether to save).

        When the agreed preemption step has been saved and committed the process exits inside
        :meth:`save`; when the loop ends normally the last save is committed and the job finished. A loop
        with no ``total`` ends with ``job.save(step, state, force=True)`` for its last step and ``finish()``
        (or a ``with`` block), see docs/runtime.md.
        """
        past = identity.past_total(start, total)
        if past is not None:
            raise ValueError(f"Job.steps: {past}")
        if start < 0:
            raise ValueError(f"Job.steps: need 0 <= start <= total, got start={start}, total={total}")
        if total is not None and start == total and start > 0:
            log.info("the checkpoint holds the last step (%d of total=%d): nothing left to train", start - 1, total)
        self._transition(Phase.TRAINING)
        if not (self.policy.interval_steps or self.policy.interval_seconds):
            log.info("periodic saves are off: only the last step and the agreed save of a notice are saved, so "
                     "an exception, Ctrl-C or kill -9 loses every step since %s; set "
                     "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS (e.g. 600) or REPRIEVE_CHECKPOINT_INTERVAL_STEPS to save "
                     "periodically", "the start" if start == 0 else f"step {start - 1}")
        self._last_step = None if total is None else total - 1
        self.agreement.begin(start, self._last_step)
        memory_begin = getattr(self.checkpointer, "memory_begin", None)  # memory tier hook (reprieve.memtier)
        if memory_begin is not None:  # the storage interval caps the memory schedule's
            memory_begin(start, storage_steps=self.policy.interval_steps,
                         storage_seconds=self.policy.interval_seconds)
        self._last_save_at = time.monotonic()
        for ahead in self._ahead:
            ahead.wait()
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
                    self._first_step_done(step - 1)  # reprieve-run starts the next attempt's process now
                    if self._progress is not None:
                        self._progress.first_step()
                self._observe_step(now - previous_t, step)
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
            self._observe_step(now - previous_t, step)
        self._first_step_lowered()  # a loop of one step (or none) ends here
        if total is not None and total > start and (self._decided != total - 1 or self._stop_step == total - 1):
            self._decide_or_exit(total - 1)
        self.finish()

    def _first_step_lowered(self) -> None:
        """Stop counting the training thread's lowerings (once): ``first_step_lowerings``, logged if any."""
        counter, self._first_lowerings = self._first_lowerings, None
        if counter is None:
            return
        count, seconds = counter.stop()
        if self.loop.first is None:  # no step was taken
            return
        self.first_step_lowerings = (count, seconds)
        if count:
            log.info("the first step lowered %d program(s) in %.2fs", count, seconds)

    def _first_step_done(self, step: int) -> None:
        if self._on_first_step is not None:
            hook, self._on_first_step = self._on_first_step, None
            try:
                hook(step)
            except Exception as err:  # noqa: BLE001 - a report, never a reason to stop training
                log.debug("first-step hook failed: %s", err)

    def _transition(self, phase: Phase) -> None:
        if self.phase.terminal:
            raise RuntimeError(f"job is {self.phase.value}: cannot become {phase.value}")
        if phase == Phase.TRAINING and self.phase == Phase.TRAINING:
            raise RuntimeError("Job.steps() is already running; a job trains in one loop")
        self.phase = phase

    def _observe_step(self, seconds: float, step: int) -> None:
        self.metrics.pending_steps.append(seconds)  # a deque: observed into the histogram at scrape time
        if self._skip_first_step:  # compilation: the seeded estimate (or none) stands until a real step is timed
            self._skip_first_step = False
            return
        ema = self._step_ema
        self._step_ema = seconds if ema is None else ema + STEP_EMA_WEIGHT * (seconds - ema)
        self.loop.step_seconds = self._step_ema
        self.agreement.report(step_seconds=self._step_ema)
        if step % 16 == 0:  # the exporter needs no more; a metrics update costs a lock
            self.metrics.set("reprieve_step_average_seconds", self._step_ema)

    def _decide(self, step: int) -> str | None:
        try:
            return self.agreement.decide(step)
        except AgreementError as err:
            self._await_lost_peer(err)  # the service gone (process 0 died): named before this exit, not after
            self._abort(f"agreement failed: {err}")

    def _decide_or_exit(self, step: int) -> None:
        if self._decide(step) == FINAL and self._last_saved != step:
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
        Returns True when a save was started. At the agreed final step it does not return: it saves,
        waits for the commit on all processes, and exits (restart code, or 1 past the deadline).
        """
        self._current = max(self._current, step)
        finished_at = time.perf_counter()  # the step is done (the user's code computed it before this call)
        self.finished.note(step, state, finished_at)  # ... or dispatched it: a probe says when it is computed
        self._first_step_done(step)
        if not self._state_checked:
            self._state_checked = True
            check = getattr(self.checkpointer, "check_state", None)
            if callable(check):  # a leaf no save can hold is reported at the first call, not at the first save
                check(state)
        kind = self._decide(step)
        self._decided = step
        if kind == FINAL:
            self.loop.mark_saved(step, "storage", finished_at)
            self._final_save(step, state, extra, data)
            return True
        due = kind is not None or force or should_save(step, policy=self.policy, last_saved=self._last_saved,
                                                       last_step=self._last_step)
        started = due and self._last_saved != step
        if started:
            self.loop.mark_saved(step, "storage", finished_at)
            self._start_save(step, state, extra, data, kind or ("forced" if force else "periodic"))
        # after a save of this step started (it restarts the interval's clock), so one interval asks for one save
        if self.process_id == 0 and time_save_due(policy=self.policy, now=time.monotonic(),
                                                  last_save_at=self._last_save_at):
            self.agreement.request_save("interval")  # a no-op while the previous request is being agreed
        # memory tier hook (reprieve.memtier): its own schedule, never instead of a storage save
        memory_due = getattr(self.checkpointer, "memory_due", None)
        if kind is None and memory_due is not None and memory_due(step, self._step_ema):
            self.loop.mark_saved(step, "memory", finished_at)
            self._memory_save(step, state, extra, data)
        return started

    def notify(self, reason: str, deadline: float, *, notice_id: str | None = None) -> None:
        """Report a notice from user code (``deadline`` in ``time.time()`` seconds). Thread-safe."""
        now = time.time()
        self._hub.put(Notice(id=notice_id or f"user/{reason}/{deadline:.0f}", source="user", reason=reason,
                             deadline=deadline, received_at=now))

    # -- saving ------------------------------------------------------------------------------------------
    def _start_save(self, step: int, state: Any, extra: dict[str, Any] | None, data: Any, kind: str) -> None:
        self._confirm_pending(retry_next=kind)
        record: dict[str, Any] = {"reprieve": {"step": step, "kind": kind, "attempt": self.config.attempt,
                                               "run": self._run_record(state)}}
        # what this attempt measured: the next attempt's countdown starts from it (_seed_estimates)
        save_s = getattr(self.checkpointer, "last_save_seconds", None)
        for key, value in (("stepSeconds", _positive(self._step_ema)), ("saveSeconds", _positive(save_s))):
            if value is not None:
                record["reprieve"][key] = round(value, 4)
        target = self.agreement.target
        if target is not None:
            record["reprieve"]["notice"] = target.notice.id
            record["reprieve"]["noticeSource"] = target.notice.source
        kwargs: dict[str, Any] = {}
        if data is not None:
            if not getattr(self.checkpointer, "supports_process_extra", False):
                raise TypeError(f"job.save(data=...): the checkpointer {type(self.checkpointer).__name__} does not "
                                "store per-process data positions (supports_process_extra); use the default "
                                "CheckpointManager or OrbaxCheckpointer")
            kwargs["process_extra"] = data_mod.encode(
                data, f"job.save(step {step}, data=...): process {self.process_id}'s data position")
        t0 = time.perf_counter()
        self.checkpointer.save(step, state, extra={**(extra or {}), **record}, **kwargs)
        self._blocked(time.perf_counter() - t0)
        self._last_saved = self._pending = step
        self._last_save_at = self._pending_started = time.monotonic()
        self.metrics.inc("reprieve_saves_total", kind=kind)
        log.debug("save of step %d started (%s)", step, kind)

    def _memory_save(self, step: int, state: Any, extra: dict[str, Any] | None, data: Any) -> bool:
        """A copy for the memory tier (``reprieve.memtier``): the loop waits only for the host copy. True when a
        copy was started (the tier skips one while the previous copy is still in the background)."""
        record: dict[str, Any] = {"step": step, "kind": "memory", "attempt": self.config.attempt,
                                  "run": self._run_record(state)}
        save_s = getattr(self.checkpointer, "last_save_seconds", None)
        for key, value in (("stepSeconds", _positive(self._step_ema)), ("saveSeconds", _positive(save_s))):
            if value is not None:
                record[key] = round(value, 4)
        position = None if data is None else data_mod.encode(
            data, f"job.save(step {step}, data=...): process {self.process_id}'s data position")
        t0 = time.perf_counter()
        started = bool(self.checkpointer.memory_save(step, state, extra={**(extra or {}), "reprieve": record},  # type: ignore[attr-defined]
                                                     process_extra=position))
        if started:
            self.metrics.inc("reprieve_saves_total", kind="memory")
        self._blocked(time.perf_counter() - t0)
        return started

    def _run_record(self, state: Any) -> dict[str, Any]:
        """The run identity this save records (``reprieve.identity``). Key paths cost microseconds per leaf, so
        the record is kept for as long as the state keeps its tree and shapes (the agreed save is on the
        restart path)."""
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(state)
        key = (treedef, tuple(getattr(leaf, "shape", None) for leaf in leaves))
        if self._run_cache is None or self._run_cache[0] != key:
            self._run_cache = (key, identity.record(self.config.run_id, identity.structure(state)))
        return self._run_cache[1]

    def on_commit(self, step: int) -> None:
        """The checkpointer's commit callback (any thread): metrics and a rate-limited progress report."""
        if self._committed is None or step > self._committed:
            self._committed = step
        self._record_commit(step)

    def _confirm_pending(self, *, retry_next: str | None = None) -> None:
        """Wait for the in-flight save (if any), then record it as committed. ``retry_next``: the kind of the save
        about to start, which retries a failed one (:meth:`_save_failed`); None: its failure is raised."""
        if self._pending is None:
            return
        t0 = time.perf_counter()
        try:
            self.checkpointer.wait()
        except Exception as err:
            self._blocked(time.perf_counter() - t0)
            failed, self._pending = self._pending, None
            if retry_next is None:
                raise
            self._save_failed(failed, err, agreed_next=retry_next == "final")
            return
        self._blocked(time.perf_counter() - t0)
        self._committed, self._pending = max(self._pending, self._committed or -1), None
        self._failed_saves = self.loop.failed_saves = 0
        self._record_commit(self._committed)

    def _save_failed(self, step: int, err: Exception, *, agreed_next: bool) -> None:
        """The save of ``step`` failed and a next save is about to start: log, count and report it, and train on
        unless :func:`reprieve.policy.save_failure_verdict` says it is fatal (then raise, as without this rule).
        Every process sees the same failure at the same save, so all decide alike."""
        if self._failed_saves == 0:
            self._failing_since = self._pending_started
        self._failed_saves += 1
        self.loop.failed_saves = self._failed_saves
        cause = f"{type(err).__name__}: {err}"
        self.loop.last_save_error = f"step {step}: {cause}"[:500]
        self.metrics.inc("reprieve_save_failures_total")
        kind = classify_save_error(err)
        fatal = save_failure_verdict(kind, self._failed_saves, self.config.max_failed_saves, agreed_next=agreed_next,
                                     failing_seconds=time.monotonic() - self._failing_since,
                                     min_failing_seconds=self.min_failing_seconds)
        if self._progress is not None:
            self._progress.report(self._current, -1 if self._committed is None else self._committed)
        if fatal is None:
            log.error("checkpoint save of step %d failed (%d in a row, fatal at REPRIEVE_MAX_FAILED_SAVES=%d over "
                      "%.0f s or more): %s; training goes on, the next save retries (the last committed step is %s)",
                      step, self._failed_saves, self.config.max_failed_saves, self.min_failing_seconds, cause,
                      "none" if self._committed is None else self._committed)
            return
        log.critical("checkpoint save of step %d failed: %s; %s", step, cause, fatal)
        if kind == STORAGE:  # the bound: say how many and why
            raise RuntimeError(f"checkpoint save of step {step} failed ({cause}): {fatal}") from err
        raise err  # fenced, or not the storage: as it came

    def _blocked(self, seconds: float) -> None:
        """The training loop waited ``seconds`` for a save (the copy off the devices, a commit). Only waits
        between steps count as checkpoint badput: the agreed save and the last commit come after the last
        reported step, where the operator counts them as restart gap (``docs/goodput.md``)."""
        self.metrics.observe("reprieve_save_blocking_seconds", seconds)
        if self.phase == Phase.TRAINING and not self._final:
            self.loop.save_blocking_seconds += seconds

    def _record_commit(self, step: int) -> None:
        # The measured save time feeds the countdown as soon as a save commits, not at the next save: a
        # notice between two periodic saves must not plan with the pessimistic default estimate.
        seconds = getattr(self.checkpointer, "last_save_seconds", None)
        if seconds is not None:
            self.agreement.report(save_seconds=seconds)
            self.metrics.observe("reprieve_save_to_commit_seconds", seconds)
        self.metrics.set("reprieve_last_committed_step", step)
        if self._progress is not None:
            self._progress.report(self._current, step)

    def _final_save(self, step: int, state: Any, extra: dict[str, Any] | None, data: Any) -> None:
        target = self.agreement.target
        assert target is not None
        self._final = True
        self.loop.last = (step, time.perf_counter())  # the step is done: only its save is left
        deadline = target.deadline if target.deadline_known else None
        log.info("saving agreed step %d (notice %s, %s); deadline %s", step, target.notice.id,
                 target.notice.reason, "unknown" if deadline is None else f"in {deadline - time.time():.1f}s")
        timers = _arm_deadline_timers(step, deadline, self.config.shutdown_timeout_seconds)
        defer = getattr(self.checkpointer, "defer_retention", None)
        if callable(defer) and step != self._last_step:  # a restart follows: its first commit does retention
            defer()
        memory = False
        try:
            if self._last_saved != step:
                self._start_save(step, state, extra, data, "final")
            if step != self._last_step:  # a restart follows: it can read this step from memory, not storage
                memory = self._agreed_memory_copy(step, state, extra, data, deadline)
            self._confirm_pending()
        except Exception as err:  # noqa: BLE001 - any failure of the agreed save: exit 1, loudly
            self._abort(f"agreed checkpoint at step {step} failed: {err!r}")
        finally:
            for t in timers:
                t.cancel()
        if memory:
            self._await_agreed_memory_copy(step, deadline)
        now = time.time()
        since_notice = now - target.notice.received_at
        self.metrics.set("reprieve_notice_to_commit_seconds", since_notice)
        decision = exit_decision(committed=True, now=now, deadline=deadline,
                                 restart_code=self.config.restart_exit_code, last_step=step == self._last_step)
        if decision.late:
            log.warning("agreed checkpoint at step %d %s: still exiting as saved; give the job a longer "
                        "notice window (spec.preemption.noticeSeconds) or a cheaper save", step, decision.reason)
        else:
            log.info("agreed checkpoint at step %d committed on all %d process(es), %.2fs after the notice%s", step,
                     self.num_processes, since_notice, "" if deadline is None else
                     f", {deadline - now:.1f}s before the deadline")
        if decision.code is None:
            log.info("agreed checkpoint at step %d %s", step, decision.reason)
            return
        self._teardown(RESTART, code=decision.code)
        log.info("exiting with code %d: %s", decision.code,
                 f"the agreed checkpoint of step {step} is committed, restart wanted (REPRIEVE_RESTART_EXIT_CODE)"
                 if decision.code == self.config.restart_exit_code else
                 f"the agreed checkpoint of step {step} {decision.reason}")
        self._exit_fn(decision.code)
        raise SystemExit(decision.code)  # exit_fn must not return: the loop must not go on past the agreed step

    def _agreed_memory_copy(self, step: int, state: Any, extra: dict[str, Any] | None, data: Any,
                            deadline: float | None) -> bool:
        """With a memory tier, the agreed step is also copied to memory (and the peer) beside its storage save, so
        the restart that follows restores it from the pods' memory instead of reading storage back (docs/memory.md,
        "After a notice"). Never instead of the storage save, and skipped when the deadline is too close to
        afford a second host copy. True when a copy was started."""
        memory_save = getattr(self.checkpointer, "memory_save", None)
        memory_wait = getattr(self.checkpointer, "memory_wait", None)
        if not callable(memory_save) or not callable(memory_wait):
            return False
        save_s = _positive(getattr(self.checkpointer, "last_save_seconds", None)) or 0.0
        if deadline is not None and deadline - time.time() < agreed_memory_margin(save_s):
            log.info("agreed step %d: no memory copy beside the storage save (%.1fs to the deadline)", step,
                     deadline - time.time())
            return False
        if not memory_wait(AGREED_MEMORY_BUSY_WAIT_S):  # a periodic copy still in the background (a slow peer)
            log.info("agreed step %d: no memory copy beside the storage save (the previous copy is still being "
                     "written or sent)", step)
            return False
        try:
            return self._memory_save(step, state, extra, data)
        except Exception as err:  # noqa: BLE001 - the storage save is the guarantee: a memory copy never fails it
            log.warning("agreed step %d: the memory copy beside the storage save failed (%s: %s); the restart reads "
                        "storage", step, type(err).__name__, err)
            return False

    def _await_agreed_memory_copy(self, step: int, deadline: float | None) -> None:
        """Wait (bounded) for the agreed step's memory copy to be committed here and at the peer: the next
        attempt's restore round, which may start as soon as this process announces its exit, sees it then."""
        limit = AGREED_MEMORY_WAIT_S if deadline is None else max(0.0, min(AGREED_MEMORY_WAIT_S,
                                                                          deadline - time.time() - 1.0))
        t0 = time.perf_counter()
        done = self.checkpointer.memory_wait(limit)  # type: ignore[attr-defined]
        log.info("agreed step %d: memory copy %s %.2fs after the storage commit", step,
                 "committed" if done else "not finished (the restart reads storage where it lacks it)",
                 time.perf_counter() - t0)

    # -- end -----------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Wait for the last save's commit, report it and leave the job (called when :meth:`steps` ends)."""
        self._teardown(FINISH)

    close = finish  # the name the Checkpointer-style shutdown has elsewhere

    def abandon(self) -> None:
        """Stop the runtime's threads without saving or leaving the job; also run at interpreter exit."""
        if not self.phase.terminal:
            log.warning("process %d: the runtime is closed without finishing job.steps() (an exception, a break or "
                        "sys.exit): nothing is saved by this exit (the last checkpoint is step %s); an exit with "
                        "the restart code %d from here is not a saved preemption", self.process_id,
                        "none" if self._committed is None else self._committed, self.config.restart_exit_code)
            self._await_lost_peer(sys.exc_info()[1] or getattr(sys, "last_value", None))
        self._teardown(ABANDON)

    def _await_lost_peer(self, exc: BaseException | None) -> None:
        """A JAX runtime error ends the loop (a collective failed: a peer's process died and its connections were
        reset), or the agreement failed (the coordination service, or a peer, is gone): before this process ends,
        report the peer the error names and let the peer watch name the silent peer, so the exit is reported as
        that peer's loss, not as a failure of this process (``docs/contract.md``, "Peer lost")."""
        if self._wait_lost_peer is None or not (collective_failed(exc) or isinstance(exc, AgreementError)):
            return
        lost = self._wait_lost_peer(str(exc))
        if lost:
            log.warning("process %d: the step failed (%s) and process(es) %s went silent: this exit is their loss",
                        self.process_id, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
                        ", ".join(map(str, lost)))

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
            # sys.exit(<restart code>) in the program's own code: it reads as a saved preemption and is not one
            log.critical("process %d: sys.exit(%d) without an agreed save: %d is REPRIEVE_RESTART_EXIT_CODE, which "
                         "says 'state saved, restart me', but nothing was saved by this exit (the last checkpoint "
                         "is step %s). reprieve-run reports it as not agreed; let job.save() exit at the agreed "
                         "step instead", self.process_id, code, code,
                         "none" if self._committed is None else self._committed)
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
        if how.ignore_signals:
            _ignore_termination_signals()  # from here the process ends with the decided code, whatever comes
            if code is not None and self._on_exiting is not None:
                # The supervisor reports the code to the operator now: the next attempt's assignment is decided
                # while this process still leaves the job and ends (~0.15-0.25 s); nothing of it starts in this
                # pod before this process is gone.
                try:
                    self._on_exiting(code)
                except Exception as err:  # noqa: BLE001 - a report, never a reason not to exit
                    log.debug("exit announcement failed: %s", err)
        try:
            if how.wait_for_commit:
                self._confirm_pending()
        finally:
            if self._progress is not None:
                if how.report_progress:
                    self._progress.report(self._current, -1 if self._committed is None else self._committed,
                                          force=True, timeout_s=2.0)
                self._progress.close()
            for closer in self._closers:
                try:
                    closer()
                except Exception as err:  # noqa: BLE001 - closing must go on
                    log.warning("closing %r failed: %s", closer, err)
            self._hub.close()
            # Without a distributed shutdown (which cancels the watcher's pending get) wait it out: a thread
            # still inside the coordination client at interpreter exit aborts the process.
            self.agreement.close(timeout_s=0.0 if how.leave_distributed else self.agreement.poll_s + 1.0)
            if how.close_checkpointer:
                try:
                    self.checkpointer.close()
                except Exception as err:  # noqa: BLE001 - closing must go on
                    log.warning("closing the checkpointer failed: %s", err)
            self.metrics.close()
            if how.leave_distributed and self._shutdown_distributed:
                self.coordinator.shutdown()
            if how.leave_distributed and self.num_processes > 1:
                self.agreement.join(2.0)
                join = getattr(self.checkpointer, "join_threads", None)  # the memory tier's schedule watcher
                if callable(join):
                    join(2.0)


def _arm_deadline_timers(step: int, deadline: float | None, guard_s: float) -> list[threading.Timer]:
    """At the deadline: a loud log. ``guard_s`` later, still not committed: hard exit 1 (a hung commit)."""
    if deadline is None:
        return []
    left = max(0.0, deadline - time.time())

    def loud() -> None:
        log.critical("deadline passed before the agreed checkpoint at step %d was committed", step)

    def hard() -> None:
        import os

        log.critical("agreed checkpoint at step %d still not committed %.0fs after the deadline: exit 1",
                     step, guard_s)
        logging.shutdown()
        os._exit(1)

    timers = [threading.Timer(left, loud), threading.Timer(left + guard_s, hard)]
    for t in timers:
        t.daemon = True
        t.start()
    return timers
