"""Landing memory populated ahead (reprieve.landing): when a warm process may populate it, how the pool hands it
out and gives it back, and that a storage restore lands in it bit-exact."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")  # as the other runtime modules

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from reprieve import landing
from reprieve.arrays import host_buffer
from reprieve.trace_ahead import latest_metadata

from tests.runtime.helpers_pagecache import evict

GiB = 1 << 30


@pytest.fixture(autouse=True)
def no_pool() -> Iterator[None]:
    landing._pool.clear()
    yield
    landing.release()
    landing._pool.clear()


@pytest.mark.unit
@pytest.mark.parametrize("nbytes,current,limit,available,problem", [
    (1 * GiB, 1 * GiB, 4 * GiB, 20 * GiB, None),  # 1 + 2 <= 4
    (1 * GiB, 2 * GiB + 1, 4 * GiB, 20 * GiB, "the pod's memory limit is 4294967296 bytes with 2147483649 in use"),
    (1 * GiB, None, None, 20 * GiB, None),  # no cgroup limit: the machine's memory decides
    (1 * GiB, None, None, 2 * GiB - 1, "the machine has 2147483647 bytes available"),
    (1 * GiB, 0, None, None, None),  # nothing known: populate
])
def test_landing_memory_needs_room_for_it_twice_over(nbytes: int, current: int | None, limit: int | None,
                                                     available: int | None, problem: str | None) -> None:
    got = landing.room_problem(nbytes, current=current, limit=limit, available=available)
    assert (got is None) == (problem is None)
    if problem is not None:
        assert got is not None and got.startswith(problem) and str(nbytes) in got


@pytest.mark.integration
def test_no_room_no_pool_and_the_numbers_are_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert landing.reserve(128 << 20, {"current": 900 << 20, "limit": 1 << 30, "available": None}) is None
    assert "not populated ahead: the pod's memory limit is 1073741824 bytes with 943718400 in use" in caplog.text
    assert landing.take(1 << 20) is None  # a restore then makes fresh buffers
    assert landing.reserve(1 << 20, {}) is None  # too small to be worth it


@pytest.mark.integration
def test_the_pool_hands_out_page_aligned_pieces_until_it_is_used_up() -> None:
    pool = landing.reserve(64 << 20, {})
    assert pool is not None and pool.size == 64 << 20
    a, b = landing.take(40 << 20), landing.take(10 << 20 | 5)
    assert a is not None and b is not None
    assert a.ctypes.data % landing.PAGE == 0 and b.ctypes.data % landing.PAGE == 0
    assert b.ctypes.data == a.ctypes.data + (40 << 20)  # one mapping, carved from its start
    assert b.nbytes == 10 << 20 | 5 and pool.taken == (50 << 20) + 5
    assert landing.take(20 << 20) is None  # past its end: the caller makes a fresh buffer
    a[:] = 7
    assert landing.reserve(64 << 20, {}) is None  # one per process


@pytest.mark.integration
def test_a_dead_piece_and_the_unused_rest_go_back_to_the_kernel() -> None:
    pool = landing.reserve(64 << 20, {})
    assert pool is not None
    whole = np.frombuffer(pool._mem, dtype=np.uint8)  # the mapping itself, to look at what the kernel holds
    piece = landing.take(8 << 20)
    assert piece is not None
    piece[:] = 1
    whole[-1] = 9  # a byte in the part never handed out
    assert whole[:8 << 20].min() == 1
    del piece
    gc.collect()
    assert whole[:8 << 20].max() == 0  # MADV_DONTNEED: its pages are gone (a private mapping reads zeros again)
    assert landing.release() == (64 - 8) << 20
    assert whole[-1] == 0
    assert landing.take(1 << 20) is None and landing.release() == 0  # released once


@pytest.mark.integration
def test_host_buffers_of_a_restore_land_in_the_pool_bit_exact(tmp_path) -> None:
    from reprieve.checkpoint import CheckpointManager

    devs = np.array(jax.devices()[:2])
    n = len(devs)
    sharding = NamedSharding(Mesh(devs, ("d",)), P())  # replicated: each device's copy is a landing buffer too
    state = {"w": jnp.arange(16 << 20, dtype=jnp.float32).reshape(4096, 4096), "b": jnp.ones(3)}
    state = jax.device_put(state, sharding)
    mgr = CheckpointManager(str(tmp_path / "ckpt"), attempt=1)
    mgr.save(1, state)
    mgr.wait()
    evict(tmp_path / "ckpt")  # out of the page cache: read, not mapped (a mapped restore lands nothing)
    need = landing.landing_bytes(state)
    assert need == n * ((64 << 20) + 12)  # every device's replica
    found = latest_metadata({"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt")}, "test", "")
    assert found is not None and found[0].landing_bytes == need  # in reprieve.json, for a spare's warm process
    pool = landing.reserve(need, {})
    assert pool is not None
    base = np.frombuffer(pool._mem, dtype=np.uint8).ctypes.data
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    assert landing.landing_bytes(abstract) == need  # the same from the abstract state (the benchmarks' warm rows)
    step, restored, _ = CheckpointManager(str(tmp_path / "ckpt"), attempt=2).restore(abstract)
    assert step == 1
    w = restored["w"]
    assert np.array_equal(np.asarray(w), np.asarray(state["w"]))
    inside = [base <= s.data.unsafe_buffer_pointer() < base + pool.size for s in w.addressable_shards]
    assert inside == [True] * n  # every device's buffer is the pool's pages, adopted without a copy
    assert pool.taken == n * (64 << 20)  # the tiny leaf is made on the heap as before
    assert landing.release() == pool.size - n * (64 << 20)
    assert host_buffer((1 << 20,), np.dtype(np.uint8)).ctypes.data != base  # released: fresh buffers again
    gc.collect()  # the restore's own references are gone: only the arrays hold the pieces, whose pages stay theirs
    assert np.array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))
    del restored, w
    gc.collect()  # the arrays gone, their pieces' pages go back to the kernel
    assert np.frombuffer(pool._mem, dtype=np.uint8)[:1 << 20].max() == 0


@pytest.mark.integration
def test_a_spare_sizes_its_landing_memory_from_the_latest_checkpoint_once_there_is_one(tmp_path) -> None:
    from reprieve.checkpoint import CheckpointManager
    from reprieve.prewarm import LandingAhead

    uri = str(tmp_path / "ckpt")
    ahead = LandingAhead({"REPRIEVE_CHECKPOINT_URI": uri})
    ahead.attempt()
    assert not ahead.done and landing.take(1 << 20) is None  # no checkpoint yet: asked again while it waits
    mgr = CheckpointManager(uri, attempt=1)
    mgr.save(3, {"w": jnp.ones(24 << 20, jnp.float32)})  # 96 MiB
    mgr.wait()
    ahead.attempt()
    assert ahead.done and landing._pool and landing._pool[0].size == 96 << 20
    found = latest_metadata({"REPRIEVE_CHECKPOINT_URI": uri}, "test", "")
    assert found is not None and found[0].owned_bytes is None  # not told the step donates: nothing for its copy
    landing.release()
    landing._pool.clear()
    hinted = LandingAhead({"REPRIEVE_CHECKPOINT_URI": uri, "REPRIEVE_WARM_LANDING_BYTES": str(80 << 20)})
    hinted.attempt()  # the figure of the pod's own last trainer goes first
    assert hinted.done and landing._pool[0].size == 80 << 20


@pytest.mark.unit
def test_a_restore_that_adopts_each_distinct_shard_once_lands_only_the_other_replicas() -> None:
    assert len(jax.devices()) >= 4, jax.devices()  # the module's XLA_FLAGS, unless a process started JAX before
    devs = np.array(jax.devices()[:2])
    rep = NamedSharding(Mesh(devs, ("d",)), P())
    rows = NamedSharding(Mesh(devs, ("d",)), P("d"))
    two_by_two = NamedSharding(Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b")), P("a"))
    state = {"rep": jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=rep),  # 4 KiB on each of 2 devices
             "rows": jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=rows),  # 2 KiB on each
             "half": jax.ShapeDtypeStruct((8, 4), jnp.int8, sharding=two_by_two),  # 16 B on each of 4, 2 distinct
             "host": np.zeros(5, np.float64)}
    assert landing.landing_bytes(state) == 2 * 4096 + 2 * 2048 + 4 * 16 + 40
    assert landing.landing_bytes(state, adopted_once=True) == 4096 + 0 + 2 * 16 + 40


@pytest.mark.integration
def test_a_typed_key_lands_its_key_data_and_a_numpy_leaf_itself() -> None:
    keys = jax.random.split(jax.random.key(0), 6)  # threefry: 2 uint32 words a key
    data = jax.random.key_data(keys)
    abstract = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=keys.sharding)
    assert landing.leaf_bytes(keys) == landing.leaf_bytes(abstract) == data.nbytes == 6 * 2 * 4
    assert landing.leaf_bytes(np.zeros(5, np.float64)) == 40 and landing.leaf_bytes(3) == 0


@pytest.mark.integration
def test_a_spare_stops_asking_once_a_checkpoint_records_no_landing_bytes(tmp_path) -> None:
    from reprieve.checkpoint import CheckpointManager
    from reprieve.prewarm import LandingAhead

    uri = str(tmp_path / "ckpt")
    mgr = CheckpointManager(uri, attempt=1)
    mgr.save(1, {"lr": 0.1})  # no array: nothing recorded, as in a checkpoint of an older reprieve
    mgr.wait()
    ahead = LandingAhead({"REPRIEVE_CHECKPOINT_URI": uri})
    ahead.attempt()
    assert ahead.done and not landing._pool  # not read again every few seconds for the spare's whole wait


@pytest.mark.unit
def test_the_bytes_a_donating_steps_copy_needs_are_the_cpu_arrays_every_replica() -> None:
    devs = np.array(jax.devices()[:2])
    rep = NamedSharding(Mesh(devs, ("d",)), P())
    state = {"rep": jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=rep),  # 4 KiB on each of 2 devices
             "one": jnp.zeros((8,), jnp.int16),  # 16 B on the default device
             "host": np.zeros(5, np.float64), "lr": 0.1}  # neither is copied into memory XLA allocates
    assert landing.owned_bytes(state) == 2 * 4096 + 16


@pytest.mark.integration
def test_memory_xla_allocates_is_not_populated_without_room_and_a_warm_process_asks_once(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    from reprieve.prewarm import LandingAhead

    caplog.set_level(logging.INFO, logger="reprieve.landing")
    no_room = {"current": 3 * GiB, "limit": 4 * GiB, "available": 64 * GiB}
    assert not landing.reserve_owned(GiB, no_room)
    assert "memory XLA allocates not populated ahead: the pod's memory limit is 4294967296 bytes with 3221225472 in " \
           "use" in caplog.text and not landing.owned_ahead()
    assert not landing.reserve_owned(landing.MIN_BYTES - 1, {"current": 0, "limit": None, "available": None})
    assert landing.owned_done() is None  # below the minimum: nothing populated, nothing to give back
    caplog.clear()
    ahead = LandingAhead({"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_WARM_OWNED_BYTES": str(1 << 60)})
    ahead.attempt()
    ahead.attempt()  # no checkpoint yet, no landing hint: asked again for the landing memory, not for this
    assert not ahead.done and caplog.text.count("memory XLA allocates not populated ahead") == 1, caplog.text
    assert f"{(1 << 60) + (32 << 20)} bytes of memory XLA allocates need twice that" in caplog.text


@pytest.mark.unit
@pytest.mark.parametrize("held,current,limit,available,problem", [
    (1 * GiB, 5 * GiB, 8 * GiB, 20 * GiB, None),  # 3 GiB left under the limit, 20 on the machine: room once over
    (1 * GiB, 7 * GiB + 1, 8 * GiB, 20 * GiB, "the pod's memory limit is 8589934592 bytes with 7516192769 in use"),
    (1 * GiB, None, None, 1 * GiB, None),  # exactly once over: kept
    (1 * GiB, None, None, 1 * GiB - 1, "the machine has 1073741823 bytes available, less than the 1073741824"),
    (0, 7 * GiB, 7 * GiB, 0, None),  # nothing held: nothing to give back
    (1 * GiB, None, None, None, None),  # nothing known: kept
])
def test_memory_held_ahead_goes_back_once_the_room_falls_below_once_over(
        held: int, current: int | None, limit: int | None, available: int | None, problem: str | None) -> None:
    got = landing.tight_problem(held, current=current, limit=limit, available=available)
    assert (got is None) == (problem is None), got
    if problem is not None:
        assert got is not None and got.startswith(problem) and str(held) in got


def _resident() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * landing.PAGE


@pytest.mark.integration
def test_a_warm_process_gives_back_its_pool_and_heap_block_when_the_machine_runs_short(
        caplog: pytest.LogCaptureFixture) -> None:
    """What a warm process holds ahead (the landing pool, the heap block for XLA's copy) stays while there is room
    once over, and goes back to the kernel, both, once there is not: the resident memory falls by about their size,
    the restore then makes fresh buffers, and nothing is populated again."""
    caplog.set_level(logging.INFO, logger="reprieve.landing")
    roomy = {"current": None, "limit": None, "available": 64 * GiB}
    pool = landing.reserve(96 << 20, roomy)
    assert pool is not None and landing.reserve_owned(80 << 20, roomy)
    held = landing.held_ahead()
    assert held == (96 << 20) + (80 << 20) + (32 << 20), held  # the heap block has its slack
    assert landing.give_back_if_tight(roomy) == 0 and landing.held_ahead() == held
    before = _resident()
    back = landing.give_back_if_tight({"current": None, "limit": None, "available": held - 1})
    assert back >= (96 << 20) + (64 << 20), back  # the pool whole, and most of the heap block (malloc_trim)
    assert before - _resident() >= (96 << 20) + (64 << 20), (before, _resident())
    assert f"given back: the machine has {held - 1} bytes available, less than the {held} bytes held ahead" \
        in caplog.text, caplog.text
    assert landing.held_ahead() == 0 and not landing.owned_ahead() and landing.take(1 << 20) is None
    assert landing.give_back_if_tight({"available": 0}) == 0  # nothing left to give
    assert landing.reserve(96 << 20, roomy) is None  # one pool per process: not populated again
