"""The replica protocol over TCP (the pod network, never the storage tier): the client's side and the framing.

One request per connection: a JSON line (the op and its fields, and the job's token when one is set), then the
op's bytes; the server answers with a JSON line ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``, then
the answer's bytes.

=========  ==========================================================  =========================================
op         request                                                     answer
=========  ==========================================================  =========================================
put        ``tree``, ``name``, ``manifest`` and ``data`` byte counts,  ok once the copy is checked and committed
           ``keep`` (the writer's steps of this attempt its holder
           keeps beside it); the manifest's bytes, then data.bin's
list       (nothing)                                                   ``location``, ``holdings``, ``fences``
manifest   ``tree``, ``name``                                          ``bytes``, then the manifest's bytes
read       ``tree``, ``name``, ``ranges`` [[offset, length], ...]      the ranges' bytes, in order
fence      ``attempt``, ``base`` ([step, attempt] or null)             ok
=========  ==========================================================  =========================================

The data of ``put`` and ``read`` goes with ``sendfile(2)`` from the memory volume's page cache; the reader
checks every shard's crc32c (``put``: the server before it commits; ``read``: the restoring process).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, cast

from .. import tether
from ..jsonobject import json_object

MAX_LINE = 1 << 20


class WireError(RuntimeError):
    """The peer answered with an error, closed the connection, or sent something malformed."""


def send_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def recv_line(rfile: BinaryIO, where: str) -> dict[str, Any]:
    """One JSON line from a buffered reader of the socket (the op's bytes follow it in the same reader)."""
    line = rfile.readline(MAX_LINE + 1)
    if not line.endswith(b"\n"):
        what = "a line longer than the limit" if len(line) > MAX_LINE else f"a closed connection ({len(line)} bytes)"
        raise WireError(f"{where}: expected a JSON line, got {what}")
    return json_object(line, f"{where}: a line", WireError)


def recv_exact(rfile: BinaryIO, view: memoryview, where: str) -> None:
    """Fill ``view`` from the reader (large reads go straight from the socket into ``view``)."""
    got = 0
    n = len(view)
    while got < n:
        with view[got:] as rest:  # released on errors too: the caller may close the mapping behind ``view``
            k = rfile.readinto(rest)  # type: ignore[attr-defined]
        if not k:
            raise WireError(f"{where}: connection closed after {got} of {n} bytes")
        got += k


def recv_bytes(rfile: BinaryIO, n: int, where: str) -> bytes:
    buf = bytearray(n)
    recv_exact(rfile, memoryview(buf), where)
    return bytes(buf)


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port) (``reprieve.tether.split_address``); ValueError when it is not one."""
    target = tether.split_address(address)
    if target is None:
        raise ValueError(f"not a host:port address: {address!r}")
    return target


class Client:
    """Requests to one replica server at ``address`` (``host:port``)."""

    def __init__(self, address: str, *, timeout_s: float = 60.0, token: str | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.token = token

    @contextlib.contextmanager
    def _request(self, op: str, **fields: Any) -> Iterator[tuple[socket.socket, BinaryIO]]:
        where = f"replica server {self.address} ({op})"
        try:
            sock = socket.create_connection(split_address(self.address), timeout=self.timeout_s)
        except OSError as err:
            raise WireError(f"{where}: cannot connect ({err})") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            header = {"op": op, **fields}
            if self.token:
                header["token"] = self.token
            send_line(sock, header)
            with cast(BinaryIO, sock.makefile("rb", buffering=1 << 16)) as rfile:
                yield sock, rfile
        except OSError as err:
            raise WireError(f"{where}: {err}") from None
        finally:
            sock.close()

    def _answer(self, rfile: BinaryIO, op: str) -> dict[str, Any]:
        where = f"replica server {self.address} ({op})"
        try:
            answer = recv_line(rfile, where)
        except OSError as err:
            raise WireError(f"{where}: {err}") from None
        if not answer.get("ok"):
            raise WireError(f"{where}: {answer.get('error', 'refused without a reason')}")
        return answer

    def put(self, tree: str, name: str, manifest: bytes, data_path: str, data_bytes: int, *,
            keep: Sequence[int] = ()) -> None:
        """Send a committed copy (its manifest, then data.bin with sendfile); returns once the server committed it
        and deleted the writer's older copies but those of the steps in ``keep`` (this attempt's)."""
        with self._request("put", tree=tree, name=name, manifest=len(manifest), data=data_bytes,
                           keep=sorted(keep)) as (sock, rfile):
            sock.sendall(manifest)
            if data_bytes:
                with open(data_path, "rb") as fh:
                    sent = sock.sendfile(fh, 0, data_bytes)
                if sent != data_bytes:
                    raise WireError(f"replica server {self.address} (put): sent {sent} of {data_bytes} bytes")
            self._answer(rfile, "put")

    def list(self) -> dict[str, Any]:
        with self._request("list") as (_, rfile):
            return self._answer(rfile, "list")

    def manifest(self, tree: str, name: str) -> bytes:
        with self._request("manifest", tree=tree, name=name) as (_, rfile):
            answer = self._answer(rfile, "manifest")
            return recv_bytes(rfile, int(answer["bytes"]), f"replica server {self.address} (manifest)")

    def read(self, tree: str, name: str, ranges: Sequence[tuple[int, int]], into: Sequence[memoryview]) -> None:
        """Read the byte ranges of the copy's data.bin into ``into`` (one view per range, of its length)."""
        with self._request("read", tree=tree, name=name, ranges=[list(r) for r in ranges]) as (_, rfile):
            self._answer(rfile, "read")
            for view in into:
                recv_exact(rfile, view, f"replica server {self.address} (read {tree}/{name})")

    def fence(self, attempt: int, base: tuple[int, int] | None) -> None:
        with self._request("fence", attempt=attempt, base=None if base is None else list(base)) as (_, rfile):
            self._answer(rfile, "fence")
