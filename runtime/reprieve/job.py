"""The training-loop face of the runtime: ``Job.steps``, ``Job.save``, ``Job.should_stop``, ``Job.restore_or``.

A :class:`Job` ties the notice sources, the cross-process :class:`~reprieve.agreement.Agreement`, the
periodic :class:`~reprieve.policy.SavePolicy` and a :class:`Checkpointer` together. Per step the loop takes
one uncontended lock and reads a few attributes: no RPC, no file system access. When the agreed final step
comes, :meth:`Job.save` saves it, waits until it is committed on every process, reports progress, shuts the
distributed client down and exits with ``REPRIEVE_RESTART_EXIT_CODE`` (or 1 if the deadline passed first).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, Protocol, Self, cast

from .agreement import EARLY, FINAL, Agreement, AgreementError
from .config import RuntimeConfig
from .coordination import Coordinator
from .kube import ProgressReporter
from .metrics import Metrics
from .notice import Notice
from .notice_sources import NoticeHub
from .policy import SavePolicy, should_save

log = logging.getLogger(__name__)

STEP_EMA_WEIGHT = 0.1  # weight of the newest step in the step-time moving average


class Checkpointer(Protocol):
    """What a :class:`Job` needs from a checkpoint manager (``reprieve.checkpoint.CheckpointManager``)."""

    last_save_seconds: float | None

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None: ...

    def wait(self) -> None: ...

    def latest_step(self) -> int | None: ...

    def restore(self, abstract_state: Any, *, step: int | None = None) -> tuple[int, Any, dict[str, Any]]: ...

    def close(self) -> None: ...


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
        exit_fn: Callable[[int], Any] = sys.exit,
        shutdown_distributed: bool = True,
    ) -> None:
        self.config = config
        self.coordinator = coordinator
        self.checkpointer = checkpointer
        self.agreement = agreement
        self.policy = policy or SavePolicy(interval_steps=config.checkpoint_interval_steps)
        self.metrics = metrics or Metrics()
        self._hub = hub
        self._progress = progress
        self._closers = closers or []
        self._exit_fn = exit_fn
        self._shutdown_distributed = shutdown_distributed
        self._last_step: int | None = None
        self._last_saved: int | None = None
        self._pending: int | None = None  # saved, commit not yet confirmed
        self._committed: int | None = None
        self._current = -1
        self._decided = -1  # last step save() or should_stop() decided about
        self._stop_step: int | None = None  # should_stop() returned True for it
        self._step_ema: float | None = None
        self._closed = False

    @property
    def process_id(self) -> int:
        return self.coordinator.process_id

    @property
    def num_processes(self) -> int:
        return self.coordinator.num_processes

    @property
    def step_seconds(self) -> float | None:
        """Moving average of the time between steps yielded by :meth:`steps`."""
        return self._step_ema

    # -- restore -----------------------------------------------------------------------------------------
    def restore_or(self, init_fn: Callable[[], Any], abstract: Any = None) -> tuple[Any, int]:
        """``(state, first_step)``: the latest checkpoint restored, or ``(init_fn(), 0)`` when there is none.

        Without ``abstract``, ``init_fn()`` always runs: its result gives the structure, shapes, dtypes and
        shardings to restore onto. With ``abstract`` (the state's tree of ``jax.ShapeDtypeStruct`` with
        ``sharding=``, or of arrays), ``init_fn`` runs only when there is no checkpoint yet: a restart neither
        pays for initialisation nor holds a fresh copy of the state beside the restored one in device memory.
        The checkpointer's ``restore(step=None)`` raising ``FileNotFoundError`` (on every process alike) means
        "no checkpoint yet".
        """
        if abstract is None:
            state = init_fn()
            target = _abstract(state)
        else:
            state, target = None, _abstract(abstract)
            _require(abstract_problem(target))  # on the first run too, not only at the first restart
        try:
            # step=None: the checkpointer picks the latest complete checkpoint once for all processes
            step, restored, _extra = self.checkpointer.restore(target, step=None)
        except FileNotFoundError:
            log.info("no checkpoint under %s: starting at step 0", self.config.checkpoint_uri)
            if state is None:
                state = init_fn()
                _require(abstract_problem(target, _abstract(state)))
            return state, 0
        self._last_saved = self._committed = step
        self.metrics.set("reprieve_last_committed_step", step)
        log.info("restored step %d from %s: resuming at step %d", step, self.config.checkpoint_uri, step + 1)
        return restored, step + 1

    # -- loop ------------------------------------------------------------------------------------------
    def steps(self, start: int, total: int) -> Iterator[int]:
        """Yield ``start .. total-1``. Call :meth:`save` with every step (it decides whether to save).

        When the agreed preemption step has been saved and committed the process exits inside
        :meth:`save`; when the loop ends normally the last save is committed and the job closed.
        """
        if start < 0 or total < start:
            raise ValueError(f"Job.steps: need 0 <= start <= total, got start={start}, total={total}")
        self._last_step = total - 1
        self.agreement.last_step = total - 1
        self.agreement.begin(start)
        previous_t: float | None = None
        for step in range(start, total):
            now = time.perf_counter()
            if previous_t is not None:
                self._observe_step(now - previous_t, step)
                if self._decided != step - 1 or self._stop_step == step - 1:
                    self._decide_or_exit(step - 1)  # no save() in the body, or should_stop() said stop
            previous_t = now
            self._current = step
            yield step
        if total > start and (self._decided != total - 1 or self._stop_step == total - 1):
            self._decide_or_exit(total - 1)
        self.finish()

    def _observe_step(self, seconds: float, step: int) -> None:
        ema = self._step_ema
        self._step_ema = seconds if ema is None else ema + STEP_EMA_WEIGHT * (seconds - ema)
        self.agreement.step_seconds = self._step_ema
        if step % 16 == 0:  # the exporter needs no more; a metrics update costs a lock
            self.metrics.set("reprieve_step_seconds", self._step_ema)

    def _decide_or_exit(self, step: int) -> str | None:
        try:
            kind = self.agreement.decide(step)
        except AgreementError as err:
            self._abort(f"agreement failed: {err}")
        if kind == FINAL and self._last_saved != step:
            self._abort(f"agreed save step {step} passed without job.save({step}, state): nothing was saved")
        return kind

    def should_stop(self, step: int) -> bool:
        """True when ``step`` is the agreed final step: call :meth:`save` with it (which saves and exits)."""
        try:
            kind = self.agreement.decide(step)
        except AgreementError as err:
            self._abort(f"agreement failed: {err}")
        self._decided = step
        if kind == FINAL:
            self._stop_step = step
        return kind == FINAL

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> bool:
        """Save ``state`` after step ``step`` if the periodic policy or an agreed notice asks for it.

        Returns True when a save was started. At the agreed final step it does not return: it saves,
        waits for the commit on all processes, and exits (restart code, or 1 past the deadline).
        """
        self._current = max(self._current, step)
        try:
            kind = self.agreement.decide(step)
        except AgreementError as err:
            self._abort(f"agreement failed: {err}")
        self._decided = step
        if kind == FINAL:
            self._final_save(step, state, extra)
            return True
        due = kind == EARLY or should_save(step, policy=self.policy, last_saved=self._last_saved,
                                           last_step=self._last_step)
        if due and self._last_saved != step:
            self._start_save(step, state, extra, kind or "periodic")
            return True
        return False

    def notify(self, reason: str, deadline: float, *, notice_id: str | None = None) -> None:
        """Report a notice from user code (``deadline`` in ``time.time()`` seconds). Thread-safe."""
        now = time.time()
        self._hub.put(Notice(id=notice_id or f"user/{reason}/{deadline:.0f}", source="user", reason=reason,
                             deadline=deadline, received_at=now))

    # -- saving ------------------------------------------------------------------------------------------
    def _start_save(self, step: int, state: Any, extra: dict[str, Any] | None, kind: str) -> None:
        self._confirm_pending()
        record = {"reprieve": {"step": step, "kind": kind, "attempt": self.config.attempt}}
        target = self.agreement.target
        if target is not None:
            record["reprieve"]["notice"] = target.notice.id
        self.checkpointer.save(step, state, extra={**(extra or {}), **record})
        self._last_saved = self._pending = step
        self.metrics.inc("reprieve_saves_total", kind=kind)
        log.debug("save of step %d started (%s)", step, kind)

    def on_commit(self, step: int) -> None:
        """A checkpointer's commit callback (any thread): metrics and a rate-limited progress report."""
        if self._committed is None or step > self._committed:
            self._committed = step
        self.metrics.set("reprieve_last_committed_step", step)
        # The measured save time feeds the countdown as soon as a save commits, not at the next save: a
        # notice between two periodic saves must not plan with the pessimistic default estimate.
        seconds = getattr(self.checkpointer, "last_save_seconds", None)
        if seconds is not None:
            self.agreement.save_seconds = seconds
            self.metrics.set("reprieve_save_seconds", seconds)
        if self._progress is not None:
            self._progress.report(self._current, step)

    def _confirm_pending(self) -> None:
        """Wait for the in-flight save (if any), then record it as committed."""
        if self._pending is None:
            return
        self.checkpointer.wait()
        self._committed, self._pending = max(self._pending, self._committed or -1), None
        seconds = getattr(self.checkpointer, "last_save_seconds", None)
        if seconds is not None:
            self.agreement.save_seconds = seconds
            self.metrics.set("reprieve_save_seconds", seconds)
        self.metrics.set("reprieve_last_committed_step", self._committed)
        if self._progress is not None:
            self._progress.report(self._current, self._committed)

    def _final_save(self, step: int, state: Any, extra: dict[str, Any] | None) -> None:
        target = self.agreement.target
        assert target is not None
        deadline = target.deadline if target.deadline_known else None
        log.info("saving agreed step %d (notice %s, %s); deadline %s", step, target.notice.id,
                 target.notice.reason, "unknown" if deadline is None else f"in {deadline - time.time():.1f}s")
        timers = _arm_deadline_timers(step, deadline, self.config.shutdown_timeout_seconds)
        try:
            if self._last_saved != step:
                self._start_save(step, state, extra, "final")
            self._confirm_pending()
        except Exception as err:  # noqa: BLE001 - any failure of the agreed save: exit 1, loudly
            for t in timers:
                t.cancel()
            self._abort(f"agreed checkpoint at step {step} failed: {err!r}")
        for t in timers:
            t.cancel()
        now = time.time()
        since_notice = now - target.notice.received_at
        self.metrics.set("reprieve_notice_to_commit_seconds", since_notice)
        if deadline is not None and now > deadline:
            log.critical("agreed checkpoint at step %d committed %.1fs AFTER the deadline: exiting 1, not %d",
                         step, now - deadline, self.config.restart_exit_code)
            code = 1
        else:
            code = self.config.restart_exit_code
            log.info("agreed checkpoint at step %d committed on all %d process(es), %.2fs after the notice%s",
                     step, self.num_processes, since_notice,
                     "" if deadline is None else f", {deadline - now:.1f}s before the deadline")
        if self._last_step is not None and step == self._last_step and code != 1:
            log.info("the agreed step is the last step: training finished")
            return
        if self._progress is not None:
            self._progress.report(step, step, force=True, timeout_s=2.0)
        self.close()
        log.info("exiting with code %d", code)
        self._exit_fn(code)
        raise SystemExit(code)  # exit_fn must not return: the loop must not go on past the agreed step

    # -- end -----------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Wait for the last save's commit, report it and close (called when :meth:`steps` ends)."""
        if self._closed:
            return
        try:
            self._confirm_pending()
        finally:
            if self._progress is not None and self._committed is not None:
                self._progress.report(self._current, self._committed, force=True, timeout_s=2.0)
            self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """``with reprieve.init() as job:`` finishes the job on a normal exit (also after ``break``) and
        leaves quietly (no distributed shutdown, which would wait for the peers) on an exception."""
        if exc_type is None:
            self.finish()
        else:
            self.abandon()

    def abandon(self) -> None:
        """Stop the runtime's threads without saving or leaving the job; also run at interpreter exit.

        A watcher thread still inside the coordination client when Python exits aborts the process
        (SIGABRT), so this waits up to ``poll_s`` for it to leave its pending ``get``.
        """
        if self._closed:
            return
        self._closed = True
        log.warning("process %d: the runtime is closed without finishing job.steps() (break or error); "
                    "no checkpoint is taken by this exit", self.process_id)
        for closer in self._closers:
            try:
                closer()
            except Exception as err:  # noqa: BLE001 - closing must go on
                log.warning("closing %r failed: %s", closer, err)
        self._hub.close()
        self.agreement.close(timeout_s=self.agreement.poll_s + 1.0)

    def close(self) -> None:
        """Stop the notice sources and watcher threads, close the checkpointer, leave the job."""
        if self._closed:
            return
        self._closed = True
        for closer in self._closers:
            try:
                closer()
            except Exception as err:  # noqa: BLE001 - closing must go on
                log.warning("closing %r failed: %s", closer, err)
        self.agreement.close()
        self._hub.close()
        try:
            self.checkpointer.close()
        except Exception as err:  # noqa: BLE001 - closing must go on
            log.warning("closing the checkpointer failed: %s", err)
        self.metrics.close()
        if self._shutdown_distributed:
            self.coordinator.shutdown()  # also cancels the watcher's pending get
        if self.num_processes > 1:
            self.agreement.join(2.0)

    def _abort(self, why: str) -> NoReturn:
        log.critical("process %d: %s; exiting 1 (state NOT saved by this exit)", self.process_id, why)
        self._closed = True
        # No distributed shutdown (its barrier would wait for dead peers), but let the watcher leave the
        # client first: a thread inside it at interpreter exit aborts the process instead of exiting 1.
        self.agreement.close(timeout_s=self.agreement.poll_s + 0.5)
        self._exit_fn(1)
        raise SystemExit(1)


def _abstract(state: Any) -> Any:
    """``jax.ShapeDtypeStruct`` leaves (with shardings) for restore targets; other leaves unchanged."""
    import jax

    def leaf(x: Any) -> Any:
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
        return x

    return jax.tree.map(leaf, state)


def abstract_problem(abstract: Any, built: Any = None) -> str | None:
    """What is wrong with a user-given abstract state, or None. Pure: a table test covers it.

    ``abstract`` and ``built`` are trees as :func:`_abstract` makes them (``ShapeDtypeStruct`` for arrays).
    Every array leaf of ``abstract`` needs a sharding; with ``built`` (what ``init_fn()`` returned) the two
    must have one structure and the same shape and dtype per array leaf. A Python scalar in ``built`` matches a
    0-d leaf (``jax.eval_shape`` makes one of it; it is saved and restored as a scalar). Checked on the first
    run too, so a wrong abstract state fails at once, not at the first restart.
    """
    import jax

    want, want_def = jax.tree_util.tree_flatten_with_path(abstract)
    for path, a in want:
        if isinstance(a, jax.ShapeDtypeStruct) and a.sharding is None:
            return (f"abstract leaf {jax.tree_util.keystr(path)} has no sharding; give "
                    "jax.ShapeDtypeStruct(shape, dtype, sharding=...) for every array (flax NNX: nnx.eval_shape "
                    "leaves carry none; see docs/runtime.md, \"flax NNX\")")
        if isinstance(a, jax.ShapeDtypeStruct) and isinstance(getattr(a.sharding, "mesh", None),
                                                              jax.sharding.AbstractMesh):
            return (f"abstract leaf {jax.tree_util.keystr(path)} has a sharding on an abstract mesh (no devices to "
                    "restore onto); map concrete ones in, e.g. nnx.get_named_sharding(abstract, mesh) "
                    "(docs/runtime.md, \"flax NNX\")")
    if built is None:
        return None
    got, got_def = jax.tree_util.tree_flatten_with_path(built)
    if cast(Any, want_def) != got_def:  # PyTreeDef equality (the stubs do not declare it)
        return f"init_fn() returned a tree of another structure than abstract:\n  abstract: {want_def}\n" \
               f"  init_fn(): {got_def}"
    for (path, a), (_, b) in zip(want, got, strict=True):
        if not isinstance(a, jax.ShapeDtypeStruct) or (isinstance(b, int | float | complex) and a.shape == ()):
            continue
        if not isinstance(b, jax.ShapeDtypeStruct) or (a.shape, a.dtype) != (b.shape, b.dtype):
            described = f"{b.dtype}{list(b.shape)}" if isinstance(b, jax.ShapeDtypeStruct) else repr(b)
            return (f"leaf {jax.tree_util.keystr(path)}: abstract says {a.dtype}{list(a.shape)}, "
                    f"init_fn() returned {described}")
    return None


def _require(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(f"restore_or: {problem}")


def _arm_deadline_timers(step: int, deadline: float | None, guard_s: float) -> list[threading.Timer]:
    """At the deadline: a loud log. ``guard_s`` later, still not committed: hard exit 1 (a hung commit)."""
    if deadline is None:
        return []
    left = max(0.0, deadline - time.time())

    def loud() -> None:
        log.critical("deadline passed before the agreed checkpoint at step %d was committed", step)

    def hard() -> None:
        log.critical("agreed checkpoint at step %d still not committed %.0fs after the deadline: exit 1",
                     step, guard_s)
        logging.shutdown()
        os._exit(1)

    timers = [threading.Timer(left, loud), threading.Timer(left + guard_s, hard)]
    for t in timers:
        t.daemon = True
        t.start()
    return timers
