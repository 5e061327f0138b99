"""What a :class:`reprieve.Job` stops and closes on its way out, in order: one teardown of
:data:`reprieve.lifecycle.TEARDOWNS` carried out (the lifecycle says what each does, this does it)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .agreement import Agreement, AgreementError
from .capabilities import Checkpointer
from .collective_error import collective_failed, first_cause
from .coordination import Coordinator
from .lifecycle import FINISH, ExitDecision, Teardown
from .metrics import Metrics
from .notice_sources import NoticeHub, ignore_termination_signals
from .progress import ProgressReporter
from .targets import Tier

log = logging.getLogger("reprieve.job")  # the job's lines, under the name they always had


class Leaving:
    """The job's parts that a teardown stops. ``closers``: the notice sources and the peer watch, closed in the
    order they started; ``on_exiting(code)``: the supervisor's announcement of a decided exit code."""

    def __init__(self, *, hub: NoticeHub, agreement: Agreement, checkpointer: Checkpointer, metrics: Metrics, coordinator: Coordinator, progress: ProgressReporter | None,
                 closers: list[Callable[[], None]], on_exiting: Callable[[int], None] | None,
                 shutdown_distributed: bool) -> None:
        self.hub, self.agreement, self.checkpointer = hub, agreement, checkpointer
        self.metrics, self.coordinator, self.progress = metrics, coordinator, progress
        self.closers, self.on_exiting, self.shutdown_distributed = closers, on_exiting, shutdown_distributed

    def announce(self, how: Teardown, code: int | None) -> None:
        """Before anything closes: from here the process ends with the decided code, whatever comes."""
        if not how.ignore_signals:
            return
        ignore_termination_signals()
        if code is not None and self.on_exiting is not None:
            # The supervisor reports the code to the operator now: the next attempt's assignment is decided
            # while this process still leaves the job and ends (~0.15-0.25 s); nothing of it starts in this
            # pod before this process is gone.
            try:
                self.on_exiting(code)
            except Exception as err:  # noqa: BLE001 - a report, never a reason not to exit
                log.debug("exit announcement failed: %s", err)

    def close(self, how: Teardown, *, current: int, committed: int | None, tier: Tier | None) -> None:
        """Everything ``how`` stops, each whatever the one before raised (``current``: the loop's step; ``tier``:
        the memory tier, closed before the checkpointer)."""
        final = None  # the exit's progress patch, sent while the rest closes (joined before the process leaves)
        if self.progress is not None:
            if how.report_progress:
                final = self.progress.final(current, -1 if committed is None else committed, timeout_s=2.0)
            self.progress.close()
        for closer in self.closers:
            try:
                closer()
            except Exception as err:  # noqa: BLE001 - closing must go on
                log.warning("closing %r failed: %s", closer, err)
        self.hub.close()
        # Without a distributed shutdown (which cancels the watcher's pending get) wait it out: a thread
        # still inside the coordination client at interpreter exit aborts the process.
        self.agreement.close(timeout_s=0.0 if how.leave_distributed else self.agreement.poll_s + 1.0)
        if how.close_checkpointer:
            try:
                try:
                    if tier is not None:  # a finished job's copies are of no more use: deleted (#46)
                        tier.close(finished=how is FINISH)
                finally:
                    self.checkpointer.close()
            except Exception as err:  # noqa: BLE001 - closing must go on
                log.warning("closing the checkpointer failed: %s", err)
        if final is not None:
            final.join()  # bounded by the patches' own timeouts (one in flight, then this one's 2 s)
        self.metrics.close()
        if how.leave_distributed and self.shutdown_distributed:
            self.coordinator.shutdown()
        if how.leave_distributed and self.coordinator.num_processes > 1:
            self.agreement.join(2.0)
            if tier is not None:  # its schedule watcher uses the coordination client
                tier.join_watcher(2.0)


def await_lost_peer(wait_lost: Callable[[str], tuple[int, ...]], process_id: int, exc: BaseException | None, *,
                    then: str = "") -> tuple[int, ...]:
    """A JAX runtime error ends the loop (a collective failed: a peer's process died and its connections were
    reset), or the agreement failed (the coordination service, or a peer, is gone): before this process ends,
    report the peer the error names and let the peer watch name the silent peer (``wait_lost``), so the exit is
    reported as that peer's loss, not as a failure of this process (``docs/contract.md``, "Peer lost"). The lost
    processes (``()``: none named); ``then``: what happens next, said on the same line."""
    if not (collective_failed(exc) or isinstance(exc, AgreementError)):
        return ()
    lost = wait_lost(str(exc))
    if lost:
        log.warning("process %d: the step failed (%s) and process(es) %s went silent: this exit is their loss%s",
                    process_id, _first_line(exc), ", ".join(map(str, lost)), then)
    return lost


def _first_line(exc: BaseException | None) -> str:
    """The error's first line, without XLA's repeats (:func:`reprieve.collective_error.first_cause`)."""
    return first_cause(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:200]


def ending_at_exit(committed: int | None) -> str:
    """What follows an exception that a peer's loss caused (the tail of :func:`await_lost_peer`'s line)."""
    return ("; this process ends at its exit (SIGABRT, as JAX's heartbeat timeout would, before JAX's own shutdown, "
            "which would wait for the lost peer and abort with a stack trace) and the job restarts from "
            + ("its start: there is no checkpoint yet" if committed is None else f"the last checkpoint, step {committed}"))


def end_at_exit(now: bool) -> None:
    """End this process with SIGABRT (``now``, or at its exit, after the uncaught exception's traceback and before
    JAX's ``atexit`` shutdown, registered earlier): its peer is lost, and JAX's shutdown would wait for it, fail,
    and abort with a C++ stack trace (``docs/runtime.md``, "Exit codes")."""
    if now:
        _abort()
    atexit.register(_abort)


def _abort() -> None:
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # ending anyway
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.abort()


def _last_checkpoint(committed: int | None) -> str:
    return "there is no checkpoint yet" if committed is None else f"the last checkpoint is step {committed}"


def warn_abandoned(process_id: int, committed: int | None, restart_code: int) -> None:
    log.warning("process %d: the runtime is closed without finishing job.steps() (an exception, a break or "
                "sys.exit): nothing is saved by this exit (%s); an exit with "
                "the restart code %d from here is not a saved preemption", process_id, _last_checkpoint(committed),
                restart_code)


def warn_restart_code_without_save(process_id: int, code: int, committed: int | None) -> None:
    """sys.exit(<restart code>) in the program's own code: it reads as a saved preemption and is not one."""
    log.critical("process %d: sys.exit(%d) without an agreed save: %d is REPRIEVE_RESTART_EXIT_CODE, which "
                 "says 'state saved, restart me', but nothing was saved by this exit (%s). reprieve-supervisor "
                 "reports it as not agreed; let job.save() exit at the agreed step instead", process_id, code, code,
                 _last_checkpoint(committed))


def log_agreed_commit(step: int, decision: ExitDecision, num_processes: int, since_notice: float,
                      deadline: float | None, now: float) -> None:
    """The agreed save's one line: committed (or late), and what follows when no exit does."""
    if decision.late:
        log.warning("agreed checkpoint at step %d %s: still exiting as saved; give the job a longer "
                    "notice window (spec.preemption.noticeSeconds) or a cheaper save", step, decision.reason)
    else:
        log.info("agreed checkpoint at step %d committed on all %d process(es), %.2fs after the notice%s", step,
                 num_processes, since_notice, "" if deadline is None else f", {deadline - now:.1f}s before the deadline")
    if decision.code is None:
        log.info("agreed checkpoint at step %d %s", step, decision.reason)


def log_agreed_exit(step: int, decision: ExitDecision, restart_code: int) -> None:
    log.info("exiting with code %d: %s", decision.code,
             f"the agreed checkpoint of step {step} is committed, restart wanted (REPRIEVE_RESTART_EXIT_CODE)"
             if decision.code == restart_code else f"the agreed checkpoint of step {step} {decision.reason}")


def raise_step_failure(state: Any, failed: tuple[int, str], process_id: int) -> NoReturn:
    """A step's computation failed on this process (a collective whose peer died, most often) and the loop,
    running ahead of its device, goes on dispatching steps that fail of it: raise the step's error (``failed``:
    the step and why, ``FinishedSteps.failed``), as the loop's own wait for a result would, so the exception path
    names the lost peer and ends the process."""
    import jax  # the state is JAX's: importing reprieve does not import it

    step, why = failed
    prefix = f"step {step} failed on process {process_id}, and no later step can finish"
    try:
        jax.block_until_ready(state)  # raises the step's error (a failed result reads as ready)
    except Exception as err:  # noqa: BLE001 - raised again as its own type (a JAX runtime error, most often)
        raise type(err)(f"{prefix}: {first_cause(str(err))}") from None
    raise RuntimeError(f"{prefix}: {why}")
