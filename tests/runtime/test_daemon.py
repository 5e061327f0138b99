"""The runtime's background threads (``reprieve.background``): a daemon runs until closed; a reconnecting one opens
its session again after each failure, backing off, and starts the backoff over once the session works."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from itertools import count

import pytest
from reprieve.background import Daemon, Reconnecting

pytestmark = pytest.mark.unit

LOG = logging.getLogger("test.background")


class Flaky(Reconnecting):
    """Fails twice, then works (one session that returns), then fails for ever; records each backoff's delay."""

    def __init__(self) -> None:
        self.waited: list[float] = []
        self.sessions = 0
        self.done = threading.Event()

        def delays() -> Iterator[float]:  # 0.001, 0.002, ...: the position in the backoff, not a real wait
            return (n / 1000 for n in count(1))

        super().__init__("test-flaky", "flaky session", LOG, delays)

    def _session(self, connected: Callable[[], None]) -> None:
        self.sessions += 1
        if self.sessions == 3:
            connected()
            return
        if self.sessions == 6:
            self.done.set()
            self._stop.set()
        raise ConnectionError(f"refused #{self.sessions}")


def test_a_session_is_opened_again_after_each_failure_and_the_backoff_restarts_once_it_works(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    flaky = Flaky()
    real_wait = flaky._stop.wait
    monkeypatch.setattr(flaky._stop, "wait", lambda delay: flaky.waited.append(delay) or real_wait(0))
    flaky.start()
    assert flaky.done.wait(10)
    assert flaky._thread is not None
    flaky._thread.join(10)
    assert flaky.waited == [0.001, 0.002, 0.001, 0.002, 0.003]  # sessions 1, 2 fail; 3 works; 4, 5, 6 fail
    lines = [r.getMessage() for r in caplog.records]
    assert "flaky session works again after 2 failure(s)" in lines
    assert lines[0] == "flaky session failed (refused #1, failure 1); retrying in 0s"
    # the first failure in a row is loud; a row starts again once the session has worked
    assert [r.levelno for r in caplog.records if "failed" in r.getMessage()] == [
        logging.WARNING, logging.DEBUG, logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_a_daemon_runs_until_closed() -> None:
    class Ticker(Daemon):
        ticks = 0

        def _run(self) -> None:
            while not self._stop.wait(0.001):
                self.ticks += 1

    ticker = Ticker("test-ticker").start()
    assert ticker._thread is not None and ticker._thread.daemon and ticker._thread.name == "test-ticker"
    ticker.close()
    ticker._thread.join(5)
    assert not ticker._thread.is_alive()
