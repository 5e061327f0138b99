"""reprieve.tether: what a knock at the coordination service's address says, and the held connection's cycle on
loopback (the real thing, process 0 of a real job SIGKILLed, is in test_startup_and_peers.py)."""

from __future__ import annotations

import errno
import socket
import threading

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
