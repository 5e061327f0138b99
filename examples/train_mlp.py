"""A real, deterministic JAX training job that survives preemption with Reprieve.

An MLP regressor trained with optax Adam on step-indexed synthetic data: the batch for step ``k`` depends only on
``k`` and the seed, so a run that was preempted and resumed ends with exactly the same parameters as one that
never stopped. Data-parallel over every device of every process (``jax.distributed`` through ``reprieve.init``).

Run it anywhere::

    python examples/train_mlp.py --steps 200            # single process, checkpoints in ./checkpoints

and on Kubernetes through ``examples/trainingjob.yaml`` (the operator sets the contract environment).

Environment knobs (handy for tests and the demo): ``TRAIN_STEPS``, ``TRAIN_STEP_SLEEP`` (seconds added to each
step, to make a toy step last as long as a real one), ``TRAIN_RESULT`` (where process 0 writes the final
parameters' SHA-256 and step count as JSON), ``TRAIN_STEP_LOG`` (process 0 appends one JSON line per step:
attempt, step, wall time; the goodput analysis in ``hack/localcluster/goodput.py`` reads it),
``TRAIN_FAIL_AT_STEP`` (raise at that step: an application bug, for the failure-budget tests).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import reprieve
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

FEATURES, HIDDEN, BATCH = 32, 256, 256


def batch_for_step(step: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``: a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
    w = np.random.default_rng([seed, 10**9]).standard_normal((FEATURES, 1), dtype=np.float32)
    y = np.sin(x @ w) + 0.1 * rng.standard_normal((BATCH, 1), dtype=np.float32)
    return x, y.astype(np.float32)


def init_params(seed: int) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "b1": jnp.zeros((HIDDEN,)),
        "w2": jax.random.normal(k2, (HIDDEN, HIDDEN)) / np.sqrt(HIDDEN),
        "b2": jnp.zeros((HIDDEN,)),
        "w3": jax.random.normal(k3, (HIDDEN, 1)) / np.sqrt(HIDDEN),
    }


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    h = jax.nn.gelu(h @ params["w2"] + params["b2"])
    return jnp.mean((h @ params["w3"] - y) ** 2)


def params_digest(params: dict[str, jax.Array]) -> str:
    """SHA-256 over every parameter's bytes, in key order (parameters are replicated: read the local copy)."""
    digest = hashlib.sha256()
    for name in sorted(params):
        arr = np.asarray(params[name].addressable_data(0))
        digest.update(name.encode() + arr.tobytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "300")))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--step-sleep", type=float, default=float(os.environ.get("TRAIN_STEP_SLEEP", "0")))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("train")

    job = reprieve.init()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    data_sharded = NamedSharding(mesh, P("data"))
    optimizer = optax.adam(args.lr)

    # One compiled program creates the state directly with its sharding (no op-by-op dispatch, no host copy).
    @functools.partial(jax.jit, out_shardings=replicated)
    def init_state() -> dict:
        params = init_params(args.seed)
        return {"params": params, "opt": optimizer.init(params)}

    @jax.jit
    def train_step(state: dict, x: jax.Array, y: jax.Array) -> tuple[dict, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
        updates, opt = optimizer.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    def global_batch(step: int) -> tuple[jax.Array, jax.Array]:
        x, y = batch_for_step(step, args.seed)
        return (jax.make_array_from_callback(x.shape, data_sharded, lambda idx: x[idx]),
                jax.make_array_from_callback(y.shape, data_sharded, lambda idx: y[idx]))

    # Shapes and shardings without running init_state: on a restart nothing is initialised only to be replaced.
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
                            jax.eval_shape(init_state))
    state, start = job.restore_or(init_state, abstract=abstract)
    log.info("process %d/%d starting at step %d of %d (attempt %s)", jax.process_index(), jax.process_count(),
             start, args.steps, os.environ.get("REPRIEVE_ATTEMPT", "1"))
    loss = None
    attempt = int(os.environ.get("REPRIEVE_ATTEMPT", "1"))
    step_log_path = os.environ.get("TRAIN_STEP_LOG") if jax.process_index() == 0 else None
    step_log = open(step_log_path, "a", buffering=1) if step_log_path else None  # noqa: SIM115  line-buffered: every record is on disk when job.save exits the process
    fail_at = int(os.environ.get("TRAIN_FAIL_AT_STEP", "-1"))
    for step in job.steps(start, args.steps):
        if step == fail_at:
            raise RuntimeError(f"TRAIN_FAIL_AT_STEP={fail_at}: simulated application failure")
        state, loss = train_step(state, *global_batch(step))
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if step_log is not None:
            loss.block_until_ready()
            step_log.write(json.dumps({"attempt": attempt, "step": step, "t": time.time()}) + "\n")
        if step % 50 == 0:
            log.info("step %d loss %.5f", step, float(loss))
        job.save(step, state)

    digest = params_digest(state["params"])
    log.info("finished %d steps; params sha256 %s; final loss %s", args.steps, digest,
             None if loss is None else f"{float(loss):.5f}")
    result = os.environ.get("TRAIN_RESULT")
    if result and jax.process_index() == 0:
        with open(result, "w") as f:
            json.dump({"steps": args.steps, "sha256": digest, "resumedFrom": start}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
