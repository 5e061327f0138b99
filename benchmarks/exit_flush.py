"""The exit's search for the files to flush (``reprieve.exiting``), in a warm process's heap.

``reprieve.exiting.exit_process`` skips the interpreter's teardown and flushes every open file object itself, found
among the objects the garbage collector tracks: on the restart path, between the old trainer's ``exiting with code``
and its end. A warm process freezes its heap before it parks (``reprieve.prewarm.settle_heap``), and
``gc.get_objects()`` does not return frozen objects. Each fresh process here builds the heap a warm process of the
example holds (JAX, flax, the example's model and its step traced ahead: ~200,000 objects), opens a file, runs one
jitted call (the attempt's own objects), then times ``reprieve.exiting._files_to_flush()``:

* **no freeze**: the heap as a process that froze nothing holds it (every object walked);
* **reprieve's freeze**: ``reprieve.exiting.freeze()``, as a warm process does: the files it froze are remembered,
  and only what the attempt made is walked;
* **the program's own freeze**: a plain ``gc.freeze()``: the exit unfreezes and walks everything.

Each mode checks that the open file is found. ``--repeat`` fresh processes per mode, taking turns.

    python benchmarks/exit_flush.py                    # 5 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {"none": "no freeze", "reprieve": "reprieve's freeze", "plain": "the program's own freeze"}

CHILD = r'''
import gc, importlib.util, json, os, sys, tempfile, time
import jax, jax.numpy as jnp
from flax import nnx
spec = importlib.util.spec_from_file_location("train_lm", os.environ["EXAMPLE"])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
graphdef, shapes = nnx.split(nnx.eval_shape(lambda: m.create(0, 3e-3, m.memory_rows(0))))
train_step = m.make_train_step(graphdef)
from reprieve import exiting
from reprieve.topology import Topology
from reprieve import prelower
with prelower.collecting():  # as reprieve.init(trace_ahead=...) runs it (traced, not lowered here)
    m.trace_ahead(Topology("cpu", "cpu", None, 1, 2), train_step, shapes)
log = tempfile.TemporaryFile("w")  # open across the freeze, as a warm process's log file would be
gc.collect()
if os.environ["MODE"] == "reprieve":
    exiting.freeze()
elif os.environ["MODE"] == "plain":
    gc.freeze()
jax.jit(lambda a: a * 2)(jnp.ones(4)).block_until_ready()  # the attempt's own objects
walked = len(gc.get_objects()) if os.environ["MODE"] == "reprieve" else None
t = time.perf_counter()
files = exiting._files_to_flush()
seconds = time.perf_counter() - t
assert any(f is log for f in files), "the open file was not found"
print(json.dumps({"seconds": seconds, "walked": walked if walked is not None else len(gc.get_objects())}))
'''


def child(mode: str) -> dict[str, float]:
    env = dict(os.environ, MODE=mode, EXAMPLE=str(ROOT / "examples" / "train_lm.py"), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.repeat):  # taking turns: a load change hits every mode
        for mode in MODES:
            rows.setdefault(mode, []).append(child(mode))
    med = {m: statistics.median(r["seconds"] for r in runs) for m, runs in rows.items()}
    for mode, runs in rows.items():
        print(f"{MODES[mode]:26} {med[mode] * 1000:7.1f} ms median ({min(r['seconds'] for r in runs) * 1000:.1f}-"
              f"{max(r['seconds'] for r in runs) * 1000:.1f}), {statistics.median(r['walked'] for r in runs):,.0f} "
              "objects walked")
    print(f"reprieve's freeze vs no freeze: {med['reprieve'] / med['none']:.2f}x; vs the program's own freeze: "
          f"{med['reprieve'] / med['plain']:.2f}x (median of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
