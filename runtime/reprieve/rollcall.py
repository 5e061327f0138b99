"""The roll call before ``jax.distributed.initialize``: who has come, who is still awaited, who never came.

JAX's own start-up says nothing while it waits for the other processes and, when one never comes, ends every
process that did with SIGABRT and "another task died" after ``REPRIEVE_INIT_TIMEOUT_SECONDS``, naming nobody. So
before JAX starts its coordination service, process 0 listens on the coordinator's port itself: every other
process connects and says who it is (one JSON line: job, attempt, process index, pod), process 0 answers with who
is still missing, and every process logs ``waiting for process 1 of 2 at ADDRESS (N s left)`` while it waits. At
the timeout every process raises :class:`RollCallError` naming the processes that never came (exit 1, not a
SIGABRT). Once all have come, process 0 closes its listener, tells everybody to go, and JAX starts on the same
port; the others knock until it listens (``bootstrap.await_listening``), so gRPC's back-off is never paid.

A process of another attempt or job that connects (a stale process, a wrong address) is told so and turned
away; it is never counted. The messages and the decisions are pure functions (``tests/runtime/test_rollcall.py``
tables them); :func:`lead` and :func:`attend` are the sockets.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

FIRST_LINE_AFTER_S = 2.0  # a start that takes less says nothing
EVERY_S = 10.0  # then a line this often
TICK_S = 0.1


class RollCallError(RuntimeError):
    """Not every process came within the start-up timeout (the message names the missing ones)."""


@dataclass(frozen=True)
class Hello:
    job: str
    attempt: int
    process: int
    pod: str | None = None

    def line(self) -> bytes:
        return json.dumps({"job": self.job, "attempt": self.attempt, "process": self.process,
                           "pod": self.pod}).encode() + b"\n"

    @classmethod
    def parse(cls, raw: bytes) -> Hello | None:
        try:
            value = json.loads(raw)
            return cls(str(value["job"]), int(value["attempt"]), int(value["process"]), value.get("pod"))
        except (ValueError, KeyError, TypeError):
            return None


def refusal(hello: Hello | None, *, job: str, attempt: int, n: int, present: set[int]) -> str | None:
    """Why process 0 turns a caller away (pure), or None to count it."""
    if hello is None:
        return "not a reprieve roll call line"
    if (hello.job, hello.attempt) != (job, attempt):
        return f"it is attempt {hello.attempt} of job {hello.job!r}; this is attempt {attempt} of job {job!r}"
    if not 0 < hello.process < n:
        return f"process {hello.process} is not one of 1..{n - 1}"
    if hello.process in present:
        return f"process {hello.process} has come already"
    return None


def processes(ids: list[int]) -> str:
    """``process 1``, ``processes 1, 3``, ``processes 1-7`` (pure)."""
    if len(ids) == 1:
        return f"process {ids[0]}"
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"processes {ids[0]}-{ids[-1]}"
    return "processes " + ", ".join(map(str, ids))


def waiting_line(missing: list[int], n: int, address: str, left_s: float, *, coordinator: bool = False) -> str:
    """The line logged while waiting (pure)."""
    who = f"{processes(missing)} of {n}" + (" (the coordinator)" if coordinator else "")
    return f"waiting for {who} at {address} ({max(0.0, left_s):.0f} s left)"


def never_came(missing: list[int], n: int, address: str, waited_s: float, *, coordinator: bool = False) -> str:
    """The error at the timeout (pure)."""
    what = (f"{processes(missing)} of {n} never came to {address} within {waited_s:.0f} s" if not coordinator else
            f"process 0 of {n} (the coordinator) never listened at {address} within {waited_s:.0f} s")
    return (f"{what} (REPRIEVE_INIT_TIMEOUT_SECONDS): check that they were started with the same "
            "REPRIEVE_COORDINATOR_ADDRESS, REPRIEVE_NUM_PROCESSES and REPRIEVE_ATTEMPT, and their own logs")


class _Pacer:
    """When to log the next waiting line."""

    def __init__(self, start: float) -> None:
        self.next = start + FIRST_LINE_AFTER_S

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + EVERY_S
        return True


def lead(bind: tuple[str, int], address: str, *, job: str, attempt: int, n: int, timeout_s: float) -> float:
    """Process 0: take the roll call on ``bind`` until every other process came; the seconds it took.

    Raises:
        RollCallError: the timeout passed first (the message names the missing processes).
    """
    start = time.monotonic()
    pacer = _Pacer(start)
    present: dict[int, socket.socket] = {}
    pending: dict[socket.socket, bytes] = {}  # connected, hello not read whole yet
    server = _listen(bind)
    try:
        while len(present) < n - 1:
            now = time.monotonic()
            missing = [p for p in range(1, n) if p not in present]
            if now - start >= timeout_s:
                message = never_came(missing, n, address, now - start)
                _tell(present.values(), {"missing": missing, "error": message})
                raise RollCallError(message)
            if pacer.due(now):
                log.info("%s", waiting_line(missing, n, address, timeout_s - (now - start)))
                _tell(present.values(), {"missing": missing, "left": timeout_s - (now - start)})
            readable, _, _ = select.select([server, *pending], [], [], TICK_S)
            for sock in readable:
                if sock is server:
                    conn, _ = server.accept()
                    conn.setblocking(False)
                    pending[conn] = b""
                    continue
                chunk = _recv(sock)
                if chunk is None:
                    continue
                if not chunk:  # closed before saying who it is
                    pending.pop(sock)
                    sock.close()
                    continue
                pending[sock] += chunk
                if b"\n" not in pending[sock]:
                    continue
                line = pending.pop(sock).split(b"\n", 1)[0]
                hello = Hello.parse(line)
                why = refusal(hello, job=job, attempt=attempt, n=n, present=set(present))
                if why is not None:
                    log.warning("roll call at %s: turned away a caller: %s", address, why)
                    _tell([sock], {"refused": why})
                    sock.close()
                    continue
                assert hello is not None
                present[hello.process] = sock
                log.debug("roll call: process %d (pod %s) came", hello.process, hello.pod)
    finally:
        server.close()  # before "go": the others must find JAX's service listening, not this socket
        for sock in pending:
            sock.close()
    _tell(present.values(), {"go": True})
    _await_close(list(present.values()), 1.0)  # they close first: no TIME_WAIT left on the port here
    return time.monotonic() - start


def attend(address: str, hello: Hello, *, n: int, timeout_s: float) -> float:
    """Process ``hello.process`` > 0: answer process 0's roll call at ``address``; the seconds it took.

    Raises:
        RollCallError: process 0 never listened, or said that some processes never came, or turned us away.
    """
    start = time.monotonic()
    pacer = _Pacer(start)
    host, _, port = address.rpartition(":")
    sock = None
    while sock is None:
        now = time.monotonic()
        if now - start >= timeout_s:
            raise RollCallError(never_came([0], n, address, now - start, coordinator=True))
        if pacer.due(now):
            log.info("%s", waiting_line([0], n, address, timeout_s - (now - start), coordinator=True))
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=max(TICK_S, 0.5))
        except OSError:
            time.sleep(TICK_S)
    buffer = b""
    with sock:
        sock.sendall(hello.line())
        sock.settimeout(TICK_S)
        while True:
            now = time.monotonic()
            if now - start >= timeout_s + 5.0:  # process 0 says first; this only guards against a stuck one
                raise RollCallError(f"process 0 at {address} did not end its roll call within {timeout_s:.0f} s")
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as err:
                raise RollCallError(f"the roll call at {address} broke off ({err}): did process 0 end?") from err
            if not chunk:
                raise RollCallError(f"process 0 at {address} closed the roll call without a word: did it end?")
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                message = _parse(raw)
                if message.get("go"):
                    return time.monotonic() - start
                if "refused" in message:
                    raise RollCallError(f"process 0 at {address} turned this process away: {message['refused']}")
                if "error" in message:
                    raise RollCallError(str(message["error"]))
                if "missing" in message:  # process 0 paces these
                    log.info("%s", waiting_line(list(message["missing"]), n, address, float(message.get("left", 0))))


def _listen(bind: tuple[str, int]) -> socket.socket:
    host, port = bind
    if host in ("", "::") and socket.has_dualstack_ipv6():
        server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, reuse_port=False)
    else:
        server = socket.create_server((host or "0.0.0.0", port),
                                      family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    server.setblocking(False)
    return server


def _recv(sock: socket.socket) -> bytes | None:
    """What ``sock`` has (b"" at its end), or None when nothing is there yet."""
    try:
        return sock.recv(65536)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def _tell(socks: Any, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode() + b"\n"
    for sock in list(socks):
        try:
            sock.setblocking(True)
            sock.sendall(data)
            sock.setblocking(False)
        except OSError:
            pass


def _await_close(socks: list[socket.socket], timeout_s: float) -> None:
    limit = time.monotonic() + timeout_s
    open_ = list(socks)
    while open_ and time.monotonic() < limit:
        readable, _, _ = select.select(open_, [], [], max(0.0, limit - time.monotonic()))
        for sock in readable:
            if _recv(sock) == b"":
                open_.remove(sock)
    for sock in socks:
        sock.close()


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
