"""Every kind of state a real JAX job trains round-trips bit-exact through the default checkpointer (real files):
typed PRNG keys (``jax.random.key``, ``nnx.Rngs``), float8 / float4 / int4 / uint4 / int2 / uint2, complex,
equinox modules (``eqx.filter`` / ``eqx.combine``), and flax NNX end to end with an abstract state that carries
shardings (the recipe of docs/runtime.md). The table in docs/checkpoint.md lists the same."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import reprieve
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from reprieve.checkpoint import CheckpointManager

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _mesh(shape: tuple[int, int] = (2, 2)) -> Mesh:
    return Mesh(np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape), ("data", "model"))


def _abstract_of(state: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
                        if isinstance(x, jax.Array) else x, state)


def _same_bits(a: Any, b: Any) -> bool:
    if isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        return (jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key) and a.dtype == b.dtype
                and np.asarray(jax.random.key_data(a)).tobytes() == np.asarray(jax.random.key_data(b)).tobytes())
    return np.asarray(a).dtype == np.asarray(b).dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_typed_prng_keys_come_back_as_typed_keys_on_any_sharding(tmp_path: Path) -> None:
    mesh = _mesh()
    keys = jax.device_put(jax.random.split(jax.random.key(7), 8), NamedSharding(mesh, P("data")))
    state = {"key": jax.random.key(3), "keys": keys, "rbg": jax.random.key(5, impl="rbg"),
             "data": jax.random.key_data(jax.random.key(9))}  # the old way (raw key data) still works
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, state)
        abstract = _abstract_of(state)
        abstract["keys"] = jax.ShapeDtypeStruct((8,), keys.dtype, sharding=NamedSharding(mesh, P("model")))
        _, got, _ = mgr.restore(abstract)
    for k, value in state.items():
        assert _same_bits(value, got[k]), k
    assert got["keys"].sharding.is_equivalent_to(NamedSharding(mesh, P("model")), 1)
    assert str(jax.random.key_impl(got["rbg"])) == "rbg"
    np.testing.assert_array_equal(jax.random.normal(got["keys"][3], (4,)), jax.random.normal(keys[3], (4,)))
    # impl mismatch is named
    wrong = dict(abstract, rbg=jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=abstract["key"].sharding))
    with CheckpointManager(str(tmp_path)) as mgr, pytest.raises(ValueError, match=r"\['rbg'\] from checkpoint .*: "
                                                                                   r"saved typed PRNG keys of impl rbg"):
        mgr.restore(wrong)


SMALL_FLOATS = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz",
                "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn"]
SMALL_INTS = ["int4", "uint4", "int2", "uint2"]


@pytest.mark.parametrize("name", SMALL_FLOATS + SMALL_INTS)
def test_quantised_dtypes_round_trip_bit_exact_on_device_and_host(tmp_path: Path, name: str) -> None:
    dtype = np.dtype(getattr(ml_dtypes, name))
    rng = np.random.default_rng(0)
    if name in SMALL_INTS:
        info = ml_dtypes.iinfo(dtype)
        host = rng.integers(int(info.min), int(info.max) + 1, size=(8, 4)).astype(dtype)
    else:
        host = rng.standard_normal((8, 4)).astype(np.float32).astype(dtype)
    mesh = _mesh()
    state: dict[str, Any] = {"host": host.copy()}
    try:
        state["dev"] = jax.device_put(host, NamedSharding(mesh, P("data", "model")))
    except Exception as err:  # noqa: BLE001 - a dtype this jax has no device support for: host leaf only
        pytest.skip(f"jax has no {name} arrays on CPU ({err}); the numpy leaf is covered by the other dtypes")
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, state)
        abstract = {"host": host, "dev": jax.ShapeDtypeStruct((8, 4), dtype, sharding=NamedSharding(mesh, P()))}
        _, got, _ = mgr.restore(abstract)
    assert got["dev"].dtype == dtype and got["host"].dtype == dtype
    assert np.asarray(got["dev"]).tobytes() == host.tobytes() and got["host"].tobytes() == host.tobytes()


def test_equinox_module_through_filter_and_combine(tmp_path: Path) -> None:
    import equinox as eqx

    def make(seed: int) -> Any:
        return eqx.nn.MLP(4, 2, width_size=8, depth=2, key=jax.random.key(seed))

    model = make(1)
    params, static = eqx.partition(model, eqx.is_array)
    with CheckpointManager(str(tmp_path)) as mgr:
        with pytest.raises(TypeError, match="eqx.filter"):  # the module itself holds functions
            mgr.save(1, model)
        mgr.save(2, params)
        # restore target: shapes from eqx.filter_eval_shape, shardings mapped in (replicated on one device here)
        shapes = eqx.filter(eqx.filter_eval_shape(make, 0), lambda x: isinstance(x, jax.ShapeDtypeStruct))
        sharding = params.layers[0].weight.sharding
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)
        _, restored, _ = mgr.restore(abstract)
    again = eqx.combine(restored, static)
    x = jnp.arange(4.0)
    assert np.asarray(again(x)).tobytes() == np.asarray(model(x)).tobytes()
    assert all(_same_bits(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored), strict=True))


# -- flax NNX end to end ----------------------------------------------------------------------------------

def _nnx_model_cls() -> Any:
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(8, 16, kernel_init=nnx.with_partitioning(init, (None, "model")), rngs=rngs)
            self.down = nnx.Linear(16, 8, kernel_init=nnx.with_partitioning(init, ("model", None)), rngs=rngs)
            self.drop = nnx.Dropout(0.3, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.down(self.drop(jax.nn.gelu(self.up(x))))

    return Block


def test_flax_nnx_with_dropout_and_optimizer_resumes_bit_identical(tmp_path: Path) -> None:
    import optax
    from flax import nnx

    block_cls = _nnx_model_cls()

    def create() -> Any:
        model = block_cls(nnx.Rngs(0, dropout=1))
        return model, nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(model: Any, opt: Any, x: jax.Array) -> jax.Array:
        def loss_fn(m: Any) -> jax.Array:
            return jnp.mean(m(x) ** 2)
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    x = jnp.ones((4, 8))

    def run(mesh: Mesh, steps: range, job: Any) -> tuple[list[float], Any]:
        with jax.set_mesh(mesh):
            # docs/runtime.md, "flax NNX": shapes from nnx.eval_shape, shardings from NNX's own helper
            graphdef, abstract = nnx.split(nnx.eval_shape(create))
            abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                    abstract, nnx.get_named_sharding(abstract, mesh))
            state, start = job.restore_or(lambda: nnx.state(create()), abstract)
            model, opt = nnx.merge(graphdef, state)
            losses = []
            for step in job.steps(start, steps.stop):
                losses.append(float(train_step(model, opt, x)))
                job.save(step, nnx.state((model, opt)))
            return losses, nnx.state((model, opt))

    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "a")}
    straight, final = run(_mesh(), range(6), reprieve.init(env=env, install_sigterm=False))
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "b"), "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "3"}
    first, _ = run(_mesh(), range(3), reprieve.init(env=env, install_sigterm=False))
    second, resumed = run(_mesh(), range(6), reprieve.init(env=env, install_sigterm=False))
    assert len(first) == 3 and len(second) == 3
    assert first + second == straight  # dropout masks included: the Rngs key and count were restored
    kinds = [type(v).__name__ for v in jax.tree.leaves(resumed)]
    assert "PRNGKeyArray" in kinds
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(resumed), strict=True):
        assert _same_bits(a, b)
    # onto another layout (model axis 4 wide): the same bits, on the new shardings
    nothing_more, moved = run(_mesh((1, 4)), range(6), reprieve.init(env=env, install_sigterm=False))
    assert nothing_more == []
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(moved), strict=True):
        assert _same_bits(a, b)
    kernel = moved[0]["up"]["kernel"][...]  # (model state, optimizer state)
    assert kernel.sharding.is_equivalent_to(NamedSharding(_mesh((1, 4)), P(None, "model")), 2)


def test_an_nnx_abstract_state_without_shardings_names_the_leaf_and_the_recipe(tmp_path: Path) -> None:
    from flax import nnx

    block_cls = _nnx_model_cls()
    with jax.set_mesh(_mesh()):
        _, on_abstract_mesh = nnx.split(nnx.eval_shape(lambda: block_cls(nnx.Rngs(0))))
    _, no_mesh = nnx.split(nnx.eval_shape(lambda: nnx.Linear(2, 2, rngs=nnx.Rngs(0))))
    with reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}, install_sigterm=False) as job:
        with pytest.raises(ValueError, match=r"abstract leaf \['bias'\]\.value has no sharding.*flax NNX"):
            job.restore_or(lambda: None, no_mesh)
        with pytest.raises(ValueError, match=r"abstract leaf \['down'\]\['bias'\]\.value has a sharding on an "
                                             r"abstract mesh.*nnx.get_named_sharding"):
            job.restore_or(lambda: None, on_abstract_mesh)
        job.abandon()


def test_every_dtype_the_layout_lists_round_trips_bit_exact(tmp_path: Path) -> None:
    """The layout's whole dtype table (spec.py), as numpy leaves (jax lacks some without x64) in one save."""
    from reprieve.checkpoint import spec

    names = sorted(spec._ZARR_DTYPES) + sorted(spec._RAW_DTYPES)
    rng = np.random.default_rng(1)
    state = {}
    for name in names:
        dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
        raw = rng.integers(0, 256, size=(3, 5) + ((dtype.itemsize,) if dtype.itemsize else ()), dtype=np.uint8)
        value = raw.view(np.uint8).reshape(3, 5, dtype.itemsize).copy().view(dtype).reshape(3, 5)
        if name == "bool":
            value = raw[..., 0] % 2 == 1
        elif name in SMALL_INTS + ["int1", "uint1"]:
            info = ml_dtypes.iinfo(dtype)
            value = rng.integers(int(info.min), int(info.max) + 1, size=(3, 5)).astype(dtype)
        elif name.startswith(("float4", "float6")):
            value = rng.standard_normal((3, 5)).astype(np.float32).astype(dtype)
        state[name] = value
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, state)
        _, got, _ = mgr.restore({k: v for k, v in state.items()})
    for name in names:
        assert got[name].dtype == state[name].dtype and got[name].tobytes() == state[name].tobytes(), name
