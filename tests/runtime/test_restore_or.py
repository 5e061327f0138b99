"""job.restore_or with an abstract state: init_fn runs only when there is no checkpoint (real CheckpointManager)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reprieve
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _job(root: Path) -> Any:
    return reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(root)}, install_sigterm=False, watch_pod=False)


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("d",))


class Init:
    """init_fn that counts its calls; the state is replicated, 8 rows so every device count divides it."""

    def __init__(self, rows: int = 8) -> None:
        self.calls, self.rows = 0, rows

    def __call__(self) -> dict[str, Any]:
        self.calls += 1
        rep = NamedSharding(_mesh(), P())
        return {"w": jax.device_put(jnp.arange(self.rows * 3, dtype=jnp.float32).reshape(self.rows, 3), rep),
                "n": jax.device_put(jnp.zeros((), jnp.int32), rep)}


def _abstract(sharding_w: Any, rows: int = 8) -> dict[str, Any]:
    rep = NamedSharding(_mesh(), P())
    return {"w": jax.ShapeDtypeStruct((rows, 3), jnp.float32, sharding=sharding_w),
            "n": jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)}


def test_init_fn_runs_only_without_a_checkpoint_and_restore_lands_on_the_abstract_sharding(tmp_path: Path) -> None:
    init = Init()
    row_sharded = NamedSharding(_mesh(), P("d"))
    with _job(tmp_path) as job:
        state, start = job.restore_or(init, abstract=_abstract(NamedSharding(_mesh(), P())))
        assert (start, init.calls) == (0, 1)
        for step in job.steps(start, 3):
            state = {"w": state["w"] + 1.0, "n": state["n"] + 1}
            job.save(step, state)
    expected = np.asarray(state["w"])

    with _job(tmp_path) as job:
        restored, start = job.restore_or(init, abstract=_abstract(row_sharded))
        assert (start, init.calls) == (3, 1), "init_fn ran on a restart although a checkpoint was there"
        assert restored["w"].sharding.is_equivalent_to(row_sharded, 2)
        np.testing.assert_array_equal(np.asarray(restored["w"]), expected)
        assert int(restored["n"]) == 3
        job.abandon()

    with _job(tmp_path) as job:  # without abstract: init_fn still gives the target (the old behaviour)
        restored, start = job.restore_or(init)
        assert (start, init.calls) == (3, 2)
        np.testing.assert_array_equal(np.asarray(restored["w"]), expected)
        job.abandon()


def test_python_scalars_in_the_state_work_with_an_abstract_from_eval_shape(tmp_path: Path) -> None:
    rep = NamedSharding(_mesh(), P())
    calls = []

    def init() -> dict[str, Any]:
        calls.append(1)
        return {"w": jax.device_put(jnp.ones((4,), jnp.float32), rep), "epoch": 0, "lr": 0.1}

    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), jax.eval_shape(init))
    with _job(tmp_path) as job:
        state, start = job.restore_or(init, abstract=abstract)
        for step in job.steps(start, 2):
            state = {"w": state["w"] * 2, "epoch": state["epoch"] + 1, "lr": state["lr"] / 2}
            job.save(step, state)
    with _job(tmp_path) as job:
        restored, start = job.restore_or(init, abstract=abstract)
        assert (start, len(calls)) == (2, 2)  # eval_shape traced init once; the restart did not call it
        assert (restored["epoch"], restored["lr"]) == (2, 0.025)
        np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((4,), 4.0, np.float32))
        job.abandon()


def test_an_abstract_leaf_without_sharding_is_refused_on_the_first_run(tmp_path: Path) -> None:
    init = Init()
    bad = {"w": jax.ShapeDtypeStruct((8, 3), jnp.float32), "n": _abstract(None)["n"]}
    with _job(tmp_path) as job:
        with pytest.raises(ValueError, match=r"abstract leaf \['w'\] has no sharding"):
            job.restore_or(init, abstract=bad)
        assert init.calls == 0
        job.abandon()


def test_init_fn_that_does_not_match_the_abstract_state_is_refused_on_the_first_run(tmp_path: Path) -> None:
    rep = NamedSharding(_mesh(), P())
    with _job(tmp_path) as job:
        with pytest.raises(ValueError, match=r"leaf \['w'\]: abstract says float32\[8, 3\], init_fn\(\) returned "
                                             r"float32\[16, 3\]"):
            job.restore_or(Init(rows=16), abstract=_abstract(rep))
        with pytest.raises(ValueError, match="another structure"):
            job.restore_or(Init(), abstract={"w": _abstract(rep)["w"]})
        job.abandon()


def test_a_numpy_leaf_in_the_abstract_state_is_restored_as_numpy(tmp_path: Path) -> None:
    """Defect (issue 23): docs/checkpoint.md says numpy leaves are supported and come back as numpy, but an
    abstract state holding one was refused ("has no sharding") on the first run already."""
    rep = NamedSharding(_mesh(), P())

    def init() -> dict[str, Any]:
        return {"w": jax.device_put(jnp.ones((4,), jnp.float32), rep), "rng": np.arange(5, dtype=np.int64)}

    abstract = {"w": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=rep), "rng": np.zeros(5, np.int64)}
    with _job(tmp_path) as job:
        state, start = job.restore_or(init, abstract)
        for step in job.steps(start, 2):
            state = {"w": state["w"] + 1.0, "rng": state["rng"] + 1}
            job.save(step, state)
    with _job(tmp_path) as job:
        restored, start = job.restore_or(init, abstract)
        assert start == 2
        assert type(restored["rng"]) is np.ndarray
        np.testing.assert_array_equal(restored["rng"], np.arange(5, dtype=np.int64) + 2)
        job.abandon()
