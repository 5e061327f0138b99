"""``reprieve-supervisor``, the supervisor: the worker container's PID 1 for in-place restarts (and ``reprieve run``).

- :mod:`.process`: the supervisor process, the shell that carries the decisions out (children, signals, the API);
- :mod:`.protocol`: what it decides next, a pure state machine (``protocol.step``);
- :mod:`.contract`: the formats it shares with the operator and the trainer (the assignment, the annotations,
  the trainer's environment), pure;
- :mod:`.trainer`: the trainer's side of the link (``reprieve.init()`` reports to the supervisor through it).

Importing the package imports none of them: the trainer imports only :mod:`.trainer` and :mod:`.contract`.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The ``reprieve-supervisor`` console script (``reprieve.supervisor:main``): :func:`.process.main`."""
    from .process import main as process_main

    return process_main(argv)


DEPRECATED_NAME = "reprieve-run"


def main_deprecated(argv: Sequence[str] | None = None) -> int:
    """The ``reprieve-run`` console script, the supervisor's name until 0.1: one line on stderr, then :func:`main`.
    Kept for one release so images and scripts that call it keep working."""
    import sys

    print(f"{DEPRECATED_NAME} is deprecated: it is now reprieve-supervisor (the same program; {DEPRECATED_NAME} "
          "goes in the next release)", file=sys.stderr, flush=True)
    return main(argv)
