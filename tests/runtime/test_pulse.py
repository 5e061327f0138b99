"""reprieve.pulse: the links to peers' pulses, against real processes on loopback (killed, stopped, stopped behind an
address that stops answering, leaving), and the pure verdicts and probe schedule (unit)."""

from __future__ import annotations

import errno
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from reprieve.pulse import (
    ALIVE,
    BEAT,
    BYE,
    DEAD,
    GONE,
    MIN_PEER_LOST_SECONDS,
    PROBE_TIMEOUT_SECONDS,
    PulseLinks,
    PulseServer,
    PulseWatch,
    _Link,
    at_once,
    probe,
    probe_verdict,
    timings,
)

from tests.runtime.helpers_agreement import fill_accept_queue

LOST_S = 2.0


@pytest.mark.unit
def test_a_connect_says_alive_dead_gone_or_nothing() -> None:
    assert probe_verdict(None) == ALIVE
    assert probe_verdict(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) == DEAD
    assert probe_verdict(ConnectionResetError(errno.ECONNRESET, "reset")) == DEAD
    assert probe_verdict(TimeoutError("timed out")) == GONE
    assert probe_verdict(OSError(errno.EHOSTUNREACH, "No route to host")) == GONE
    assert probe_verdict(OSError(errno.EMFILE, "Too many open files")) is None  # says nothing of the peer
    assert probe_verdict(socket.gaierror(-2, "Name or service not known")) is None


@pytest.mark.unit
def test_the_bound_is_two_missed_beats_and_the_probe_s_timeout() -> None:
    beat, quiet = timings(2.0)
    assert quiet == pytest.approx(2.0 - PROBE_TIMEOUT_SECONDS) and beat == pytest.approx(quiet / 2)
    assert timings(1.0) == timings(MIN_PEER_LOST_SECONDS)  # never below the documented minimum
    assert timings(10.0)[1] == pytest.approx(8.5)


@pytest.mark.unit
@pytest.mark.parametrize(("heard", "probed", "probes", "due"), [
    (10.0, float("-inf"), 0, 10.5),  # quiet_s after the last beat
    (10.0, 10.5, 1, 11.0),  # then quiet_s after the last probe it answered
    (12.0, 10.5, 1, 12.5),  # a beat since: after the beat
    (10.0, 11.5, 4, float("inf")),  # PROBES_A_SPELL answered: no more this spell (the queue stays short)
])
def test_a_link_falls_due_for_a_probe_after_quiet_s_a_few_times_a_spell(heard: float, probed: float, probes: int,
                                                                        due: float) -> None:
    link = _Link(("10.0.0.1", 1), socket.socket(), heard, probes, probed)
    try:
        assert link.probe_at(0.5, PulseLinks.PROBES_A_SPELL) == due
    finally:
        link.sock.close()


@pytest.mark.unit
def test_every_probe_runs_at_once_not_one_timeout_after_another() -> None:
    together = threading.Barrier(3, timeout=5.0)  # passes only when all three are under way together

    def slow(x: int) -> int:
        together.wait()
        return x * 2

    assert at_once({1: 1, 2: 2, 3: 3}, slow) == {1: 2, 2: 4, 3: 6}
    assert at_once({}, slow) == {}


class _Peer:
    """A real process holding a pulse on loopback (``kill``, ``stop``: what happens to a peer)."""

    def __init__(self, host: str = "127.0.0.1", watchers: int = 1) -> None:
        code = (f"import time\nfrom reprieve.pulse import PulseServer\n"
                f"s = PulseServer({host!r}, {timings(LOST_S)[0]}, watchers={watchers}).start()\n"
                f"print(s.port, flush=True)\n"
                f"import sys\nsys.stdin.readline()\ns.close(leaving=True)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.address = (host, int(self.proc.stdout.readline()))

    def leave(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(10)

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def peer() -> Iterator[_Peer]:
    p = _Peer()
    yield p
    p.proc.kill()
    p.proc.wait(10)


def _listen(links: PulseLinks, seconds: float) -> tuple[list[tuple[str, int, float]], float]:
    started = time.monotonic()
    events = links.listen(seconds, threading.Event())
    return events, time.monotonic() - started


def _no_verdict_until(links: PulseLinks, done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Listen in short slices, with no verdict in any, until ``done()`` (something observable happened)."""
    limit = time.monotonic() + timeout
    while not done():
        assert _listen(links, 0.05)[0] == [], f"a verdict before {what}"
        assert time.monotonic() < limit, f"not within {timeout} s: {what}"


@pytest.mark.integration  # real processes and sockets
def test_a_killed_peer_is_dead_at_once(peer: _Peer) -> None:
    links = PulseLinks(LOST_S, time.monotonic)
    try:
        assert links.link({1: peer.address}) == []
        linked = links.heard(1) or 0.0
        _no_verdict_until(links, lambda: (links.heard(1) or 0.0) > linked, "a beat")
        peer.proc.send_signal(signal.SIGKILL)
        events, took = _listen(links, 5.0)
        assert [e[:2] for e in events] == [(DEAD, 1)] and took < 0.5, (events, took)
        assert links.heard(1) is None and links.link({1: peer.address}) == []  # said once: never linked again
    finally:
        links.close()


@pytest.mark.integration  # real processes and sockets
def test_a_peer_that_leaves_the_job_is_no_loss(peer: _Peer) -> None:
    """Also when it leaves before its pulse accepted process 0's link (still in the accept queue: closing the
    listener would reset it, and process 0 would take the reset for a death)."""
    links = PulseLinks(LOST_S, time.monotonic)
    try:
        links.link({1: peer.address})
        peer.leave()  # at once: the link is usually not accepted yet
        _no_verdict_until(links, lambda: links.heard(1) is None, "the BYE unlinked it")
        assert links.link({1: peer.address}) == []  # never linked again (its pulse now refuses)
    finally:
        links.close()


@pytest.mark.integration  # real processes and sockets
def test_a_stopped_peer_answers_and_is_left_alone_then_gone_once_its_address_stops_answering(peer: _Peer) -> None:
    """SIGSTOP: no beats, but its kernel completes the probes' handshakes (busy, not lost), and the few probes of a
    long spell never fill its accept queue (no false verdict). Stopped again, then its queue filled mid-spell,
    after a probe it answered: the kernel drops the next SYNs, as for a vanished node, and the spell's next probe
    gets no answer: gone, within the bound of the queue filling."""
    links = PulseLinks(LOST_S, time.monotonic)
    held: list[socket.socket] = []
    try:
        links.link({1: peer.address})
        peer.proc.send_signal(signal.SIGSTOP)
        _no_verdict_until(links, lambda: links.probes(1) == PulseLinks.PROBES_A_SPELL, "every probe of the spell")
        peer.proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        while (links.heard(1) or 0.0) <= resumed:  # beats again: a new quiet spell
            assert _listen(links, 0.1)[0] == [] and time.monotonic() - resumed < 10, "no beat after SIGCONT"
        peer.proc.send_signal(signal.SIGSTOP)
        _no_verdict_until(links, lambda: links.probes(1) >= 1, "the spell's first probe answered")
        held = fill_accept_queue(peer.address)
        filled = time.monotonic()
        events = links.listen(5.0, threading.Event())
        found = time.monotonic() - filled
        assert [e[:2] for e in events] == [(GONE, 1)], events
        assert found <= LOST_S + 0.5, f"gone {found:.2f} s after it stopped answering (bound {LOST_S} s)"
    finally:
        peer.proc.send_signal(signal.SIGCONT)
        for sock in held:
            sock.close()
        links.close()


@pytest.mark.integration  # real processes and sockets
def test_a_first_link_refused_is_dead_and_one_without_an_answer_is_said_and_tried_again_later(
        caplog: pytest.LogCaptureFixture) -> None:
    """Refused: the process wrote its pulse into its record, so it listened, and has ended. No answer from a
    process that just wrote its record is more likely a firewall between the pods than a loss: a warning naming
    the cause, no verdict (it would end the gang), and another try after ``RETRY_S``."""
    now = [100.0]
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # bound, not listening: refused
        with socket.socket() as full:
            full.bind(("127.0.0.3", 0))
            full.listen(0)
            queued = socket.create_connection(full.getsockname(), timeout=1.0)
            links = PulseLinks(LOST_S, lambda: now[0], probe_timeout_s=0.3)
            try:
                targets = {1: bound.getsockname(), 2: full.getsockname()}
                assert [e[:2] for e in links.link(targets)] == [(DEAD, 1)]
                assert "process 2's pulse at 127.0.0.3:" in caplog.text and "NetworkPolicy" in caplog.text
                tried: list[int] = []
                links._connect = lambda address: tried.append(address[1]) or (None, GONE)  # type: ignore[method-assign]
                assert links.link(targets) == [] and tried == []  # not before RETRY_S, and 1 is judged once
                now[0] += PulseLinks.RETRY_S
                assert links.link(targets) == [] and tried == [full.getsockname()[1]]
            finally:
                links.close()
                queued.close()


@pytest.mark.integration  # real processes and sockets
def test_a_link_that_closes_while_its_pulse_still_answers_is_linked_again() -> None:
    """A connection can close without the process ending (a reset on the path): the confirming probe answers, so
    no verdict; the next ``link`` holds a new one."""
    server = PulseServer("127.0.0.1", 0.05).start()
    links = PulseLinks(LOST_S, time.monotonic)
    try:
        links.link({1: ("127.0.0.1", server.port)})
        _no_verdict_until(links, lambda: len(server._conns) == 1, "the server accepted the link")
        with server._lock:  # the server side of the link closes; the listener stays
            old = list(server._conns)
            for conn in old:
                conn.shutdown(socket.SHUT_RDWR)
        _no_verdict_until(links, lambda: any(c not in old for c in server._conns), "a new link")
        assert links.link({1: ("127.0.0.1", server.port)}) == []
        assert links.heard(1) is not None
    finally:
        links.close()
        server.close()


@pytest.mark.integration  # real processes and sockets
def test_a_pulse_beats_and_says_bye() -> None:
    server = PulseServer("127.0.0.1", 0.05).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2.0) as conn:
            conn.settimeout(2.0)
            assert conn.recv(1) == BEAT
            server.close(leaving=True)
            seen = b""
            while chunk := conn.recv(64):
                seen += chunk
            assert seen.endswith(BYE)
        assert probe(("127.0.0.1", server.port), 1.0) == DEAD  # nothing listens once it left
    finally:
        server.close()


@pytest.mark.unit
def test_closing_a_pulse_and_a_watch_ends_their_waits_at_once_not_a_beat_later() -> None:
    """Both threads wait in a selector a beat at a time; every agreed exit closes them (restart gap): a close wakes
    them. With 29-30 s beats, a close that waited for the beat would take that long."""
    server = PulseServer("127.0.0.1", 30.0).start()
    watch = PulseWatch(PulseLinks(60.0, time.monotonic), lambda events: False)
    watch.target(1, ("127.0.0.1", server.port))
    watch.start()
    try:
        deadline = time.monotonic() + 10
        while not watch.settled(1):  # linked: the watch's thread now waits in its selector
            assert time.monotonic() < deadline, "the watch never linked to the pulse"
            time.sleep(0.01)
        assert watch.links.beat_s > 25
        start = time.monotonic()
        watch.close()
        server.close(leaving=True)
        elapsed = time.monotonic() - start
        assert watch._thread is not None and not watch._thread.is_alive()
        assert server._thread is not None and not server._thread.is_alive()
        assert elapsed < 5.0, f"closing took {elapsed:.1f}s: the threads waited for their beat"
    finally:
        watch.close()
        server.close()


@pytest.mark.integration  # real processes and sockets
def test_process_0_s_pulse_queues_every_watcher_s_first_link() -> None:
    """At a start every other process links to process 0's pulse at once: its accept queue holds them all, even
    while the process is stalled (a queue of 8 dropped the SYNs past 8 peers: a link without an answer)."""
    peer = _Peer(watchers=20)
    held: list[socket.socket] = []
    try:
        peer.proc.send_signal(signal.SIGSTOP)  # nothing is accepted: the queue alone must hold them
        for _ in range(20):
            held.append(socket.create_connection(peer.address, timeout=0.5))
    finally:
        peer.proc.kill()
        peer.proc.wait(10)
        for sock in held:
            sock.close()
