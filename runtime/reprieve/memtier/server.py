"""The replica server: receives peers' copies into this pod's memory directory and serves every copy it holds.

It runs where it outlives the trainer: as a thread of ``reprieve-supervisor`` (the worker container's PID 1), which
tells the trainer its address in ``REPRIEVE_MEMORY_SERVER``. Outside reprieve-supervisor the trainer runs it itself
(copies are then served while a trainer runs in the pod, which is when a restore asks). Protocol:
:mod:`.wire`. A received copy is checked (manifest, every shard's crc32c, the fence, the limit) before the
rename that commits it; a connection that breaks half-way leaves only a ``.tmp`` that is never listed.
No JAX here.
"""

from __future__ import annotations

import hmac
import logging
import mmap
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any, BinaryIO, cast

from ..env import Env
from . import layout, wire
from .config import TOKEN_ENV
from .layout import CopyName
from .manifest import CopyCorruptError, Manifest
from .store import CopyBusyError, CopyRefusedError, MemoryDir, hold_for_reading, verify

log = logging.getLogger(__name__)

CRASH_ENV = "REPRIEVE_MEMTIER_TEST_CRASH_AT"  # test-only: "receive:<step>" dies half-way through that receive
RECEIVE_LOCK_TIMEOUT_S = 120.0  # a receive waits this long for the copy in flight in this pod to commit
IDLE_TIMEOUT_S = 60.0  # a connection that sends nothing for this long is dropped


class ReplicaServer:
    """Serve ``directory`` on ``host:port`` (port 0: any free port). :attr:`address` is what peers dial."""

    def __init__(self, directory: MemoryDir, *, host: str = "0.0.0.0", port: int = 0,
                 advertise_host: str | None = None, token: str | None = None) -> None:
        self.dir = directory
        self._token = token
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=64)
        self._sock.settimeout(0.5)
        bound = self._sock.getsockname()[1]
        shown = advertise_host or (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        self.address = f"[{shown}]:{bound}" if ":" in shown else f"{shown}:{bound}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0  # copies committed from peers (tests and logs read it)

    def start(self) -> ReplicaServer:
        self._thread = threading.Thread(target=self._serve, name="reprieve-replica-server", daemon=True)
        self._thread.start()
        log.info("memory replica server on %s, directory %s", self.address, self.dir.path)
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn, f"{peer[0]}:{peer[1]}"), daemon=True,
                             name="reprieve-replica-conn").start()

    def _handle(self, conn: socket.socket, peer: str) -> None:
        conn.settimeout(IDLE_TIMEOUT_S)
        try:
            with conn, cast(BinaryIO, conn.makefile("rb", buffering=1 << 16)) as rfile:
                where = f"replica request from {peer}"
                try:
                    header = wire.recv_line(rfile, where)
                    if self._token and not hmac.compare_digest(str(header.get("token", "")), self._token):
                        raise PermissionError("the request does not carry this job's REPRIEVE_MEMORY_TOKEN")
                    op = header.get("op")
                    handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
                    if handler is None:
                        raise ValueError(f"unknown op {op!r}")
                    header["_peer"] = peer
                    handler(conn, rfile, header)
                except (OSError, ValueError, KeyError, TypeError, PermissionError, wire.WireError, CopyCorruptError,
                        CopyRefusedError, CopyBusyError) as err:
                    log.warning("%s: %s: %s", where, type(err).__name__, err)
                    try:
                        wire.send_line(conn, {"ok": False, "error": f"{type(err).__name__}: {err}"})
                    except OSError:
                        pass
        except OSError:
            pass

    def _name(self, header: dict[str, Any]) -> tuple[str, CopyName]:
        tree, raw = header.get("tree"), header.get("name")
        name = layout.parse_name(str(raw))
        if tree not in layout.TREES or name is None or name.tmp:
            raise ValueError(f"no such copy: tree {tree!r}, name {raw!r}")
        return str(tree), name

    # -- ops ---------------------------------------------------------------------------------------------------
    def _op_put(self, conn: socket.socket, rfile: BinaryIO, header: dict[str, Any]) -> None:
        tree, name = self._name(header)
        if tree != layout.PEER:
            raise ValueError("copies are put into the peer tree only")
        n_manifest, n_data = int(header["manifest"]), int(header["data"])
        if not 0 < n_manifest <= 64 << 20 or n_data < 0:
            raise ValueError(f"bad sizes: manifest {n_manifest}, data {n_data}")
        where = f"copy {name} from {header.get('_peer', 'a peer')}"
        manifest = Manifest.from_bytes(wire.recv_bytes(rfile, n_manifest, where), where)
        problems = manifest.problems(name)
        if manifest.data_bytes != n_data:
            problems.append(f"data is {n_data} bytes, the manifest says {manifest.data_bytes}")
        if problems:
            raise CopyCorruptError(f"{where}: {'; '.join(problems)}")
        keep = _kept(header.get("keep", []), name)
        with self.dir.in_flight(timeout_s=RECEIVE_LOCK_TIMEOUT_S):
            self.dir.make_room(tree, n_data, keep=keep, writer=name.writer)
            tmp = self.dir.begin(tree, name, n_data, attempt=name.attempt)
            try:
                if n_data:
                    with open(os.path.join(tmp, layout.DATA_FILE), "r+b") as fh, \
                            mmap.mmap(fh.fileno(), n_data, flags=mmap.MAP_SHARED) as mem:
                        _populate(mem)
                        with memoryview(mem) as view:
                            if Env(os.environ).raw(CRASH_ENV) == f"receive:{name.step}":  # test-only fault injection
                                wire.recv_exact(rfile, view[:n_data // 2], where)
                                log.error("test fault injection: dying half-way through receiving %s", name)
                                os._exit(86)
                            wire.recv_exact(rfile, view, where)
                        verify(mem, manifest, where=where)
                self.dir.commit(tree, name, manifest, keep=keep)
            except BaseException:
                self.dir.abort(tree, name)
                raise
        self.received += 1
        log.info("memory: holding %s for process %d (%d bytes)", name, name.writer, n_data)
        wire.send_line(conn, {"ok": True})

    def _op_list(self, conn: socket.socket, rfile: BinaryIO, header: dict[str, Any]) -> None:
        holdings = [{"tree": h.tree, "name": str(h.name), "num_processes": h.num_processes,
                     "base": None if h.base is None else list(h.base), "nbytes": h.nbytes, "root": h.root}
                    for h in self.dir.holdings(self.address)]
        fences = {str(a): None if b is None else list(b) for a, b in self.dir.fences().items()}
        wire.send_line(conn, {"ok": True, "location": self.address, "holdings": holdings, "fences": fences})

    def _op_manifest(self, conn: socket.socket, rfile: BinaryIO, header: dict[str, Any]) -> None:
        tree, name = self._name(header)
        path = os.path.join(self.dir.copy_dir(tree, name), layout.MANIFEST_FILE)
        with open(path, "rb") as fh:
            raw = fh.read()
        wire.send_line(conn, {"ok": True, "bytes": len(raw)})
        conn.sendall(raw)

    def _op_read(self, conn: socket.socket, rfile: BinaryIO, header: dict[str, Any]) -> None:
        tree, name = self._name(header)
        ranges = [(int(a), int(b)) for a, b in header["ranges"]]
        path = os.path.join(self.dir.copy_dir(tree, name), layout.DATA_FILE)
        with open(path, "rb") as fh:
            hold_for_reading(fh.fileno(), path)  # not written over by a later copy while it is sent
            size = os.fstat(fh.fileno()).st_size
            bad = [r for r in ranges if r[0] < 0 or r[1] < 0 or r[0] + r[1] > size]
            if bad:
                raise ValueError(f"ranges {bad[:4]} lie outside {name}'s {size} bytes")
            wire.send_line(conn, {"ok": True})
            for offset, length in ranges:
                if length:
                    conn.sendfile(fh, offset, length)

    def _op_fence(self, conn: socket.socket, rfile: BinaryIO, header: dict[str, Any]) -> None:
        base = header.get("base")
        self.dir.write_fence(int(header["attempt"]), None if base is None else (int(base[0]), int(base[1])))
        wire.send_line(conn, {"ok": True})


MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14; Python 3.11's mmap lacks the name


def _populate(mem: mmap.mmap) -> None:
    """Map the received copy's pages (the volume's already: allocated, or a deleted copy's written over) in one
    call instead of a fault per 4 KiB as the socket fills them (1 GiB on the benchmark VM: 0.31-0.40 CPU-s for
    populating and filling against 0.45-0.73). A kernel without it faults them in as before."""
    try:
        mem.madvise(MADV_POPULATE_WRITE)
    except OSError:
        pass


def _kept(raw: Any, name: CopyName) -> list[CopyName]:
    """A put's ``keep``: the writer's copies of those steps (the put's attempt) stay beside the one it commits."""
    if not isinstance(raw, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in raw):
        raise ValueError(f"put of {name}: keep must be a list of steps >= 0, got {raw!r}")
    return [CopyName(s, name.attempt, name.writer) for s in raw]


def serve_pod(env: Mapping[str, str]) -> ReplicaServer | None:
    """reprieve-supervisor's replica server for its pod when the memory tier is on (``REPRIEVE_MEMORY_DIR``): bound to
    ``REPRIEVE_POD_IP`` (all interfaces without one) on ``REPRIEVE_MEMORY_PORT``. None when the tier is off or the
    settings are bad (the trainer's ``reprieve.init()`` refuses them with the same message)."""
    from ..config import ConfigError
    from .config import MemoryConfig

    pod_ip = Env(env).opt_text("REPRIEVE_POD_IP")
    try:
        cfg = MemoryConfig.from_env(env, pod_ip=pod_ip)
    except ConfigError as err:
        log.error("memory tier: %s; not serving the pod's copies", err)
        return None
    if cfg is None:
        return None
    try:
        server = ReplicaServer(MemoryDir(cfg.directory, limit_bytes=cfg.limit_bytes), host=pod_ip or "0.0.0.0",
                               port=cfg.port, advertise_host=pod_ip, token=cfg.token)
    except OSError as err:
        log.error("memory tier: cannot serve %s on port %d: %s", cfg.directory, cfg.port, err)
        return None
    return server.start()


def main(argv: list[str] | None = None) -> int:
    """``python -m reprieve.memtier.server --dir D --port P``: a replica server alone (a pod that only holds
    replicas; tests)."""
    import argparse
    import signal

    ap = argparse.ArgumentParser(prog="python -m reprieve.memtier.server")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--limit-bytes", type=int)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s replica-server %(levelname)s %(message)s")
    server = ReplicaServer(MemoryDir(args.dir, limit_bytes=args.limit_bytes), host=args.host, port=args.port,
                           token=Env(os.environ).opt_text(TOKEN_ENV)).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(server.address, flush=True)
    stop.wait()
    server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
