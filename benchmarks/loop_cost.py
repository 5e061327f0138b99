"""The training loop's own cost per step when there is nothing to save: a bare loop beside the same loop under
``job.steps()`` + ``job.save()``, in one process, one run.

    .venv/bin/python benchmarks/loop_cost.py [--steps 1000] [--blocks 40] [--leaves 64] [--target-us 5]

Single-device JAX on CPU, no periodic saves (``SavePolicy(interval_steps=0, save_last=False)``: every
``job.save`` has nothing to do). Loop shapes, each timed in blocks that alternate bare and Reprieve, so the
machine's noise (a shared 2-core VM) hits both alike:

- ``no step``: the body only hands a computed state to ``job.save`` (the runtime alone; the bare loop is empty);
- ``synced step``: a tiny jitted step on a state of ``--leaves`` arrays that donates it, waited for every step (a
  loop that reads its loss each step): the state handed to save is computed;
- ``async step``: the same step not waited for (JAX runs ahead of its device): the state handed to save is
  usually still computing;
- ``async, probed``: the same, with the finished-step probe of a job of several processes
  (``FinishedSteps(probe=True)``; a single process has no survivor to say a step, so it probes nothing): a step
  still computing at its save gets a probe dispatched, the one cost of saying the gang's step exactly.

Per shape: the median seconds per step of each, the cost (the median over block pairs of Reprieve minus bare, in
µs per step), its spread (10th-90th percentile of the pairs) and the ratio Reprieve/bare. Target: the cost at
most ``--target-us`` per step in the first three shapes (``docs/runtime.md``); the last line says met or MISSED,
and the exit code is 1 when missed. The probed shape is reported beside them, not held to the target. Then the
finished-step probe's cost per save of a computed state, in isolation (timeit).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

SHAPES = ("no step", "synced step", "async step", "async, probed")  # (name, loop); the last not under the target
UNDER_TARGET = SHAPES[:3]


def make_state(leaves: int) -> dict[str, Any]:
    import jax.numpy as jnp

    return {f"layer{i:03d}": jnp.full((16, 16), 0.5) for i in range(leaves)}


def make_step() -> Callable[[Any], Any]:
    import jax

    return jax.jit(lambda s: jax.tree.map(lambda x: x * 0.999 + 0.0005, s), donate_argnums=0)  # type: ignore[no-any-return]


def run_block(shape: str, reprieve: bool, n: int, state: Any, step_fn: Callable[[Any], Any],
              steps: Iterator[int], save: Callable[[int, Any], bool]) -> tuple[float, Any]:
    """Seconds per step of ``n`` steps of one shape, bare or under Reprieve; the state it ends with."""
    import jax

    t0 = time.perf_counter()
    if shape == "no step":
        if reprieve:
            for _ in range(n):
                save(next(steps), state)
        else:
            for _ in range(n):
                pass
    elif shape.startswith("synced"):
        if reprieve:
            for _ in range(n):
                step = next(steps)
                state = jax.block_until_ready(step_fn(state))
                save(step, state)
        else:
            for _ in range(n):
                state = jax.block_until_ready(step_fn(state))
    else:
        if reprieve:
            for _ in range(n):
                step = next(steps)
                state = step_fn(state)
                save(step, state)
        else:
            for _ in range(n):
                state = step_fn(state)
    state = jax.block_until_ready(state)  # the queued steps count in the block that queued them
    return (time.perf_counter() - t0) / n, state


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def probe_note_us(leaves: int) -> float:
    """Microseconds per ``FinishedSteps.note`` of a computed state of ``leaves`` arrays, probing as a job of several
    processes does (timeit, best of 5)."""
    from reprieve.finished import FinishedSteps

    state = make_state(leaves)
    finished = FinishedSteps(probe=True)
    finished.prepare(state)
    for step in range(100):
        finished.note(step, state)
    n = 3000
    counter = iter(range(100, 10**9))

    def noted() -> None:
        for _ in range(n):
            finished.note(next(counter), state)

    return min(timeit.repeat(noted, number=1, repeat=5)) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="steps per block")
    parser.add_argument("--blocks", type=int, default=40, help="block pairs per shape (bare and Reprieve alternate)")
    parser.add_argument("--leaves", type=int, default=64, help="arrays in the state")
    parser.add_argument("--target-us", type=float, default=5.0, help="most µs per step the loop may cost")
    args = parser.parse_args()

    import jax
    import reprieve
    from reprieve.finished import FinishedSteps
    from reprieve.policy import SavePolicy

    work = Path(tempfile.mkdtemp(prefix="reprieve-loop-cost-"))
    job = reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(work / "ckpt")}, install_sigterm=False,
                        policy=SavePolicy(interval_steps=0, save_last=False))
    step_fn = make_step()
    state = make_state(args.leaves)
    state = jax.block_until_ready(step_fn(state))  # compiled
    job.finished.prepare(state)
    steps = job.steps(0, 10**12)
    save = job.save
    results: dict[str, tuple[list[float], list[float]]] = {}
    try:
        for shape in SHAPES:
            if shape == "async, probed":
                job.finished = FinishedSteps(probe=True)  # what Job makes in a job of several processes
                job.finished.prepare(state)
            _, state = run_block(shape, True, 200, state, step_fn, steps, save)  # warm: both paths taken once
            _, state = run_block(shape, False, 200, state, step_fn, steps, save)
            bare: list[float] = []
            rep: list[float] = []
            for block in range(args.blocks):
                for reprieve_on in ((False, True) if block % 2 == 0 else (True, False)):
                    per_step, state = run_block(shape, reprieve_on, args.steps, state, step_fn, steps, save)
                    (rep if reprieve_on else bare).append(per_step)
            results[shape] = (bare, rep)
        saves = sum(job.metrics.snapshot()["reprieve_saves_total"].values())
    finally:
        job.abandon()
    note_us = probe_note_us(args.leaves)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())

    print(f"{args.blocks} block pairs x {args.steps} steps per shape, state of {args.leaves} arrays, nothing to save "
          f"(saves started: {saves:g}); cost = median over pairs of (Reprieve - bare); load {load}")
    print(f"{'shape':14}{'bare s/step':>14}{'reprieve s/step':>17}{'cost us/step':>14}{'p10..p90 us':>18}"
          f"{'ratio':>9}")
    missed = []
    for shape, (bare, rep) in results.items():
        diffs = [(r - b) * 1e6 for b, r in zip(bare, rep, strict=True)]
        cost = statistics.median(diffs)
        if shape in UNDER_TARGET and cost > args.target_us:
            missed.append(f"{shape} {cost:.2f} us")
        b, r = statistics.median(bare), statistics.median(rep)
        ratio = f"{r / b:.3f}" if b > 1e-6 else "-"  # an empty bare loop: no ratio to speak of
        print(f"{shape:14}{b:>14.7f}{r:>17.7f}{cost:>14.2f}"
              f"{f'{percentile(diffs, 0.1):.1f}..{percentile(diffs, 0.9):.1f}':>18}{ratio:>9}")
    print(f"{f'finished-step probe per save ({args.leaves} arrays, computed)':58}{note_us:>8.2f} us (timeit)")
    print(f"target <= {args.target_us:g} us per step ({', '.join(UNDER_TARGET)}): " + (f"MISSED ({'; '.join(missed)})" if missed else "met"))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
