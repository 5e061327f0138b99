"""A real training job for the memory tier's fault tests: ``reprieve.init()`` with the default storage
checkpointer and the memory tier from the environment (``REPRIEVE_MEMORY_*``), one device per process.

State: ``w`` (int32, rows sharded over the processes: every process saves its own rows), ``b`` (float32,
replicated: only process 0 saves it, as replica 0) and ``n`` (the step count), updated by exact integer and
small-float arithmetic, so the state after ``s`` steps is known in closed form (:func:`expected`). The data
position is the number of batches taken (the same on every process), saved with every copy.

``WORKER_STOP_AT=S``: after step ``S`` every process waits until its memory copy of ``S`` is committed (and
replicated, with a peer), writes ``stopped-<pid>``, and then hangs: the test makes the loss (a node lost without
notice) only once every process has stopped, then kills the gang as the operator's gang restart would. (A process
that died earlier would abort the others through the coordination service's heartbeat before they stopped.)
``WORKER_STOP_UNREPLICATED=1``: a stop whose copy could not be replicated (the test broke the peer) still stops.
``WORKER_HOLD_AT=S``: after step ``S``'s save every process writes ``held-<pid>`` and waits for the file ``go`` (the
test changes something meanwhile). ``WORKER_SLOW_STEPS=N`` with ``WORKER_SLOW_SECONDS=T``: the attempt's first N steps take T seconds
(a slow warm-up: compilation, a loaded machine), the later ones ``WORKER_STEP_SECONDS``. Before every save a process waits for its previous memory copy to finish in the background, so that
every due memory save happens (on a busy machine one would otherwise be skipped, which the tier allows; the faults
under test are about restores), except after the steps in ``WORKER_NO_WAIT_AT`` (comma-separated): a save due
there while the copy before is still written or sent (``REPRIEVE_MEMTIER_TEST_SLOW_COPY``) is skipped, as a copy
slower than a step makes it. ``WORKER_LOCKSTEP=1``: after that wait every process meets the others at a
barrier before it saves, as a real step's collectives keep a gang together: this step's copy then starts only once
every process has replicated the copies before it (the steps here have no collective, and a process running ahead
on a loaded machine sees an older step replicated by the whole gang than the test means). At the end each process
writes ``final-<pid>.json``: its rows of ``w``, ``b``,
``n``, the data position and where the restore read from.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import reprieve
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tests.runtime.helpers_agreement import worker_env, worker_start

ROWS = 12  # rows of w: sharded over 1, 2, 3 or 4 processes alike


def expected(steps: int, nproc: int) -> dict[str, Any]:
    w = np.arange(ROWS * 3, dtype=np.int64).reshape(ROWS, 3)
    for _ in range(steps):
        w = (w * 3 + 1) & 0xFFFFFFFF  # int32 arithmetic wraps around, on the devices as here
    return {"w": w.astype(np.uint32).view(np.int32).tolist(), "b": [float(steps) * 0.5] * 2, "n": steps}


class Batches:
    """An input pipeline whose position is how many batches it gave (grain's get_state/set_state)."""

    def __init__(self) -> None:
        self.taken = 0

    def __next__(self) -> int:
        self.taken += 1
        return self.taken

    def get_state(self) -> dict[str, int]:
        return {"taken": self.taken}

    def set_state(self, value: dict[str, int]) -> None:
        self.taken = int(value["taken"])


def main() -> None:
    pid, workdir, total, step_seconds = worker_start(30)
    stop_at, hold_at = worker_env("STOP_AT", -1), worker_env("HOLD_AT", -1)
    slow_steps, slow_seconds = worker_env("SLOW_STEPS", 0), worker_env("SLOW_SECONDS", 0.0)
    lockstep = worker_env("LOCKSTEP", False)
    no_wait = {int(s) for s in worker_env("NO_WAIT_AT", "").split(",") if s.strip()}
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    job = reprieve.init()
    mesh = Mesh(np.array(jax.devices()), ("p",))
    rows, rep = NamedSharding(mesh, P("p")), NamedSharding(mesh, P())

    def init_state() -> dict[str, jax.Array]:
        full = np.arange(ROWS * 3, dtype=np.int32).reshape(ROWS, 3)
        return {"w": jax.make_array_from_callback(full.shape, rows, lambda idx: full[idx]),
                "b": jax.device_put(np.zeros((2,), np.float32), rep),
                "n": jax.device_put(np.zeros((), np.int32), rep)}

    abstract = {"w": jax.ShapeDtypeStruct((ROWS, 3), jnp.int32, sharding=rows),
                "b": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=rep),
                "n": jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)}
    batches = Batches()
    state, start = job.restore_or(init_state, abstract=abstract, data=batches)
    train = jax.jit(lambda s: {"w": s["w"] * 3 + 1, "b": s["b"] + 0.5, "n": s["n"] + 1})
    tier = None if job.memory is None else job.memory.tier
    for step in job.steps(start, total):
        next(batches)
        state = jax.block_until_ready(train(state))
        time.sleep(slow_seconds if step - start < slow_steps else step_seconds)
        if tier is not None and step not in no_wait:
            tier.wait()
        if lockstep:
            multihost_utils.sync_global_devices(f"memtier-worker-step-{step}")
        job.save(step, state, data=batches)
        if step == hold_at:
            (workdir / f"held-{pid}").write_text(str(step))
            _hold(workdir / "go")
        if step == stop_at:
            _stop(job, tier, step, pid, workdir)
    local = np.concatenate([np.asarray(s.data) for s in sorted(state["w"].addressable_shards,
                                                                   key=lambda s: s.index[0].start or 0)])
    first = min(s.index[0].start or 0 for s in state["w"].addressable_shards)
    (workdir / f"final-{pid}.json").write_text(json.dumps({
        "rows": [first, first + len(local)], "w": local.tolist(), "b": np.asarray(state["b"]).tolist(),
        "n": int(state["n"]), "taken": batches.taken, "restored_from": job.loop.restored_from}))


def _hold(go: Path) -> None:
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{go} did not appear within 120 s")
        time.sleep(0.02)


def _stop(job: Any, tier: Any, step: int, pid: int, workdir: Path) -> None:
    job.checkpointer.wait()  # a storage save of this step is committed on every process
    if tier is not None:
        tier.wait()  # the copy of this step is committed here, and sent to the peer (or failed to be)
        done = tier.replicated_step if tier.peer is not None else tier.saved_step
        if done != step and os.environ.get("WORKER_STOP_UNREPLICATED") != "1":  # 1: the test broke the peer
            raise SystemExit(f"process {pid}: the memory copy of step {step} was not "
                             f"{'replicated' if tier.peer is not None else 'saved'} (newest: {done})")
    (workdir / f"stopped-{pid}").write_text(str(step))
    logging.getLogger("memtier_worker").info("stopped after step %d", step)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
