"""reprieve.PerProcess: a function of replicated arrays compiled for this process's devices only, its results
replicated on the mesh. In one process (4 simulated devices): the results are bitwise those of ``jax.jit`` over the
mesh, one program serves several devices, compiling ahead leaves the first call nothing to lower, a sharded
argument is refused by name. With real ``jax.distributed`` gangs sharing a persistent compilation cache: a gang of
3 processes, then the same job shrunk to 2 finds its ``PerProcess`` program in the cache on every process, where
``jax.jit`` over the mesh compiles again (the cold compile issue #47 measured at a shrink), and every process of
both computes the same bits."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reprieve
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from reprieve.compile_ahead import watch_lowerings
from reprieve.per_process import PerProcessError

from tests.runtime.helpers_agreement import launch
from tests.runtime.workers.per_process_worker import update

WORKER = Path(__file__).resolve().parent / "workers" / "per_process_worker.py"


def _mesh(n: int) -> Mesh:
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts)")
    return Mesh(np.array(jax.devices()[:n]), ("d",))


def _state(mesh: Mesh) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = np.random.default_rng(0)
    replicated = NamedSharding(mesh, PartitionSpec())
    shapes = {"w": (32, 16), "b": (16,)}

    def put(value: Any) -> jax.Array:
        return jax.device_put(jnp.asarray(value), replicated)

    state = {"params": {k: put(rng.standard_normal(s, np.float32)) for k, s in shapes.items()},
             "mu": {k: put(np.zeros(s, np.float32)) for k, s in shapes.items()}, "count": put(np.int32(0))}
    return state, {k: put(rng.standard_normal(s, np.float32)) for k, s in shapes.items()}


@pytest.mark.unit
@pytest.mark.parametrize("devices", [1, 2, 4])
def test_the_results_are_bitwise_jits_over_the_mesh_and_replicated_on_it(devices: int) -> None:
    mesh = _mesh(devices)
    state, grads = _state(mesh)
    fn = reprieve.PerProcess(update, mesh)
    got, want = state, state
    for _ in range(3):  # its own results back in, as a training loop does
        got, want = fn(got, grads), jax.jit(update)(want, grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.sharding == NamedSharding(mesh, PartitionSpec())
        for shard in a.addressable_shards:
            assert np.array_equal(shard.data, b.addressable_data(0))
    assert int(got["count"].addressable_data(0)) == 3


@pytest.mark.unit
def test_compiled_ahead_the_first_call_lowers_nothing_and_later_calls_find_one_program() -> None:
    mesh = _mesh(4)
    state, grads = _state(mesh)
    fn = reprieve.PerProcess(update, mesh)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), (state, grads))
    fn.lower(*abstract).compile()
    with watch_lowerings() as lowerings:
        out = fn(state, grads)
        fn(out, grads)
    assert lowerings.stop() == (0, 0.0)


@pytest.mark.unit
def test_a_sharded_argument_is_refused_by_its_path() -> None:
    mesh = _mesh(2)
    state, grads = _state(mesh)
    grads["w"] = jax.device_put(grads["w"], NamedSharding(mesh, PartitionSpec("d")))
    with pytest.raises(PerProcessError, match=r"PerProcess\(update\): argument \[1\]\['w'\] is sharded"):
        reprieve.PerProcess(update, mesh)(state, grads)


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_a_shrunk_gang_finds_the_per_process_program_in_the_cache_and_jit_over_the_mesh_does_not(
        tmp_path: Path) -> None:
    cache = tmp_path / "jax-cache"

    def gang(name: str, n: int) -> list[dict[str, Any]]:
        work = tmp_path / name
        g = launch(work, n, worker=WORKER, extra_env={"REPRIEVE_COMPILATION_CACHE_DIR": str(cache)})
        assert g.wait(240) == [0] * n, g.tail()
        return [json.loads((work / f"result-{i}.json").read_text()) for i in range(n)]

    full = gang("full", 3)
    assert [(r["per_process_hits"], r["mesh_hits"]) for r in full] == [(0, 0)] * 3, full  # a cold cache
    shrunk = gang("shrunk", 2)
    assert all(r["per_process_hits"] >= 1 for r in shrunk), shrunk
    assert [r["mesh_hits"] for r in shrunk] == [0, 0], shrunk  # its program for 2 processes was never compiled
    assert all(r["replicated_on_the_mesh"] for r in full + shrunk), full + shrunk
    assert len({r["per_process"] for r in full + shrunk}) == 1, full + shrunk  # the same bits on every count
