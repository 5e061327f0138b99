"""The runtime's one shape of background thread, and of a connection kept up against failures.

:class:`Daemon`: ``start()`` runs ``_run`` in a daemon thread, ``close()`` sets ``_stop`` (``_run`` watches it and
waits on it, so a close ends a wait at once). :class:`Waker`: the same for a thread that waits in a selector.
:class:`Reconnecting`: a daemon whose ``_run`` opens ``_session``
again after every failure, backing off 1 s doubling to 30 s, logging the 1st, 10th and every 100th failure in a
row at WARNING (``failure_log_level``), and one line when it works again.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Self


def failure_log_level(failures: int) -> int:
    """How loudly a watch logs its ``failures``-th failure in a row: WARNING for the 1st, the 10th and every 100th,
    DEBUG otherwise, so a long outage is visible without a line every backoff (pure)."""
    return logging.WARNING if failures in (1, 10) or failures % 100 == 0 else logging.DEBUG


def backoff_delays(initial: float = 1.0, maximum: float = 30.0) -> Iterator[float]:
    """1, 2, 4, ... capped at ``maximum`` (pure)."""
    delay = initial
    while True:
        yield delay
        delay = min(maximum, delay * 2)


class Daemon:
    """A daemon thread named ``thread_name`` that runs ``_run`` until ``close()``."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        raise NotImplementedError


WAKE = object()  # the data of a waker's key in a selector


class Waker:
    """Ends a wait in ``selector`` from another thread: the read end of a socket pair is registered there with
    ``data`` :data:`WAKE`; :meth:`wake` writes a byte, and the waiting thread, seeing a key whose data is
    :data:`WAKE`, calls :meth:`drain` and looks at its stop flag. A close then costs no select timeout (a pulse's
    ``beat_s`` each, on the restart path of every agreed exit)."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        selector.register(self._read, selectors.EVENT_READ, WAKE)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake is pending anyway) or closed (the thread is done)
            self._write.send(b"!")

    def drain(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: empty
            while self._read.recv(64):
                pass

    def close(self) -> None:
        self._read.close()
        self._write.close()


class Reconnecting(Daemon):
    """A daemon that keeps a session (a watch) open: ``_session(connected)`` runs until it returns or fails, and
    calls ``connected()`` once it works (which resets the backoff); it is opened again until ``close()``.
    ``what`` names it in ``log`` ("pod watch of ns/pod")."""

    def __init__(self, thread_name: str, what: str, log: logging.Logger,
                 delays: Callable[[], Iterator[float]] = backoff_delays) -> None:
        super().__init__(thread_name)
        self.what = what
        self._log = log
        self._delays = delays

    def _session(self, connected: Callable[[], None]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        delays = self._delays()
        failures = 0

        def connected() -> None:
            nonlocal delays, failures
            if failures:
                self._log.info("%s works again after %d failure(s)", self.what, failures)
            failures, delays = 0, self._delays()

        while not self._stop.is_set():
            try:
                self._session(connected)
            except Exception as err:  # noqa: BLE001 - any failure: back off and open it again
                failures += 1
                delay = next(delays)
                self._log.log(failure_log_level(failures), "%s failed (%s, failure %d); retrying in %.0fs", self.what,
                              err, failures, delay)
                self._stop.wait(delay)
