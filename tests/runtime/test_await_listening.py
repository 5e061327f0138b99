"""``bootstrap.await_listening``: processes other than 0 knock at the coordinator before jax.distributed connects,
so gRPC's ~1 s back-off after a refused first connection is never paid (real sockets on loopback).

Each test counts the knocks (``socket.create_connection``) and the pauses between them (``time.sleep`` in the
caller's thread) instead of timing the call: the pauses are the poll period, never a back-off, and the knocks
stop at the first one answered or the first one past the timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from reprieve.bootstrap import await_listening

from tests.runtime.helpers_agreement import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclass
class Knocks:
    started: list[float] = field(default_factory=list)  # monotonic time at which each knock began
    answered: list[bool] = field(default_factory=list)
    pauses: list[float] = field(default_factory=list)  # what the caller's thread slept between knocks


@pytest.fixture
def knocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Knocks]:
    seen = Knocks()
    caller = threading.get_ident()
    connect, sleep = socket.create_connection, time.sleep

    def knock(*args: object, **kwargs: object) -> socket.socket:
        seen.started.append(time.monotonic())
        try:
            conn = connect(*args, **kwargs)  # type: ignore[arg-type]
        except OSError:
            seen.answered.append(False)
            raise
        seen.answered.append(True)
        return conn

    def pause(seconds: float) -> None:
        if threading.get_ident() == caller:
            seen.pauses.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(socket, "create_connection", knock)
    monkeypatch.setattr(time, "sleep", pause)
    yield seen


def test_returns_at_once_when_the_coordinator_listens(knocks: Knocks) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        await_listening(f"127.0.0.1:{server.getsockname()[1]}", 10)
    assert knocks.answered == [True] and knocks.pauses == []  # one knock, answered; no wait at all


def test_waits_for_a_coordinator_that_starts_later(knocks: Knocks) -> None:
    port = free_port()
    listening: list[float] = []
    done = threading.Event()

    def serve() -> None:  # listens once three knocks were refused (no clock in it: Event waits, not sleeps)
        while len(knocks.answered) < 3:
            done.wait(0.005)
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            listening.append(time.monotonic())
            done.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        await_listening(f"127.0.0.1:{port}", 30)
    finally:
        done.set()
        thread.join(5)
    assert listening, "returned before the coordinator listened"
    assert knocks.answered[-1] and not any(knocks.answered[:-1]) and len(knocks.answered) >= 4, knocks
    # the first knock after the coordinator listened was answered, and was the last
    assert sum(t >= listening[0] for t in knocks.started) <= 1, (listening, knocks)
    # between knocks: the 10 ms poll, not gRPC's ~1 s back-off that this function exists to avoid
    assert knocks.pauses == [0.01] * (len(knocks.answered) - 1), knocks.pauses


def test_gives_up_after_its_timeout_and_leaves_the_error_to_jax(knocks: Knocks) -> None:
    t0 = time.monotonic()
    waited = await_listening(f"127.0.0.1:{free_port()}", 0.3)
    assert waited >= 0.3  # it did wait its timeout, knocking every poll ...
    assert not any(knocks.answered) and len(knocks.answered) > 1
    assert knocks.pauses == [0.01] * (len(knocks.answered) - 1), knocks.pauses
    # ... and gave up at the first knock past it (one that began after the timeout at most)
    assert sum(t >= t0 + 0.3 for t in knocks.started) <= 1, knocks.started
    assert await_listening("not-an-address", 5) == 0.0
