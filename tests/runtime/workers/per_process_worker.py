"""One optimizer-like update of replicated arrays, run two ways on whatever processes it is started with: through
``reprieve.PerProcess`` (a program over this process's devices) and as ``jax.jit`` over the mesh of every device.
Each process writes ``result-<pid>.json``: the persistent-cache hits each way's first call had (JAX's
``/jax/compilation_cache/cache_hits`` events), a digest of ``PerProcess``'s results and whether they are replicated
on the mesh. Started by ``launch`` (tests/runtime/helpers_agreement.py) with
``REPRIEVE_COMPILATION_CACHE_DIR`` set.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import reprieve
from jax.sharding import Mesh, NamedSharding, PartitionSpec

events: list[str] = []
jax.monitoring.register_event_listener(lambda name, **_: events.append(name))
HIT = "/jax/compilation_cache/cache_hits"


def update(state: dict[str, Any], grads: dict[str, Any]) -> dict[str, Any]:
    """Adam-like: the moments, a global norm, the step (what an optimizer computes from replicated values)."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g / jnp.maximum(norm, 1.0), state["mu"], grads)
    params = jax.tree.map(lambda p, m: p - 0.01 * m / (jnp.abs(m) + 1e-8), state["params"], mu)
    return {"params": params, "mu": mu, "count": state["count"] + 1}


def digest(tree: Any) -> str:
    """SHA-256 over every leaf's bytes (this process's copy), in tree order."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        h.update(np.asarray(leaf.addressable_data(0)).tobytes())
    return h.hexdigest()


def main() -> None:
    with reprieve.init(install_sigterm=False, watch_pod=False) as job:  # leaves the job at the end: no peer lost
        run(job.process_id)


def run(process_id: int) -> None:
    mesh = Mesh(np.array(jax.devices()), ("d",))
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(value: np.ndarray) -> jax.Array:
        return jax.make_array_from_callback(value.shape, replicated, lambda _: value)

    rng = np.random.default_rng(0)
    shapes = {"w": (32, 16), "b": (16,)}
    state = {"params": {k: put(rng.standard_normal(s, np.float32)) for k, s in shapes.items()},
             "mu": {k: put(np.zeros(s, np.float32)) for k, s in shapes.items()}, "count": put(np.int32(0))}
    grads = {k: put(rng.standard_normal(s, np.float32)) for k, s in shapes.items()}

    def hits(fn: Any) -> tuple[Any, int]:
        before = events.count(HIT)
        out = jax.block_until_ready(fn(state, grads))
        return out, events.count(HIT) - before

    local, local_hits = hits(reprieve.PerProcess(update, mesh))
    _, mesh_hits = hits(jax.jit(update))
    result = {"per_process_hits": local_hits, "mesh_hits": mesh_hits, "per_process": digest(local),
              "replicated_on_the_mesh": all(a.sharding == replicated for a in jax.tree.leaves(local))}
    Path(os.environ["WORKER_DIR"], f"result-{process_id}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
