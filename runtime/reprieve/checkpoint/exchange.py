"""The restore's peer exchange: the owner of a replicated piece (:mod:`.read_once`) sends it from its landing buffer
to the processes that need it, over TCP, once its own reads succeeded.

Each process publishes ``{address, host, token, mode}`` under the restore's key in the coordination service and
serves the pieces it owns on that address (a process whose ``read_once`` is off publishes only its mode and host:
the others then turn the exchange off at once instead of waiting for an address that never comes); each needer
opens one connection to every owner it needs before it reads (``hello``: its process id and the owner's token, 36
bytes), and the owner, once its reads are done, streams the pieces that needer needs in the agreed order, each
piece's bytes followed by their crc32c (4 bytes, little-endian, taken from the owner's buffer when its reads were
done). A needer receives straight into its own landing buffer
(one copy a byte: the kernel's, out of the socket) and checks the crc32c piece by piece while the bytes are in the
CPU's cache.

Nothing here is trusted to be whole: a piece that does not arrive (the owner unreachable, dead mid-stream, its own
reads failed, a timeout) or fails its checksum is returned by :meth:`Exchange.receive` with the reason, and the
restore reads it from storage itself; no array is built before every piece is in place.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hmac
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..checksum import crc32c
from ..coordination import CoordinationError, Coordinator
from ..env import Env
from .faults import crashing_at, maybe_crash
from .read_once import AUTO, MIN_PIECE_BYTES, OFF, Piece, engaged

log = logging.getLogger(__name__)

CONNECT_S = 30.0  # how long a process waits for the others' addresses, and an owner for a needer to connect
PIECE_BYTES = 1 << 20  # received, then checksummed while in the CPU's cache
_TOKEN_CHARS = 32
_HELLO = 4 + _TOKEN_CHARS


@dataclasses.dataclass(frozen=True)
class Peers:
    """How a collective restore meets the other processes of the job for the exchange.

    Attributes:
        coordinator: the job's coordination service (addresses go through its key-value store).
        key: unique to this restore of this checkpoint (every process passes the same).
        mode: ``read_once.AUTO`` (share when the processes span several hosts), ``ON`` or ``OFF``.
        timeout_s: the longest a needer waits for an owner's pieces (the owner's reads included) and an owner for
            its needers to take them.
        min_bytes: pieces under this are read by every process that needs them.
        connect_s: the longest this process waits for all the others' addresses (one wait for all of them: a
            process that has not published by then is read around, its pieces from storage), and an owner for a
            needer that has not connected (bounded by ``timeout_s``).
        members: the processes that restore together (every one of them passes the same); None: every process of
            the job. A memory-tier restore where only some processes read storage passes those
            (:meth:`~reprieve.checkpoint.CheckpointManager.read_step`): the others hold nothing of the exchange and
            are not waited for.
    """

    coordinator: Coordinator
    key: str
    mode: str = AUTO
    timeout_s: float = 300.0
    min_bytes: int = MIN_PIECE_BYTES
    connect_s: float = CONNECT_S
    members: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        me, n = self.coordinator.process_id, self.coordinator.num_processes
        if self.members is not None:
            bad = [p for p in self.members if not 0 <= p < n]
            if bad or me not in self.members or len(set(self.members)) != len(self.members):
                raise ValueError(f"restore exchange {self.key}: members {list(self.members)} must be distinct "
                                 f"processes of the job's {n} and include this one ({me})")

    def processes(self) -> tuple[int, ...]:
        """The processes of this restore, in order."""
        n = self.coordinator.num_processes
        return tuple(range(n)) if self.members is None else tuple(sorted(self.members))


class ExchangeError(Exception):
    """A piece did not arrive whole from its owner."""


def _advertised_host() -> tuple[str, str]:
    """``(bind, advertise)``: the pod's IP where the operator set ``REPRIEVE_POD_IP``, else every interface and
    this host's name's address."""
    import os

    pod_ip = Env(os.environ).opt_text("REPRIEVE_POD_IP")
    if pod_ip:
        return pod_ip, pod_ip
    try:
        return "0.0.0.0", socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1", "127.0.0.1"


class Exchange:
    """One process's side of a restore's exchange of ``pieces`` (every process passes the same list);
    ``view(piece)``: the piece's place in this process's landing buffer (a numpy view).

    Call :meth:`expected` (what not to read), then after this process's own reads :meth:`ready` (or :meth:`abort`
    when they failed), then :meth:`receive`, and always :meth:`close`.
    """

    def __init__(self, peers: Peers, pieces: Sequence[Piece], view: Callable[[Piece], np.ndarray]) -> None:
        self.peers = peers
        self.me = me = peers.coordinator.process_id
        self._view = view
        owed: dict[int, list[Piece]] = {}
        incoming: dict[int, list[Piece]] = {}
        for pc in pieces:
            if pc.owner == me:
                for n in pc.needers:
                    if n != me:
                        owed.setdefault(n, []).append(pc)
            elif me in pc.needers:
                incoming.setdefault(pc.owner, []).append(pc)
        self._owed, self._incoming = owed, incoming
        self._payload: dict[Piece, tuple[np.ndarray, int]] = {}
        self._ready = threading.Event()
        self._aborted = False
        self._cond = threading.Condition()
        self._connected: set[int] = set()
        self._done: set[int] = set()
        self._socks: dict[int, socket.socket] = {}
        self._token = secrets.token_hex(_TOKEN_CHARS // 2)
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.address: str | None = None  # where this process serves (None: read_once off here)
        self._started = time.monotonic()
        if peers.mode == OFF:  # say so, so that the others turn it off at once; serve and receive nothing
            peers.coordinator.set(f"{peers.key}/{self.me}", json.dumps({"mode": OFF, "host": socket.gethostname()}),
                                  overwrite=True)
            self._owed, self._incoming = {}, {}
            return
        bind, shown = _advertised_host()
        self._server = server = socket.create_server((bind, 0), backlog=64)
        server.settimeout(0.2)
        port = server.getsockname()[1]
        self.address = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
        self._thread = threading.Thread(target=self._serve, args=(server,), name="reprieve-restore-exchange",
                                        daemon=True)
        self._thread.start()
        try:
            self._meet()
        except BaseException:
            self.abort()
            self.close()
            raise

    # -- setting up --------------------------------------------------------------------------------------------------
    def _meet(self) -> None:
        """Publish this process's address, read everyone's, decide whether to share, connect to the owners."""
        coord, key = self.peers.coordinator, self.peers.key
        mine = {"address": self.address, "host": socket.gethostname(), "token": self._token, "mode": self.peers.mode}
        coord.set(f"{key}/{self.me}", json.dumps(mine), overwrite=True)
        records: dict[int, dict[str, Any]] = {self.me: mine}
        deadline = time.monotonic() + min(self.peers.connect_s, self.peers.timeout_s)  # one wait for them all
        for p in self.peers.processes():
            if p == self.me:
                continue
            try:
                records[p] = json.loads(coord.get(f"{key}/{p}", max(0.001, deadline - time.monotonic())))
            except CoordinationError as err:
                log.warning("restore exchange: process %d did not publish its address (%s); reading what it would "
                            "have sent from storage", p, err)
        modes = {p: str(r.get("mode", AUTO)) for p, r in records.items()}
        if not engaged(modes.values(), [r["host"] for r in records.values()]):
            log.log(logging.INFO if OFF in modes.values() and self.peers.mode != OFF else logging.DEBUG,
                    "restore exchange: off (read_once %s, hosts %s)",
                    ", ".join(f"{p}={m}" for p, m in sorted(modes.items())),
                    sorted({r["host"] for r in records.values()}))
            self._owed, self._incoming = {}, {}
            return
        self._owed = {n: pieces for n, pieces in self._owed.items() if n in records}
        for owner in [o for o in self._incoming if o not in records]:
            self._fail(self._incoming.pop(owner), f"process {owner} did not publish its address")
        for owner, pieces in list(self._incoming.items()):
            record = records[owner]
            host, _, port = str(record["address"]).rpartition(":")
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S)
                sock.settimeout(self.peers.timeout_s)
                sock.sendall(self.me.to_bytes(4, "little") + str(record["token"]).encode())
            except OSError as err:
                self._fail(pieces, f"cannot connect to process {owner} at {record['address']}: {err}")
                del self._incoming[owner]
                continue
            self._socks[owner] = sock

    def _fail(self, pieces: Sequence[Piece], why: str) -> None:
        """Before any read: the pieces this process will read itself after all."""
        log.warning("restore exchange: %s; reading its %d pieces (%d bytes) from storage", why, len(pieces),
                    sum(pc.nbytes for pc in pieces))

    def expected(self) -> set[tuple[int, Any, Any]]:
        """``(leaf, region, part)`` of every piece this process expects from an owner (it does not read them)."""
        return {(pc.leaf, pc.region, pc.part) for pieces in self._incoming.values() for pc in pieces}

    # -- serving -----------------------------------------------------------------------------------------------------
    def ready(self) -> None:
        """This process's reads succeeded: take each owed piece's bytes and crc32c, and start sending them."""
        for pc in {pc for pieces in self._owed.values() for pc in pieces}:
            payload = np.ascontiguousarray(self._view(pc)).reshape(-1).view(np.uint8)  # a view where it is one
            self._payload[pc] = (payload, crc32c(payload))
        self._ready.set()

    def abort(self) -> None:
        """This process's reads failed: its needers get nothing (they read the pieces themselves)."""
        self._aborted = True
        self._ready.set()

    def _serve(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True, name="reprieve-exchange-conn").start()

    def _handle(self, conn: socket.socket) -> None:
        needer = -1
        try:
            with conn:
                conn.settimeout(self.peers.timeout_s)
                hello = bytearray(_HELLO)
                _recv_into(conn, memoryview(hello), "hello")
                needer = int.from_bytes(hello[:4], "little")
                if not hmac.compare_digest(bytes(hello[4:]), self._token.encode()) or needer not in self._owed:
                    log.warning("restore exchange: refused a connection that is not one of this restore's needers")
                    needer = -1
                    return
                with self._cond:
                    self._connected.add(needer)
                if not self._ready.wait(self.peers.timeout_s) or self._aborted:
                    return
                for pc in self._owed[needer]:
                    payload, crc = self._payload[pc]
                    if crashing_at("read_once_send", self.me):  # test-only: die half-way through a piece
                        conn.sendall(payload[:len(payload) // 2].data)
                        maybe_crash("read_once_send", self.me)
                    conn.sendall(payload.data)
                    conn.sendall(crc.to_bytes(4, "little"))
        except (OSError, ExchangeError) as err:
            log.warning("restore exchange: sending to process %d failed: %s", needer, err)
        finally:
            if needer >= 0:
                with self._cond:
                    self._done.add(needer)
                    self._cond.notify_all()

    # -- receiving ---------------------------------------------------------------------------------------------------
    def receive(self, pool: concurrent.futures.Executor) -> list[tuple[Piece, str]]:
        """Receive every expected piece into its place (owners at once, in ``pool``); returns the pieces that did
        not arrive whole, each with why (the caller reads them from storage)."""
        futs = [pool.submit(self._receive_from, owner, sock, self._incoming[owner])
                for owner, sock in self._socks.items()]
        failed = []
        for fut in futs:
            failed.extend(fut.result())
        return failed

    def _receive_from(self, owner: int, sock: socket.socket, pieces: list[Piece]) -> list[tuple[Piece, str]]:
        with sock:
            for n, pc in enumerate(pieces):
                dest = self._view(pc)
                aside = not dest.flags.c_contiguous  # a strided place: received into a buffer of its own first
                flat = np.empty(pc.nbytes, np.uint8) if aside else dest.reshape(-1).view(np.uint8)
                try:
                    if flat.nbytes != pc.nbytes:
                        raise ExchangeError(f"its place holds {flat.nbytes} bytes, the plan says {pc.nbytes}")
                    crc = 0
                    with flat.data as view:
                        for off in range(0, pc.nbytes, PIECE_BYTES):
                            end = min(off + PIECE_BYTES, pc.nbytes)
                            with view[off:end] as part:
                                _recv_into(sock, part, f"piece {n + 1} of {len(pieces)} ({pc.nbytes} bytes)", off)
                            crc = crc32c(flat, off, end, crc=crc)
                    tail = bytearray(4)
                    _recv_into(sock, memoryview(tail), f"the checksum of piece {n + 1} of {len(pieces)}")
                    if int.from_bytes(tail, "little") != crc:
                        raise ExchangeError(f"piece {n + 1} of {len(pieces)} fails its checksum: crc32c 0x{crc:08x} "
                                            f"received, 0x{int.from_bytes(tail, 'little'):08x} sent")
                except (OSError, ExchangeError) as err:
                    return [(p, f"from process {owner}: {err}") for p in pieces[n:]]
                if aside:
                    dest[...] = flat.view(dest.dtype).reshape(dest.shape)
        return []

    def close(self) -> None:
        """Wait until every needer took its pieces, went away, or never came (``peers.connect_s``), bounded by the
        timeout; then stop serving."""
        if self._server is None or self._thread is None:
            return  # read_once off here: nothing served
        deadline = self._started + self.peers.timeout_s
        with self._cond:
            while time.monotonic() < deadline and not self._aborted:
                now = time.monotonic()
                waiting = [p for p in self._owed if p not in self._done and
                           (p in self._connected or now < self._started + self.peers.connect_s)]
                if not waiting:
                    break
                self._cond.wait(0.1)
        self._server.close()
        for sock in self._socks.values():
            sock.close()
        self._thread.join(timeout=1.0)


def _recv_into(sock: socket.socket, view: memoryview, what: str, before: int = 0) -> None:
    """Fill ``view`` from ``sock``; ``before``: bytes of ``what`` received before ``view`` (for the message)."""
    got, n = 0, len(view)
    while got < n:
        with view[got:] as rest:
            k = sock.recv_into(rest)
        if not k:
            raise ExchangeError(f"connection closed after {before + got} bytes of {what}")
        got += k
