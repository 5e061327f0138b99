"""The operator's probe of a silent peer's pod (``reconcile.unreachable``), over real loopback sockets: a connect
that is accepted or refused is an answer (the pod's network is there); one that gets nothing back within the
timeout is not (a pod cut off from the network: its packets dropped)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest
from reprieve_operator.reconcile import unreachable

pytestmark = pytest.mark.unit


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose SYNs go unanswered: a listener with a full accept queue (Linux drops the SYN). Filled
    by connects that complete, until one does not: the queue is full then, whatever the machine's speed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        c = socket.socket()
        c.settimeout(0.5)
        fillers.append(c)
        try:
            c.connect(("127.0.0.1", port))
        except TimeoutError:
            break
    else:
        pytest.fail("the accept queue of a listen(0) socket never filled: no port to probe that does not answer")
    yield port
    for c in [*fillers, listener]:
        c.close()


def test_a_listening_or_refusing_pod_answers_a_silent_one_does_not(silent_port: int) -> None:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: the connect is refused
    try:
        for port, want in ((listening.getsockname()[1], frozenset()), (closed.getsockname()[1], frozenset()),
                           (silent_port, frozenset({"llama-1"}))):
            start = time.monotonic()
            got = asyncio.run(unreachable([("llama-1", "127.0.0.1")], port=port, timeout=0.5))
            assert got == want, (port, got)
            # bounded by the timeout: unbounded, a dropped SYN's connect waits out the kernel's retries (> 60 s)
            assert time.monotonic() - start < 3.0
    finally:
        listening.close()
        closed.close()


def test_the_pods_are_probed_together(silent_port: int) -> None:
    """Several silent peers cost one timeout, not one each."""
    start = time.monotonic()
    got = asyncio.run(unreachable([(f"llama-{i}", "127.0.0.1") for i in range(4)], port=silent_port, timeout=0.5))
    assert got == frozenset(f"llama-{i}" for i in range(4))
    assert time.monotonic() - start < 4 * 0.5  # one after the other takes 2 s at the least
