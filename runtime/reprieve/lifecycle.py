"""The job's lifecycle, written down: its phases, its teardowns, and the exit-code decision (pure).

Phases of a :class:`reprieve.Job` and what moves it (every other transition is refused)::

    READY ──steps()──▶ TRAINING ──loop ends / finish() / with-block──────────▶ FINISHED
      │                   │ ──save() at the agreed final step, committed─────▶ EXITING ──▶ process ends
      │                   │        (exit_decision says "finished" at the last step: ─▶ FINISHED)
      └───────────────────┴──abandon() (exception in a with-block, atexit)─────▶ ABANDONED
                          └──fatal error (agreement, save, missed save)────────▶ ABORTED ──▶ exit 1

READY also finishes or is abandoned directly (a job that never trained). FINISHED, EXITING, ABANDONED and
ABORTED are terminal: a second teardown is a no-op, so ``finish()`` after ``abandon()`` (or ``atexit`` after
anything) does nothing.

Every terminal phase is reached through one teardown, :data:`TEARDOWNS` says what each does:

==========  ===========  ===========  ==============  ============  ======================================
teardown    waits for    closes the   reports         leaves        why
            last commit  checkpointer progress        jax.dist.
==========  ===========  ===========  ==============  ============  ======================================
finish      yes          yes          yes (forced)    yes           normal end: nothing in flight, peers
                                                                    finish too
restart     (committed)  yes          yes (forced)    yes           the agreed checkpoint is committed;
                                                                    SIGTERM/INT/HUP are ignored from here
abandon     no           no           no              no            an exception or a break without
                                                                    finish(): peers may be gone, so no
                                                                    barrier; threads stopped only
abort       no           no           no              no            a fatal error: exit 1 at once
==========  ===========  ===========  ==============  ============  ======================================

All four stop the notice sources and the agreement watcher (waiting for it to leave the coordination client:
a thread inside it at interpreter exit aborts the process).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    READY = "ready"
    TRAINING = "training"
    FINISHED = "finished"
    EXITING = "exiting"
    ABANDONED = "abandoned"
    ABORTED = "aborted"

    @property
    def terminal(self) -> bool:
        return self in (Phase.FINISHED, Phase.EXITING, Phase.ABANDONED, Phase.ABORTED)


@dataclass(frozen=True)
class Teardown:
    """One row of the table above."""

    name: str
    phase: Phase  # the phase it ends in
    wait_for_commit: bool
    close_checkpointer: bool
    report_progress: bool
    leave_distributed: bool
    ignore_signals: bool = False


FINISH = Teardown("finish", Phase.FINISHED, wait_for_commit=True, close_checkpointer=True, report_progress=True,
                  leave_distributed=True)
RESTART = Teardown("restart", Phase.EXITING, wait_for_commit=False, close_checkpointer=True,
                   report_progress=True, leave_distributed=True, ignore_signals=True)
ABANDON = Teardown("abandon", Phase.ABANDONED, wait_for_commit=False, close_checkpointer=False,
                   report_progress=False, leave_distributed=False)
ABORT = Teardown("abort", Phase.ABORTED, wait_for_commit=False, close_checkpointer=False, report_progress=False,
                 leave_distributed=False)
TEARDOWNS = {t.name: t for t in (FINISH, RESTART, ABANDON, ABORT)}


@dataclass(frozen=True)
class ExitDecision:
    """What the process does after the agreed final save: exit with ``code``, or (``code`` None) go on and
    finish normally because the agreed step was the job's last."""

    code: int | None
    reason: str
    late: bool = False  # committed after the notice's deadline (still saved: logged as a warning)


def exit_decision(*, committed: bool, now: float, deadline: float | None, restart_code: int,
                  last_step: bool) -> ExitDecision:
    """The exit code after the agreed final save. Pure; ``tests/runtime/test_lifecycle.py`` is its table.

    Args:
        committed: the agreed checkpoint is committed on every process.
        now: the time (``time.time()``) the commit became known.
        deadline: the notice's deadline, or None when unknown (a malformed notice: never "late").
        restart_code: ``REPRIEVE_RESTART_EXIT_CODE``.
        last_step: the agreed step is the job's last step.
    """
    if not committed:
        return ExitDecision(1, "not committed")
    # Committed late (the process outlived the deadline): the checkpoint is whole and fenced, so the exit still
    # says "saved" -- a 1 would spend one of the job's maxFailures on a preemption that lost nothing.
    late = (f"; committed {now - deadline:.1f}s AFTER the deadline (the save outlasted the notice window)"
            if deadline is not None and now > deadline else "")
    if last_step:
        return ExitDecision(None, f"committed; it is the last step: training finished{late}", late=bool(late))
    return ExitDecision(restart_code, f"committed: restart wanted{late}", late=bool(late))
