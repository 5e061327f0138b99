"""An idle TCP connection to the coordination service, held by every process but 0: it closes the instant process 0
dies, and a knock at the same address then says whether the service is gone.

When process 0 (the service's host) dies on a host that still answers, every other process's JAX client sees the
service's connection close and aborts at once (SIGABRT within a few milliseconds; JAX then spends about 0.1 s
writing its stack trace before the process ends): no silence threshold of :class:`reprieve.peers.PeerWatch` is
that fast, and a failed collective cannot name process 0 either (its address map is in the service). This
connection closes in the same instant (the kernel closes every connection of a dead process), so the survivor
names process 0 inside that window.

The connection never speaks (gRPC's server closes one that sends no preface after its handshake timeout, 120 s by
default). Every close is followed by a knock at the same address (:func:`knock_says_gone`): a connection is held
again; refused, reset or unanswered within ``knock_s`` means the service is gone, reported once to ``on_gone``. TCP
keepalive probes the held connection, so a host that vanished without closing anything is noticed too, within
about ``keepalive_s`` + two unanswered probes a second apart + the knock (5.1 s for 2 s and 1 s in
``tests/runtime/test_tether.py``'s partitioned host).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable

from .background import Daemon

log = logging.getLogger(__name__)

_UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)


def knock_says_gone(err: OSError | None) -> bool | None:
    """Whether a knock at the service's address that ended with ``err`` (None: it connected) says the service is
    gone: True (refused, reset, no answer in time, host unreachable), False (it answered), None (no verdict, e.g. a
    name that does not resolve for now: knock again later). Pure."""
    if err is None:
        return False
    if isinstance(err, (ConnectionRefusedError, ConnectionResetError)):
        return True
    if isinstance(err, socket.gaierror):
        return None
    return True if unanswered_connect(err) else None


def unanswered_connect(err: OSError) -> bool:
    """Whether a connect that failed with ``err`` got no answer at all: none in time, or the host unreachable (no
    route, no neighbour). Refused and reset are answers: something at the address is alive (pure)."""
    return isinstance(err, TimeoutError) or err.errno in _UNREACHABLE


def split_address(address: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` -> (host, port); None when it is not one (pure)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return (host, int(port)) if host and port.isdigit() else None


class ServiceTether(Daemon):
    """Hold a connection to ``address``; call ``on_gone(why)`` once the service there is gone (see above)."""

    def __init__(self, address: str, on_gone: Callable[[str], None], *, keepalive_s: float, knock_s: float,
                 connect: Callable[..., socket.socket] = socket.create_connection) -> None:
        super().__init__("reprieve-tether")
        self._address = address
        self._on_gone = on_gone
        self._keepalive_s = max(1, int(keepalive_s))
        self._knock_s = knock_s
        self._connect = connect
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.holds = 0  # connections held so far (each close is followed by a knock)

    def close(self) -> None:
        """Stop and wait for the thread: the held connection is shut, which ends its wait at once."""
        self._stop.set()
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._knock_s + 2.0)

    def _run(self) -> None:
        target: tuple[str, int] | None = split_address(self._address)
        if target is None:
            log.debug("no tether to %r: not host:port", self._address)
            return
        while not self._stop.is_set():
            try:
                sock = self._connect(target, timeout=self._knock_s)
            except OSError as err:
                gone = knock_says_gone(err)
                if self._stop.is_set():
                    return
                if gone:
                    self._on_gone(f"a knock at {self._address} found no service: {err}")
                    return
                log.debug("knock at %s: %s; knocking again", self._address, err)
                self._stop.wait(self._knock_s)
                continue
            try:
                target = sock.getpeername()[:2]  # the next knock needs no name lookup (a pod's record may be gone)
            except OSError:
                pass
            self._hold(sock)

    def _hold(self, sock: socket.socket) -> None:
        with self._lock:
            if self._stop.is_set():
                sock.close()
                return
            self._sock = sock
            self.holds += 1
        try:
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in (("TCP_KEEPIDLE", self._keepalive_s), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 2)):
                if hasattr(socket, name):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
            while sock.recv(4096):
                pass  # gRPC's server preface: read and dropped
        except OSError as err:
            log.debug("tether to %s ended: %s", self._address, err)
        finally:
            with self._lock:
                self._sock = None
            sock.close()
