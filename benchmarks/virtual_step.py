"""The step over virtual shards, default vs canonical order: ``python benchmarks/virtual_step.py [--shards 4]
[--devices 4] [--steps 50] [--width 512]``.

In one process with ``--devices`` simulated CPU devices (the full size: one device per shard by default), an MLP of
``--width`` trains ``--steps`` SGD steps with ``reprieve.VirtualStep`` in each mode; prints the median wall time per
step of each mode (after 3 warm-up steps) and their ratio. Then the default order's drift: the same run on every
smaller device count the shards allow, its parameters after ``--steps`` steps against the full size's (max
absolute difference, and the same over the largest magnitude in that parameter; the canonical order's is checked to
be 0).

``--example``: the same comparison on the example LM (examples/train_lm.py, its ``VirtualTraining`` over ``--shards``
virtual shards, ``--devices`` devices), with its data-parallel step of today (no virtual shards) beside them: the
median wall time per optimizer step of each (``--steps`` steps after 3 warm-up steps, each step waited for, the
three taking steps in turn), and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32, help="examples per shard")
    parser.add_argument("--example", action="store_true", help="time the example LM's step instead of the MLP's")
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    if args.example:
        print(json.dumps(example(args.shards, args.steps), indent=1))
        return
    import jax
    import jax.numpy as jnp
    import numpy as np
    from reprieve.virtual import sizes
    from reprieve.virtual_step import VirtualStep

    width, shards = args.width, args.shards

    def loss_fn(p: dict[str, Any], batch: tuple[Any, Any]) -> Any:
        x, y = batch
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        h = jnp.tanh(h @ p["w2"] + p["b2"])
        return jnp.mean((h @ p["w3"] - y) ** 2) / shards

    rng = np.random.default_rng(0)
    host = {"w1": rng.normal(size=(64, width)) / 8, "b1": np.zeros(width), "w2": rng.normal(size=(width, width)) /
            np.sqrt(width), "b2": np.zeros(width), "w3": rng.normal(size=(width, 8)) / np.sqrt(width)}
    host = {k: v.astype(np.float32) for k, v in host.items()}

    def batches(step: int, owned: range) -> list[Any]:
        out = []
        for v in owned:
            r = np.random.default_rng([v, step])
            x = r.normal(size=(args.batch, 64)).astype(np.float32)
            out.append((x, np.sin(x[:, :8]).astype(np.float32)))
        return out

    def train(devices: int, canonical: bool) -> tuple[dict[str, Any], list[float]]:
        step = VirtualStep(loss_fn, shards, canonical=canonical, devices=jax.devices()[:devices])
        params = step.replicate(host)
        update = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - 0.05 * b, p, g))
        times = []
        for s in range(args.steps):
            data = batches(s, step.shards)
            t0 = time.perf_counter()
            _, grads = step(params, data)
            params = jax.block_until_ready(update(params, grads))
            times.append(time.perf_counter() - t0)
        return {k: np.asarray(v) for k, v in params.items()}, times[3:]

    result: dict[str, Any] = {"shards": shards, "devices": args.devices, "steps": args.steps, "width": width,
                              "params": sum(v.size for v in host.values())}
    full = {}
    for mode, canonical in (("default", False), ("canonical", True)):
        full[mode], times = train(args.devices, canonical)
        result[f"{mode}_step_ms"] = round(1000 * statistics.median(times), 2)
    result["canonical_over_default"] = round(result["canonical_step_ms"] / result["default_step_ms"], 2)
    drift = {}
    for devices in (d for d in sizes(shards) if d < args.devices):
        for mode, canonical in (("default", False), ("canonical", True)):
            params, _ = train(devices, canonical)
            diff = max(float(np.max(np.abs(params[k] - full[mode][k]))) for k in params)
            scaled = max(float(np.max(np.abs(params[k] - full[mode][k])) / np.max(np.abs(full[mode][k])))
                         for k in params)
            drift[f"{mode}@{devices}"] = {"max_abs": diff, "max_abs_over_leaf_max": scaled}
    result["drift_vs_full"] = drift
    assert all(v["max_abs"] == 0 for k, v in drift.items() if k.startswith("canonical")), drift
    print(json.dumps(result, indent=1))


def example(shards: int, steps: int) -> dict[str, Any]:
    """The example LM's median step (ms) over every device: data-parallel (today's step), and over ``shards``
    virtual shards in the default and the canonical order; the three take their steps in turn, so that a change of
    the machine's load falls on each alike."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import jax
    import numpy as np
    import train_lm as lm
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    graphdef, shapes = nnx.split(nnx.eval_shape(lambda: lm.create(0, 3e-3)))
    data = lm.corpus(0)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    data_parallel, it = lm.make_train_step(graphdef), lm.batches(data, 0, 0, 1)

    def today(state: Any, _: int) -> Any:
        with jax.set_mesh(mesh):  # as the example runs it
            return data_parallel(state, jax.device_put(next(it), NamedSharding(mesh, P("data"))))

    trains = {"data_parallel": (today, nnx.get_named_sharding(shapes, mesh))}
    for mode, canonical in (("default", False), ("canonical", True)):
        virtual = lm.VirtualTraining(graphdef, shapes, data, 0, shards, canonical)
        trains[mode] = (virtual, virtual.step.replicated)
    states = {mode: jax.jit(lambda: nnx.state(lm.create(0, 3e-3)), out_shardings=sharding)()
              for mode, (_, sharding) in trains.items()}
    times: dict[str, list[float]] = {mode: [] for mode in trains}
    for s in range(steps + 3):
        for mode, (train, _) in trains.items():
            t0 = time.perf_counter()
            states[mode], loss = train(states[mode], s)
            jax.block_until_ready((states[mode], loss))
            times[mode].append(time.perf_counter() - t0)
    result: dict[str, Any] = {"example": "examples/train_lm.py", "devices": len(jax.devices()), "shards": shards,
                              "steps": steps}
    for mode, t in times.items():
        result[f"{mode}_step_ms"] = round(1000 * statistics.median(t[3:]), 2)
    result["canonical_over_default"] = round(result["canonical_step_ms"] / result["default_step_ms"], 2)
    result["default_over_data_parallel"] = round(result["default_step_ms"] / result["data_parallel_step_ms"], 2)
    return result

if __name__ == "__main__":
    main()
