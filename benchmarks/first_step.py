"""Where a restarted attempt's first step goes: tracing, lowering, the persistent compilation cache, the first run.

After an in-place restart with a warm process, the new attempt's first training step is most of the restart gap
(benchmarks/RESULTS.md, "First step after a restart"): the program is read from JAX's persistent compilation
cache, but the step is still traced and lowered first (the cache key is computed from the lowered module). This
benchmark runs the example model's training step (examples/train_lm.py, data-parallel over ``--devices`` simulated
CPU devices in one process) in fresh processes against one compilation cache:

* **populate**: a first process compiles the step and writes the cache;
* **restart**: a fresh process calls the step the way a restarted attempt does (cache warm);
* **restart, traced before the devices**: a fresh process first traces the step before any device is touched, as
  the example's warm process does (its ``trace_ahead``, which ``reprieve.init(trace_ahead=...)`` calls with the
  devices the previous attempt ran on: the step traced under the ``AbstractMesh`` of those); the first call then
  finds the trace in ``jax.jit``'s cache.
* **restart, lowered before the devices**: a fresh process runs the example's ``trace_ahead`` as
  ``reprieve.init(trace_ahead=...)`` does, which *lowers* the step under the ``AbstractMesh``
  (``reprieve.lower_ahead``: the module the devices' mesh lowers to; JAX 0.10 creates a CPU backend for it, cleared
  again before the devices are asked for), then, once the devices are known, ``Job.compile_ahead``'s thread compiles
  that module for them (the persistent cache's entry of the populate run) and the first step calls what it returns
  (the compiled program: ``jax.jit``'s own caches are not filled by this). The first step's loss must be the same
  in every restart.

Each row prints JAX's own timings (``jax.monitoring``: trace, lowering, cache read) and the first call's wall time;
the last line is the ratio of the two restarts' first calls. ``--repeat`` runs each restart that many times.

    python benchmarks/first_step.py                    # 2 devices, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEVICES_KNOWN = "first_step.py: the devices are known"

CHILD = r'''
import importlib.util, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
import jax.monitoring as mon
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

events = {}
mon.register_event_duration_secs_listener(lambda e, s, **kw: events.setdefault(e, []).append(s))
mon.register_event_duration_secs_listener(  # which functions were traced (fun_name), not only how long it took
    lambda e, s, **kw: events.setdefault(e + "#names", []).append(str(kw.get("fun_name"))))
from reprieve.jax_workarounds import enable_compilation_cache  # the cache exactly as a restarted attempt has it
from reprieve.config import RuntimeConfig
assert enable_compilation_cache(RuntimeConfig.from_env({"REPRIEVE_COMPILATION_CACHE_DIR": os.environ["CACHE"]}))
spec = importlib.util.spec_from_file_location("train_lm", os.environ["EXAMPLE"])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
n = int(os.environ["DEVICES"])
graphdef, shapes = nnx.split(nnx.eval_shape(lambda: m.create(0, 3e-3)))
train = m.make_train_step(graphdef)  # the example's own step and its own trace-ahead, as a warm process runs them
batch_shape = (m.GLOBAL_BATCH, m.SEQ + 1)
pretrace = 0.0
lowering_touched = None
if os.environ["MODE"] in ("pretrace", "ahead", "lowered"):
    from jax._src import xla_bridge
    from reprieve import prelower
    from reprieve.topology import Topology
    t = time.perf_counter()
    with prelower.collecting() as pending:  # the example's trace_ahead, as reprieve.init(trace_ahead=...) runs it
        m.trace_ahead(Topology("cpu", "cpu", None, 1, n), train, shapes)
    if os.environ["MODE"] == "lowered":  # and what init() does next: lowered, the backend it made cleared
        assert prelower.lower_pending(pending, "cpu") == 1
    pretrace = time.perf_counter() - t
    lowering_touched = xla_bridge.backends_are_initialized()
    assert not lowering_touched, "the trace or the lowering left a backend"
from reprieve.checkpoint import CheckpointManager
manager = CheckpointManager(os.environ["CKPT"], fsync=False)

def restore(abstract):
    if os.environ["MODE"] == "populate":  # no checkpoint yet: initialise (and save it at the end)
        return jax.jit(lambda: nnx.state(m.create(0, 3e-3)), out_shardings=shardings)()
    return manager.restore(abstract)[1]

jax.devices()
print(DEVICES_KNOWN, file=sys.stderr, flush=True)  # JAX's cache-miss explanations after this are the restart's
events.clear()
t0 = time.perf_counter()  # the devices are known: what a restarted attempt spends from here to its first step
mesh = Mesh(np.array(jax.devices()), ("data",))
with jax.set_mesh(mesh):
    shardings = nnx.get_named_sharding(shapes, mesh)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
    ahead, call = None, train
    if os.environ["MODE"] in ("ahead", "lowered"):  # what Job.compile_ahead does (before the example's restore)
        from reprieve.compile_ahead import start_ahead  # lowered before the devices: only the cache's read is left
        ahead, call = start_ahead(train, (abstract, jax.ShapeDtypeStruct(batch_shape, jnp.int32,
                                                                         sharding=NamedSharding(mesh, P("data")))), {})
    # the restore's stand-in: the state read back from a checkpoint written by the populate run
    state = restore(abstract)
    batch = jax.device_put(np.zeros(batch_shape, np.int32), NamedSharding(mesh, P("data")))
    jax.block_until_ready((state, batch))
    restored = time.perf_counter() - t0
    if ahead is not None:
        ahead.wait()  # Job.steps() does this before the first step
        assert ahead.ok and ahead.from_ahead == (os.environ["MODE"] == "lowered"), (ahead.ok, ahead.from_ahead)
    from reprieve.compile_ahead import watch_lowerings
    t = time.perf_counter()
    with watch_lowerings() as lowered:  # what the first call lowers in this thread
        state, loss = call(state, batch)
        loss.block_until_ready()
    first = time.perf_counter() - t
    to_first = time.perf_counter() - t0
    first_loss = float(loss)
    t = time.perf_counter()
    state, loss = call(state, batch)
    loss.block_until_ready()
    second = time.perf_counter() - t

if os.environ["MODE"] == "populate":
    manager.save(1, state)
    manager.wait()
manager.close()

def total(key):
    return sum(events.get(key, []))

print(json.dumps({"pretrace": pretrace, "first": first, "loss": first_loss, "lowering_touched": lowering_touched,
                  "second": second, "restore": restored, "to_first": to_first,
                  "first_lowerings": lowered.count,
                  "trace": total("/jax/core/compile/jaxpr_trace_duration"),
                  "traced": events.get("/jax/core/compile/jaxpr_trace_duration#names", []),
                  "lower": total("/jax/core/compile/jaxpr_to_mlir_module_duration"),
                  "cache_read": total("/jax/compilation_cache/cache_retrieval_time_sec"),
                  "cache_hits": len(events.get("/jax/compilation_cache/cache_retrieval_time_sec", []))}))
'''


def child(mode: str, cache: Path, devices: int, *, explain: bool = False, ckpt: Path | None = None) -> dict[str, Any]:
    """One fresh process in ``mode``; its JSON line. ``explain``: with ``JAX_EXPLAIN_CACHE_MISSES``, and
    ``step_traces`` counts the example's functions traced once the devices were known (a tracing-cache miss
    of a function defined in train_lm.py: the step traced again, where a trace made ahead was not found).
    ``ckpt``: where the populate run saves the state the others restore (default: beside ``cache``)."""
    ckpt = cache.parent / "ckpt" if ckpt is None else ckpt
    env = dict(os.environ, MODE=mode, CACHE=str(cache), CKPT=str(ckpt), DEVICES=str(devices),
               EXAMPLE=str(ROOT / "examples" / "train_lm.py"),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    if explain:
        env["JAX_EXPLAIN_CACHE_MISSES"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD.replace("DEVICES_KNOWN", repr(DEVICES_KNOWN))], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if explain:
        after = out.stderr.split(DEVICES_KNOWN, 1)[1]
        misses = [block.splitlines()[:3] for block in after.split("TRACING CACHE MISS")[1:]]
        result["step_traces"] = sum("train_lm.py" in "\n".join(lines) for lines in misses)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reprieve-first-step-") as tmp:
        cache = Path(tmp) / "cache"
        rows = {"populate": [child("populate", cache, args.devices)]}
        for _ in range(args.repeat):  # interleaved: a load change hits both
            rows.setdefault("restart", []).append(child("plain", cache, args.devices))
            rows.setdefault("restart, traced before the devices", []).append(child("pretrace", cache, args.devices))
            rows.setdefault("  and compiled beside the restore", []).append(child("ahead", cache, args.devices))
            rows.setdefault("restart, lowered before the devices", []).append(child("lowered", cache, args.devices))
    print(f"{'':38}{'first call':>11}{'trace':>8}{'lower':>8}{'cache read':>11}{'hits':>6}{'pre-trace':>10}"
          f"{'2nd call':>10}{'restore':>9}{'to 1st step':>12}")
    med: dict[str, float] = {}
    whole: dict[str, float] = {}
    for label, runs in rows.items():
        def m(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)
        med[label], whole[label] = m("first"), m("to_first")
        print(f"{label:38}{m('first'):>10.3f}s{m('trace'):>7.3f}s{m('lower'):>7.3f}s{m('cache_read'):>10.3f}s"
              f"{m('cache_hits'):>6.0f}{m('pretrace'):>9.3f}s{m('second'):>9.3f}s{m('restore'):>8.3f}s"
              f"{m('to_first'):>11.3f}s")
    ratio = med["restart, traced before the devices"] / med["restart"]
    print(f"first call after a restart, traced before the devices vs not: {ratio:.2f}x "
          f"(median of {args.repeat}; {args.devices} simulated CPU devices, one process)")
    ratio = whole["  and compiled beside the restore"] / whole["restart"]
    print(f"devices known -> first step done (restore + first call), traced ahead and compiled beside the restore "
          f"vs neither: {ratio:.2f}x")
    ratio = whole["restart, lowered before the devices"] / whole["  and compiled beside the restore"]
    print(f"devices known -> first step done, lowered before the devices (the compiled program called) vs traced "
          f"ahead and compiled beside the restore: {ratio:.2f}x")
    losses = {label: {r["loss"] for r in runs} for label, runs in rows.items() if label != "populate"}
    if len(set().union(*losses.values())) != 1:
        raise SystemExit(f"the first step's loss differs between the restarts: {losses}")
    print("the first step's loss is the same in every restart:", next(iter(losses.values())).pop())
    return 0


if __name__ == "__main__":
    sys.exit(main())
