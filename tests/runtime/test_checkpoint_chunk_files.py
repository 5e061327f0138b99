"""The storage restore's own reader of local chunk files (``reprieve.checkpoint.chunk_files``): which reads it takes
(a table), and what it says of a chunk file that is short, long, flipped or missing. The files are written by
TensorStore's zarr3 driver with the layout's codecs, so a checksum this reader computes differently fails here."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
from reprieve.checkpoint import chunk_files, layout, spec
from reprieve.checkpoint.chunk_files import (
    PAGE,
    ChunkFileError,
    ChunkRead,
    contiguous_span,
    direct_reads,
    map_budget,
    map_chunks,
    mappable,
    pick_mapped,
    read_chunk,
    status_word,
)
from reprieve.checkpoint.metadata import CheckpointCorruptError, CheckpointUnavailableError
from reprieve.checkpoint.restore import read_failure

from tests.runtime.helpers_pagecache import evict

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.mark.parametrize(("box", "shape", "span"), [
    (((0, 4), (0, 8)), (4, 8), (0, 32)),  # the whole array
    (((2, 4), (0, 8)), (4, 8), (16, 16)),  # whole rows
    (((1, 2), (3, 6)), (4, 8), (11, 3)),  # part of one row
    (((1, 3), (3, 6)), (4, 8), None),  # parts of two rows
    (((0, 1), (2, 3), (0, 5)), (2, 4, 5), (10, 5)),
    (((0, 2), (0, 4), (0, 5)), (2, 4, 5), (0, 40)),
    (((0, 2), (1, 4), (0, 5)), (2, 4, 5), None),
    (((0, 0), (0, 8)), (4, 8), None),  # empty
])
def test_contiguous_span(box, shape, span) -> None:
    assert contiguous_span(box, shape) == span


@pytest.mark.parametrize(("shape", "chunk", "targets", "parts", "reads"), [
    # the same sharding: a whole chunk inside one target's rows goes straight into its span
    ((8, 4), (2, 4), [((0, 4), (0, 4)), ((4, 8), (0, 4))], [(1, ((6, 8), (0, 4)))], [ChunkRead((3, 0), 1, 8, 8)]),
    # a target inside a chunk (more devices than saved shards): not the whole chunk
    ((8, 4), (4, 4), [((0, 2), (0, 4))], [(0, ((0, 2), (0, 4)))], None),
    # a chunk over two targets
    ((8, 4), (4, 4), [((0, 2), (0, 4)), ((2, 4), (0, 4))], [(0, ((0, 2), (0, 4))), (1, ((2, 4), (0, 4)))], None),
    # a whole chunk that is not one span of its target (the target is wider than the chunk, over two rows)
    ((4, 8), (2, 4), [((0, 4), (0, 8))], [(0, ((0, 2), (0, 4)))], None),
    # ... and one that is (a single row)
    ((4, 8), (1, 4), [((0, 4), (0, 8))], [(0, ((1, 2), (4, 8)))], [ChunkRead((1, 1), 0, 12, 4)]),
    # the array's edge cuts the chunk (its file holds the padding): TensorStore's
    ((5, 4), (2, 4), [((0, 5), (0, 4))], [(0, ((4, 5), (0, 4)))], None),
    # a scalar
    ((), (), [()], [(0, ())], None),
])
def test_direct_reads(shape, chunk, targets, parts, reads) -> None:
    assert direct_reads(shape, chunk, targets, parts) == reads


def _chunk_file(tmp_path: Path, dtype: str = "float32") -> tuple[str, np.ndarray]:
    """A (4, 6) array of random values (negative ones too) in chunks of (2, 6), written by TensorStore with the
    layout's codecs; chunk (1, 0)'s path and values."""
    import ml_dtypes  # noqa: F401 - bfloat16, int4... for numpy

    rng = np.random.default_rng(0)
    kind = np.dtype(dtype)
    if kind == np.dtype(bool):
        values = rng.integers(0, 2, (4, 6)).astype(bool)
    elif kind.kind in "iu":
        values = rng.integers(-8 if kind.kind == "i" else 0, 8, (4, 6)).astype(kind)
    else:
        values = (rng.standard_normal((4, 6)) * 3).astype(kind)
    md = spec.zarr3_metadata([4, 6], dtype, [2, 6])
    arr = ts.open(spec.zarr3_spec({"driver": "file", "path": str(tmp_path) + "/"}, md), create=True).result()
    arr.write(values).result()
    return str(tmp_path / layout.chunk_key(0, (1, 0)).split("/", 2)[2]), values[2:4]


# every dtype whose bytes might differ from numpy's: sub-byte integers and floats (one byte each on disk, not packed),
# booleans, complex numbers
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int4", "int2", "float4_e2m1fn", "float8_e4m3fn", "int8",
                                   "bool", "complex64"])
def test_a_chunk_file_reads_into_the_buffer_as_tensorstore_reads_it(tmp_path: Path, dtype: str) -> None:
    path, want = _chunk_file(tmp_path, dtype)
    out = np.zeros_like(want)
    read_chunk(path, out.reshape(-1).view(np.uint8).data)
    assert out.tobytes() == want.tobytes()


@pytest.mark.parametrize(("damage", "code", "words"), [
    ("truncate", "FAILED_PRECONDITION", "holds 30 bytes, 52 expected"),
    ("grow", "FAILED_PRECONDITION", "holds 53 bytes, 52 expected"),
    ("flip", "DATA_LOSS", "fails its checksum"),
    ("delete", "NOT_FOUND", "No such file"),
])
def test_a_damaged_chunk_file_is_refused_naming_it(tmp_path: Path, damage: str, code: str, words: str) -> None:
    path, want = _chunk_file(tmp_path)
    data = Path(path).read_bytes()
    assert len(data) == want.nbytes + 4
    if damage == "truncate":
        Path(path).write_bytes(data[:30])
    elif damage == "grow":
        Path(path).write_bytes(data + b"\0")
    elif damage == "flip":
        Path(path).write_bytes(data[:5] + bytes([data[5] ^ 0x10]) + data[6:])
    else:
        os.remove(path)
    out = np.zeros_like(want)
    with pytest.raises(ChunkFileError) as got:
        read_chunk(path, out.reshape(-1).view(np.uint8).data)
    message = str(got.value)
    assert message.startswith(f"{code}: chunk file {path}") and words in message, message
    # the restore's classification: every one of these is damage, not an unavailable store
    assert type(read_failure(f"checkpoint x: {message}", got.value)) is CheckpointCorruptError


@pytest.mark.parametrize(("err", "kind"), [
    (errno.EACCES, CheckpointUnavailableError),  # the process may not read it: the store did not serve it
    (errno.ESTALE, CheckpointUnavailableError),  # a network filesystem's handle went stale
    (errno.ENOENT, CheckpointCorruptError),
    (errno.EIO, CheckpointCorruptError),  # as TensorStore's UNKNOWN: damage
])
def test_a_failed_system_call_is_classed_as_tensorstore_would(err: int, kind: type) -> None:
    word = status_word(OSError(err, os.strerror(err)))
    assert type(read_failure("checkpoint x", ChunkFileError(f"{word}: chunk file f: ..."))) is kind


@pytest.mark.parametrize(("starts_counts", "count", "itemsize", "ok"), [
    ([(0, 1024), (1024, 1024)], 2048, 4, True),  # two pages of float32, in order
    ([(1024, 1024), (0, 1024)], 2048, 4, True),  # ... in any order
    ([(0, 1024), (1024, 1000)], 2024, 4, True),  # the last one short of a page
    ([(0, 1000), (1000, 1024)], 2024, 4, False),  # a file that starts inside a page
    ([(0, 1024)], 2048, 4, False),  # half the buffer: the rest comes from elsewhere
    ([(0, 1024), (2048, 1024)], 3072, 4, False),  # a gap
    ([(0, 1024), (0, 1024)], 1024, 4, False),  # the same span twice
    ([(0, 4096)], 4096, 1, True),
    ([], 0, 4, False),
])
def test_mappable(starts_counts, count, itemsize, ok) -> None:
    reads = [ChunkRead((k,), 0, start, n) for k, (start, n) in enumerate(starts_counts)]
    assert mappable(reads, count, itemsize, page=4096) is ok


def _page_chunks(tmp_path: Path, n: int = 3) -> tuple[list[str], np.ndarray]:
    """A float32 array of ``n`` chunks of one page each, written by TensorStore with the layout's codecs; the chunk
    files' paths in order and the values."""
    per = PAGE // 4
    values = np.random.default_rng(1).standard_normal(n * per).astype(np.float32)
    md = spec.zarr3_metadata([n * per], "float32", [per])
    ts.open(spec.zarr3_spec({"driver": "file", "path": str(tmp_path) + "/"}, md), create=True).result() \
        .write(values).result()
    return [str(tmp_path / layout.chunk_key(0, (k,)).split("/", 2)[2]) for k in range(n)], values


def _mapped_files() -> set[str]:
    with open("/proc/self/maps") as fh:
        return {line.split()[-1] for line in fh if len(line.split()) >= 6}


def test_page_cached_chunk_files_are_mapped_as_one_buffer_and_checked(tmp_path: Path) -> None:
    """Just written, the files are in the page cache: they become one buffer, each file mapped at its place (the
    process's map lists them), bit-exact; each file's checksum passes over its mapping; a write to the buffer copies
    the page (the file keeps its bytes)."""
    paths, values = _page_chunks(tmp_path)
    before = Path(paths[1]).read_bytes()
    got = map_chunks(paths, [PAGE] * 3)
    assert got is not None
    assert got.nbytes == got.mapped_bytes == values.nbytes
    buf = got.buffer()
    assert buf.view(np.float32).tobytes() == values.tobytes()
    assert set(paths) <= _mapped_files()
    assert got.mapped == {0, PAGE, 2 * PAGE} and not got.unread
    for k in range(3):
        got.check(k * PAGE)
    buf[PAGE:PAGE + 8] = 0
    assert Path(paths[1]).read_bytes() == before
    with pytest.raises(ChunkFileError, match=f"DATA_LOSS: chunk file {paths[1]} fails its checksum"):
        got.check(PAGE)  # the buffer's bytes, not the file's, are what is checked


def test_a_mapped_chunk_file_that_fails_its_checksum_is_refused_naming_it(tmp_path: Path) -> None:
    paths, _ = _page_chunks(tmp_path)
    data = bytearray(Path(paths[2]).read_bytes())
    data[100] ^= 0x08
    Path(paths[2]).write_bytes(bytes(data))
    got = map_chunks(paths, [PAGE] * 3)
    assert got is not None
    got.check(0)
    with pytest.raises(ChunkFileError) as err:
        got.check(2 * PAGE)
    assert str(err.value).startswith(f"DATA_LOSS: chunk file {paths[2]} fails its checksum"), err.value


@pytest.mark.parametrize(("evicted", "mapped"), [(1, True), (2, True), (3, False)])  # of 4 files
def test_chunk_files_mostly_in_the_page_cache_are_mapped_and_the_rest_read_into_place(tmp_path: Path, evicted: int,
                                                                                     mapped: bool) -> None:
    """At least half of the bytes in files the page cache holds whole: those are mapped, the others read into their
    places (never faulted in from the device, where a read error would be a SIGBUS), bit-exact; fewer: None (read
    whole into a buffer of the caller's)."""
    paths, values = _page_chunks(tmp_path, 4)
    for path in paths[:evicted]:
        evict(path)
    got = map_chunks(paths, [PAGE] * 4)
    assert (got is not None) is mapped
    if got is not None:
        assert got.mapped == {k * PAGE for k in range(evicted, 4)}
        assert sorted(got.unread) == [k * PAGE for k in range(evicted)]
        got.complete()
        assert got.nbytes == values.nbytes and got.mapped_bytes == (4 - evicted) * PAGE
        assert got.buffer().view(np.float32).tobytes() == values.tobytes()
        assert set(paths[evicted:]) <= _mapped_files() and not set(paths[:evicted]) & _mapped_files()


def test_a_chunk_file_read_into_place_that_fails_its_checksum_is_refused_naming_it(tmp_path: Path) -> None:
    paths, _ = _page_chunks(tmp_path, 4)
    data = bytearray(Path(paths[0]).read_bytes())
    data[9] ^= 0x20
    Path(paths[0]).write_bytes(bytes(data))
    evict(paths[0])
    got = map_chunks(paths, [PAGE] * 4)
    assert got is not None and sorted(got.unread) == [0]
    with pytest.raises(ChunkFileError, match=f"^DATA_LOSS: chunk file {paths[0]} fails its checksum"):
        got.complete()


@pytest.mark.parametrize("why", ["cold", "short", "missing", "filesystem"])
def test_chunk_files_are_not_mapped_where_they_are_to_be_read(tmp_path: Path, why: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in the page cache (a cold read: faulting pages in is no faster than ``preadv``), of another size or
    missing (the read names it), or on a filesystem that is not local (a dropped page would be fetched again from a
    server that may be gone): None, and the caller reads the files."""
    paths, _ = _page_chunks(tmp_path)
    if why == "cold":
        for path in paths:
            evict(path)
    elif why == "short":
        os.truncate(paths[1], PAGE)
    elif why == "missing":
        os.remove(paths[2])
    else:
        monkeypatch.setattr(chunk_files, "MAPPABLE_FILESYSTEMS", {})
    mapped_before = _mapped_files()
    assert map_chunks(paths, [PAGE] * 3) is None
    assert not set(paths) & (_mapped_files() - mapped_before)  # nothing left mapped
    if why == "filesystem":
        assert chunk_files.filesystem(paths[0]) is not None  # known here, only not listed


@pytest.mark.parametrize(("candidates", "budget", "picked"), [
    ({"a": (2, 8 << 20), "b": (1, 4 << 20)}, 10, {"a", "b"}),
    ({"a": (2, 8 << 20), "b": (1, 4 << 20)}, 2, {"a"}),  # the largest first, within the budget
    ({"a": (3, 8 << 20), "b": (1, 4 << 20)}, 2, {"b"}),  # one that does not fit leaves room for a smaller one
    ({"a": (1, (1 << 20) - 1), "b": (1, 1 << 20)}, 10, {"b"}),  # under MAP_MIN_BYTES: read
    ({"a": (1, 8 << 20)}, 0, set()),  # no room for another mapping
])
def test_pick_mapped(candidates, budget, picked) -> None:
    assert pick_mapped(candidates, budget) == picked


def test_the_map_budget_is_half_the_room_left_under_max_map_count() -> None:
    limit = int(Path("/proc/sys/vm/max_map_count").read_text())
    before = len(Path("/proc/self/maps").read_text().splitlines())
    budget = map_budget()
    after = len(Path("/proc/self/maps").read_text().splitlines())  # a thread may start or end between the reads
    assert (limit - max(before, after)) // 2 <= budget <= (limit - min(before, after)) // 2, (budget, before, after)
