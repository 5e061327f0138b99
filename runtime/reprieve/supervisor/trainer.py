"""The trainer's side of ``reprieve-supervisor``: tell the supervisor how far it got; in a warm process, wait for the
assignment (``docs/contract.md``, "In-place restarts and the supervisor").

The supervisor hands every process it starts one end of a Unix socket, named by ``REPRIEVE_SUPERVISOR_FD``.
The runtime writes one JSON line per event on it: ``{"event": "init", "attempt": A}`` when ``reprieve.init()``
takes its identity, ``{"event": "step", "step": S, "topology": {...} | null, "landing": N, "owned": M}`` once the
first training step is done (the devices it runs on, :mod:`reprieve.topology`, handed to the next warm process in
``REPRIEVE_EXPECTED_TOPOLOGY``; the bytes its restore landed and copied into memory XLA allocates, when known, in
``REPRIEVE_WARM_LANDING_BYTES`` and ``REPRIEVE_WARM_OWNED_BYTES``),
``{"event": "peerLost", "processes": [P, ...], "step": S, "stepAt": T}`` when the runtime finds processes of the
job silent (``[]``: heard from again; :mod:`reprieve.peers`; JAX's coordination service may end this process for
them), with its last finished step and when it finished (unix seconds; absent before the first step),
``{"event": "exiting", "code": C}`` when the exit code is decided (the agreed checkpoint committed, termination
signals ignored from then on) and the process is about to leave the job and end. A warm process (also
``REPRIEVE_WARM_FD``, the same socket) writes ``{"event": "warming"}`` when its ``reprieve.init()`` is entered (its
imports done: an assignment waiting for it, or one that comes now, is written to it at once), ``{"event": "ready"}``
once its warm-up is done (it is parked: the warm-up is skipped when the assignment line is already there,
:meth:`SupervisorLink.assignment_here`), then reads the assignment line (blocking until the supervisor writes it); ``{"event": "error", "message": ...}`` when it cannot
take one (devices already touched). Nothing here ever raises into training for a lost supervisor: events are
best effort.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from ..env import Env
from ..topology import current_if_initialised
from .contract import EVENTS_FD_ENV, WARM_FD_ENV, AssignmentError, parse_assignment_line

log = logging.getLogger(__name__)

# How long a warm process, its imports done ("warming"), waits for an assignment the supervisor already has: one
# written at once skips the warm-up (the trace, the lowering, the landing memory, the heap's collection: 0.5-1.2 s
# in the goodput benchmark's restarts onto a spare started just before), which a parked process has done for nothing
# when the attempt waits for it. Where nothing waits, the process warms up this much later, in the background.
ASSIGNMENT_WAIT_S = 0.2


class SupervisorLink:
    """This process's socket to its supervisor (see the module docstring)."""

    def __init__(self, sock: socket.socket, *, warm: bool) -> None:
        self._sock = sock
        self.warm = warm
        self._first_step_sent = False

    @classmethod
    def take(cls, env: MutableMapping[str, str]) -> SupervisorLink | None:
        """The link named in ``env`` (None when not supervised). Removes the variables from ``env``: the fd is
        this process's alone, and a child process must not write to whatever reuses its number."""
        reader = Env(env)
        raw, warm_raw = reader.opt_text(EVENTS_FD_ENV), reader.opt_text(WARM_FD_ENV)
        env.pop(EVENTS_FD_ENV, None)
        env.pop(WARM_FD_ENV, None)
        if raw is None and warm_raw is None:
            return None
        value = raw if raw is not None else warm_raw
        try:
            fd = int(str(value))
            sock = socket.socket(fileno=fd)
        except (ValueError, OSError) as err:
            log.warning("%s=%r is not a socket this process holds (%s): running without the supervisor link",
                        EVENTS_FD_ENV if raw is not None else WARM_FD_ENV, value, err)
            return None
        sock.set_inheritable(False)
        return cls(sock, warm=warm_raw is not None)

    def send(self, event: str, **fields: Any) -> None:
        """One event line; never raises (a supervisor that is gone does not stop training)."""
        try:
            self._sock.sendall(json.dumps({"event": event, **fields}).encode() + b"\n")
        except OSError as err:
            log.debug("supervisor link: %s not sent (%s)", event, err)

    def first_step(self, step: int, landing: int | None = None, owned: int | None = None) -> None:
        """The first training step is done (once): the supervisor may now start the next attempt's process, and
        tell it the devices this one runs on (``reprieve.expected_topology()``), the bytes its restore landed
        (``landing``: :func:`reprieve.landing.landing_bytes` of the state) and those it copies into memory XLA
        allocates (``owned``: :func:`reprieve.landing.owned_bytes`, a donating step on CPU devices); the warm process
        populates both ahead."""
        if not self._first_step_sent:
            self._first_step_sent = True
            self.send("step", step=step, topology=_topology(), **({"landing": landing} if landing else {}),
                      **({"owned": owned} if owned else {}))

    def peer_lost(self, processes: tuple[int, ...], last: tuple[int, float] | None = None, *,
                  gone: tuple[int, ...] = ()) -> None:
        """The processes of the job this process finds silent now (``()``: none): if JAX ends this process for
        them, the supervisor's exit report names them (``peerLost``), so the exit counts as their loss. ``last``:
        this process's last finished step and when (unix seconds): the gang's, as training is synchronous; the
        exit report carries it (``lastStep``), so the operator counts the steps after process 0's last progress
        report as lost, not as restart gap. ``gone``: of ``processes``, those whose pulse did not answer (their node
        gone or cut off): the exit report names them (``peerGone``) and the operator counts them lost at once."""
        fields: dict[str, Any] = {"processes": list(processes)}
        if any(p in processes for p in gone):
            fields["gone"] = [p for p in gone if p in processes]
        if last is not None:
            fields.update(step=last[0], stepAt=round(last[1], 3))
        self.send("peerLost", **fields)

    def exiting(self, code: int) -> None:
        """The exit code is decided and the checkpoint committed; the process now leaves the job and ends. The
        supervisor reports the code at once instead of at the exit (``docs/contract.md``)."""
        self.send("exiting", code=code)

    def warming(self) -> None:
        """Warm process, entering ``reprieve.init()``: its imports are done (the supervisor waits a little for such a
        process rather than start the attempt cold). Refuses first, as :meth:`await_assignment` does, when a JAX
        backend is already initialised here: the supervisor starts the attempt cold at once."""
        self._refuse_if_devices_touched()
        self.send("warming")

    def assignment_here(self, timeout_s: float = 0.0) -> bool:
        """Warm process: whether the supervisor has written something for it (its assignment; or closed the link),
        waiting at most ``timeout_s``. Then the attempt waits for this process: its warm-up is not worth doing."""
        try:
            return bool(select.select([self._sock], [], [], timeout_s)[0])
        except (OSError, ValueError):
            return False

    def await_assignment(self, idle: Callable[[], None] | None = None, idle_seconds: float = 5.0) -> dict[str, str]:
        """Warm process: report ready, block until the assignment line arrives, return its ``REPRIEVE_*`` values.
        ``idle`` is called every ``idle_seconds`` while no line has started to arrive (``init(trace_ahead=)``).

        Raises:
            RuntimeError: a JAX backend is already initialised here (the supervisor is told, and starts the
                attempt cold).
            SystemExit: the supervisor closed the socket (it is gone, or it chose a cold start): nothing to do.
        """
        self._refuse_if_devices_touched()
        self.send("ready")
        log.info("pre-warmed process %d: waiting in reprieve.init() for its assignment", os.getpid())
        while idle is not None and not select.select([self._sock], [], [], idle_seconds)[0]:
            idle()
        line = self._sock.makefile("rb").readline()
        if not line:
            log.info("pre-warmed process %d: the supervisor closed the link; exiting", os.getpid())
            raise SystemExit(0)
        try:
            updates = parse_assignment_line(line.decode("utf-8", "replace"), os.environ)
        except AssignmentError as err:
            self.send("error", message=str(err))
            raise RuntimeError(f"reprieve.init(): {err}") from None
        self._refuse_if_devices_touched()  # a thread of the user's may have touched them while we waited
        return updates

    def _refuse_if_devices_touched(self) -> None:
        problem = device_problem(sys.modules)
        if problem is not None:
            self.send("error", message=problem)
            raise RuntimeError(problem)


def device_problem(modules: Mapping[str, Any]) -> str | None:
    """Why this (warm) process cannot take an assignment: a JAX backend is already initialised. Never imports
    JAX itself."""
    if "jax" not in modules:
        return None
    try:
        from jax._src import xla_bridge  # not public API; the only way to ask without initialising one

        initialised = xla_bridge.backends_are_initialized()
        names = sorted(getattr(xla_bridge, "_backends", {}) or {})
    except Exception:  # noqa: BLE001 - another JAX: cannot tell, let jax.distributed.initialize decide
        return None
    if not initialised:
        return None
    return (f"reprieve.init() in a pre-warmed process (REPRIEVE_WARM_FD, started by reprieve-supervisor before its attempt "
            f"was known): a JAX backend is already initialised ({', '.join(names) or 'unknown'}), so this process "
            "cannot join the next attempt's gang. Code before reprieve.init() may import modules and read "
            "configuration, but must not touch devices: no jax.devices()/jax.device_count(), no arrays, no jitted "
            "calls. Move that code after reprieve.init(). reprieve-supervisor starts this attempt cold instead "
            "(docs/runtime.md, 'Running under reprieve-supervisor').")


def _topology() -> dict[str, Any] | None:
    """This process's view of the job's devices (:mod:`reprieve.topology`), or None when it has none yet."""
    topology = current_if_initialised()
    return None if topology is None else topology.to_json()
