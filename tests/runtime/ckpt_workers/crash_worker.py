"""Single-process writer for crash tests.

    python crash_worker.py DIR ATTEMPT [--steps N] [--kill-loop SEED]

Without ``--kill-loop``: saves steps 1..N of ``state(step)`` (a crash point may be injected with
REPRIEVE_CKPT_TEST_CRASH_AT). With ``--kill-loop``: resumes after the latest complete checkpoint
(restoring and verifying it), then saves forever with seeded small pauses, printing
``COMMITTED <step>`` after each commit, until the parent kills it with SIGKILL.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from reprieve.checkpoint import CheckpointManager


def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:2]), ("x",))


def state(step: int) -> dict:
    m = mesh()
    base = np.arange(4096 * 4, dtype=np.float32).reshape(64, 256) + step
    return {
        "w": jax.device_put(base, NamedSharding(m, P("x"))),
        "b": jax.device_put(jnp.full((32,), step, jnp.int32), NamedSharding(m, P())),
        "step": step,
    }


def abstract() -> dict:
    m = mesh()
    return {"w": jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(m, P("x"))),
            "b": jax.ShapeDtypeStruct((32,), jnp.int32, sharding=NamedSharding(m, P())), "step": 0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("attempt", type=int)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--kill-loop", type=int)
    args = ap.parse_args()
    mgr = CheckpointManager(args.dir, attempt=args.attempt, keep=2,
                            on_commit=lambda s: print(f"COMMITTED {s}", flush=True))
    if args.kill_loop is None:
        for s in range(1, args.steps + 1):
            mgr.save(s, state(s))
            mgr.wait()
        mgr.close()
        return 0
    rnd = random.Random(args.kill_loop)
    latest = mgr.latest_step()
    start = 1
    if latest is not None:
        step, got, _ = mgr.restore(abstract())
        if not (np.array_equal(np.asarray(got["w"]), np.asarray(state(step)["w"])) and got["step"] == step):
            print(f"BAD RESTORE {step}", flush=True)
            return 3
        start = step + 1
    print(f"READY {start}", flush=True)
    s = start
    while True:
        mgr.save(s, state(s))
        if rnd.random() < 0.5:
            mgr.wait()
        time.sleep(rnd.random() * 0.02)
        s += 1


if __name__ == "__main__":
    sys.exit(main())
