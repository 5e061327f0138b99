"""What a trainer's exit means, and whether the local restart loop starts it again (pure).

A supervisor (``reprieve-supervisor`` in a pod, ``reprieve run`` on a laptop) sees two things of a trainer that ends: its
exit code, and whether the runtime announced that code before it left (``{"event": "exiting"}`` on the supervisor
link, sent only after the agreed checkpoint committed on every process). Together they tell a saved preemption
from a program that called ``sys.exit(<restart code>)`` itself, which looks the same from outside:

=========================  ==========  ===============================================================
exit code                  announced   kind
=========================  ==========  ===============================================================
0                          any         ``finished``
the restart code           yes         ``saved``: the agreed checkpoint is committed, restart wanted
the restart code           no          ``unagreed``: nothing was saved by this exit (said loudly)
anything else              any         ``failed``
=========================  ==========  ===============================================================

The local loop (:func:`local_next`) does what the operator does on a cluster: a ``saved`` exit starts the next
attempt (``REPRIEVE_ATTEMPT`` + 1, so checkpoint fencing and notice attempts work as in a pod), anything else
ends the loop with the trainer's code. Unlike the operator, which cannot see the announcement in a pod without
the supervisor, it does not restart an ``unagreed`` exit: a program that exits with the restart code before
saving anything would otherwise be restarted for ever.
"""

from __future__ import annotations

from typing import Literal

ExitKind = Literal["finished", "saved", "unagreed", "failed"]


def classify_exit(code: int, announced: int | None, restart_code: int) -> ExitKind:
    """The kind of a trainer's exit (the table above)."""
    if code == 0:
        return "finished"
    if code == restart_code:
        return "saved" if announced == code else "unagreed"
    return "failed"


def describe_exit(kind: ExitKind, code: int, restart_code: int) -> str:
    """One line for the supervisor's log."""
    return {
        "finished": "training finished",
        "saved": "the agreed checkpoint is committed: restart wanted",
        "unagreed": (f"exited with the restart code {restart_code} WITHOUT an agreed save (the runtime did not "
                     f"announce it): user code called sys.exit({restart_code})? Nothing was saved by this exit; "
                     "the last checkpoint is what a restart resumes"),
        "failed": f"failed with code {code}",
    }[kind]


def local_next(kind: ExitKind, restarts: int, max_restarts: int | None) -> tuple[bool, str]:
    """``(restart, why)`` for the local loop after an exit of ``kind``, ``restarts`` restarts done so far."""
    if kind == "saved":
        if max_restarts is not None and restarts >= max_restarts:
            return False, f"not restarted: --max-restarts {max_restarts} reached"
        return True, "restarting: the next attempt resumes from the agreed checkpoint"
    if kind == "unagreed":
        return False, "not restarted: an exit with the restart code that saved nothing is not a preemption"
    return False, "stopping, as the operator would"
