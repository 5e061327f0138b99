"""The operator's one shape of background thread: a daemon thread that runs ``step()`` until ``stop()``.

A step that raises is logged and retried after ``retry_seconds`` (a dropped watch stream reconnects); the
retry wait ends early on ``stop()``. Subclasses implement ``step`` and look at ``stopped`` inside long steps.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("reprieve_operator")


class BackgroundLoop:
    """``what`` names the loop in the log; ``name`` is the thread's name."""

    def __init__(self, name: str, what: str, retry_seconds: float = 1.0) -> None:
        self.what = what
        self.retry_seconds = retry_seconds
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.step()
            except Exception as err:  # noqa: BLE001  (any error: log, wait, step again)
                log.warning("%s interrupted (%s); reconnecting", self.what, err)
                self.stopped.wait(self.retry_seconds)
