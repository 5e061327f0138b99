"""plan_reads: how saved chunks fill target shard regions; narrowing: what a restore's cast loses; read_failure: a
failed read as damage or as a storage that did not answer (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reprieve.checkpoint.metadata import CheckpointCorruptError, CheckpointUnavailableError
from reprieve.checkpoint.restore import ReadOp, narrowing, plan_reads, read_budget, read_failure

pytestmark = pytest.mark.unit

ROWS4 = [((0, 2), (0, 8)), ((2, 4), (0, 8)), ((4, 6), (0, 8)), ((6, 8), (0, 8))]
COLS4 = [((0, 8), (0, 2)), ((0, 8), (2, 4)), ((0, 8), (4, 6)), ((0, 8), (6, 8))]


def test_same_sharding_reads_each_chunk_straight_into_its_target() -> None:
    ops = plan_reads((8, 8), (2, 8), ROWS4, itemsize=4, limit_bytes=1 << 20)
    assert ops == [ReadOp(r, ((i, r),), direct=True) for i, r in enumerate(ROWS4)]


def test_resharding_reads_each_chunk_once_and_scatters() -> None:
    ops = plan_reads((8, 8), (2, 8), COLS4, itemsize=4, limit_bytes=1 << 20)
    assert [op.box for op in ops] == ROWS4  # 4 chunk reads, not 16
    assert all(not op.direct and len(op.parts) == 4 for op in ops)
    assert ops[1].parts[2] == (2, ((2, 4), (4, 6)))


def test_target_inside_a_bigger_chunk_reads_only_that_part() -> None:
    ops = plan_reads((8, 8), (8, 8), [ROWS4[1]], itemsize=4, limit_bytes=1 << 20)
    assert ops == [ReadOp(ROWS4[1], ((0, ROWS4[1]),), direct=True)]


def test_parts_bigger_than_the_budget_are_read_one_by_one() -> None:
    ops = plan_reads((8, 8), (8, 8), COLS4, itemsize=4, limit_bytes=64)  # a whole chunk is 256 bytes
    assert [op.box for op in ops] == COLS4 and all(len(op.parts) == 1 for op in ops)


@pytest.mark.parametrize("shape,chunk,targets,n_ops", [
    ((), (), [()], 1),  # 0-d
    ((0, 4), (1, 4), [((0, 0), (0, 4))], 0),  # empty array: nothing to read
    ((5,), (2,), [((0, 5),)], 3),  # uneven edge chunk
    ((8, 8), (2, 8), [((0, 8), (0, 8))], 4),  # restore onto a single device
])
def test_edge_shapes(shape, chunk, targets, n_ops: int) -> None:
    ops = plan_reads(shape, chunk, targets, itemsize=4, limit_bytes=1 << 20)
    assert len(ops) == n_ops
    def size(r) -> int:
        return math.prod(hi - lo for lo, hi in r)

    assert sum(size(p) for op in ops for _, p in op.parts) == sum(size(t) for t in targets)


MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize(("host_bytes", "limit", "expected"), [
    (0, None, 32 * MiB),             # tiny state: the floor, a few chunks still in flight
    (256 * MiB, None, 32 * MiB),     # 1/32 would be 8 MiB: floor
    (1 * GiB, None, 32 * MiB),       # 1/32
    (4 * GiB, None, 128 * MiB),      # 1/32: 16 MiB chunks read 8 at a time
    (64 * GiB, None, 1 * GiB),       # capped
    (4 * GiB, 8 * MiB, 8 * MiB),     # a user-set limit wins
])
def test_read_budget_scales_with_the_state_this_host_restores(host_bytes: int, limit: int | None,
                                                              expected: int) -> None:
    assert read_budget(host_bytes, limit) == expected


def test_read_budget_rejects_a_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="restore memory limit must be > 0 bytes, got 0"):
        read_budget(GiB, 0)


# -- the save side's host copy: shards copied in groups worth a thread's hand-off ---------------------------------
COPY_GROUPS = [
    ("nothing", [], []),
    ("a small state: one group (copied in the calling thread)", [1] * 9, [list(range(9))]),
    ("big shards: one each", [10, 10, 10], [[0], [1], [2]]),
    ("small ones gathered until the size", [4, 4, 4, 4, 9], [[0, 1, 2], [3, 4]]),
    ("a small tail joins the last group", [10, 10, 3], [[0], [1, 2]]),
]


@pytest.mark.parametrize(("sizes", "groups"), [r[1:] for r in COPY_GROUPS], ids=[r[0] for r in COPY_GROUPS])
def test_copy_groups(sizes: list[int], groups: list[list[int]]) -> None:
    from reprieve.checkpoint.save import copy_groups

    assert copy_groups(sizes, 10) == groups


@pytest.mark.parametrize("saved,target,loses", [
    ("bfloat16", "int32", "fractions are dropped"),  # issue 46: 30.125 restored as 30 without a word
    ("float32", "int8", "fractions are dropped"),
    ("float32", "bfloat16", "narrowing"),
    ("float64", "float32", "narrowing"),
    ("int64", "int32", "narrowing"),
    ("int32", "float32", "narrowing"),  # integers above 2**24 change
    ("complex64", "float32", "narrowing"),
    ("float32", "float32", None),
    ("bfloat16", "float32", None),
    ("float8_e4m3fn", "bfloat16", None),  # exact, though numpy's safe-cast table does not know ml_dtypes' floats
    ("int8", "int32", None),
    ("int4", "int8", None),
    ("bool", "int32", None),
])
def test_narrowing(saved: str, target: str, loses: str | None) -> None:
    import jax  # noqa: F401 - registers ml_dtypes' names with numpy

    got = narrowing(np.dtype(saved), np.dtype(target))
    assert (got is None) if loses is None else (got is not None and loses in got), got


@pytest.mark.parametrize(("message", "kind"), [
    # TensorStore's words for what this repository's tests did to a chunk (test_checkpoint.py) and to the store
    ('FAILED_PRECONDITION: Error reading local file "c/0": Not enough data: expected at least 16384 or 8190 more',
     CheckpointCorruptError),  # a chunk shorter than its metadata says
    ("DATA_LOSS: Error reading local file \"c/0\": Digest mismatch, stored digest is 0xf7316c63", CheckpointCorruptError),
    ('NOT_FOUND: chunk {0} stored at local file "c/0" is missing', CheckpointCorruptError),
    ("INVALID_ARGUMENT: Error parsing object", CheckpointCorruptError),
    ("something without a status code", CheckpointCorruptError),  # as before: unknown is damage
    ("UNAVAILABLE: CURL error Couldn't connect to server", CheckpointUnavailableError),
    ("DEADLINE_EXCEEDED: request timed out", CheckpointUnavailableError),
    ("ABORTED: the connection was reset", CheckpointUnavailableError),
    ("RESOURCE_EXHAUSTED: HTTP response code: 429 (SlowDown)", CheckpointUnavailableError),
    ("PERMISSION_DENIED: HTTP response code: 403", CheckpointUnavailableError),
    ("UNAUTHENTICATED: expired token", CheckpointUnavailableError),
])
def test_a_failed_read_is_damage_unless_the_storage_did_not_answer(message: str, kind: type) -> None:
    got = read_failure(f"checkpoint s3://b/r/step_1: reading arrays/00000 failed: {message}", ValueError(message))
    assert type(got) is kind and str(got).startswith("checkpoint s3://b/r/step_1: reading arrays/00000 failed")


def test_scratch_buffers_stay_within_their_limit_and_are_reused() -> None:
    """The resharding read's scratch buffers (``restore._Scratch``): at most the limit's bytes at once. With the
    limit's worth taken, another read gets the buffer that comes back first (it waited for it: a fresh one would pass
    the limit); a size that fits no free buffer makes room by dropping one."""
    import contextlib
    import threading

    from reprieve.checkpoint.restore import _Scratch

    def address(buf: np.ndarray) -> int:
        return int(buf.__array_interface__["data"][0])

    scratch = _Scratch(3 << 20)
    got: list[int] = []
    with contextlib.ExitStack() as held:
        first = [held.enter_context(scratch.take(1 << 20)) for _ in range(3)]
        assert scratch._made == 3 << 20 and len({address(b) for b in first}) == 3

        def read() -> None:
            with scratch.take(1 << 20) as buf:
                got.append(address(buf))

        waiter = threading.Thread(target=read)
        waiter.start()
    waiter.join(30)  # the stack gave the three back: the waiting read took one of them
    assert not waiter.is_alive() and got and got[0] in {address(b) for b in first}, got
    assert scratch._made == 3 << 20  # nothing made beyond the limit
    with scratch.take(2 << 20) as big:  # fits no free buffer: smaller ones dropped to make room
        assert big.nbytes == 2 << 20 and scratch._made <= 3 << 20


@pytest.mark.parametrize(("chunk", "limit", "whole"), [((4, 8), 1 << 20, True), ((4, 8), 64, False)])
def test_a_chunk_is_read_whole_only_when_its_file_fits_the_budget(chunk: tuple[int, int], limit: int,
                                                                   whole: bool) -> None:
    """A chunk larger than the read budget is left to TensorStore, which reads its parts piece by piece."""
    from types import SimpleNamespace

    from reprieve.checkpoint.restore import _chunk_of

    buf = np.zeros((8, 8), np.float32)
    lf = SimpleNamespace(meta=SimpleNamespace(chunk_shape=list(chunk)), out=lambda i: buf)
    op = ReadOp(((4, 8), (0, 8)), ((0, ((4, 8), (0, 4))), (1, ((4, 8), (4, 8)))), direct=False)
    got = _chunk_of(lf, op, limit)  # type: ignore[arg-type]
    assert got == (((1, 0), ((4, 8), (0, 8))) if whole else None)
