"""reprieve.tether: what a knock at the coordination service's address says, the held connection's cycle on
loopback, and (root only) a service host that vanishes without closing anything, noticed by TCP keepalive (the real
thing, process 0 of a real job SIGKILLed, is in test_startup_and_peers.py)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from reprieve.tether import ServiceTether, knock_says_gone, split_address

from tests.runtime.test_peers import _until


@pytest.mark.unit
@pytest.mark.parametrize(("err", "gone"), [
    (None, False),  # it answered: the service is there
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),  # the process is gone, its host answers
    (ConnectionResetError(errno.ECONNRESET, "reset"), True),  # its listener closed while the knock arrived
    (TimeoutError("timed out"), True),  # no answer: the host vanished
    (OSError(errno.EHOSTUNREACH, "no route to host"), True),
    (OSError(errno.ENETUNREACH, "network is unreachable"), True),
    (socket.gaierror(socket.EAI_NONAME, "name does not resolve"), None),  # no verdict: knock again later
    (OSError(errno.EMFILE, "too many open files"), None),
])
def test_what_a_knock_says(err: OSError | None, gone: bool | None) -> None:
    assert knock_says_gone(err) is gone


@pytest.mark.unit
@pytest.mark.parametrize(("address", "target"), [
    ("10.0.3.7:8476", ("10.0.3.7", 8476)),
    ("job-0.job:8476", ("job-0.job", 8476)),
    ("[fd00::7]:8476", ("fd00::7", 8476)),
    ("10.0.3.7", None),
    (":8476", None),
])
def test_split_address(address: str, target: tuple[str, int] | None) -> None:
    assert split_address(address) == target


class _Service:
    """A listener on loopback that counts the connections it accepted and can drop them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.listener.accept()[0])
            except OSError:
                return

    def die(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # stops listening and wakes the accept (close alone does neither)
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.mark.integration  # real sockets on loopback
def test_a_closed_connection_is_held_again_while_the_service_answers_and_reported_once_it_does_not() -> None:
    service, gone = _Service(), []
    tether = ServiceTether(service.address, gone.append, keepalive_s=1, knock_s=1.0).start()
    try:
        _until(lambda: tether.holds == 1 and len(service.accepted) == 1, "the first connection held")
        service.accepted[0].close()  # the server drops it (gRPC's handshake timeout): the knock connects again
        _until(lambda: tether.holds == 2 and len(service.accepted) == 2, "held again after the close")
        assert gone == []
        service.die()
        _until(lambda: len(gone) == 1, "the service reported gone")
        assert gone[0].startswith(f"a knock at {service.address} found no service")
    finally:
        tether.close()


@pytest.mark.integration
def test_close_ends_the_hold_at_once_and_reports_nothing() -> None:
    service, gone = _Service(), []
    tether = ServiceTether(service.address, gone.append, keepalive_s=1, knock_s=1.0).start()
    _until(lambda: tether.holds == 1, "the connection held")
    tether.close()  # joins the thread: nothing can be reported after it returns
    assert tether._thread is not None and not tether._thread.is_alive()
    assert gone == [] and tether.holds == 1
    service.die()


# -- a host that vanishes: TCP keepalive (issue #24) ---------------------------------------------------------------

_HOLD = """
import socket
s = socket.create_server(("0.0.0.0", 7001))
print("listening", flush=True)
held = []
while True:
    held.append(s.accept()[0])  # held open, never answered: the tether's connection stays idle
"""


def _in_netns(path: str, make: Callable[[], socket.socket]) -> socket.socket:
    """A socket made by ``make`` in the network namespace at ``path`` (on a thread that enters it: a socket stays in
    the namespace it was made in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, Any] = {}

    def run() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                raise OSError(ctypes.get_errno(), "setns")
            out["sock"] = make()
        except OSError as err:
            out["err"] = err
        finally:
            os.close(fd)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "err" in out:
        raise out["err"]
    return out["sock"]


@pytest.fixture
def service_host() -> Iterator[tuple[str, str]]:
    """A service listening on 10.78.0.2:7001 in a network namespace of its own, joined by a veth pair to a client
    namespace: (the service's namespace, the client's)."""
    tag = f"rpvtether{os.getpid()}"
    svc, cli = f"{tag}-svc", f"{tag}-cli"
    listener: subprocess.Popen[str] | None = None

    def sh(*cmd: str) -> None:
        subprocess.run(list(cmd), check=True, capture_output=True, text=True)

    try:
        sh("ip", "netns", "add", svc)
        sh("ip", "netns", "add", cli)
        sh("ip", "link", "add", f"{tag}a", "netns", svc, "type", "veth", "peer", "name", f"{tag}b", "netns", cli)
        for ns, dev, addr in ((svc, f"{tag}a", "10.78.0.2/24"), (cli, f"{tag}b", "10.78.0.1/24")):
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", addr, "dev", dev)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        listener = subprocess.Popen(["ip", "netns", "exec", svc, "python3", "-c", _HOLD], stdout=subprocess.PIPE,
                                    text=True)
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        yield svc, cli
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        for ns in (svc, cli):
            subprocess.run(["ip", "netns", "delete", ns], check=False, capture_output=True)


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(c) for c in ("ip", "iptables")),
                    reason="needs root, ip and iptables (network namespaces, a veth pair, DROP rules)")
def test_a_service_host_that_vanishes_without_closing_anything_is_noticed_by_keepalive_then_the_knock(
        service_host: tuple[str, str]) -> None:
    svc, cli = service_host
    keepalive_s, knock_s = 2, 1.0
    gone: list[str] = []
    reported = threading.Event()

    def on_gone(why: str) -> None:
        gone.append(why)
        reported.set()

    def connect(target: tuple[str, int], timeout: float) -> socket.socket:
        return _in_netns(f"/run/netns/{cli}", lambda: socket.create_connection(target, timeout=timeout))

    tether = ServiceTether("10.78.0.2:7001", on_gone, keepalive_s=keepalive_s, knock_s=knock_s,
                           connect=connect).start()
    try:
        _until(lambda: tether.holds == 1, "the connection held")
        # The host vanishes: nothing closes, nothing answers any more (its interfaces stay; every packet dropped).
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(["ip", "netns", "exec", svc, "iptables", "-I", chain, "!", f"-{chain[0].lower()}", "lo",
                            "-j", "DROP"], check=True)
        cut = time.monotonic()
        assert gone == []  # the connection was held until the cut: nothing reported yet
        # Keepalive: idle keepalive_s, then 2 unanswered probes 1 s apart (TCP_KEEPCNT, TCP_KEEPINTVL in _hold) end
        # the connection; the knock then finds no answer within knock_s. The margin is for a loaded machine.
        bound = keepalive_s + 2 * 1 + 1 + knock_s + 10.0
        assert reported.wait(bound), f"on_gone not called within {bound:.0f} s of the cut (holds {tether.holds})"
        assert len(gone) == 1 and gone[0].startswith("a knock at 10.78.0.2:7001 found no service"), gone
        assert tether.holds == 1  # the knock never connected again
        print(f"reported gone {time.monotonic() - cut:.1f} s after the cut")
    finally:
        tether.close()
