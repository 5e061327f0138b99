"""Regression tests of defects that crashed or mislabelled real runs (issue 12), on real files.

1. a corrupt newest checkpoint: restore falls back, and the re-save of the same step must commit (it used to
   fail for ever with ``OSError: [Errno 39] Directory not empty`` renaming onto the corrupt directory);
3. complex leaves: accepted by ``save()`` and failing at ``wait()`` (``fill_value`` 0 for a complex dtype);
4. a ``reprieve.json`` whose ``step`` disagrees with its directory name was restored as if it were right.
"""

from __future__ import annotations

import json
import logging
import os
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
