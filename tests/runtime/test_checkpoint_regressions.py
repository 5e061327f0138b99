"""Regression tests of defects that crashed or mislabelled real runs (issue 12), on real files.

1. a corrupt newest checkpoint: restore falls back, and the re-save of the same step must commit (it used to
   fail for ever with ``OSError: [Errno 39] Directory not empty`` renaming onto the corrupt directory);
3. complex leaves: accepted by ``save()`` and failing at ``wait()`` (``fill_value`` 0 for a complex dtype);
4. a ``reprieve.json`` whose ``step`` disagrees with its directory name was restored as if it were right.

Issue 46: ``s3:/bucket/x`` (one slash) became a local folder; a root whose every checkpoint was quarantined started
again at step 0; a narrowing cast on restore (bf16 30.125 into int32: 30) said nothing.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reprieve.checkpoint import CheckpointManager, layout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _state(v: float) -> dict[str, jax.Array]:
    return {"w": jnp.full((8, 4), v, jnp.float32), "n": jnp.asarray(int(v), jnp.int32)}


def _abstract() -> dict[str, jax.ShapeDtypeStruct]:
    s = _state(0)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), s)


def _flip_first_chunk(ckpt: Path) -> None:
    chunk = min(p for p in (ckpt / "arrays").rglob("*") if p.is_file() and "/c/" in str(p))
    data = bytearray(chunk.read_bytes())
    data[1] ^= 0x10
    chunk.write_bytes(bytes(data))


def test_a_corrupt_checkpoint_is_quarantined_and_the_same_step_saves_again(tmp_path: Path, caplog) -> None:
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(1, _state(1))
        mgr.save(2, _state(2))
    _flip_first_chunk(tmp_path / layout.committed_name(2, 1))
    caplog.set_level(logging.WARNING, logger="reprieve.checkpoint")
    # Outside the operator the attempt stays 1: the rerun falls back, retrains and saves step 2 again.
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        step, restored, _ = mgr.restore(_abstract())
        assert step == 1 and int(restored["n"]) == 1
        assert mgr.all_steps() == [1], "the corrupt checkpoint is still listed"
        mgr.save(2, _state(2))
        mgr.wait()  # used to raise: rename onto the corrupt step_..._a1 (Errno 39), a .tmp left behind
        assert mgr.latest_step() == 2
        step, restored, _ = mgr.restore(_abstract())
        assert step == 2 and int(restored["n"]) == 2
    names = sorted(os.listdir(tmp_path))
    quarantined = [n for n in names if n.startswith(layout.committed_name(2, 1) + layout.CORRUPT_SUFFIX)]
    assert len(quarantined) == 1, names
    assert not [n for n in names if n.endswith(layout.TMP_SUFFIX)], names
    assert "quarantined" in caplog.text and quarantined[0] in caplog.text
    # A second corruption of the same name is quarantined beside the first, never onto it.
    _flip_first_chunk(tmp_path / layout.committed_name(2, 1))
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        assert mgr.restore(_abstract())[0] == 1
        mgr.save(2, _state(2))
        mgr.wait()
        assert mgr.all_steps() == [1, 2]
    assert len([n for n in os.listdir(tmp_path) if layout.CORRUPT_SUFFIX in n]) == 2
    # a later attempt's startup leaves quarantined checkpoints alone (they are evidence)
    CheckpointManager(str(tmp_path), attempt=2)
    assert len([n for n in os.listdir(tmp_path) if layout.CORRUPT_SUFFIX in n]) == 2


def test_retention_keeps_only_the_newest_quarantined_copies(tmp_path: Path) -> None:
    """Quarantined copies were never cleaned: every corruption left a full-size copy for ever. Retention keeps the
    ``keep`` newest (by step, then copy) and deletes the older ones."""
    with CheckpointManager(str(tmp_path), keep=2) as mgr:
        mgr.save(1, _state(1))
    for name in (f"{layout.committed_name(1, 1)}.corrupt", f"{layout.committed_name(1, 1)}.corrupt-2",
                 f"{layout.committed_name(3, 1)}.corrupt", f"{layout.committed_name(2, 1)}.corrupt"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "QUARANTINED.json").write_text("{}")
    with CheckpointManager(str(tmp_path), keep=2) as mgr:
        mgr.save(4, _state(4))  # its commit runs a retention pass; close() waits for it
    left = sorted(n for n in os.listdir(tmp_path) if layout.CORRUPT_SUFFIX in n)
    assert left == [f"{layout.committed_name(2, 1)}.corrupt", f"{layout.committed_name(3, 1)}.corrupt"]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(layout.DELETING_SUFFIX)]


def test_a_stale_directory_under_the_committed_name_never_fails_a_commit(tmp_path: Path) -> None:
    """Whatever holds the name (a checkpoint restored past with ``step=``, a copy put back by hand), the new
    save of that step replaces it instead of failing."""
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(1, _state(1))
        mgr.save(2, _state(2))
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        assert mgr.restore(_abstract(), step=1)[0] == 1
        mgr.save(2, _state(20))
        mgr.wait()
        step, restored, _ = mgr.restore(_abstract())
    assert step == 2 and int(restored["n"]) == 20
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("step_")) == [
        layout.committed_name(1, 1), layout.committed_name(2, 1)]


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_leaves_round_trip_bit_exact(tmp_path: Path, dtype) -> None:
    rng = np.random.default_rng(0)
    value = (rng.standard_normal((6, 4)) + 1j * rng.standard_normal((6, 4))).astype(dtype)
    with jax.enable_x64(dtype == np.complex128), CheckpointManager(str(tmp_path)) as mgr:
        state = {"z": jnp.asarray(value), "host": value[0].copy()}
        mgr.save(1, state)
        mgr.wait()  # used to fail here: fill_value 0 is not a complex zarr3 fill value
        abstract = {"z": jax.ShapeDtypeStruct((6, 4), dtype, sharding=state["z"].sharding), "host": value[0]}
        _, got, _ = mgr.restore(abstract)
    assert got["z"].dtype == dtype and np.asarray(got["z"]).tobytes() == value.tobytes()
    assert got["host"].tobytes() == value[0].tobytes()


@pytest.mark.parametrize("field,value", [("step", 3), ("attempt", 7)])
def test_metadata_that_disagrees_with_the_name_is_corrupt(tmp_path: Path, caplog, field: str, value: int) -> None:
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(1, _state(1))
        mgr.save(2, _state(2))
    meta_path = tmp_path / layout.committed_name(2, 1) / layout.METADATA_FILE
    meta = json.loads(meta_path.read_text())
    meta[field] = value
    meta_path.write_text(json.dumps(meta))
    caplog.set_level(logging.ERROR, logger="reprieve.checkpoint")
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        assert mgr.latest_step() == 2
        step, restored, _ = mgr.restore(_abstract())
        # used to return (3, <state of step 2>) while latest_step() said 2
        assert step == 1 and int(restored["n"]) == 1
        assert mgr.latest_step() == 1
    assert f"{field} {value}" in caplog.text and "disagrees" in caplog.text


def test_arrays_that_disagree_with_the_metadata_are_corrupt(tmp_path: Path, caplog) -> None:
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(1, _state(1))
        mgr.save(2, _state(2))
    meta_path = tmp_path / layout.committed_name(2, 1) / layout.METADATA_FILE
    meta = json.loads(meta_path.read_text())
    for leaf in meta["leaves"]:
        if leaf["path"] == "['w']":
            leaf["shape"], leaf["chunk_shape"] = [4, 8], [4, 8]  # same bytes, other shape: zarr.json says 8x4
    meta_path.write_text(json.dumps(meta))
    abstract = {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32, sharding=_state(0)["w"].sharding),
                "n": _abstract()["n"]}
    caplog.set_level(logging.ERROR, logger="reprieve.checkpoint")
    with CheckpointManager(str(tmp_path), keep=5) as mgr, pytest.raises(Exception, match="zarr.json"):
        mgr.restore(abstract, step=2)


# -- issue 46 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["s3:/bucket/x", "file:relative/x"])
def test_init_refuses_a_uri_with_a_scheme_it_does_not_know(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           uri: str) -> None:
    """It used to save to ./s3:/bucket/x/ (exit 0, the start-up line looking right): on a pod those checkpoints die
    with the node."""
    import reprieve
    from reprieve.env import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"starts like a URI .* not one of the accepted forms: .*s3://bucket/prefix"):
        reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": uri}, install_sigterm=False, watch_pod=False)
    assert os.listdir(tmp_path) == [], "a local folder was made for a URI"


RESTORE_OR = textwrap.dedent("""
    import jax.numpy as jnp
    import reprieve

    job = reprieve.init(install_sigterm=False)
    state, start = job.restore_or(lambda: {"w": jnp.zeros((8, 4)), "n": jnp.asarray(0, jnp.int32)})
    print("START", start, flush=True)
""")


def _start(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    return subprocess.run([sys.executable, "-c", RESTORE_OR], capture_output=True, text=True, timeout=120,
                          check=False, env={**clean, "REPRIEVE_CHECKPOINT_URI": str(root), **env})


def test_a_root_whose_checkpoints_were_all_quarantined_does_not_start_from_scratch(tmp_path: Path) -> None:
    """Every checkpoint found corrupt (three .corrupt directories): the next start trained from step 0 with one INFO
    line. It now refuses, naming each copy and why, unless REPRIEVE_START_OVER_QUARANTINED=1."""
    from reprieve.checkpoint import CheckpointCorruptError

    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, _state(step))
    for step in (1, 2, 3):
        _flip_first_chunk(tmp_path / layout.committed_name(step, 1))
    with CheckpointManager(str(tmp_path), keep=5) as mgr, pytest.raises(CheckpointCorruptError):
        mgr.restore(_abstract())  # falls back through all three, quarantining each
    corrupt = sorted(n for n in os.listdir(tmp_path) if n.endswith(layout.CORRUPT_SUFFIX))
    assert corrupt == [f"{layout.committed_name(s, 1)}{layout.CORRUPT_SUFFIX}" for s in (1, 2, 3)]

    refused = _start(tmp_path)
    assert refused.returncode != 0 and "START" not in refused.stdout, refused.stdout
    assert "OnlyQuarantinedError" in refused.stderr and "holds no usable checkpoint, only 3 quarantined" in \
        refused.stderr, refused.stderr[-3000:]
    for name in corrupt:
        assert f"{name} (process 0: checkpoint" in refused.stderr, refused.stderr[-3000:]  # what, and why
    assert "REPRIEVE_START_OVER_QUARANTINED=1" in refused.stderr
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(layout.CORRUPT_SUFFIX)) == corrupt  # nothing touched

    allowed = _start(tmp_path, REPRIEVE_START_OVER_QUARANTINED="1")
    assert allowed.returncode == 0 and "START 0" in allowed.stdout, allowed.stderr[-3000:]
    assert "only 3 quarantined as corrupt" in allowed.stderr and "starting at step 0" in allowed.stderr


def test_a_root_with_a_usable_checkpoint_beside_quarantined_ones_restores_it(tmp_path: Path) -> None:
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        mgr.save(1, _state(1))
        mgr.save(2, _state(2))
    _flip_first_chunk(tmp_path / layout.committed_name(2, 1))
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        assert mgr.restore(_abstract())[0] == 1  # quarantines step 2
    with CheckpointManager(str(tmp_path), keep=5) as mgr:
        assert mgr.restore(_abstract())[0] == 1


def test_a_narrowing_cast_on_restore_is_a_warning_once_per_leaf(tmp_path: Path, caplog) -> None:
    """A bf16 checkpoint into an int32 abstract restored 30.125 as 30 without a word."""
    value = jnp.full((64, 8), 30.125, jnp.bfloat16)
    with CheckpointManager(str(tmp_path), max_chunk_bytes=256) as mgr:  # 8 chunks: one warning, not eight
        mgr.save(1, {"w": value, "same": jnp.ones((4,), jnp.float32)})
        mgr.wait()
        caplog.set_level(logging.WARNING, logger="reprieve.checkpoint")
        abstract = {"w": jax.ShapeDtypeStruct((64, 8), jnp.int32, sharding=value.sharding),
                    "same": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=value.sharding)}
        _, got, _ = mgr.restore(abstract)
    assert int(got["w"][0, 0]) == 30
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "restore leaf ['w']" in warnings[0] and "saved as bfloat16, restored as int32" in warnings[0]
    assert "fractions are dropped" in warnings[0] and str(tmp_path) in warnings[0]


def test_a_listing_process_0_could_not_make_fails_every_process_at_once_naming_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Process 0 lists the checkpoints and publishes the restore plan; when its listing fails (the store stopped
    answering between start-up and the restore), the others hear why at once instead of waiting out the barrier
    timeout (1800 s by default) for a plan that never comes."""
    import threading
    import time

    from reprieve.checkpoint.metadata import CheckpointUnavailableError
    from reprieve.coordination import LocalCoordinator

    shared = LocalCoordinator()

    class View(LocalCoordinator):  # process ``pid`` of 2, sharing one in-memory store of keys
        def __init__(self, pid: int) -> None:
            super().__init__()
            self._kv, self._cond, self.process_id, self.num_processes = shared._kv, shared._cond, pid, 2

    import itertools

    import reprieve.checkpoint.manager as manager_module

    managers = []
    for pid in range(2):  # one process's managers are numbered in order: both of these are its first
        monkeypatch.setattr(manager_module, "_instances", itertools.count(1000))
        managers.append(CheckpointManager(str(tmp_path / "ckpt"), coordinator=View(pid), attempt=1,
                                          barrier_timeout_s=60))

    def unreachable() -> list[object]:
        raise OSError("the store did not answer (emulated)")

    managers[0]._visible = unreachable  # type: ignore[method-assign]
    abstract = {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}
    raised: dict[int, BaseException] = {}

    def restore(pid: int) -> None:
        try:
            managers[pid].restore(abstract)
        except BaseException as err:  # noqa: BLE001 - what each process raised is the point
            raised[pid] = err

    t0 = time.monotonic()
    threads = [threading.Thread(target=restore, args=(pid,)) for pid in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(raised.get(0), OSError), raised
    assert isinstance(raised.get(1), CheckpointUnavailableError), raised
    assert "process 0 could not list" in str(raised[1]) and "did not answer (emulated)" in str(raised[1])
    assert time.monotonic() - t0 < 10, "process 1 waited for a plan instead of hearing why there is none"
