"""A small real language model that survives preemption with Reprieve: flax NNX transformer, optax, grain.

A 2-layer decoder-only transformer (flax NNX; bf16 activations, f32 parameters, dropout on) learns a generated
corpus of additions ("12+7=19;..."), character by character, with optax AdamW. The input pipeline is grain: a
``MapDataset`` of *global* batches that every process slices its part from, so its position is one number
that also survives a change of process count. Data-parallel over every device of every process.

Everything a restart needs travels in the checkpoint: parameters, optimizer moments, the dropout RNG (typed
key and counter of ``nnx.Rngs``) and each process's grain iterator (``job.save(..., data=it)``), so a run that
was preempted and resumed ends with the same parameters, bit for bit, as one that never stopped.

**Virtual shards** (docs/elastic.md). When the job declares them (``REPRIEVE_VIRTUAL_SHARDS``, which the operator
sets from ``spec.elastic.virtualShards``; read through the runtime's ``RuntimeConfig``), the step goes through
``reprieve.VirtualStep`` instead, so that the job can shrink and grow without changing its maths: virtual shard
``v`` of ``n`` is the ``v``-th of ``n`` equal slices of every global batch (the same ``GLOBAL_BATCH`` examples in
the same order as without them, whatever the process count), with its own grain iterator and position in the
checkpoint (``reprieve.VirtualData``); the gradient is the sum over every shard, taken and reduced as one flat
array (one all-reduce a step, or one all-gather in canonical order); dropout's key is folded with the step, the
shard and the module (``with_shard_index``), so a shard draws the same masks on any process count.
``TRAIN_CANONICAL`` (``1`` by default; ``0``: the default order, equal within rounding) adds the shards in the
fixed order ``0 .. n-1``: a run that shrank and grew ends with the parameters of an uninterrupted run, bit for
bit. The shard count must divide ``GLOBAL_BATCH`` and be a multiple of the device count. Without virtual shards
nothing of this runs.

Run it anywhere::

    python examples/train_lm.py --steps 300            # single process, checkpoints in ./checkpoints

and on Kubernetes through ``examples/trainingjob.yaml`` (the operator sets the contract environment).
Environment knobs (tests and the demo): ``TRAIN_STEPS``, ``TRAIN_STEP_SLEEP`` (seconds added to each step),
``TRAIN_RESULT`` (process 0 writes the parameters' SHA-256, the step count and the step it resumed from as
JSON), ``TRAIN_STEP_LOG`` (process 0 appends one JSON line per step: attempt, step, wall time; read by
``hack/localcluster/goodput.py``), ``TRAIN_FAIL_AT_STEP`` (raise at that step: an application bug),
``TRAIN_GLOBAL_BATCH`` (16 by default: a count of virtual shards must divide it, e.g. 24 for 12 shards, which split
over 4 and 3 workers), ``TRAIN_SHARD_SLEEP`` (over virtual shards: seconds added to each step per shard a device
computes, so a shrunk job's steps take longer as on real devices; benchmarks/goodput.py --stockout), ``TRAIN_CANONICAL``
(the order over virtual shards, above), ``TRAIN_STATE_MIB`` (MiB of hashed n-gram memory added to the model: a
state of a real size for the benchmarks; rows of ``D_MODEL`` float32 that each step looks up by a hash of
position, previous token and token, and trains by sparse SGD; not over virtual shards).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import reprieve
from flax import nnx
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

VOCAB = "0123456789+=; "
SEQ, D_MODEL, HEADS, MLP, LAYERS, DROPOUT = 32, 64, 4, 128, 2, 0.1
GLOBAL_BATCH, CORPUS = int(os.environ.get("TRAIN_GLOBAL_BATCH", "16")), 4096


# -- data ---------------------------------------------------------------------------------------------------
def corpus(seed: int) -> np.ndarray:
    """``CORPUS`` token sequences of ``SEQ + 1`` characters of "a+b=c;" sums: generated, deterministic."""
    rng = np.random.default_rng(seed)
    text = "".join(f"{a}+{b}={a + b};" for a, b in rng.integers(0, 100, size=(CORPUS * SEQ // 6, 2)))
    ids = np.frombuffer(text.encode(), np.uint8)
    table = np.zeros(256, np.int32)
    table[np.frombuffer(VOCAB.encode(), np.uint8)] = np.arange(len(VOCAB))
    tokens = table[ids]
    n = (len(tokens) - 1) // SEQ
    starts = np.arange(min(n, CORPUS)) * SEQ
    return np.stack([tokens[s:s + SEQ + 1] for s in starts])


def batches(data: np.ndarray, seed: int, process: int, processes: int) -> grain.DatasetIterator:
    """This process's slice of every global batch of ``data``, in an order fixed by ``seed`` (epochs
    reshuffled)."""
    per = GLOBAL_BATCH // processes
    ds = grain.MapDataset.source(data).shuffle(seed=seed).repeat().batch(GLOBAL_BATCH)
    # Read in the training thread: the corpus is in memory and a batch costs microseconds. grain's default (16
    # threads filling a 500-batch buffer) cost ~0.5 CPU-s a process before the first step and more each step for
    # nothing here; a dataset that reads files keeps the default. Same batches, same iterator state either way.
    reading = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return iter(ds.map(lambda b: b[process * per:(process + 1) * per]).to_iter_dataset(reading))


# -- model --------------------------------------------------------------------------------------------------
class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        kw: dict[str, Any] = {"dtype": jnp.bfloat16, "param_dtype": jnp.float32, "rngs": rngs}
        self.ln1, self.ln2 = nnx.LayerNorm(D_MODEL, **kw), nnx.LayerNorm(D_MODEL, **kw)
        self.attn = nnx.MultiHeadAttention(num_heads=HEADS, in_features=D_MODEL, decode=False, **kw)
        self.up, self.down = nnx.Linear(D_MODEL, MLP, **kw), nnx.Linear(MLP, D_MODEL, **kw)
        self.drop = nnx.Dropout(DROPOUT, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.drop(self.attn(self.ln1(x), mask=mask))
        return x + self.drop(self.down(jax.nn.gelu(self.up(self.ln2(x)))))


class Memory(nnx.Variable[jax.Array]):
    """The rows of the model's hashed n-gram memory (``TRAIN_STATE_MIB``): trained by sparse SGD in the step (only
    the rows a batch looked up change), not by the optimizer, so they carry no moments."""


MEMORY_ROW_BYTES = D_MODEL * 4  # float32
MEMORY_LR = 0.1
MEMORY_INIT_ROWS = 16384  # rows drawn at once (16 MiB)


def memory_init(key: jax.Array, rows: int) -> jax.Array:
    """``rows`` rows of N(0, 0.02) float32 draws, :data:`MEMORY_INIT_ROWS` at a time into the one array (each block
    its own stream, ``fold_in(key, block)``; the last block ends at the last row). One draw of the whole memory
    held ~4 copies of it at once (threefry's counters and bits, the normal's transform; benchmarks/RESULTS.md, "The
    example at a real state size"); a block at a time holds the memory and a block."""
    block = min(rows, MEMORY_INIT_ROWS)

    def fill(i: jax.Array, out: jax.Array) -> jax.Array:
        rows_i = jax.random.normal(jax.random.fold_in(key, i), (block, D_MODEL), jnp.float32) * 0.02
        return jax.lax.dynamic_update_slice(out, rows_i, (jnp.minimum(i * block, rows - block), 0))

    return jax.lax.fori_loop(0, -(-rows // block), fill, jnp.zeros((rows, D_MODEL), jnp.float32))


def memory_rows(state_mib: float) -> int:
    """The memory's row count for ``state_mib`` MiB of rows (0: no memory)."""
    return int(state_mib * 2**20) // MEMORY_ROW_BYTES


class LanguageModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, memory_rows: int = 0) -> None:
        kw: dict[str, Any] = {"dtype": jnp.bfloat16, "param_dtype": jnp.float32, "rngs": rngs}
        self.tokens = nnx.Embed(len(VOCAB), D_MODEL, **kw)
        self.positions = nnx.Embed(SEQ, D_MODEL, **kw)
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.ln = nnx.LayerNorm(D_MODEL, **kw)
        self.head = nnx.Linear(D_MODEL, len(VOCAB), **kw)
        if memory_rows:  # drawn last: every other parameter is initialised as without it
            self.memory = Memory(memory_init(rngs.params(), memory_rows))

    def memory_index(self, ids: jax.Array) -> jax.Array:
        """The memory row of each position: a hash of (position, previous token, token)."""
        prev = jnp.concatenate([jnp.zeros_like(ids[:, :1]), ids[:, :-1]], axis=1)
        key = (jnp.arange(ids.shape[1])[None, :] * len(VOCAB) + prev) * len(VOCAB) + ids
        mixed = key.astype(jnp.uint32) * jnp.uint32(2654435761)  # Knuth's multiplicative hash, wrapping
        return (mixed % jnp.uint32(self.memory.shape[0])).astype(jnp.int32)

    def __call__(self, ids: jax.Array, memory: jax.Array | None = None) -> jax.Array:
        """``memory``: the rows :meth:`memory_index` picked (looked up by the step, which trains them)."""
        x = self.tokens(ids) + self.positions(jnp.arange(ids.shape[1]))
        if memory is not None:
            x = x + memory.astype(x.dtype)
        mask = nnx.make_causal_mask(ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x)).astype(jnp.float32)


def create(seed: int, lr: float, memory: int = 0) -> tuple[LanguageModel, nnx.Optimizer]:
    """The model (``memory`` rows of hashed n-gram memory: ``TRAIN_STATE_MIB``) and its optimizer."""
    model = LanguageModel(nnx.Rngs(params=seed, dropout=seed + 1), memory)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, weight_decay=0.01))
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def make_train_step(graphdef: nnx.GraphDef[Any]) -> Any:
    """One optimizer step as a pure ``jax.jit`` function of the state: ``(state, batch) -> (state, loss)``.

    Pure (``nnx.merge`` inside, ``nnx.state`` out) rather than ``nnx.jit`` over the objects, so it can be traced
    ahead from shapes alone, before ``reprieve.init()`` (``jax.jit(...).trace``), and the first call after a
    restart finds that trace.

    Data-parallel by hand (``jax.shard_map`` over the mesh's ``data`` axis): each device takes the gradient of its
    part of the batch, and the gradients cross devices as **one** flat array (one all-reduce a step). Left to the
    compiler, the gradients of the 120 parameter arrays travel as one tuple all-reduce that the CPU runtime (gloo)
    runs operand by operand: 40 collectives a step, which made a step cost 2-4x the CPU (benchmarks/RESULTS.md,
    "Other measurements"). Each device draws its own dropout mask (the stream's key folded with its index).

    With a hashed n-gram memory (``TRAIN_STATE_MIB``), each device also takes the gradient of the memory rows its
    part of the batch looked up; the rows' indices and gradients cross devices by one all-gather (a few KiB, however
    large the memory: a sum of each device's part placed at its index), and every device applies the same sparse SGD
    update to its replicated copy.

    The state is donated (``donate_argnums=0``): the step writes the new state into the old one's buffers, so a step
    holds one state, not two, and the sparse update of the memory rows changes those rows in place instead of
    copying the whole memory every step. ``job.save`` copies what it keeps before it returns (docs/checkpoint.md),
    so the next step may donate the state it was given.
    """

    def step(state: nnx.State, batch: jax.Array) -> tuple[nnx.State, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)
        gdef, params, rest = nnx.split(model, nnx.Param, ...)
        flat, unravel = ravel_pytree(params)
        has_memory = hasattr(model, "memory")

        def local(flat: jax.Array, rest: nnx.State, batch: jax.Array) -> tuple[Any, ...]:
            m = nnx.merge(gdef, unravel(jax.lax.pcast(flat, "data", to="varying")), rest)
            device = jax.lax.axis_index("data")
            nnx.update(m, jax.tree.map(lambda k: jax.random.fold_in(k, device), nnx.state(m, nnx.RngKey)))
            ids = batch[:, :-1]

            def loss_fn(m: LanguageModel, rows: jax.Array | None) -> jax.Array:
                logits = m(ids, rows)
                return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

            if has_memory:
                index = m.memory_index(ids)
                loss, (grads, rows_grad) = nnx.value_and_grad(loss_fn, argnums=(0, 1))(m, m.memory[...][index])
            else:
                loss, grads = nnx.value_and_grad(loss_fn)(m, None)
            assert jax.tree.structure(grads) == jax.tree.structure(params)  # ravelled in the same order
            g, _ = ravel_pytree(grads)
            # Kept whole: without the barrier the compiler splits the all-reduce back into one per parameter.
            g = jax.lax.optimization_barrier(g)
            out = (jax.lax.pmean(loss, "data"), nnx.state(m, nnx.RngCount), jax.lax.pmean(g, "data"))
            if has_memory:  # the gradient of the mean over devices, in device (= batch) order
                n = jax.lax.axis_size("data")

                def gather(x: jax.Array) -> jax.Array:  # an all-gather whose result every device holds alike
                    mine = jnp.zeros((n, *x.shape), x.dtype).at[device].set(x)
                    return jax.lax.psum(mine, "data").reshape(n * x.shape[0], *x.shape[1:])

                out += (gather(index), gather(rows_grad / n))
            return out

        specs = (P(), P(), P()) + ((P(), P()) if has_memory else ())
        loss, counts, g, *sparse = jax.shard_map(local, in_specs=(P(), P(), P("data")), out_specs=specs)(
            flat, rest, batch)
        nnx.update(model, counts)
        optimizer.update(model, unravel(g))
        if has_memory:
            index, rows_grad = sparse
            model.memory[...] = model.memory[...].at[index.reshape(-1)].add(
                -MEMORY_LR * rows_grad.reshape(-1, D_MODEL))
        return nnx.state((model, optimizer)), loss

    return jax.jit(step, donate_argnums=0)


class VirtualTraining:
    """The step over the job's ``count`` virtual shards (``reprieve.VirtualStep``), with their data positions.

    ``self(state, step) -> (state, loss)`` is one optimizer step over the whole global batch, on any process count
    that divides ``count``. The parameters go to ``VirtualStep`` as one flat vector, so its reduction moves one
    array (one ``psum``, or one ``all_gather`` in canonical order) instead of one per parameter array (the reason
    ``make_train_step`` ravels). Dropout's key is ``fold_in(key(seed + 1), step, shard, module)``: a function of
    the step, so the ``nnx.Rngs`` counters of the state are left as they are and the key needs no counter. The
    update (optax on the replicated state) and the ravel are ``reprieve.PerProcess`` programs, over this process's
    devices only, like each shard's gradient: a job that shrinks or grows finds all three in its compilation cache.
    """

    def __init__(self, graphdef: nnx.GraphDef[Any], shapes: nnx.State, data: np.ndarray, seed: int, count: int,
                 canonical: bool) -> None:
        if GLOBAL_BATCH % count:
            raise SystemExit(f"examples/train_lm.py: REPRIEVE_VIRTUAL_SHARDS={count} must divide the global batch "
                             f"({GLOBAL_BATCH}); use 1, 2, 4, 8 or 16 virtual shards")
        model_shapes, _ = nnx.merge(graphdef, shapes)
        gdef, param_shapes, rest_shapes = nnx.split(model_shapes, nnx.Param, ...)

        def shard_loss(flat: jax.Array, batch: tuple[jax.Array, jax.Array], shard: jax.Array) -> jax.Array:
            tokens, step = batch
            key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed + 1), step), shard)
            leaves, treedef = jax.tree.flatten(rest_shapes)
            rest = jax.tree.unflatten(treedef, [  # every dropout module its own key, its counter at 0
                jax.random.fold_in(key, i) if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
                else jnp.zeros(leaf.shape, leaf.dtype) for i, leaf in enumerate(leaves)])
            m = nnx.merge(gdef, unravel_like(param_shapes)(flat), rest)
            logits = m(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean() / count

        def flat_params(state: nnx.State) -> jax.Array:
            model, _ = nnx.merge(graphdef, state)
            return ravel_pytree(nnx.state(model, nnx.Param))[0]

        def advance(state: nnx.State, g: jax.Array) -> tuple[nnx.State, jax.Array]:
            model, optimizer = nnx.merge(graphdef, state)
            optimizer.update(model, unravel_like(param_shapes)(g))
            state = nnx.state((model, optimizer))
            return state, flat_params(state)

        self.step = reprieve.VirtualStep(shard_loss, count, canonical=canonical, with_shard_index=True)
        self.data = reprieve.VirtualData(count, self.step.shards, lambda v: batches(data, seed, v, count))
        # programs over this process's devices, not the mesh: the same on any process count, so a shrunk or grown
        # job finds them in the compilation cache instead of compiling them (docs/elastic.md)
        self.flat_params = reprieve.PerProcess(flat_params, self.step.mesh)
        self.advance = reprieve.PerProcess(advance, self.step.mesh)
        size = sum(x.size for x in jax.tree.leaves(param_shapes))
        self.grads = jax.ShapeDtypeStruct((size,), jnp.float32, sharding=self.step.replicated)  # advance's 2nd arg
        self._flat: jax.Array | None = None  # the current state's flat parameters (advance returns them)

    def __call__(self, state: nnx.State, step: int) -> tuple[nnx.State, jax.Array]:
        flat = self.flat_params(state) if self._flat is None else self._flat
        loss, g = self.step(flat, [(b, np.uint32(step)) for b in next(self.data)])
        state, self._flat = self.advance(state, g)
        return state, loss


def unravel_like(shapes: Any) -> Any:
    """``ravel_pytree``'s inverse for a tree of ``shapes`` (``jax.ShapeDtypeStruct`` leaves), inside a trace."""
    return ravel_pytree(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))[1]


def trace_ahead(topology: reprieve.Topology, train_step: Any, shapes: nnx.State) -> None:
    """Trace ``train_step`` for ``topology`` (``reprieve.init(trace_ahead=...)`` calls this before any device is
    touched, as soon as the job's devices are known), so a restarted attempt's first step skips tracing, and (on
    CPU devices) lower it there too: ``reprieve.lower_ahead``. ``job.compile_ahead`` then only reads the compiled
    program from the compilation cache, beside the restore; on a first start, or if the devices changed, the step
    is traced and lowered as usual (docs/restarts.md, "Lowering the step before the devices").
    """
    if GLOBAL_BATCH % topology.device_count:
        return  # main() refuses this topology after init
    mesh = topology.abstract_mesh((topology.device_count,), ("data",))
    with jax.sharding.use_abstract_mesh(mesh):
        shardings = nnx.get_named_sharding(shapes, mesh)
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
        batch = jax.ShapeDtypeStruct((GLOBAL_BATCH, SEQ + 1), jnp.int32, sharding=NamedSharding(mesh, P("data")))
        reprieve.lower_ahead(train_step, abstract, batch)


def params_digest(model: LanguageModel) -> str:
    """SHA-256 over every parameter's bytes (the memory's rows too) in path order (replicated: the local copy)."""
    digest = hashlib.sha256()
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(nnx.state(model, (nnx.Param, Memory)))[0],
                             key=lambda kv: jax.tree_util.keystr(kv[0])):
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(leaf.addressable_data(0)).view(np.uint8).data)  # its buffer, no copy
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "300")))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--step-sleep", type=float, default=float(os.environ.get("TRAIN_STEP_SLEEP", "0")))
    parser.add_argument("--shard-sleep", type=float, default=float(os.environ.get("TRAIN_SHARD_SLEEP", "0")))
    parser.add_argument("--state-mib", type=float, default=float(os.environ.get("TRAIN_STATE_MIB", "0")),
                        help="MiB of trained hashed n-gram memory added to the state (TRAIN_STATE_MIB; 0: none)")
    args = parser.parse_args()
    if args.state_mib < 0:
        raise SystemExit(f"examples/train_lm.py: TRAIN_STATE_MIB must be >= 0 MiB, got {args.state_mib:g}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    log = logging.getLogger("train")

    # Before reprieve.init(): everything that needs no device. Under reprieve-supervisor this runs in the pre-warmed
    # process while the previous attempt still trains, so a restart does not pay for it (docs/runtime.md, "What
    # code before reprieve.init() may do"): the model's structure and shapes (nnx.eval_shape traces, it
    # allocates nothing and touches no device) and the generated corpus. reprieve.init() traces the training step
    # there too (trace_ahead), for the devices the previous attempt ran on, before touching any.
    rows = memory_rows(args.state_mib)
    graphdef, shapes = nnx.split(nnx.eval_shape(lambda: create(args.seed, args.lr, rows)))
    data = corpus(args.seed)
    train_step = make_train_step(graphdef)

    shards = reprieve.RuntimeConfig.from_env(os.environ).virtual_shards  # what reprieve.init() reads
    if shards and rows:
        raise SystemExit("examples/train_lm.py: TRAIN_STATE_MIB (the n-gram memory) is not supported over virtual "
                         f"shards (REPRIEVE_VIRTUAL_SHARDS={shards}): its sparse update is in the plain step only")
    canonical = os.environ.get("TRAIN_CANONICAL", "1")
    if canonical not in ("0", "1"):
        raise SystemExit(f"examples/train_lm.py: TRAIN_CANONICAL must be 0 or 1, got {canonical!r}")
    job = reprieve.init(trace_ahead=None if shards else lambda topology: trace_ahead(topology, train_step, shapes))
    it: Any
    if shards:
        virtual = VirtualTraining(graphdef, shapes, data, args.seed, shards, canonical == "1")
        mesh, it = virtual.step.mesh, virtual.data
        # emulated device time: each device computes its shards one after another (VirtualStep), the devices at once
        args.step_sleep += args.shard_sleep * shards / jax.device_count()
        log.info("training over %d virtual shards (this process: %s), %s order", shards, list(virtual.step.shards),
                 "canonical" if virtual.step.canonical else "default")
    else:
        if GLOBAL_BATCH % jax.device_count():
            raise SystemExit(f"examples/train_lm.py: the global batch ({GLOBAL_BATCH}) must split evenly over the "
                             f"{jax.device_count()} devices; use 1, 2, 4, 8 or 16 devices in all")
        mesh = Mesh(np.array(jax.devices()), ("data",))
        data_sharding = NamedSharding(mesh, P("data"))
        it = batches(data, args.seed, job.process_id, job.num_processes)
    # VirtualStep runs each shard's gradient on one device: a context mesh of every device would refuse it
    with contextlib.nullcontext() if shards else jax.set_mesh(mesh):
        # docs/runtime.md, "flax NNX": shapes from nnx.eval_shape, shardings from NNX's own helper (no
        # partitioning annotations here: everything replicated, data-parallel). Nothing is initialised on a
        # restart; on a first run one compiled program builds the state directly with those shardings.
        shardings = nnx.get_named_sharding(shapes, mesh)
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
        init = jax.jit(lambda: nnx.state(create(args.seed, args.lr, rows)), out_shardings=shardings)
        # Lower and compile the step for these devices beside the restore; steps() waits for it before the
        # first step, which then finds the program in JAX's caches (docs/runtime.md, "Compiling the step while
        # the state is restored"). Over virtual shards: the update and the ravel of the parameters (each shard's
        # gradient compiles at the first step).
        train: Callable[[nnx.State, int], tuple[nnx.State, jax.Array]]
        if shards:
            job.compile_ahead(virtual.advance, abstract, virtual.grads)
            job.compile_ahead(virtual.flat_params, abstract)
            train = virtual
        else:
            # the step to call: train_step, or the program compiled from the module lowered before the devices
            step_fn = job.compile_ahead(train_step, abstract, jax.ShapeDtypeStruct((GLOBAL_BATCH, SEQ + 1), jnp.int32,
                                                                                   sharding=data_sharding))

            def train(state: nnx.State, step: int) -> tuple[nnx.State, jax.Array]:
                batch = jax.make_array_from_process_local_data(data_sharding, next(it))
                return step_fn(state, batch)  # type: ignore[no-any-return]
        state, start = job.restore_or(init, abstract, data=it)

        log.info("process %d/%d starting at step %d of %d (attempt %s)", jax.process_index(), jax.process_count(),
                 start, args.steps, os.environ.get("REPRIEVE_ATTEMPT", "1"))
        attempt = int(os.environ.get("REPRIEVE_ATTEMPT", "1"))
        step_log_path = os.environ.get("TRAIN_STEP_LOG") if jax.process_index() == 0 else None
        step_log = open(step_log_path, "a", buffering=1) if step_log_path else None  # noqa: SIM115  line-buffered: every record is on disk when job.save exits the process
        fail_at = int(os.environ.get("TRAIN_FAIL_AT_STEP", "-1"))
        loss = None
        for step in job.steps(start, args.steps):
            if step == fail_at:
                raise RuntimeError(f"TRAIN_FAIL_AT_STEP={fail_at}: simulated application failure")
            if args.step_sleep:
                # A bigger model's device time, without burning the CPUs: before the step is dispatched, so that,
                # as on a real device, the step's results exist only at its end (a process killed meanwhile
                # leaves the step uncomputed for every process, and unlogged).
                time.sleep(args.step_sleep)
            state, loss = train(state, step)
            if step_log is not None:
                loss.block_until_ready()
                step_log.write(json.dumps({"attempt": attempt, "step": step, "t": time.time()}) + "\n")
            if step % 50 == 0:
                log.info("step %d loss %.4f", step, float(loss))
            job.save(step, state, data=it)

    model, _ = nnx.merge(graphdef, state)
    digest = params_digest(model)
    log.info("finished %d steps; params sha256 %s; final loss %s", args.steps, digest,
             None if loss is None else f"{float(loss):.4f}")
    result = os.environ.get("TRAIN_RESULT")
    if result and jax.process_index() == 0:
        with open(result, "w") as f:
            json.dump({"steps": args.steps, "sha256": digest, "resumedFrom": start}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
