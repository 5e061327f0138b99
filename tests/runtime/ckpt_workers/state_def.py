"""The deterministic test state shared by checkpoint tests and their worker processes.

Leaves cover bf16/f32/int8/int32/bool/uint32 (RNG key data), 0-d arrays, numpy and Python leaves,
inside nested dict / list / tuple / dataclass containers. Values depend only on ``seed``, so any
process (of any process count) can rebuild the exact global value of every leaf and compare.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Moments:
    mu: Any
    nu: Any


def global_values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((16, 8)).astype(np.float32),
        "emb": rng.standard_normal((12, 4)).astype(ml_dtypes.bfloat16),
        "mu": rng.standard_normal((16, 8)).astype(np.float32),
        "nu": rng.random((16, 8)).astype(np.float32),
        "count": rng.integers(-2**31, 2**31 - 1, size=(8,), dtype=np.int32),
        "q": rng.integers(-128, 127, size=(4, 4), dtype=np.int8),
        "flags": rng.random(8) > 0.5,
        "scalar": np.array(rng.standard_normal(), dtype=np.float32),
        "rng": rng.integers(0, 2**32 - 1, size=(4,), dtype=np.uint32),  # key data of two keys,
    }


# Two sharding variants over a mesh with axes ("x", "y").
SPECS = {
    "a": {"w": P("x", "y"), "emb": P("y", None), "mu": P(None, "x"), "nu": P("x"), "count": P("x"),
          "q": P(), "flags": P("y"), "scalar": P(), "rng": P()},
    "b": {"w": P(None, "x"), "emb": P(), "mu": P("y", "x"), "nu": P(None, "y"), "count": P("y"),
          "q": P("x", "y"), "flags": P(), "scalar": P(), "rng": P("x")},
}


def make_mesh(shape: tuple[int, int]) -> Mesh:
    devs = np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    return Mesh(devs, ("x", "y"))


def _tree(leaf: Any) -> dict[str, Any]:
    return {
        "params": {"w": leaf("w"), "emb": leaf("emb")},
        "opt": Moments(mu=leaf("mu"), nu=leaf("nu")),
        "counters": [leaf("count"), leaf("q")],
        "flags": (leaf("flags"),),
        "scalar": leaf("scalar"),
        "rng": leaf("rng"),
        "host": np.arange(5, dtype=np.int64) * 3,
        "step": 7,
        "lr": 0.125,
        "name": "run",
    }


def make_state(seed: int, mesh: Mesh, variant: str) -> dict[str, Any]:
    vals = global_values(seed)

    def leaf(k: str) -> jax.Array:
        sharding = NamedSharding(mesh, SPECS[variant][k])
        return jax.make_array_from_callback(vals[k].shape, sharding, lambda idx: vals[k][idx])

    return _tree(leaf)


def make_abstract(mesh: Mesh, variant: str, dtypes: dict[str, Any] | None = None) -> dict[str, Any]:
    vals = global_values(0)
    dtypes = dtypes or {}

    def leaf(k: str) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(vals[k].shape, dtypes.get(k, vals[k].dtype),
                                    sharding=NamedSharding(mesh, SPECS[variant][k]))

    return _tree(leaf)


def check_state(restored: dict[str, Any], seed: int, mesh: Mesh, variant: str) -> list[str]:
    """Bit-exact comparison of every addressable shard; returns a list of mismatches (empty: ok)."""
    vals = global_values(seed)
    got = {
        "w": restored["params"]["w"], "emb": restored["params"]["emb"], "mu": restored["opt"].mu,
        "nu": restored["opt"].nu, "count": restored["counters"][0], "q": restored["counters"][1],
        "flags": restored["flags"][0], "scalar": restored["scalar"], "rng": restored["rng"],
    }
    errors = []
    for k, arr in got.items():
        want_sharding = NamedSharding(mesh, SPECS[variant][k])
        if not arr.sharding.is_equivalent_to(want_sharding, arr.ndim):
            errors.append(f"{k}: sharding {arr.sharding} != {want_sharding}")
        if arr.dtype != vals[k].dtype:
            errors.append(f"{k}: dtype {arr.dtype} != {vals[k].dtype}")
        for shard in arr.addressable_shards:
            a = np.asarray(shard.data)
            b = vals[k][shard.index]
            if a.tobytes() != np.ascontiguousarray(b).tobytes():
                errors.append(f"{k}: shard {shard.index} on {shard.device} differs")
    if not np.array_equal(restored["host"], np.arange(5, dtype=np.int64) * 3):
        errors.append("host numpy leaf differs")
    if (restored["step"], restored["lr"], restored["name"]) != (7, 0.125, "run"):
        errors.append("python leaves differ")
    return errors
