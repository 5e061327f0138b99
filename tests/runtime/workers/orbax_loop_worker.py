"""A MaxText-shaped loop: the program's own ``orbax.checkpoint.CheckpointManager`` with
``reprieve.orbax_policy.AgreedStepPolicy`` as its save decision, ``mngr.save`` every step,
``policy.exit_if_saved(step)`` after it. ``x`` counts the steps trained (one shard per process), so a checkpoint's
value proves its step. Writes ``running-<pid>`` once warm and ``done-<pid>`` (``x`` of its shard) when finished."""

from __future__ import annotations

import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint import checkpoint_managers
from reprieve.orbax_policy import AgreedStepPolicy

from tests.runtime.helpers_agreement import worker_start


def main() -> None:
    pid, workdir, total, step_seconds = worker_start(100)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    policy = AgreedStepPolicy(checkpoint_managers.FixedIntervalPolicy(int(os.environ.get("WORKER_EVERY", "50"))))
    job, mngr = policy.init(lambda cfg: ocp.CheckpointManager(
        os.path.abspath(cfg.checkpoint_uri), options=ocp.CheckpointManagerOptions(save_decision_policy=policy)))
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("p",)), PartitionSpec("p"))
    shape = (4 * job.num_processes,)

    def init_state() -> dict[str, jax.Array]:
        return {"x": jax.make_array_from_callback(shape, sharding, lambda idx: np.zeros((4,), np.float32))}

    abstract = {"x": jax.ShapeDtypeStruct(shape, np.float32, sharding=sharding)}
    state, start = job.restore_or(init_state, abstract)
    train_step = jax.jit(lambda s: {"x": s["x"] + 1})
    for step in job.steps(start, total):
        state = jax.block_until_ready(train_step(state))
        time.sleep(step_seconds)
        if step == start + 5:
            (workdir / f"running-{pid}").touch()
        mngr.save(step, args=ocp.args.StandardSave(state))
        policy.exit_if_saved(step)
    mngr.wait_until_finished()
    (workdir / f"done-{pid}").write_text(str(float(state["x"].addressable_shards[0].data[0])))


if __name__ == "__main__":
    main()
