"""``bootstrap.await_listening``: processes other than 0 knock at the coordinator before jax.distributed connects,
so gRPC's ~1 s back-off after a refused first connection is never paid (real sockets on loopback)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from reprieve.bootstrap import await_listening

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_returns_at_once_when_the_coordinator_listens() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert await_listening(f"127.0.0.1:{server.getsockname()[1]}", 10) < 0.5


def test_waits_for_a_coordinator_that_starts_later() -> None:
    port = _free_port()
    opened = threading.Event()

    def serve() -> None:
        time.sleep(0.4)
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            opened.set()
            time.sleep(2)

    threading.Thread(target=serve, daemon=True).start()
    waited = await_listening(f"127.0.0.1:{port}", 10)
    assert opened.is_set() and 0.35 <= waited < 1.5, waited


def test_gives_up_after_its_timeout_and_leaves_the_error_to_jax() -> None:
    waited = await_listening(f"127.0.0.1:{_free_port()}", 0.3)
    assert 0.3 <= waited < 1.5
    assert await_listening("not-an-address", 5) == 0.0
