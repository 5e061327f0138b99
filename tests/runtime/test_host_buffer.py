"""``reprieve.arrays.host_buffer``: the landing memory of every restore and the save's staging. Large
buffers ask for transparent huge pages where the kernel lends them; each kind is checked on the machine that runs
the test (the kernel's own accounting, ``/proc/self/smaps``), so the test fails where the path taken is not the
one the machine offers."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import numpy as np
import pytest
from reprieve import arrays

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def smaps_of(address: int) -> dict[str, int]:
    """The numeric fields of the ``/proc/self/smaps`` entry of the mapping that holds ``address``."""
    fields: dict[str, int] | None = None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                if fields is not None:
                    break
                start, end = (int(x, 16) for x in head.split("-"))
                if start <= address < end:
                    fields = {}
            elif fields is not None and head.endswith(":") and line.split()[1].isdigit():
                fields[head[:-1]] = int(line.split()[1])
    assert fields is not None, f"no mapping holds {address:#x}"
    return fields


def test_a_large_buffer_is_aligned_writable_zeroed_and_asks_for_huge_pages_where_offered() -> None:
    buf = arrays.host_buffer((4, 4 << 20), np.dtype(np.float32))  # 64 MiB
    assert buf.shape == (4, 4 << 20) and buf.dtype == np.float32 and buf.flags.writeable
    assert buf.ctypes.data % 64 == 0 and not buf.any()
    vma = smaps_of(buf.ctypes.data)
    assert vma["Rss"] >= 64 << 10, vma  # populated up front, not on first touch
    if arrays._huge_pages():  # the kernel lends huge pages on request: this mapping asked (whether it got them
        assert vma.get("THPeligible") == 1, vma  # depends on free memory and the defrag setting)


def test_without_huge_pages_a_large_buffer_is_populated_small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrays, "_huge_pages", lambda: False)
    buf = arrays.host_buffer((16 << 20,), np.dtype(np.uint8))
    assert buf.ctypes.data % 64 == 0 and buf.flags.writeable and not buf.any()
    assert smaps_of(buf.ctypes.data)["Rss"] >= 16 << 10


def test_a_small_buffer_is_aligned_and_writable() -> None:
    buf = arrays.host_buffer((1000,), np.dtype(np.int16))
    assert buf.shape == (1000,) and buf.ctypes.data % 64 == 0 and buf.flags.writeable


def test_huge_pages_that_populate_slower_than_small_pages_are_left_for_the_rest_of_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not arrays._huge_pages_offered():
        pytest.skip("this kernel lends no huge pages on request")
    monkeypatch.setattr(arrays, "_huge_slower", [False])
    monkeypatch.setattr(arrays, "_small_pages_seconds_per_byte", lambda: float("inf"))  # huge pages always faster
    arrays.host_buffer((16 << 20,), np.dtype(np.uint8))
    assert arrays._huge_pages()
    monkeypatch.setattr(arrays, "_small_pages_seconds_per_byte", lambda: 0.0)  # small pages always faster
    first = arrays.host_buffer((16 << 20,), np.dtype(np.uint8))
    assert smaps_of(first.ctypes.data).get("THPeligible") == 1  # this one asked for huge pages, and was timed
    assert not arrays._huge_pages()
    later = arrays.host_buffer((16 << 20,), np.dtype(np.uint8))
    vma = smaps_of(later.ctypes.data)
    assert vma.get("THPeligible") == 0 and vma["Rss"] >= 16 << 10, vma  # small pages, populated up front


def test_buffers_made_in_a_pool_come_back_in_order_and_the_first_large_one_alone_judges_huge_pages() -> None:
    from concurrent.futures import ThreadPoolExecutor

    specs = [((16,), np.dtype(np.int8)), ((4, 4 << 20), np.dtype(np.float32)), ((2, 3 << 20), np.dtype(np.float16)),
             ((8 << 20,), np.dtype(np.uint8))]

    mapped: list[tuple[tuple[int, ...], np.dtype]] = []

    class Recording(ThreadPoolExecutor):
        def map(self, fn, *iterables, **kw):  # type: ignore[no-untyped-def, override]
            items = list(iterables[0])
            mapped.extend(items)
            return super().map(fn, items, **kw)

    judged = arrays._huge_pages()  # huge pages still tried: the first large buffer (index 1) is made alone, first
    with Recording(4) as pool:
        bufs = arrays.host_buffers(specs, pool)
    assert [(b.shape, b.dtype) for b in bufs] == specs
    assert all(b.ctypes.data % 64 == 0 and b.flags.writeable for b in bufs)
    assert not any(b.any() for b in bufs[1:])  # the mapped ones (from 1 MiB on) come zeroed from the kernel
    assert mapped == ([s for i, s in enumerate(specs) if i != 1] if judged else specs)


def test_replicas_on_devices_get_their_own_adopted_buffers_and_a_donated_one_spares_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``on_devices``: a restored buffer replicated over devices. The first device adopts the buffer itself (no
    copy), every other replica its own 64-byte aligned copy, which its device adopts as well (a plain numpy copy
    was copied by the device a second time); donating one replica leaves the others intact."""
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    buf = arrays.host_buffer((4 << 20,), np.dtype(np.float32))  # 16 MiB
    buf[:] = np.arange(buf.size, dtype=np.float32)
    made: list[np.ndarray] = []
    real = arrays.host_buffer
    monkeypatch.setattr(arrays, "host_buffer", lambda shape, dtype: made.append(real(shape, dtype)) or made[-1])
    placed = arrays.on_devices([buf], [devices[:2]])
    first, second = placed[devices[0]], placed[devices[1]]
    assert first.unsafe_buffer_pointer() == buf.ctypes.data  # adopted: no copy
    assert len(made) == 1 and second.unsafe_buffer_pointer() == made[0].ctypes.data != buf.ctypes.data
    gone = jax.jit(lambda x: x * 0 - 1, donate_argnums=0)(first)
    assert first.is_deleted() and float(gone[7]) == -1.0
    np.testing.assert_array_equal(np.asarray(second), np.arange(buf.size, dtype=np.float32))


def test_shards_put_on_their_devices_in_one_call_are_each_adopted_where_they_belong() -> None:
    """``on_devices`` puts a leaf's shards in one batched ``device_put``: each device holds its own shard's bytes and
    adopts its buffer (no copy), as one call per shard did."""
    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    bufs = [arrays.host_buffer((1 << 18,), np.dtype(np.float32)) for _ in devices[:4]]
    for i, b in enumerate(bufs):
        b[:] = i
    placed = arrays.on_devices(bufs, [[d] for d in devices[:4]])
    for i, (b, d) in enumerate(zip(bufs, devices[:4], strict=True)):
        assert placed[d].devices() == {d} and placed[d].unsafe_buffer_pointer() == b.ctypes.data
        assert float(placed[d][0]) == float(i)


def test_leaves_assembled_together_are_put_in_one_call_each_adopted_in_its_sharding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``assemble``: a restore's leaves (one replicated over two devices, one sharded over four, one of another
    dtype) become their arrays with one ``device_put`` for all of them: each array has its leaf's shape, sharding
    and values, each shard adopts the buffer it landed in, the replica its own copy."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    calls: list[int] = []
    real_put = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda xs, ds, **kw: calls.append(len(xs)) or real_put(xs, ds, **kw))
    pair = NamedSharding(Mesh(np.array(devices[:2]), ("d",)), P())
    four = NamedSharding(Mesh(np.array(devices[:4]), ("d",)), P("d"))
    rep = arrays.host_buffer((3, 5), np.dtype(np.float32))
    rep[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
    rows = [arrays.host_buffer((2, 3), np.dtype(np.int32)) for _ in range(4)]
    for i, r in enumerate(rows):
        r[:] = np.arange(6, dtype=np.int32).reshape(2, 3) + 6 * i
    scalar = arrays.host_buffer((), np.dtype(np.float16))
    scalar[...] = 2.5
    made = arrays.assemble([([rep], [devices[:2]], (3, 5), pair),
                            (rows, [[d] for d in devices[:4]], (8, 3), four),
                            ([scalar], [devices[:2]], (), pair)])
    assert calls == [2 + 4 + 2]
    a, b, c = made
    assert a.sharding == pair and b.sharding == four and c.sharding == pair and c.dtype == np.float16
    np.testing.assert_array_equal(np.asarray(a), rep)
    np.testing.assert_array_equal(np.asarray(b), np.arange(24, dtype=np.int32).reshape(8, 3))
    assert float(c) == 2.5
    pointers = {s.device: s.data.unsafe_buffer_pointer() for s in a.addressable_shards}
    assert pointers[devices[0]] == rep.ctypes.data != pointers[devices[1]]  # the replica: its own copy
    for s in b.addressable_shards:
        assert s.data.unsafe_buffer_pointer() == rows[devices.index(s.device)].ctypes.data
    assert arrays.assemble([]) == []


def test_leaves_assembled_for_a_donating_step_are_copies_xla_owns_which_its_donation_reuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ``owned_copies`` that says so (``Job.restore_or``: the step donates the state on CPU devices), each
    buffer is adopted by its first device and then copied by XLA onto each of its devices: every shard is memory XLA
    allocated (no shard is a host buffer, the replica has no host copy first), a donating step's output reuses it,
    and the copied bytes are counted. Asked once; not known (None): the buffers are adopted as without it."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    pair = NamedSharding(Mesh(np.array(devices[:2]), ("d",)), P())
    four = NamedSharding(Mesh(np.array(devices[:4]), ("d",)), P("d"))

    def leaves() -> tuple[list, list[np.ndarray]]:
        rep = arrays.host_buffer((3, 5), np.dtype(np.float32))
        rep[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
        rows = [arrays.host_buffer((2, 3), np.dtype(np.int32)) for _ in range(4)]
        for i, r in enumerate(rows):
            r[:] = np.arange(6, dtype=np.int32).reshape(2, 3) + 6 * i
        return [([rep], [devices[:2]], (3, 5), pair), (rows, [[d] for d in devices[:4]], (8, 3), four)], [rep, *rows]

    calls: list[tuple[int, object]] = []
    real_put = jax.device_put
    monkeypatch.setattr(jax, "device_put",
                        lambda xs, ds, **kw: calls.append((len(xs), kw.get("may_alias"))) or real_put(xs, ds, **kw))
    asked: list[int] = []
    spec, hosts = leaves()
    with arrays.owned_copies(lambda: asked.append(1) or True) as owned:
        a, b = arrays.assemble(spec)
    assert calls == [(1 + 4, None), (2 + 4, False)] and asked == [1]  # adopted, then copied; asked once
    np.testing.assert_array_equal(np.asarray(a), np.arange(15, dtype=np.float32).reshape(3, 5))
    np.testing.assert_array_equal(np.asarray(b), np.arange(24, dtype=np.int32).reshape(8, 3))
    assert owned.copied == 2 * 60 + 4 * 24
    host = {h.ctypes.data for h in hosts}
    shards = [s.data.unsafe_buffer_pointer() for x in (a, b) for s in x.addressable_shards]
    assert not host & set(shards) and len(set(shards)) == 6, (host, shards)  # XLA's, and the replicas apart
    before = sorted(s.data.unsafe_buffer_pointer() for s in b.addressable_shards)
    out = jax.jit(lambda x: x + 1, donate_argnums=0)(b)
    assert sorted(s.data.unsafe_buffer_pointer() for s in out.addressable_shards) == before  # the donation reused it

    calls.clear()
    spec, hosts = leaves()
    with arrays.owned_copies(lambda: None) as owned:  # not known yet (the step still lowering): adopted
        a, _ = arrays.assemble(spec)
    assert calls == [(2 + 4, None)] and owned.copied == 0 and owned.asked
    assert {s.data.unsafe_buffer_pointer() for s in a.addressable_shards} >= {hosts[0].ctypes.data}
