"""The replica server and the memory directory for real: tmpfs directories, loopback TCP, the in-flight lock.

Copies are built by hand (a uint8 leaf cut into shards) so that every fault can be placed exactly: a flipped byte
on the way, a sender that dies half-way, a stale attempt, a limit too small, a missing token; and on the restore's
side, a copy shorter than its manifest says and a peer that goes away half-way through a read.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from reprieve.memtier import layout, wire
from reprieve.memtier.decide import Holding
from reprieve.memtier.layout import CopyName
from reprieve.memtier.manifest import CopyCorruptError, Manifest, Shard, crc32c
from reprieve.memtier.restore import Source, SourceError, open_sources, restore_state
from reprieve.memtier.server import ReplicaServer
from reprieve.memtier.store import CopyBusyError, CopyRefusedError, MemoryDir, verify

from tests.runtime.helpers_relay import CutRelay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SHM = Path("/dev/shm")


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    """A fresh directory on tmpfs (falls back to tmp_path where /dev/shm is missing), removed after."""
    base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else tmp_path
    d = base / f"reprieve-test-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def write_copy(mdir: MemoryDir, name: CopyName, payload: bytes, *, parts: int = 4, tree: str = "own") -> Manifest:
    """Commit a copy of one uint8 leaf of ``len(payload)`` elements, cut into ``parts`` shards."""
    n = len(payload)
    cut = [n * i // parts for i in range(parts + 1)]
    shards, offset = [], 0
    for a, b in itertools.pairwise(cut):
        offset = layout.aligned(offset)
        shards.append(Shard(0, ((a, b),), offset, b - a, crc32c(payload[a:b])))
        offset += b - a
    leaves = [{"path": "['x']", "kind": "array", "index": 0, "shape": [n], "dtype": "uint8", "chunk_shape": [n],
               "nbytes": n}]
    m = Manifest(writer=name.writer, num_processes=2, step=name.step, attempt=name.attempt, leaves=leaves,
                 shards=shards, data_bytes=offset, extra={"k": 1}, process_extra={"pos": name.step})
    with mdir.in_flight():
        tmp = mdir.begin(tree, name, offset, attempt=name.attempt)
        with open(os.path.join(tmp, layout.DATA_FILE), "r+b") as fh:
            for s, (a, b) in zip(shards, itertools.pairwise(cut)):
                fh.seek(s.offset)
                fh.write(payload[a:b])
        mdir.commit(tree, name, m)
    return m


def put(client: wire.Client, mdir: MemoryDir, name: CopyName, keep: tuple[int, ...] = ()) -> None:
    m = mdir.manifest("own", name)
    client.put("peer", str(name), m.to_bytes(), os.path.join(mdir.copy_dir("own", name), layout.DATA_FILE),
               m.data_bytes, keep=keep)


@pytest.fixture
def pair(shm: Path) -> tuple[MemoryDir, MemoryDir, ReplicaServer]:
    """A writer's directory and a peer's directory served on loopback."""
    writer, holder = MemoryDir(str(shm / "writer")), MemoryDir(str(shm / "holder"))
    server = ReplicaServer(holder, host="127.0.0.1", port=0).start()
    yield writer, holder, server
    server.close()


def test_a_copy_sent_to_the_peer_is_checked_committed_listed_and_served(pair: tuple[MemoryDir, MemoryDir,
                                                                                    ReplicaServer]) -> None:
    writer, holder, server = pair
    payload = os.urandom(100_003)
    name = CopyName(40, 2, 1)
    m = write_copy(writer, name, payload)
    client = wire.Client(server.address)
    put(client, writer, name)
    assert holder.names("peer") == [name] and server.received == 1
    listing = client.list()
    assert listing["location"] == server.address
    assert [(x["tree"], x["name"], x["num_processes"], x["nbytes"]) for x in listing["holdings"]] == [
        ("peer", str(name), 2, m.data_bytes)]
    assert Manifest.from_bytes(client.manifest("peer", str(name)), "x") == m
    bufs = [bytearray(s.nbytes) for s in m.shards]
    client.read("peer", str(name), [(s.offset, s.nbytes) for s in m.shards], [memoryview(b) for b in bufs])
    assert b"".join(bufs) == payload


def test_a_newer_copy_replaces_the_older_one_of_the_same_writer_only(pair: tuple[MemoryDir, MemoryDir,
                                                                                 ReplicaServer]) -> None:
    writer, holder, server = pair
    client = wire.Client(server.address)
    for name in (CopyName(10, 2, 1), CopyName(10, 2, 0), CopyName(20, 2, 1)):
        write_copy(writer, name, os.urandom(1000))
        put(client, writer, name)
    assert holder.names("peer") == [CopyName(10, 2, 0), CopyName(20, 2, 1)]
    assert writer.names("own") == [CopyName(20, 2, 1)]  # one own copy per pod: the newest


def test_a_put_keeps_the_writers_copies_it_names_and_drops_them_at_a_later_put(
        pair: tuple[MemoryDir, MemoryDir, ReplicaServer]) -> None:
    """The writer names the gang step's copy (10) and one that may still become it (15) beside 20; its next put
    names 20 alone: 10 and 15 go. Another writer's copies are untouched by either put."""
    writer, holder, server = pair
    client = wire.Client(server.address)
    for name, keep in ((CopyName(5, 2, 0), ()), (CopyName(10, 2, 1), ()), (CopyName(15, 2, 1), (10,)),
                       (CopyName(20, 2, 1), (10, 15))):
        write_copy(writer, name, os.urandom(1000))
        put(client, writer, name, keep=keep)
    assert holder.names("peer") == [CopyName(5, 2, 0), CopyName(10, 2, 1), CopyName(15, 2, 1), CopyName(20, 2, 1)]
    write_copy(writer, CopyName(25, 2, 1), os.urandom(1000))
    put(client, writer, CopyName(25, 2, 1), keep=(20,))
    assert holder.names("peer") == [CopyName(5, 2, 0), CopyName(20, 2, 1), CopyName(25, 2, 1)]


def test_a_put_with_a_malformed_keep_is_refused_naming_it(pair: tuple[MemoryDir, MemoryDir, ReplicaServer]) -> None:
    writer, holder, server = pair
    name = CopyName(40, 2, 1)
    write_copy(writer, name, os.urandom(1000))
    with pytest.raises(wire.WireError, match=r"keep must be a list of steps >= 0, got \[-1\]"):
        put(wire.Client(server.address), writer, name, keep=(-1,))
    assert holder.names("peer") == []


def test_kept_copies_make_room_when_the_limit_has_none_the_gang_steps_last(shm: Path) -> None:
    """Room for three copies of 4 KiB: the writer's 10 (the gang step's) and 15 kept beside 20; the put of 25 that
    still names them needs room for one more: 15 goes first, then 10 would; the newest (20) stays until 25
    committed."""
    writer, holder = MemoryDir(str(shm / "w")), MemoryDir(str(shm / "h"), limit_bytes=3 * 4096 + 100)
    with _served(holder) as server:
        client = wire.Client(server.address)
        for step, keep in ((10, ()), (15, (10,)), (20, (10, 15))):
            write_copy(writer, CopyName(step, 2, 1), os.urandom(4096))
            put(client, writer, CopyName(step, 2, 1), keep=keep)
        assert [n.step for n in holder.names("peer")] == [10, 15, 20]
        write_copy(writer, CopyName(25, 2, 1), os.urandom(4096))
        put(client, writer, CopyName(25, 2, 1), keep=(10, 15, 20))
        assert [n.step for n in holder.names("peer")] == [10, 20, 25]


def test_a_byte_flipped_on_the_way_is_refused_and_nothing_is_committed(pair: tuple[MemoryDir, MemoryDir,
                                                                                   ReplicaServer]) -> None:
    writer, holder, server = pair
    name = CopyName(40, 2, 1)
    write_copy(writer, name, os.urandom(5000))
    data = os.path.join(writer.copy_dir("own", name), layout.DATA_FILE)
    with open(data, "r+b") as fh:
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(wire.WireError, match="fails its checksum"):
        put(wire.Client(server.address), writer, name)
    assert holder.names("peer") == []
    with pytest.raises(CopyCorruptError, match="shard 0 .* fails its checksum"):
        from reprieve.memtier.store import verify

        m = writer.manifest("own", name)
        mem = writer.open_data("own", name)
        verify(mem, m, where="own copy")


def test_a_sender_that_dies_half_way_leaves_nothing_visible(pair: tuple[MemoryDir, MemoryDir, ReplicaServer]) -> None:
    writer, holder, server = pair
    name = CopyName(40, 2, 1)
    m = write_copy(writer, name, os.urandom(1 << 20))
    host, port = wire.split_address(server.address)
    with socket.create_connection((host, port)) as sock:
        wire.send_line(sock, {"op": "put", "tree": "peer", "name": str(name), "manifest": len(m.to_bytes()),
                              "data": m.data_bytes})
        sock.sendall(m.to_bytes())
        sock.sendall(b"\0" * (m.data_bytes // 2))
        deadline = time.monotonic() + 10
        while not any(e.endswith(".tmp") for e in os.listdir(os.path.join(holder.path, "peer"))):
            assert time.monotonic() < deadline, "the receive never started"
            time.sleep(0.01)
    deadline = time.monotonic() + 10
    while any(e.endswith(".tmp") for e in os.listdir(os.path.join(holder.path, "peer"))):
        assert time.monotonic() < deadline, "the torn receive was not cleaned up"
        time.sleep(0.01)
    assert holder.names("peer") == [] and server.received == 0
    put(wire.Client(server.address), writer, name)  # the next attempt of the same copy goes through
    assert holder.names("peer") == [name]


def test_a_copy_of_an_attempt_older_than_the_pods_fence_is_refused(pair: tuple[MemoryDir, MemoryDir,
                                                                                ReplicaServer]) -> None:
    writer, holder, server = pair
    client = wire.Client(server.address)
    client.fence(5, (30, 4))
    assert holder.fences() == {5: (30, 4)}
    name = CopyName(40, 4, 1)
    write_copy(writer, name, os.urandom(1000))
    with pytest.raises(wire.WireError, match="attempt 5 has started in this pod.*fenced"):
        put(client, writer, name)
    assert holder.names("peer") == []
    client.fence(5, None)  # written once: the first record stays
    assert holder.fences() == {5: (30, 4)}


def test_a_copy_that_does_not_fit_the_limit_is_refused_naming_the_sizes(shm: Path) -> None:
    writer, holder = MemoryDir(str(shm / "w")), MemoryDir(str(shm / "h"), limit_bytes=10_000)
    with _served(holder) as server:
        name = CopyName(40, 2, 1)
        write_copy(writer, name, os.urandom(20_000))
        with pytest.raises(wire.WireError, match=r"does not fit.*limit is 0.0 MiB \(10000 bytes\)"):
            put(wire.Client(server.address), writer, name)
        assert holder.names("peer") == []


def test_a_server_with_a_token_refuses_requests_without_it(shm: Path) -> None:
    with _served(MemoryDir(str(shm / "h")), token="s3cret") as server:
        with pytest.raises(wire.WireError, match="REPRIEVE_MEMORY_TOKEN"):
            wire.Client(server.address).list()
        assert wire.Client(server.address, token="s3cret").list()["holdings"] == []


def test_one_copy_in_flight_per_pod(shm: Path) -> None:
    mdir = MemoryDir(str(shm / "d"))
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with mdir.in_flight():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert entered.wait(10)
    with pytest.raises(CopyBusyError), mdir.in_flight(timeout_s=0):
        pass
    release.set()
    t.join()
    with mdir.in_flight(timeout_s=0):
        pass


def test_leftovers_of_a_dead_writer_are_removed_and_never_listed(shm: Path) -> None:
    mdir = MemoryDir(str(shm / "d"))
    os.makedirs(os.path.join(mdir.path, "own", str(CopyName(9, 1, 0).in_flight)))
    assert mdir.names("own") == []
    with mdir.in_flight():
        pass
    assert os.listdir(os.path.join(mdir.path, "own")) == []


def test_a_fenced_writer_cannot_begin_a_copy(shm: Path) -> None:
    mdir = MemoryDir(str(shm / "d"))
    mdir.write_fence(3, None)
    with mdir.in_flight(), pytest.raises(CopyRefusedError, match="attempt 3 has started"):
        mdir.begin("own", CopyName(5, 2, 0), 10, attempt=2)


class _served:
    def __init__(self, mdir: MemoryDir, token: str | None = None) -> None:
        self.server = ReplicaServer(mdir, host="127.0.0.1", port=0, token=token).start()

    def __enter__(self) -> ReplicaServer:
        return self.server

    def __exit__(self, *exc: object) -> None:
        self.server.close()


def test_threads_of_one_process_write_the_same_fence_at_once(shm: Path) -> None:
    """A trainer outside reprieve-supervisor serves its pod's directory from its own process: its restore and a peer's
    fence request write the same attempt's fence record at once (this raised FileNotFoundError in a fault test).
    Exactly one writer wins each record, none fails, and no temporary file is left."""
    mdir = MemoryDir(str(shm))
    for attempt in range(1, 41):
        start, results, errors = threading.Barrier(4), [], []  # type: threading.Barrier, list[bool], list[OSError]

        def write(a: int = attempt, barrier: threading.Barrier = start, results: list[bool] = results,
                  errors: list[OSError] = errors) -> None:
            barrier.wait()
            try:
                results.append(mdir.write_fence(a, (a - 1, a - 1)))
            except OSError as err:
                errors.append(err)

        threads = [threading.Thread(target=write) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and sorted(results) == [False, False, False, True], (attempt, errors, results)
    assert sorted(mdir.fences()) == list(range(1, 41))
    assert [p for p in os.listdir(shm / layout.FENCES_DIR) if p.endswith(".tmp")] == []


def _restore_one_leaf(sources: dict[int, Source], n: int) -> np.ndarray:
    """Process 1 of 2 restores the one uint8 leaf of ``write_copy`` from writer 1's copy (it covers the leaf)."""
    abstract = {"x": jax.ShapeDtypeStruct((n,), np.uint8, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))}
    state, _, _, _ = restore_state(sources, abstract, num_writers=2, process=1, num_processes=2, token=None)
    return np.asarray(state["x"])


def test_a_copy_whose_data_is_shorter_than_its_manifest_says_is_not_a_source(shm: Path) -> None:
    """Issue 49's bad input: a copy's data.bin shorter than its manifest says is refused when its source is opened,
    naming both sizes, so the round goes to the next source instead of reading past the end of the mapping."""
    mdir = MemoryDir(str(shm / "pod"))
    name = CopyName(40, 2, 1)
    m = write_copy(mdir, name, os.urandom(1 << 20))
    os.truncate(os.path.join(mdir.copy_dir("own", name), layout.DATA_FILE), m.data_bytes // 2)
    held = Holding(name, 2, "local:1", "own", nbytes=m.data_bytes)
    with pytest.raises(SourceError, match=rf"data.bin has {m.data_bytes // 2} bytes, the manifest says "
                                          rf"{m.data_bytes}") as err:
        open_sources({1: held}, mdir, process=1, location=None, token=None)
    assert err.value.corrupt and err.value.holder == held  # the round deletes it and excludes it


def test_a_peer_that_goes_away_half_way_through_a_restore_read_fails_that_source_and_fills_no_array(
        pair: tuple[MemoryDir, MemoryDir, ReplicaServer]) -> None:
    """Issue 49's bad input: the peer's replica server stops answering half-way through the shards a restore reads
    from it. The read raises SourceError naming the copy and where (the round excludes that copy and decides
    again: the next source), no array is built; once the peer answers again the same copy restores bit-exactly."""
    writer, _, server = pair
    payload = os.urandom(4 << 20)
    name = CopyName(40, 2, 1)
    write_copy(writer, name, payload)
    put(wire.Client(server.address), writer, name)
    relay = CutRelay(wire.split_address(server.address)[1])
    held = Holding(name, 2, f"127.0.0.1:{relay.port}", "peer")
    sources = open_sources({1: held}, writer, process=1, location="another-pod", token=None)
    assert not sources[1].local
    relay.cut_after(len(payload) // 2)
    with pytest.raises(SourceError, match=rf"copy peer/{name} at 127.0.0.1:{relay.port}") as err:
        _restore_one_leaf(sources, len(payload))
    assert not err.value.corrupt and err.value.holder == held  # unreachable, not corrupt: nobody deletes it
    assert not relay.serving()
    relay.cut_after(None)
    assert _restore_one_leaf(sources, len(payload)).tobytes() == payload


@pytest.mark.parametrize("flip", [None, "second chunk"])
def test_a_shard_read_in_chunks_is_checked_as_a_whole_and_a_byte_flipped_at_the_peer_fails_it(
        pair: tuple[MemoryDir, MemoryDir, ReplicaServer], monkeypatch: pytest.MonkeyPatch, flip: str | None) -> None:
    """A peer's shard larger than a chunk arrives over several connections at once, each chunk checked by the thread
    that received it; the chunks' checksums combine into the shard's recorded one. A byte flipped in the peer's copy
    after it was committed (past the first chunk) fails that shard, naming it: a corrupt source, no array built."""
    import reprieve.memtier.restore as restore_mod

    monkeypatch.setattr(restore_mod, "CHUNK_BYTES", 96 << 10)
    writer, holder, server = pair
    payload = os.urandom(1 << 20)
    name = CopyName(40, 2, 1)
    write_copy(writer, name, payload, parts=2)  # 512 KiB shards: 6 chunks each, the last one short
    put(wire.Client(server.address), writer, name)
    if flip:
        data = Path(holder.copy_dir("peer", name)) / layout.DATA_FILE
        raw = bytearray(data.read_bytes())
        raw[holder.manifest("peer", name).shards[1].offset + (100 << 10)] ^= 0x01
        data.write_bytes(bytes(raw))
    held = Holding(name, 2, server.address, "peer")
    sources = open_sources({1: held}, writer, process=1, location="another-pod", token=None)
    if flip is None:
        assert _restore_one_leaf(sources, len(payload)).tobytes() == payload
        return
    with pytest.raises(SourceError, match=r"shard 1 \(leaf \['x'\], region \[\(524288, 1048576\)\]\) fails its "
                                          r"checksum") as err:
        _restore_one_leaf(sources, len(payload))
    assert err.value.corrupt and err.value.holder == held


def _inode(path: str) -> int:
    return os.stat(path).st_ino


def _free(mdir: MemoryDir) -> list[str]:
    return sorted(os.listdir(os.path.join(mdir.path, layout.FREE_DIR)))


def test_a_deleted_copys_data_file_is_written_over_by_the_next_copy_in_either_tree(
        pair: tuple[MemoryDir, MemoryDir, ReplicaServer]) -> None:
    """The pruned copy's pages are the next copy's: the same file (inode), sized to the new copy (shrunk or grown),
    every shard checking; one file kept at most; the received copies too."""
    writer, holder, server = pair
    client = wire.Client(server.address)
    data = lambda mdir, tree, name: os.path.join(mdir.copy_dir(tree, name), layout.DATA_FILE)
    sizes = {10: 300_000, 20: 300_000, 30: 120_001, 40: 500_000}
    inodes, received = {}, {}
    for step, n in sizes.items():
        name = CopyName(step, 2, 1)
        write_copy(writer, name, os.urandom(n))
        inodes[step] = _inode(data(writer, "own", name))
        put(client, writer, name)
        received[step] = _inode(data(holder, "peer", name))
    assert writer.names("own") == [CopyName(40, 2, 1)] and holder.names("peer") == [CopyName(40, 2, 1)]
    # 10's file was 30's, 20's was 40's (deleted when 30 and 40 committed, written over by the next copy)
    assert inodes[30] == inodes[10] and inodes[40] == inodes[20] and inodes[20] != inodes[10]
    assert received[30] == received[10] and received[40] == received[20] and received[20] != received[10]
    assert len(_free(writer)) == 1 and len(_free(holder)) == 1
    for mdir, tree in ((writer, "own"), (holder, "peer")):
        m = mdir.manifest(tree, CopyName(40, 2, 1))
        assert os.path.getsize(data(mdir, tree, CopyName(40, 2, 1))) == m.data_bytes
        mem = mdir.open_data(tree, CopyName(40, 2, 1))
        verify(mem, m, where=tree)  # raises on any shard that does not check


def test_a_copy_a_restore_has_mapped_is_never_written_over_and_its_pages_stay_the_readers(shm: Path) -> None:
    """A mapping holds its copy's file: deleting the copy frees nothing for the next one to write over while the
    mapping lives (the arrays built on it keep their bytes); once it is gone, the next deleted copy is kept."""
    mdir = MemoryDir(str(shm / "d"))
    first = os.urandom(200_000)
    m10 = write_copy(mdir, CopyName(10, 2, 0), first)
    mem = mdir.open_data("own", CopyName(10, 2, 0))
    view = np.frombuffer(mem, dtype=np.uint8)  # as a restore's array would be built on it
    for step in (20, 30, 40):
        write_copy(mdir, CopyName(step, 2, 0), os.urandom(200_000))
    assert mdir.names("own") == [CopyName(40, 2, 0)]
    assert bytes(view[m10.shards[0].offset:m10.shards[0].offset + 100]) == first[:100]
    verify(mem, m10, where="the mapped copy")
    del view, mem
    import gc

    gc.collect()
    inode40 = _inode(os.path.join(mdir.copy_dir("own", CopyName(40, 2, 0)), layout.DATA_FILE))
    write_copy(mdir, CopyName(50, 2, 0), os.urandom(200_000))
    write_copy(mdir, CopyName(60, 2, 0), os.urandom(200_000))
    assert _inode(os.path.join(mdir.copy_dir("own", CopyName(60, 2, 0)), layout.DATA_FILE)) == inode40


def test_a_reader_that_opened_a_copy_just_before_its_delete_gets_file_not_found(shm: Path) -> None:
    from reprieve.memtier.store import hold_for_reading

    mdir = MemoryDir(str(shm / "d"))
    write_copy(mdir, CopyName(10, 2, 0), os.urandom(10_000))
    path = os.path.join(mdir.copy_dir("own", CopyName(10, 2, 0)), layout.DATA_FILE)
    fd = os.open(path, os.O_RDONLY)
    try:
        write_copy(mdir, CopyName(20, 2, 0), os.urandom(10_000))  # deletes 10: its file kept for the next copy
        assert len(_free(mdir)) == 1
        with pytest.raises(FileNotFoundError):
            hold_for_reading(fd, path)
    finally:
        os.close(fd)


def test_a_finished_runs_cleanup_leaves_no_kept_file(shm: Path) -> None:
    mdir = MemoryDir(str(shm / "d"))
    for step in (10, 20):
        write_copy(mdir, CopyName(step, 2, 0), os.urandom(10_000))
    assert len(_free(mdir)) == 1
    assert mdir.remove_root(None) == ["own/s0000000020_a2_p0"]
    assert _free(mdir) == [] and mdir.names("own") == []


def test_a_deleted_copy_is_not_kept_where_memory_lacks_room_for_it_twice_over(
        shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The landing memory's rule: a kept file holds the volume at its peak, so only with room for it twice over."""
    from reprieve import landing

    mdir = MemoryDir(str(shm / "d"))
    monkeypatch.setattr(landing, "memory_now", lambda: {"current": None, "limit": None, "available": 300_000})
    for step in (10, 20):
        write_copy(mdir, CopyName(step, 2, 0), os.urandom(200_000))
    assert _free(mdir) == []  # 200 kB needs 400 kB available
    monkeypatch.setattr(landing, "memory_now", lambda: {"current": 1_000_000, "limit": 1_300_000, "available": None})
    write_copy(mdir, CopyName(30, 2, 0), os.urandom(200_000))
    assert _free(mdir) == []  # the pod's cgroup: 300 kB free of its limit, 400 kB needed
    monkeypatch.setattr(landing, "memory_now", lambda: {"current": 1_000_000, "limit": 1_500_000, "available": 10**9})
    write_copy(mdir, CopyName(40, 2, 0), os.urandom(200_000))
    assert len(_free(mdir)) == 1  # room for it twice over: kept
