"""How a process that has decided its exit code ends: :func:`exit_process` (the default ``exit_fn``).

``sys.exit`` alone ends a JAX process slowly: after the user's code has unwound, the interpreter tears down
JAX's backend (the PjRt client and its thread pools) and then every module. With the example language model on
2 CPU cores that takes 0.2-0.7 s, and on the restart path all of it is restart gap: the supervisor (or the
kubelet) reports the exit only once the process is gone.

:func:`exit_process` raises ``SystemExit(code)`` as ``sys.exit`` does, so everything a user expects still
happens: ``finally`` blocks and ``with`` blocks unwind, Python joins the non-daemon threads and runs the
``atexit`` handlers registered after ``import reprieve``. Then reprieve's own handler -- registered when
``reprieve`` is imported, so it runs after those -- waits for JAX's ordered effects (``jax.effects_barrier``),
flushes every open file and the logs, and ends the process with ``os._exit(code)``, skipping the teardown.
It is only armed by :func:`exit_process`; any other exit (a normal end, an exception, ``sys.exit`` in user
code) is untouched. ``reprieve.init(exit_fn=sys.exit)`` opts out.

Handlers registered *before* ``import reprieve`` do not run on this path (JAX's own teardown among them, on
purpose: the job has already left ``jax.distributed`` and its checkpoint is committed).
"""

from __future__ import annotations

import atexit
import gc
import io
import itertools
import logging
import os
import sys
import threading
import time
import weakref
from typing import NoReturn

_armed: list[int] = []  # the code to end with, once exit_process() ran
# The file objects among those :func:`freeze` froze (gc.get_objects() does not return frozen objects); [True] once
# it froze (gc.get_freeze_count() walks the whole frozen heap, so the exit does not ask it after a freeze of ours).
_frozen_files: list[weakref.ref[object]] = []
_frozen: list[bool] = []

# Exact types, not isinstance over every object: the scan runs over the whole heap on the restart path. A raw FileIO
# holds no buffer (its flush does nothing); the buffered and text objects over it do.
_FILE_TYPES = frozenset((io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom))


def exit_process(code: int) -> NoReturn:
    """Exit with ``code``: unwind the caller's code as ``sys.exit`` does, then end without the interpreter's
    teardown (see the module docstring)."""
    _armed[:] = [code]
    raise SystemExit(code)


def open_files(objects: list[object]) -> list[object]:
    """The buffered and text file objects among ``objects``, found by type without a Python loop: the heap of a
    JAX trainer holds hundreds of thousands of objects, and the restart waits for this process to be gone."""
    return list(itertools.compress(objects, map(_FILE_TYPES.__contains__, map(type, objects))))


def freeze() -> None:
    """``gc.freeze()``, remembering the file objects among what it freezes, so that the exit flushes them without
    walking the frozen heap (``reprieve.prewarm.settle_heap``; benchmarks/exit_flush.py)."""
    _frozen_files.extend(weakref.ref(f) for f in open_files(gc.get_objects()))  # only what is not frozen yet
    gc.freeze()
    _frozen[:] = [True]


def _files_to_flush() -> list[object]:
    """Every file object still alive: those made since the last :func:`freeze` and those it remembered. Without a
    freeze of ours, objects the program froze itself are unfrozen and walked too; after one, files the program froze
    on top of it are not found."""
    if not _frozen:
        if gc.get_freeze_count():
            gc.unfreeze()
        return open_files(gc.get_objects())
    remembered = [f for ref in _frozen_files if (f := ref()) is not None]
    return open_files(gc.get_objects()) + remembered


def _flush_open_files() -> None:
    """Flush what the interpreter's teardown would have flushed: every open file object still alive."""
    for obj in _files_to_flush():
        try:
            if not obj.closed and obj.writable():  # type: ignore[attr-defined]
                obj.flush()  # type: ignore[attr-defined]
        except (OSError, ValueError):  # a broken pipe, a file closed meanwhile: nothing to save
            pass


def _end_now() -> None:
    if not _armed:
        return
    code = _armed[0]
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            jax.effects_barrier()  # what JAX's own atexit handler would wait for
        except Exception as err:  # noqa: BLE001 - a broken backend must not turn the decided code into another
            logging.getLogger(__name__).warning("waiting for JAX's ordered effects failed: %s", err)
    logging.shutdown()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


atexit.register(_end_now)


_job_log = logging.getLogger("reprieve.job")  # the agreed save's deadline lines are the job's


def arm_deadline_timers(step: int, deadline: float | None, guard_s: float) -> list[threading.Timer]:
    """At the deadline: a loud log. ``guard_s`` later, still not committed: hard exit 1 (a hung commit)."""
    if deadline is None:
        return []
    left = max(0.0, deadline - time.time())

    def loud() -> None:
        _job_log.critical("deadline passed before the agreed checkpoint at step %d was committed", step)

    def hard() -> None:
        _job_log.critical("agreed checkpoint at step %d still not committed %.0fs after the deadline: exit 1",
                          step, guard_s)
        logging.shutdown()
        os._exit(1)

    timers = [threading.Timer(left, loud), threading.Timer(left + guard_s, hard)]
    for t in timers:
        t.daemon = True
        t.start()
    return timers
