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
from reprieve.checkpoint import layout, spec
from reprieve.checkpoint.chunk_files import (
    ChunkFileError,
    ChunkRead,
    contiguous_span,
    direct_reads,
    read_chunk,
    status_word,
)
from reprieve.checkpoint.metadata import CheckpointCorruptError, CheckpointUnavailableError
from reprieve.checkpoint.restore import read_failure

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
