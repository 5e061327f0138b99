"""CheckpointManager in one process on real files: round trips, donation, async errors, retention,
leftovers, corruption + fallback, fencing, crash between barrier and commit."""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ckpt_workers import launch, state_def
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from reprieve.checkpoint import (
    CheckpointCorruptError,
    CheckpointManager,
    CheckpointSaveError,
    FencedError,
    layout,
)

from tests.runtime.helpers_pagecache import evict

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@functools.cache
def mesh_shapes() -> list[tuple[int, int]]:
    """The meshes to save and restore on; asked at test time (devices are not touched while pytest collects)."""
    return [(2, 2), (1, 4), (4, 1)] if len(jax.devices()) >= 4 else [(1, 1)]


def test_round_trip_all_leaf_kinds_resharded(tmp_path) -> None:
    src = state_def.make_mesh(mesh_shapes()[0])
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(3, state_def.make_state(11, src, "a"), extra={"data": {"epoch": 1, "offset": 42}})
        mgr.wait()
        assert mgr.committed_step == 3 and mgr.last_save_seconds is not None and mgr.last_save_seconds > 0
        for shape in mesh_shapes():
            for variant in ("a", "b"):
                mesh = state_def.make_mesh(shape)
                step, restored, extra = mgr.restore(state_def.make_abstract(mesh, variant))
                assert (step, extra) == (3, {"data": {"epoch": 1, "offset": 42}})
                assert state_def.check_state(restored, 11, mesh, variant) == []
    meta = (tmp_path / layout.committed_name(3, 1) / layout.METADATA_FILE).read_text()
    assert '"bfloat16"' in meta and '"attempt": 1' in meta and '"tensorstore"' in meta


def test_file_uri_and_dtype_cast(tmp_path) -> None:
    mesh = state_def.make_mesh(mesh_shapes()[0])
    with CheckpointManager(f"file://{tmp_path}/ck") as mgr:
        mgr.save(1, state_def.make_state(5, mesh, "a"))
        mgr.wait()
        abstract = state_def.make_abstract(mesh, "b", dtypes={"w": jnp.bfloat16, "emb": jnp.float32})
        _, restored, _ = mgr.restore(abstract)
    vals = state_def.global_values(5)
    assert restored["params"]["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(restored["params"]["w"]), vals["w"].astype(jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(restored["params"]["emb"]), vals["emb"].astype(np.float32))


def test_shards_split_into_small_chunks_round_trip_resharded(tmp_path) -> None:
    """Chunk files smaller than a shard (the default caps them at 16 MiB) and one chunk per shard (the
    layout of checkpoints written before the cap) both restore bit-exact onto every mesh."""
    src = state_def.make_mesh(mesh_shapes()[0])
    files = {}
    for cap in (48, None):
        root = tmp_path / f"cap-{cap}"
        with CheckpointManager(str(root), max_chunk_bytes=cap) as mgr:
            mgr.save(2, state_def.make_state(7, src, "a"))
            mgr.wait()
        chunks = [p for p in (root / layout.committed_name(2, 1)).rglob("*") if p.is_file() and "/c/" in str(p)]
        files[cap] = chunks
        with CheckpointManager(str(root)) as mgr:  # the reader's own cap does not matter
            for shape in mesh_shapes():
                for variant in ("a", "b"):
                    mesh = state_def.make_mesh(shape)
                    _, restored, _ = mgr.restore(state_def.make_abstract(mesh, variant))
                    assert state_def.check_state(restored, 7, mesh, variant) == []
    assert len(files[48]) > len(files[None]) > 0
    assert max(p.stat().st_size for p in files[48]) < max(p.stat().st_size for p in files[None])


def test_small_memory_limit_still_restores(tmp_path) -> None:
    mesh = state_def.make_mesh(mesh_shapes()[0])
    with CheckpointManager(str(tmp_path), restore_memory_limit_bytes=64) as mgr:
        mgr.save(1, state_def.make_state(2, mesh, "a"))
        _, restored, _ = mgr.restore(state_def.make_abstract(mesh, "b"))
    assert state_def.check_state(restored, 2, mesh, "b") == []


@pytest.mark.parametrize("host_copy", ["staged", "device"])
def test_donation_right_after_save_is_safe(tmp_path, host_copy: str) -> None:
    mesh = state_def.make_mesh(mesh_shapes()[0])
    sharding = NamedSharding(mesh, P(*mesh.axis_names))

    @jax.jit
    def init() -> dict:
        return {"w": jnp.zeros((256, 256), jnp.float32), "n": jnp.zeros((), jnp.int32)}

    step_fn = jax.jit(lambda s: {"w": s["w"] + 1.0, "n": s["n"] + 1}, donate_argnums=0)
    state = jax.device_put(init(), {"w": sharding, "n": NamedSharding(mesh, P())})
    with CheckpointManager(str(tmp_path), keep=10, host_copy=host_copy) as mgr:
        for i in range(5):
            mgr.save(i, state)
            old = state
            state = step_fn(state)  # donates the buffers the save is still writing from
            assert old["w"].is_deleted()
        mgr.wait()
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        for i in range(5):
            _, got, _ = mgr.restore(abstract, step=i)
            assert int(got["n"]) == i
            np.testing.assert_array_equal(np.asarray(got["w"]), np.full((256, 256), float(i), np.float32))


def test_one_save_in_flight_and_errors_surface(tmp_path, caplog) -> None:
    mesh = state_def.make_mesh(mesh_shapes()[0])
    state = state_def.make_state(0, mesh, "a")
    mgr = CheckpointManager(str(tmp_path))
    caplog.set_level(logging.INFO, logger="reprieve.checkpoint")
    big = {"x": jnp.zeros((1024, 1024), jnp.float32)}
    mgr.save(1, big)
    mgr.save(2, state)  # the first save is still writing 4 MiB
    assert "waits for the in-flight save of step 1" in caplog.text or mgr.committed_step == 1
    mgr.wait()
    assert mgr.latest_step() == 2
    real_commit = mgr._storage.commit

    def broken_commit(step: int, attempt: int) -> None:
        raise OSError("disk on fire")

    mgr._storage.commit = broken_commit  # fault injection into the real manager
    mgr.save(3, state)
    with pytest.raises(CheckpointSaveError, match="step 3 .* not committed: error: commit failed: OSError: disk on fire"):
        mgr.wait()
    mgr.save(4, state)
    with pytest.raises(CheckpointSaveError, match="step 4"):
        mgr.save(5, state)  # surfaces on the next call
    mgr._storage.commit = real_commit
    mgr.save(6, state)
    mgr.close()
    assert CheckpointManager(str(tmp_path), attempt=1).all_steps()[-2:] == [2, 6]


def test_save_rejects_bad_input(tmp_path) -> None:
    mgr = CheckpointManager(str(tmp_path))
    x = jnp.ones((4,))
    with pytest.raises(TypeError, match=r"leaf \['bad'\]: expected jax.Array, numpy array.*got object"):
        mgr.save(1, {"bad": object()})
    with pytest.raises(TypeError, match=r"leaf \['f'\]: .*got custom_jvp; functions .* eqx.filter"):
        mgr.save(1, {"f": jax.nn.relu})
    with pytest.raises(TypeError, match=r"leaf \['s'\]: dtype 'str32' is not supported"):
        mgr.save(1, {"s": np.array(["a"])})
    with pytest.raises(TypeError, match=r"extra must be JSON-serialisable: \['f'\] is a object"):
        mgr.save(1, {"x": x}, extra={"f": object()})
    mgr.save(2, {"x": x, "key": jax.random.key_data(jax.random.key(0))})
    with pytest.raises(ValueError, match="step must increase, got 2 after 2"):
        mgr.save(2, {"x": x})
    mgr.wait()
    abstract = {"x": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=x.sharding)}
    with pytest.raises(KeyError, match=r"leaf \['y'\] is not in checkpoint"):
        mgr.restore({"y": abstract["x"]})
    with pytest.raises(ValueError, match=r"abstract shape \(5,\) does not match saved shape \(4,\) in checkpoint "
                                         rf"{tmp_path}/step_0000000002_a1"):
        mgr.restore({"x": jax.ShapeDtypeStruct((5,), jnp.float32, sharding=x.sharding)})
    with pytest.raises(ValueError, match="has no sharding"):
        mgr.restore({"x": jax.ShapeDtypeStruct((4,), jnp.float32)})
    with pytest.raises(FileNotFoundError, match="no complete checkpoint for step 9"):
        mgr.restore(abstract, step=9)
    mgr.close()
    with pytest.raises(FileNotFoundError, match="any step"):
        CheckpointManager(str(tmp_path / "empty")).restore(abstract)


def test_retention_keeps_last_n_and_every_k(tmp_path) -> None:
    x = {"x": jnp.arange(16.0)}
    with CheckpointManager(str(tmp_path), keep=2, keep_every=3) as mgr:
        for s in range(1, 8):
            mgr.save(s, x)
        mgr.wait()
    assert CheckpointManager(str(tmp_path)).all_steps() == [3, 6, 7]
    assert sorted(os.listdir(tmp_path)) == ["attempts"] + [layout.committed_name(s, 1) for s in (3, 6, 7)]


def test_a_save_for_a_restart_leaves_retention_to_the_next_attempts_first_commit(tmp_path) -> None:
    """The agreed save before a restart does not delete old checkpoints (the process exits right after the
    commit and closing would wait for the deletions); the next attempt's first commit deletes them."""
    x = {"x": jnp.arange(16.0)}
    with CheckpointManager(str(tmp_path), keep=1, attempt=1) as mgr:
        mgr.save(1, x)
        mgr.save(2, x)
        mgr.wait()
        mgr.defer_retention()
        mgr.save(3, x)
    assert CheckpointManager(str(tmp_path), attempt=1).all_steps() == [2, 3]  # step 1 went, step 2 stays
    with CheckpointManager(str(tmp_path), keep=1, attempt=2) as mgr:
        mgr.save(4, x)
    assert CheckpointManager(str(tmp_path), attempt=2).all_steps() == [4]
    assert sorted(os.listdir(tmp_path)) == ["attempts", layout.committed_name(4, 2)]


def test_leftovers_of_crashed_attempts_removed_at_startup(tmp_path) -> None:
    x = {"x": jnp.arange(16.0)}
    with CheckpointManager(str(tmp_path), attempt=1) as mgr:
        mgr.save(1, x)
    (tmp_path / layout.tmp_name(2, 1) / "arrays").mkdir(parents=True)
    (tmp_path / (layout.committed_name(0, 1) + ".deleting")).mkdir()
    mgr = CheckpointManager(str(tmp_path), attempt=2)
    assert sorted(os.listdir(tmp_path)) == ["attempts", layout.committed_name(1, 1)]
    assert mgr.latest_step() == 1


def _chunk_files(ckpt: os.PathLike) -> list[str]:
    out = []
    for d, _, files in os.walk(ckpt):
        out += [os.path.join(d, f) for f in files if "/c/" in os.path.join(d, f)]
    return sorted(out)


def test_a_resharded_local_restore_reads_its_chunk_files_itself(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Onto another sharding every chunk feeds several targets or no contiguous span of one: on a local root each
    such file is read whole into a reused scratch buffer, checked, and its parts copied out (checkpoint/restore.py),
    TensorStore reading only the 0-d leaves; bit-exact on every mesh. (A damaged file: the test after this one.)"""
    from reprieve.checkpoint.storage import Storage

    src = state_def.make_mesh(mesh_shapes()[0])
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(4, state_def.make_state(4, src, "a"))
    through_tensorstore: list[tuple[int, ...]] = []
    real = Storage.read_into

    def read_into(store: Any, region: tuple[slice, ...], out: Any) -> Any:
        through_tensorstore.append(out.shape)
        return real(store, region, out)

    monkeypatch.setattr(Storage, "read_into", staticmethod(read_into))
    for shape in mesh_shapes():
        mesh = state_def.make_mesh(shape)
        step, restored, _ = CheckpointManager(str(tmp_path)).restore(state_def.make_abstract(mesh, "b"))
        assert step == 4 and state_def.check_state(restored, 4, mesh, "b") == []
    assert through_tensorstore and all(s == () for s in through_tensorstore), through_tensorstore


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_chunk", "delete_metadata"])
def test_corrupt_checkpoint_names_file_and_falls_back(tmp_path, caplog, damage: str) -> None:
    mesh = state_def.make_mesh(mesh_shapes()[0])
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(1, state_def.make_state(1, mesh, "a"))
        mgr.save(2, state_def.make_state(2, mesh, "a"))
        mgr.wait()
    ck2 = tmp_path / layout.committed_name(2, 1)
    victim = _chunk_files(ck2 / "arrays" / "00000")[0]  # the bf16 embedding (first leaf in key order)
    path = Path(victim)
    if damage == "flip":
        data = bytearray(path.read_bytes())
        data[3] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "delete_chunk":
        os.remove(victim)
    else:
        os.remove(ck2 / layout.METADATA_FILE)
    caplog.set_level(logging.WARNING, logger="reprieve.checkpoint")
    abstract = state_def.make_abstract(mesh, "b")
    # the error names the checkpoint and the damaged file itself (no fallback: it is raised)
    expect = "reprieve.json" if damage == "delete_metadata" else re.escape(victim)
    with pytest.raises(CheckpointCorruptError, match=f"{ck2}.*{expect}"):
        CheckpointManager(str(tmp_path), fallback=False).restore(abstract)
    # ... and the checkpoint is quarantined: the next restore starts from the previous one
    assert not ck2.exists() and (tmp_path / (ck2.name + layout.CORRUPT_SUFFIX)).is_dir()
    mgr = CheckpointManager(str(tmp_path))
    assert mgr.all_steps() == [1]
    step, restored, _ = mgr.restore(abstract)
    assert step == 1 and state_def.check_state(restored, 1, mesh, "b") == []
    assert "quarantined" in caplog.text


def test_whole_chunks_are_read_by_the_runtime_and_a_short_one_is_refused_naming_both_sizes(tmp_path, caplog) -> None:
    """The same sharding on a local root: every chunk file read straight into its buffer (checkpoint/chunk_files.py),
    bit-exact; a cast goes through TensorStore; a chunk cut short fails the restore naming the file and both sizes,
    and the checkpoint is quarantined (nothing partly filled comes back)."""
    mesh = jax.make_mesh((len(jax.devices()),), ("d",))
    sharding = NamedSharding(mesh, P("d", None))
    rows = 16 * len(jax.devices())
    state = {"w": jax.device_put(jnp.arange(rows * 256, dtype=jnp.float32).reshape(rows, 256) - 1000.5, sharding)}
    abstract = {"w": jax.ShapeDtypeStruct((rows, 256), jnp.float32, sharding=sharding)}
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, state)
    caplog.set_level(logging.DEBUG, logger="reprieve.checkpoint.restore")
    _, restored, _ = CheckpointManager(str(tmp_path)).restore(abstract)
    assert np.array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))
    # 16 KiB a shard: read (a mapping costs more than copying so few bytes; mapped: the test after the next)
    assert ": 0 chunk files mapped as their buffers and checked, 0 read into their places" in caplog.text, caplog.text
    assert f": {len(jax.devices())} chunk files read by the runtime" in caplog.text, caplog.text
    caplog.clear()
    cast = {"w": jax.ShapeDtypeStruct((rows, 256), jnp.float64 if jax.config.jax_enable_x64 else jnp.bfloat16,
                                      sharding=sharding)}
    _, restored, _ = CheckpointManager(str(tmp_path)).restore(cast)
    assert np.array_equal(np.asarray(restored["w"]), np.asarray(state["w"]).astype(cast["w"].dtype))
    assert ": 0 chunk files mapped as their buffers and checked, 0 read into their places" in caplog.text, caplog.text
    assert ": 0 chunk files read by the runtime" in caplog.text, caplog.text
    ckpt = tmp_path / layout.committed_name(1, 1)
    victim = _chunk_files(ckpt / "arrays" / "00000")[-1]
    os.truncate(victim, 1000)
    want = 16 * 256 * 4 + 4
    with pytest.raises(CheckpointCorruptError, match=f"{ckpt}.*chunk file {re.escape(victim)} holds 1000 bytes, "
                                                     f"{want} expected"):
        CheckpointManager(str(tmp_path), fallback=False).restore(abstract)
    assert (tmp_path / (ckpt.name + layout.CORRUPT_SUFFIX)).is_dir()


def test_a_page_cached_local_restore_is_its_chunk_files_mapped(tmp_path, caplog) -> None:
    """The same sharding on a local root. Out of the page cache, the chunk files are read. In it (as the read left
    them), every shard's buffer is its chunk files mapped: the device adopts it (its address lies in a mapping of
    one of them; no copy), bit-exact; with ``map_files=False`` they are read. A write to a restored host array
    copies the page: the file keeps its bytes. The arrays stay whole when the checkpoint is deleted under them
    (retention). A mapped file that fails its checksum fails the restore naming it."""
    import shutil

    mesh = jax.make_mesh((len(jax.devices()),), ("d",))
    sharding = NamedSharding(mesh, P("d", None))
    rows = 1024 * len(jax.devices())  # 1 MiB a shard: chunk_files.MAP_MIN_BYTES
    w = jax.device_put(jnp.arange(rows * 256, dtype=jnp.float32).reshape(rows, 256) * 0.25, sharding)
    h = np.arange(1 << 18, dtype=np.int32) - 7
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, {"w": w, "h": h})
    ckpt = tmp_path / layout.committed_name(1, 1)
    files = _chunk_files(ckpt)
    evict(ckpt)
    abstract = {"w": jax.ShapeDtypeStruct((rows, 256), jnp.float32, sharding=sharding), "h": np.zeros_like(h)}
    caplog.set_level(logging.DEBUG, logger="reprieve.checkpoint.restore")
    _, cold, _ = CheckpointManager(str(tmp_path)).restore(abstract)
    assert ": 0 chunk files mapped as their buffers and checked, 0 read into their places" in caplog.text, caplog.text
    assert f": {len(files)} chunk files read by the runtime" in caplog.text, caplog.text
    assert np.array_equal(np.asarray(cold["w"]), np.asarray(w)) and np.array_equal(cold["h"], h)
    caplog.clear()
    _, warm, _ = CheckpointManager(str(tmp_path)).restore(abstract)
    assert f": {len(files)} chunk files mapped as their buffers and checked, 0 read into their places" in caplog.text
    assert ": 0 chunk files read by the runtime" in caplog.text, caplog.text
    with open("/proc/self/maps") as fh:
        spans = [(int(a, 16), int(b, 16)) for line in fh if line.split()[-1] in files
                 for a, b in [line.split()[0].split("-")]]
    for shard in warm["w"].addressable_shards:
        assert any(a <= shard.data.unsafe_buffer_pointer() < b for a, b in spans), shard.device
    assert np.array_equal(np.asarray(warm["w"]), np.asarray(w)) and np.array_equal(warm["h"], h)
    caplog.clear()
    _, off, _ = CheckpointManager(str(tmp_path), map_files=False).restore(abstract)  # turned off: read, as cold
    assert "mapped as their buffers" not in caplog.text, caplog.text
    assert f": {len(files)} chunk files read by the runtime" in caplog.text, caplog.text
    assert np.array_equal(np.asarray(off["w"]), np.asarray(w))
    warm["h"][:10] = 99  # copies the page: not the file's
    _, again, _ = CheckpointManager(str(tmp_path)).restore(abstract)
    assert np.array_equal(again["h"], h)
    shutil.rmtree(ckpt)
    assert np.array_equal(np.asarray(warm["w"]), np.asarray(w)) and np.array_equal(warm["h"][10:], h[10:])
    # a mapped file that fails its checksum fails the restore naming it (nothing partly filled comes back)
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(2, {"w": w, "h": h})
    victim = _chunk_files(tmp_path / layout.committed_name(2, 1))[-1]
    data = bytearray(Path(victim).read_bytes())
    data[7] ^= 0x01
    Path(victim).write_bytes(bytes(data))  # through the page cache: still mapped
    caplog.clear()
    with pytest.raises(CheckpointCorruptError, match=f"chunk file {re.escape(victim)} fails its checksum"):
        CheckpointManager(str(tmp_path), fallback=False).restore(abstract)


def test_restore_falls_back_past_a_corrupt_checkpoint(tmp_path, caplog) -> None:
    mesh = state_def.make_mesh(mesh_shapes()[0])
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        for s in (1, 2, 3):
            mgr.save(s, state_def.make_state(s, mesh, "a"))
    for s in (2, 3):
        os.remove(_chunk_files(tmp_path / layout.committed_name(s, 1) / "arrays" / "00001")[0])
    caplog.set_level(logging.ERROR, logger="reprieve.checkpoint")
    step, restored, _ = CheckpointManager(str(tmp_path)).restore(state_def.make_abstract(mesh, "b"))
    assert step == 1 and state_def.check_state(restored, 1, mesh, "b") == []
    assert caplog.text.count("falling back") == 2
    assert sorted(p.name for p in tmp_path.glob("*.corrupt")) == [layout.committed_name(s, 1) + ".corrupt"
                                                                  for s in (2, 3)]


def test_fencing_stale_attempt_cannot_make_checkpoints_visible(tmp_path) -> None:
    x = {"x": jnp.arange(16.0)}
    old = CheckpointManager(str(tmp_path), attempt=1)
    old.save(1, x)
    old.wait()
    new = CheckpointManager(str(tmp_path), attempt=2)  # writes the fence of attempt 2
    old.save(2, x)
    with pytest.raises(FencedError, match="attempts \\[2\\] started after attempt 1"):
        old.wait()
    assert new.latest_step() == 1 and not (tmp_path / layout.committed_name(2, 1)).exists()
    # A stale writer whose fence check raced the fence (checked just before it appeared) commits
    # anyway: the rename happens, yet the checkpoint is not in attempt 2's snapshot, so it is invisible.
    real_read_fences = old._storage.read_fences
    old._storage.read_fences = dict
    old.save(3, x)
    old.wait()
    old._storage.read_fences = real_read_fences
    assert (tmp_path / layout.committed_name(3, 1)).is_dir()
    assert new.latest_step() == 1 and new.all_steps() == [1] and old.latest_step() == 1
    new.save(5, x)
    new.wait()
    assert new.latest_step() == 5
    with pytest.raises(FencedError, match="attempt 1 is stale, attempts \\[2\\] have started"):
        CheckpointManager(str(tmp_path), attempt=1)


@pytest.mark.parametrize("point", ["after_barrier", "before_barrier"])
def test_crash_between_barrier_and_commit(tmp_path, point: str) -> None:
    cmd = [sys.executable, str(launch.WORKERS / "crash_worker.py"), str(tmp_path), "1", "--steps", "2"]
    ok = subprocess.run(cmd, env=launch.env(), capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    cmd[-1] = "3"
    crashed = subprocess.run(cmd, env=launch.env({"REPRIEVE_CKPT_TEST_CRASH_AT": point}), capture_output=True,
                             text=True, timeout=60, check=False)
    assert crashed.returncode == 86, crashed.stdout + crashed.stderr  # died at the injected point
    assert (tmp_path / layout.tmp_name(1, 1)).exists()  # the re-run's first save never committed
    mgr = CheckpointManager(str(tmp_path), attempt=2)
    assert mgr.latest_step() == 2
    assert not (tmp_path / layout.tmp_name(1, 1)).exists()


def test_slow_deletion_never_blocks_saves(tmp_path) -> None:
    """Saves commit while a retention deletion is stuck: ordering, not time (a save that waited for the
    deletion would hang here, and the test's timeout fails it)."""
    import threading

    x = {"x": jnp.arange(16.0)}
    mgr = CheckpointManager(str(tmp_path), keep=1)
    real_delete = mgr._storage.delete
    entered, release = threading.Event(), threading.Event()

    def slow_delete(name) -> None:  # a deletion stuck on a slow store, until the test lets it go
        entered.set()
        release.wait()
        real_delete(name)

    mgr._storage.delete = slow_delete
    try:
        for s in (1, 2):
            mgr.save(s, x)
            mgr.wait()
        assert entered.wait(60), "retention never deleted step 1 (keep=1)"  # stuck from here on
        for s in (3, 4):
            mgr.save(s, x)
            mgr.wait()
        assert not release.is_set() and mgr.latest_step() == 4  # both committed while the deletion was stuck
    finally:
        release.set()
    mgr.close()
    assert CheckpointManager(str(tmp_path)).all_steps() == [4]


@pytest.mark.parametrize("sync_mode", ["files", "syncfs"])
def test_durability_modes_round_trip(tmp_path, sync_mode: str) -> None:
    from reprieve.checkpoint.storage import _fsync_path

    x = {"x": jnp.arange(32.0)}
    with CheckpointManager(str(tmp_path), sync_mode=sync_mode) as mgr:
        mgr.save(1, x)
        mgr.wait()
        _, got, _ = mgr.restore({"x": jax.ShapeDtypeStruct((32,), jnp.float32, sharding=x["x"].sharding)})
    np.testing.assert_array_equal(np.asarray(got["x"]), np.arange(32.0))
    _fsync_path(str(tmp_path / "vanished.__lock"))  # another writer's temp file renamed away: ignored
    with pytest.raises(ValueError, match="sync_mode must be 'files' or 'syncfs', got 'never'"):
        CheckpointManager(str(tmp_path), sync_mode="never")
