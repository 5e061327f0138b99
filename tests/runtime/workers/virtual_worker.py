"""A small model trained over 4 virtual shards on whatever processes and devices it is started with, through the
real runtime: ``reprieve.VirtualStep`` for the step, ``reprieve.VirtualData`` for the per-shard positions (saved
with every checkpoint and restored by ``job.restore_or``, also onto another process count).

Two copies of the model train side by side on the same batches: ``canonical`` (``canonical=True``) and
``default``. Process 0 writes ``params-<step>.npz`` (both copies' parameters after the step) and every process
appends ``{"attempt", "step", "shards": {shard: position}}`` to ``batches-<pid>.jsonl``. Configured by ``launch``
(tests/runtime/helpers_agreement.py, or helpers_memtier.py with the memory tier) plus ``WORKER_STEPS`` and
``WORKER_STOP_AT`` (as memtier_worker.py's: after that step's save every process waits for its memory copy, writes
``stopped-<pid>`` and hangs until the test kills the gang).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import reprieve

from tests.runtime.workers.memtier_worker import _stop

SHARDS, BATCH, DIM, HIDDEN, LR = 4, 8, 16, 32, 0.05


class ShardBatches:
    """Shard ``v``'s batches: the ``i``-th is a pure function of ``(v, i)``; the position is ``i``."""

    def __init__(self, shard: int) -> None:
        self.shard, self.position = shard, 0

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.shard, self.position])
        self.position += 1
        x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        return x, np.sin(x[:, :4] * 3.0).astype(np.float32)

    def __iter__(self) -> ShardBatches:
        return self

    def get_state(self) -> dict[str, int]:
        return {"position": self.position}

    def set_state(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def loss_fn(params: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] - y) ** 2) / SHARDS  # the global batch's mean


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w1": (rng.normal(size=(DIM, HIDDEN)) / 4).astype(np.float32), "b1": np.zeros(HIDDEN, np.float32),
            "w2": (rng.normal(size=(HIDDEN, 4)) / 6).astype(np.float32)}


def main() -> None:
    pid = int(os.environ.get("REPRIEVE_PROCESS_ID", "0"))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s p{pid} %(name)s %(levelname)s %(message)s")
    workdir = Path(os.environ["WORKER_DIR"])
    total = int(os.environ.get("WORKER_STEPS", "6"))
    stop_at = int(os.environ.get("WORKER_STOP_AT", "-1"))
    attempt = int(os.environ.get("REPRIEVE_ATTEMPT", "1"))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    job = reprieve.init()
    steps = {"canonical": reprieve.VirtualStep(loss_fn, SHARDS, canonical=True),
             "default": reprieve.VirtualStep(loss_fn, SHARDS)}
    first = steps["canonical"]
    data = reprieve.VirtualData(SHARDS, first.shards, ShardBatches)
    host = init_params()
    abstract = {mode: {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=first.replicated) for k, v in host.items()}
                for mode in steps}
    state, start = job.restore_or(lambda: {mode: first.replicate(host) for mode in steps}, abstract, data=data)
    update = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - LR * b, p, g))
    log = open(workdir / f"batches-{pid}.jsonl", "a", buffering=1)  # noqa: SIM115 - line-buffered, open to the end
    for step in job.steps(start, total):
        positions = {v: it.position for v, it in data.iterators.items()}
        batches = next(data)
        new: dict[str, Any] = {}
        for mode, vstep in steps.items():
            _, grads = vstep(state[mode], batches)
            new[mode] = update(state[mode], grads)
        state = new
        log.write(json.dumps({"attempt": attempt, "step": step, "shards": positions}) + "\n")
        if pid == 0:
            np.savez(workdir / f"params-{step}.npz", **{f"{mode}/{k}": np.asarray(v.addressable_shards[0].data)
                                                         for mode, tree in state.items() for k, v in tree.items()})
        if job.memory is not None:
            job.memory.tier.wait()  # every due memory copy happens (as memtier_worker.py's: none is skipped)
        job.save(step, state, data=data)
        if step == stop_at:
            _stop(job, None if job.memory is None else job.memory.tier, step, pid, workdir)
    reprieve.virtual.require_virtual_step(SHARDS)  # what the runtime checks before a size change


if __name__ == "__main__":
    main()
