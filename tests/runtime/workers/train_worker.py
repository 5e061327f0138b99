"""A tiny real training job for the runtime tests and benchmark: ``x += 1`` per step, jitted.

Configured by the contract environment (``REPRIEVE_*``) plus ``WORKER_*`` knobs set by
``tests/runtime/helpers_agreement.launch``. After step ``s`` the state holds ``x == s + 1``, so a checkpoint
proves which step it was taken at. Writes ``running-<pid>`` once warm and ``done-<pid>`` when finished.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import reprieve
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tests.runtime.helpers_agreement import FileCheckpointer, worker_env, worker_start


def main() -> None:
    pid, workdir, total, step_seconds = worker_start(100)
    save_delay, warm_step = worker_env("SAVE_DELAY", 0.0), worker_env("WARM_STEP", 5)
    break_at, slow_exit = worker_env("BREAK_AT", -1), worker_env("SLOW_EXIT", 0.0)
    jitter = worker_env("STEP_JITTER", False)  # process-dependent step times (skewed loops)
    collective = worker_env("COLLECTIVE", False)  # one cross-process gloo collective a step
    log_steps = worker_env("LOG_STEPS", False)  # "step S done" after each step (a step log)
    if worker_env("ASYNC", False):
        return async_loop(pid, workdir, total)
    if collective:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")

    kind = os.environ.get("WORKER_CHECKPOINTER", "file")
    if kind in ("manager", "orbax"):
        # reprieve.init()'s default checkpointer (reprieve.checkpoint.CheckpointManager) on a global array
        # sharded over the processes: each process saves and restores its own shard
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if kind == "orbax":
            from reprieve.orbax import OrbaxCheckpointer

            job = reprieve.init(checkpointer=lambda cfg, coord: OrbaxCheckpointer(
                cfg.checkpoint_uri, coordinator=coord, attempt=cfg.attempt, keep=cfg.checkpoint_keep))
        else:
            job = reprieve.init()
        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("p",)), PartitionSpec("p"))

        def init_state() -> dict[str, jax.Array]:
            return {"x": jax.make_array_from_callback(
                (4 * job.num_processes,), sharding, lambda idx: np.zeros((4,), np.float32))}
    else:
        job = reprieve.init(checkpointer=lambda cfg, coord: FileCheckpointer(
            cfg.checkpoint_uri, coord, attempt=cfg.attempt, save_delay_s=save_delay))

        def init_state() -> dict[str, jax.Array]:
            return {"x": jnp.zeros((4,), jnp.float32)}
    if slow_exit:
        # A slow interpreter exit (JAX and TensorStore teardown take 0.1-0.2 s): the window in which a second
        # SIGTERM arrives after the restart code has been decided. atexit runs last-registered first.
        atexit.register(time.sleep, slow_exit)
    state, start = job.restore_or(init_state)
    train_step = jax.jit(lambda s: {"x": s["x"] + 1})
    orbax_manager = None
    if os.environ.get("WORKER_ORBAX_REACHED_PREEMPTION") == "1":  # a MaxText-style loop asking Orbax
        import orbax.checkpoint as ocp

        orbax_manager = ocp.CheckpointManager(workdir / "orbax-own")
    for step in job.steps(start, total):
        if orbax_manager is not None and orbax_manager.reached_preemption(step):
            return
        state = jax.block_until_ready(train_step(state))
        if collective:  # a peer that dies fails this at once, naming its address (reprieve.collective_error)
            multihost_utils.process_allgather(state["x"])
        if step_seconds:
            time.sleep(step_seconds * (1 + pid * 0.7 * (step % 3)) if jitter else step_seconds)  # the device time of a bigger model, without burning the shared CPUs
        if step == start + warm_step:
            (workdir / f"running-{pid}").touch()
        job.save(step, state)
        if log_steps:
            print(f"step {step} done", flush=True)
        if step == break_at:
            logging.getLogger("train_worker").info("leaving the loop early at step %d", step)
            return  # no job.finish(): the runtime's atexit hook must still let the process exit cleanly
    (workdir / f"done-{pid}").write_text(str(float(state["x"].addressable_shards[0].data[0])))
    logging.getLogger("train_worker").info("finished all %d steps", total)


def async_loop(pid: int, workdir: Path, total: int) -> None:
    """The example LM's loop shape (``examples/train_lm.py``): a donated, jitted step with a cross-process
    all-reduce, dispatched asynchronously; only process 0 (``WORKER_ASYNC_WAITER``) waits for each step, then logs
    it ("step S done", the step log); the others log what they dispatched ("step S dispatched") and run ahead of what is computed."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    job = reprieve.init()
    mesh = Mesh(np.array(jax.devices()), ("p",))
    sharded, replicated = NamedSharding(mesh, PartitionSpec("p")), NamedSharding(mesh, PartitionSpec())

    def init_state() -> dict[str, jax.Array]:
        return {"x": jax.make_array_from_callback((4 * job.num_processes,), sharded,
                                                  lambda idx: np.zeros((4,), np.float32)),
                "w": jax.make_array_from_callback((192, 192), replicated,
                                                  lambda idx: np.full((192, 192), 0.01, np.float32))}

    def step_fn(s: dict[str, jax.Array]) -> dict[str, jax.Array]:
        h = s["w"]
        for _ in range(int(os.environ.get("WORKER_ASYNC_MATMULS", "24"))):  # device time the loop can run ahead of
            h = jnp.tanh(h @ h)
        return {"x": s["x"] + 1 + (jnp.sum(s["x"]) + h[0, 0]) * 1e-30, "w": s["w"]}  # sum: an all-reduce

    train_step = jax.jit(step_fn, donate_argnums=0)
    state, start = job.restore_or(init_state)
    for step in job.steps(start, total):
        state = train_step(state)
        if pid == worker_env("ASYNC_WAITER", 0):  # the one process that waits for each step (-1: none)
            state["x"].block_until_ready()
            print(f"step {step} done", flush=True)
        else:
            print(f"step {step} dispatched", flush=True)
        if step == start + 5:
            (workdir / f"running-{pid}").touch()
        job.save(step, state)


if __name__ == "__main__":
    main()
