"""Every process's pulse: how process 0 knows a peer is lost within ``REPRIEVE_PEER_LOST_SECONDS`` (2 s).

JAX's coordination service declares a process dead only at its heartbeat timeout (10 s here, 100 s by default),
and the liveness records of :mod:`reprieve.peers` are written a few times a heartbeat. Neither is fast enough for a
fault to cost about a second, so every process listens on a TCP port of its own (its *pulse*, an ephemeral port on
its pod IP, written into its liveness record); process 0 holds a connection to each, every other process one to
process 0's (:class:`PulseWatch`: a thread of its own, never behind a call to the coordination service, which
hangs while process 0's host is stopped or cut off). From the watching side:

- **The process died** (killed, out of memory, crashed) **on a host that still answers**: the kernel closes the
  connection the instant the process ends. Process 0 confirms with one connect to the same port: *refused* (no
  process listens there any more) is certain. Detection: milliseconds.
- **Its node vanished, or it is cut off the network**: nothing closes. The process writes a beat on the connection
  every ``beat_s``; a link quiet for ``quiet_s`` (two missed beats) is probed with a fresh connect: *no answer*
  within ``PROBE_TIMEOUT_SECONDS`` (a SYN and its one resend at Linux's 1 s initial retransmission timeout) means
  gone. Detection: at most ``quiet_s`` + the probe timeout = the bound.
- **It is alive but busy** (compiling, restoring, a long step, a call that holds the GIL, stopped): its beats stop,
  but the kernel still completes the probe's handshake on its listening socket: *accepted* is alive. A quiet spell
  is probed again every ``quiet_s``, a few times only (``PulseLinks.PROBES_A_SPELL``: a stalled process accepts
  none, and more than its accept queue holds would look like a gone host); after those, TCP keepalive on the held
  connection (the peer's kernel answers it even while the process is stalled) still finds its node gone.
- **It leaves the job** (its exit decided by the runtime, a survivor of another peer's loss included): it writes
  ``BYE`` before closing, and its close is not a loss.

The bound, ``quiet_s`` + ``PROBE_TIMEOUT_SECONDS``, is ``REPRIEVE_PEER_LOST_SECONDS``; below
``MIN_PEER_LOST_SECONDS`` the beats would be too close together for a loaded Python thread to keep (refused at
start). A false verdict ends the gang, so every verdict of loss is a connect the peer's kernel did not answer or
refused: never a late beat alone.

:func:`probe_verdict` and :func:`timings` are pure; :class:`PulseServer` is the watched side (a thread);
:class:`PulseLinks` the watching side, run by :class:`PulseWatch` (a thread) for :class:`reprieve.peers.PeerWatch`.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .background import WAKE, Daemon, Waker
from .tether import unanswered_connect

log = logging.getLogger(__name__)

BEAT = b"."
BYE = b"x"
PROBE_TIMEOUT_SECONDS = 1.5  # a SYN and its one resend (Linux's initial retransmission timeout is 1 s)
DEFAULT_PEER_LOST_SECONDS = 2.0
MIN_PEER_LOST_SECONDS = 1.75  # quiet_s 0.25: beats 0.125 s apart, about what a loaded Python thread keeps
_KEEPALIVE = (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 2))  # a gone node, during a quiet spell

ALIVE, DEAD, GONE = "alive", "dead", "gone"

_K = TypeVar("_K")
_T = TypeVar("_T")
_R = TypeVar("_R")


def timings(lost_s: float) -> tuple[float, float]:
    """``(beat_s, quiet_s)`` for the detection bound ``lost_s``: a link is probed after two missed beats, and the
    probe's own timeout takes the rest of the bound (pure)."""
    quiet_s = max(lost_s, MIN_PEER_LOST_SECONDS) - PROBE_TIMEOUT_SECONDS
    return quiet_s / 2, quiet_s


def probe_verdict(err: OSError | None) -> str | None:
    """What a connect to a peer's pulse that ended with ``err`` (None: accepted) says (pure): ``ALIVE`` (its
    listening socket is there: the process lives, however busy), ``DEAD`` (refused or reset: the host answers and
    nothing listens, the process has ended), ``GONE`` (no answer in time, or the host unreachable: its node is gone
    or it is cut off), None (no verdict: e.g. no file descriptor left, which says nothing of the peer)."""
    if err is None:
        return ALIVE
    if isinstance(err, (ConnectionRefusedError, ConnectionResetError)):
        return DEAD
    return GONE if unanswered_connect(err) else None


def probe(address: tuple[str, int], timeout: float) -> str | None:
    """Connect to ``address`` once and close: :func:`probe_verdict` of how it went."""
    try:
        socket.create_connection(address, timeout=timeout).close()
    except OSError as err:
        return probe_verdict(err)
    return ALIVE


def at_once(items: Mapping[_K, _T], fn: Callable[[_T], _R]) -> dict[_K, _R]:
    """``{key: fn(item)}``, every call in a thread of its own (a lost node takes all its processes: probing them
    one after another would cost their timeouts in a row). One item runs in the caller's thread, and so does each
    where no thread can start (the interpreter is exiting)."""
    results: dict[_K, _R] = {}

    def run(key: _K) -> None:
        results[key] = fn(items[key])

    threads: list[threading.Thread] = []
    if len(items) > 1:
        for key in items:
            thread = threading.Thread(target=run, args=(key,), name=f"reprieve-probe-{key}", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # no new threads at interpreter shutdown
                break
            threads.append(thread)
    for thread in threads:
        thread.join()
    for key in items:
        if key not in results:
            run(key)
    return results


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


class PulseServer(Daemon):
    """A process's pulse: a listening socket on ``ip``; every connection it accepts hears a beat every ``beat_s``
    and ``BYE`` when the process leaves the job (:meth:`close`). ``watchers``: how many processes link to it at
    once (1 for a process but 0; every other process for process 0), so that their first connects all fit in the
    accept queue."""

    BACKLOG = 8  # beside the links: a quiet spell's probes (PulseLinks.PROBES_A_SPELL) while the process is stalled

    def __init__(self, ip: str, beat_s: float, watchers: int = 1) -> None:
        super().__init__("reprieve-pulse")
        self.beat_s = beat_s
        self._listener = socket.socket(_family(ip), socket.SOCK_STREAM)
        try:
            self._listener.bind((ip, 0))
            self._listener.listen(self.BACKLOG + watchers)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._waker = Waker(self._selector)

    def close(self, leaving: bool = True) -> None:
        """Stop beating; with ``leaving``, tell every link this process leaves the job (not a loss); close all."""
        self._stop.set()
        self._waker.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.beat_s + 1.0)
        while leaving:  # a link still in the accept queue hears it too (closing the listener would reset it)
            try:
                conn, _ = self._listener.accept()
            except OSError:  # BlockingIOError: none left
                break
            with self._lock:
                self._conns.append(conn)
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    if leaving:
                        conn.send(BYE)
                    conn.close()
            self._conns.clear()
        self._listener.close()
        if self._thread is None:  # never started; once started, the thread closes them as it ends
            self._selector.close()
            self._waker.close()

    def _run(self) -> None:
        selector = self._selector
        try:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(self.beat_s):
                    if key.data is WAKE:
                        self._waker.drain()  # close(): the loop's test ends it
                    elif key.fileobj is self._listener:
                        self._accept(selector)
                    else:
                        self._drain(selector, key.fileobj)  # type: ignore[arg-type]
                if not self._stop.is_set():
                    self._beat(selector)
        finally:
            selector.close()
            self._waker.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        """Every connection queued (at a start, every other process links to process 0's at once)."""
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # BlockingIOError: none left
                return
            conn.setblocking(False)
            with self._lock:
                self._conns.append(conn)
            selector.register(conn, selectors.EVENT_READ)

    def _drain(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        """A link speaks only to close (process 0 gone, or a probe done): drop it."""
        try:
            if conn.recv(64):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._drop(selector, conn)

    def _beat(self, selector: selectors.BaseSelector) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.send(BEAT)
            except BlockingIOError:
                continue  # its buffer is full of beats: process 0 is busy, it hears the next
            except OSError:
                self._drop(selector, conn)

    def _drop(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn)
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
        conn.close()


@dataclass
class _Link:
    address: tuple[str, int]
    sock: socket.socket
    heard: float  # when the last beat (or the connect) came
    probes: int = 0  # probes this quiet spell that it answered
    probed: float = float("-inf")  # when the last of them was made

    def probe_at(self, quiet_s: float, most: int) -> float:
        """When this link falls due for a probe (pure): ``quiet_s`` after its last beat and its last probe, while
        fewer than ``most`` probes of this quiet spell were answered; ``inf`` after that."""
        return max(self.heard, self.probed) + quiet_s if self.probes < most else float("inf")


class PulseLinks:
    """The watching side: a link to every watched peer's pulse, and the verdicts they give (see the module's
    docstring). Not a thread: :class:`PulseWatch` runs it. A verdict is an event
    ``(kind, process, seconds)``: ``DEAD`` or ``GONE``, ``seconds`` since the peer was last heard; each process is
    given at most one, and one that left (``BYE``) none."""

    RETRY_S = 30.0  # a first link that got no answer (a firewall between the pods?) is tried again after this
    # Probes of one quiet spell, ``quiet_s`` apart: a spell that began while the peer was only busy (a late beat)
    # still finds its node gone within the bound. Few: a stalled peer accepts none of them, and more than its
    # accept queue holds (PulseServer.BACKLOG) would look like a host that does not answer.
    PROBES_A_SPELL = 4

    def __init__(self, lost_s: float, clock: Callable[[], float],
                 probe: Callable[[tuple[str, int], float], str | None] = probe,
                 probe_timeout_s: float = PROBE_TIMEOUT_SECONDS) -> None:
        self.beat_s, self.quiet_s = timings(lost_s)
        self.probe_timeout_s = probe_timeout_s
        self._clock = clock
        self._probe = probe
        self._selector = selectors.DefaultSelector()
        self._waker = Waker(self._selector)
        self._links: dict[int, _Link] = {}
        self._done: set[int] = set()  # a verdict given, or left: never linked again
        self._retry_at: dict[int, float] = {}  # process -> when to try again a first link that got no answer
        self.addresses: dict[int, tuple[str, int]] = {}

    def link(self, targets: Mapping[int, tuple[str, int]]) -> list[tuple[str, int, float]]:
        """Hold a connection to every process of ``targets`` (process -> its pulse) not linked yet; ``DEAD`` for each
        whose pulse refuses (its record says it listened: it has ended). One that does not answer is tried again
        after ``RETRY_S``."""
        now = self._clock()
        new = {p: a for p, a in targets.items()
               if p not in self._links and p not in self._done and self._retry_at.get(p, now) <= now}
        if not new:
            return []
        self.addresses.update(new)
        connected = at_once(new, self._connect)
        events: list[tuple[str, int, float]] = []
        now = self._clock()
        for p, (sock, verdict) in sorted(connected.items()):
            if sock is not None:
                self._hold(p, sock, now)
            elif verdict == DEAD:
                self._done.add(p)
                events.append((verdict, p, 0.0))
            else:
                # No answer from a process that has just written its record: more likely a firewall or a
                # NetworkPolicy between the pods than a loss (it would end the gang): said, and tried again later.
                self._retry_at[p] = now + self.RETRY_S
                log.warning("process %d's pulse at %s:%d does not answer process 0 (%s): its loss is found at the "
                            "silence threshold and JAX's heartbeat timeout, not within %.1f s; a NetworkPolicy "
                            "between the job's pods must allow every TCP port among them (JAX's own collectives use "
                            "ephemeral ports too)", p, *self.addresses[p], verdict or "no verdict",
                            self.quiet_s + self.probe_timeout_s)
        return events

    def _connect(self, address: tuple[str, int]) -> tuple[socket.socket | None, str | None]:
        try:
            sock = socket.create_connection(address, timeout=self.probe_timeout_s)
        except OSError as err:
            return None, probe_verdict(err)
        return sock, ALIVE

    def _hold(self, p: int, sock: socket.socket, now: float) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in _KEEPALIVE:
                if hasattr(socket, name):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        self._links[p] = _Link(self.addresses[p], sock, now)
        self._selector.register(sock, selectors.EVENT_READ, p)

    def _unlink(self, p: int) -> None:
        link = self._links.pop(p, None)
        if link is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(link.sock)
            link.sock.close()

    def settled(self, processes: int) -> bool:
        """Whether each of ``processes`` peers is linked, judged, left or waiting for another try: until then
        :class:`reprieve.peers.PeerWatch` reads the records sooner (a peer lost before its link is otherwise
        found only at the silence threshold)."""
        return len(self._links) + len(self._done) + len(self._retry_at) >= processes

    def probes(self, p: int) -> int:
        """How many probes of ``p``'s current quiet spell it answered (0 when not linked)."""
        link = self._links.get(p)
        return 0 if link is None else link.probes

    def heard(self, p: int) -> float | None:
        """When ``p`` was last heard (a beat, or the link's connect); None when not linked."""
        link = self._links.get(p)
        return None if link is None else link.heard

    def listen(self, seconds: float, stop: threading.Event) -> list[tuple[str, int, float]]:
        """Hear the beats for up to ``seconds`` (or until ``stop``); return early with the verdicts found."""
        deadline = self._clock() + seconds
        while not stop.is_set():
            now = self._clock()
            left = deadline - now
            if left <= 0:
                return []
            closed: list[int] = []
            if self._links:
                for key, _ in self._selector.select(max(0.005, min(left, self.beat_s, self._next_probe() - now))):
                    p = key.data
                    if p is WAKE:
                        self._waker.drain()  # wake(): the loop's test of ``stop`` ends it
                    elif self._read(p):
                        closed.append(p)
            else:
                stop.wait(min(left, self.beat_s))
            events = self._judge(closed)
            if events:
                return events
        return []

    def _next_probe(self) -> float:
        """When the next quiet link falls due for a probe (``inf``: none will): the wait ends then, not a beat
        later, so the bound holds to the millisecond."""
        return min((link.probe_at(self.quiet_s, self.PROBES_A_SPELL) for link in self._links.values()),
                   default=float("inf"))

    def _read(self, p: int) -> bool:
        """Read ``p``'s link: True when it closed without ``BYE`` (a verdict is due); a ``BYE`` unlinks it."""
        link = self._links[p]
        try:
            data = link.sock.recv(4096)
        except BlockingIOError:
            return False
        except OSError:  # reset, or keepalive found no host: the probe decides which
            data = b""
        if BYE in data:
            self._unlink(p)
            self._done.add(p)
            return False
        if not data:
            return True
        link.heard, link.probes = self._clock(), 0
        return False

    def _judge(self, closed: list[int]) -> list[tuple[str, int, float]]:
        """Probe the links that closed and those quiet for ``quiet_s`` (again every ``quiet_s``, up to
        ``PROBES_A_SPELL`` times a spell): the verdicts."""
        now = self._clock()
        due = {p: link.address for p, link in self._links.items()
               if p in closed or link.probe_at(self.quiet_s, self.PROBES_A_SPELL) <= now}
        if not due:
            return []
        verdicts = at_once(due, lambda address: self._probe(address, self.probe_timeout_s))
        events: list[tuple[str, int, float]] = []
        again: dict[int, tuple[str, int]] = {}
        now = self._clock()
        for p, verdict in sorted(verdicts.items()):
            link = self._links[p]
            if verdict in (DEAD, GONE):
                self._unlink(p)
                self._done.add(p)
                events.append((verdict, p, now - link.heard))
            elif p in closed:
                # Closed, yet its pulse answered: a reset on the path, or the probe reached the listener of a
                # process that was ending (its queue is reset a moment later). A new link settles it: held, or
                # refused (then dead), or closed again (judged again).
                self._unlink(p)
                again[p] = link.address
                log.debug("the link to process %d closed but its pulse answered: linking again", p)
            else:
                link.probes, link.probed = link.probes + 1, now
                log.debug("process %d is quiet for %.1f s but its pulse answers: busy, not lost", p, now - link.heard)
        return events + self.link(again)

    def wake(self) -> None:
        """End a :meth:`listen` waiting in another thread now (its ``stop`` set first)."""
        self._waker.wake()

    def close(self) -> None:
        for p in list(self._links):
            self._unlink(p)
        self._selector.close()
        self._waker.close()


class PulseWatch(Daemon):
    """:class:`PulseLinks` in a thread of their own (never behind a call to the coordination service, which hangs
    while its host is stopped or cut off): links to every target given (:meth:`target`), and hands each batch of
    verdicts to ``on_verdict``, which says whether to stop (this process is ending)."""

    def __init__(self, links: PulseLinks, on_verdict: Callable[[list[tuple[str, int, float]]], bool]) -> None:
        super().__init__("reprieve-pulse-links")
        self.links = links
        self._on_verdict = on_verdict
        self._targets: dict[int, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def target(self, p: int, address: tuple[str, int]) -> None:
        """Link to ``p``'s pulse at ``address`` (from its record; the first address given stays)."""
        with self._lock:
            self._targets.setdefault(p, address)

    def settled(self, processes: int) -> bool:
        return self.links.settled(processes)

    def close(self) -> None:
        self._stop.set()
        self.links.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(PROBE_TIMEOUT_SECONDS + 2.0)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    targets = dict(self._targets)
                events = self.links.link(targets) or self.links.listen(2 * self.links.beat_s, self._stop)
                if events and not self._stop.is_set() and self._on_verdict(events):
                    return
        finally:
            self.links.close()
