"""background.BackgroundLoop: steps until stopped; a failing step is logged and retried; stop ends the wait."""

from __future__ import annotations

import logging
import threading

import pytest
from reprieve_operator.background import BackgroundLoop

pytestmark = pytest.mark.unit


class Steps(BackgroundLoop):
    def __init__(self, failures: int, retry_seconds: float) -> None:
        super().__init__("test-loop", "test loop", retry_seconds)
        self.failures, self.steps, self.done = failures, 0, threading.Event()

    def step(self) -> None:
        self.steps += 1
        if self.steps <= self.failures:
            raise RuntimeError(f"failure {self.steps}")
        self.stop()
        self.done.set()


def test_a_failing_step_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    loop = Steps(failures=2, retry_seconds=0.01)
    with caplog.at_level(logging.WARNING, logger="reprieve_operator"):
        loop.start()
        assert loop.done.wait(10)
        loop.thread.join(10)
    assert loop.steps == 3 and not loop.thread.is_alive()
    assert [r.getMessage() for r in caplog.records] == [
        "test loop interrupted (failure 1); reconnecting", "test loop interrupted (failure 2); reconnecting"]


def test_stop_ends_the_retry_wait_at_once() -> None:
    loop = Steps(failures=1, retry_seconds=3600.0)
    loop.start()
    loop.stop()
    loop.thread.join(10)  # would take an hour if the wait ignored stop()
    assert not loop.thread.is_alive() and loop.steps <= 1 and loop.thread.daemon
