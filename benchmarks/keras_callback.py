"""What ``reprieve.keras.ReprieveCallback`` costs ``model.fit``: ``python benchmarks/keras_callback.py [--batches 400]``.

One process, CPU, Keras 3 on JAX, an MLP of ``--width`` (4 Dense layers, Adam): the parts ``--parts`` names, in one run.

- ``hooks_vs_loop``: the callback's two batch hooks, called by a bare loop outside ``fit`` on a computed state with
  nothing to save, against the runtime's own loop on the same job and state (``next(steps)`` +
  ``job.save(step, state, data=position)``, docs/runtime.md), blocks of ``--loop-batches`` alternating; per model
  (``--layers``: the 4-layer MLP, 28 variables with Adam's, and a deeper one): the median step of each (µs; the
  median within a block, then over blocks) and the cost the callback adds (the median over block pairs of hooks -
  loop). ``begin``: ``on_train_batch_begin`` alone, what fit's thread runs when Keras dispatches the batch ends on
  its own thread (only where the callback leaves that dispatch on). The target: the callback's idle cost no more
  than the loop's, whatever the number of variables.

- ``fit_per_batch``: ``fit``'s time per batch (``verbose=0``, nothing due) without a callback and with the callback
  alone, widths 64 and ``--width``, and whether Keras dispatched the batch ends asynchronously.

- ``idle`` (the part ``reprieve``): the callback's two batch hooks per batch when nothing is due; ``job_idle_step``:
  the runtime's decision inside them, ``job.idle_step`` (``job.save`` runs only at the steps it sends there; the loop
  of docs/runtime.md pays ``job.save`` and ``next(steps)`` every step).
- ``stall``: the time the hook holding the save blocks at one (``REPRIEVE_CHECKPOINT_INTERVAL_STEPS``, Reprieve's
  format, the device-to-host copy in the loop, the write in the background), against Keras's own
  ``keras.callbacks.OrbaxCheckpoint(save_freq=N)`` (the part ``orbax``: Orbax, async) on the same model and interval.

- ``python_in_fit``: a fixed piece of pure Python (``probe``: 200 dict inserts) timed in a quiet process and in
  ``on_train_batch_end`` of the same fit, after the callback's hooks. A batch hook runs while the step XLA
  dispatched computes on the same cores, so every piece of Python in it is slower by about ``slowdown`` (in_fit /
  quiet; on a 2-core VM shared with other work it moves from run to run, with ``idle``); ``idle_quiet_us``, the
  idle median divided by it, is what compares with ``benchmarks/loop_cost.py`` (measured outside a fit).

Medians and p90 in microseconds (idle) and milliseconds (stall). Run with nothing else on the machine to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras
import numpy as np


def build(width: int, layers: int = 3) -> keras.Model:
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.layers.Dense(width, activation="relu") for _ in range(layers)]
                         + [keras.layers.Dense(1)])
    m.compile(keras.optimizers.Adam(1e-3), loss="mse")
    m.build((None, 64))
    return m


def data(batches: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.RandomState(0).normal(size=(batches * 32, 64)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def timed(callback: keras.callbacks.Callback, hooks: tuple[str, ...]) -> dict[str, list[float]]:
    """Wrap ``callback``'s ``hooks`` with a clock; the seconds of each call, per hook."""
    times: dict[str, list[float]] = {h: [] for h in hooks}
    for hook in hooks:
        inner = getattr(callback, hook)

        def wrapper(*args: Any, _inner: Any = inner, _out: list[float] = times[hook], **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                _out.append(time.perf_counter() - t0)

        setattr(callback, hook, wrapper)
    return times


def stats(values: list[float], scale: float) -> dict[str, float]:
    values = sorted(values)
    return {"n": len(values), "median": round(statistics.median(values) * scale, 2),
            "p90": round(values[int(0.9 * (len(values) - 1))] * scale, 2)}


def probe() -> int:
    """The fixed piece of pure Python (ns): 200 dict inserts, about what ``_batch_state`` and ``job.save`` do."""
    t0 = time.perf_counter_ns()
    d = {}
    for i in range(200):
        d[i] = i
    return time.perf_counter_ns() - t0


class Probe(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.ns: list[int] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.ns.append(probe())


def reprieve_fit(width: int, batches: int, every: int, root: str) -> dict[str, Any]:
    import reprieve
    from reprieve.keras import ReprieveCallback

    env = {"REPRIEVE_CHECKPOINT_URI": os.path.join(root, "reprieve"), "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": str(every),
           "REPRIEVE_CHECKPOINT_KEEP": "2"}
    job = reprieve.init(env=env, install_sigterm=False)
    model = build(width)
    callback = ReprieveCallback(job)
    times = timed(callback, ("on_train_batch_begin", "on_train_batch_end"))
    times.update(timed(job, ("idle_step",)))  # the runtime's decision, inside on_train_batch_begin
    x, y = data(batches)
    quiet, in_fit = [probe() for _ in range(batches)], Probe()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False, callbacks=[callback, in_fit])
    begin, end = times["on_train_batch_begin"], times["on_train_batch_end"]
    saving = {s for s in range(batches) if (s + 1) % every == 0 and s != batches - 1}  # the interval's saves
    # batch i's save decision is made where fit runs it: after batch i's end (before), or in batch i + 1's begin
    # (after): the per-batch idle cost is both hooks of a batch neither of whose hooks saves
    idle = [b + e for i, (b, e) in enumerate(zip(begin, end, strict=True))
            if i not in saving and i - 1 not in saving and i > 1]
    stall = [max(end[i], begin[i + 1]) for i in sorted(saving)]
    decided = [t for i, t in enumerate(times["idle_step"]) if i not in saving and i > 1]  # one call a batch but
    # the epoch's first (its decision is the epoch's end's): i is the batch before the one whose begin asked
    state_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.weights + model.optimizer.variables)
    python = python_in_fit(quiet, [t for i, t in enumerate(in_fit.ns) if i not in saving])
    return {"idle_us": stats(idle, 1e6), "stall_ms": stats(stall, 1e3), "state_mib": round(state_bytes / 2**20, 1),
            "job_idle_step_us": stats(decided, 1e6), "python_in_fit": python,
            "idle_quiet_us": round(statistics.median(idle) * 1e6 / python["slowdown"], 2)}


def hooks_vs_loop(width: int, layers: int, batches: int, blocks: int, root: str) -> dict[str, Any]:
    """The callback's idle hooks against the runtime's own idle loop, in one job, blocks alternating."""
    import reprieve
    from reprieve.keras import ReprieveCallback
    from reprieve.policy import SavePolicy

    job = reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": os.path.join(root, f"loop-{layers}")}, install_sigterm=False,
                        policy=SavePolicy(interval_steps=0, save_last=False))  # nothing is ever due
    model = build(width, layers)
    model.optimizer.build(model.trainable_variables)  # what fit does before the callbacks start
    callback = ReprieveCallback(job)
    callback.set_model(model)
    callback.set_params({"epochs": 1, "steps": 10**12, "verbose": 0})
    callback.on_train_begin()
    variables = {"trainable_variables": model.trainable_variables, "optimizer_variables": model.optimizer.variables,
                 "non_trainable_variables": model.non_trainable_variables, "metrics_variables": model.metrics_variables}
    model._jax_state = {k: [v.value for v in vs] for k, vs in variables.items()}  # fit's state after a batch
    callback.on_epoch_begin(0)
    state = {g: dict(zip(callback._paths[g], model._jax_state[k], strict=True)) for g, k in  # the loop's own tree
             (("trainable", "trainable_variables"), ("non_trainable", "non_trainable_variables"),
              ("optimizer", "optimizer_variables"), ("metrics", "metrics_variables"))}
    steps, position, save = callback._steps, callback.position, job.save
    clock = time.perf_counter
    batch = 0

    def hooks(n: int) -> float:
        nonlocal batch
        times = [0.0] * n
        for i in range(n):
            t0 = clock()
            callback.on_train_batch_begin(batch)
            callback.on_train_batch_end(batch)
            times[i] = clock() - t0
            batch += 1
        return statistics.median(times)

    def begin(n: int) -> float:  # what fit's thread runs when Keras dispatches the batch ends asynchronously
        nonlocal batch
        times = [0.0] * n
        for i in range(n):
            t0 = clock()
            callback.on_train_batch_begin(batch)
            times[i] = clock() - t0
            batch += 1
        return statistics.median(times)

    def loop(n: int) -> float:
        nonlocal batch
        times = [0.0] * n
        step = 0
        for i in range(n):
            t0 = clock()
            step = next(steps)
            save(step, state, data=position)
            times[i] = clock() - t0
        batch += n
        callback._step = step  # the callback's next batch follows the loop's last step, decided by the loop
        callback._pending = False
        return statistics.median(times)

    # Keras runs the batch-end hooks in a thread only when no callback overrides them (the async part: after only)
    bodies = {"hooks": hooks, "loop": loop}
    if keras.callbacks.CallbackList([callback])._async_train:
        bodies["begin"] = begin
    for body in bodies.values():
        body(200)  # warm
    runs: dict[str, list[float]] = {name: [] for name in bodies}
    for block in range(blocks):
        for name in list(bodies)[::1 if block % 2 == 0 else -1]:
            runs[name].append(bodies[name](batches))
    job.abandon()
    out: dict[str, Any] = {"variables": sum(len(v) for v in model._jax_state.values()),
                           "loop_us": round(statistics.median(runs["loop"]) * 1e6, 2)}
    for name in bodies.keys() - {"loop"}:
        diffs = sorted((h - lo) * 1e6 for h, lo in zip(runs[name], runs["loop"], strict=True))
        out[name] = {"us": round(statistics.median(runs[name]) * 1e6, 2), "cost_us": round(statistics.median(diffs), 2),
                     "cost_p10_p90_us": [round(diffs[int(0.1 * (len(diffs) - 1))], 2),
                                         round(diffs[int(0.9 * (len(diffs) - 1))], 2)]}
    return out


class Clock(keras.callbacks.Callback):
    """The time each batch begins (it overrides no batch-end hook: Keras's async dispatch is left as it was)."""

    def __init__(self) -> None:
        super().__init__()
        self.t: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.t.append(time.perf_counter())


def fit_per_batch(width: int, batches: int, fits: int, root: str) -> dict[str, Any]:
    """``fit``'s time per batch, ``verbose=0`` (from the third batch's begin to the last's: no start-up, no end),
    without a callback and with ``ReprieveCallback`` alone (nothing due: a job that saves only on a notice), fits
    alternating after a warm one of each; and whether Keras dispatched the batch-end hooks asynchronously
    (``CallbackList._async_train``, what the callbacks' overrides decide)."""
    import reprieve
    from reprieve.keras import ReprieveCallback
    from reprieve.policy import SavePolicy

    model = build(width)
    x, y = data(batches)
    runs: dict[str, list[float]] = {"none": [], "reprieve": []}
    async_train = None
    for i in range(fits + 1):
        for name in ("none", "reprieve") if i % 2 == 0 else ("reprieve", "none"):
            clock = Clock()
            callbacks: list[keras.callbacks.Callback] = [clock]
            if name == "reprieve":
                job = reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": os.path.join(root, f"fit-{width}-{i}")},
                                    install_sigterm=False, policy=SavePolicy(interval_steps=0, save_last=False))
                callbacks.insert(0, ReprieveCallback(job))
                async_train = keras.callbacks.CallbackList(callbacks, add_history=True)._async_train
            model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
            if i:  # the first of each compiles
                runs[name].append((clock.t[-1] - clock.t[2]) / (len(clock.t) - 3))
    none, with_callback = statistics.median(runs["none"]) * 1e6, statistics.median(runs["reprieve"]) * 1e6
    return {"async_batch_end": async_train, "none_us": round(none, 1), "reprieve_us": round(with_callback, 1),
            "cost_us": round(with_callback - none, 1)}


def orbax_fit(width: int, batches: int, every: int, root: str) -> dict[str, Any]:
    model = build(width)
    callback = keras.callbacks.OrbaxCheckpoint(os.path.join(root, "orbax"), save_freq=every, max_to_keep=2)
    times = timed(callback, ("on_train_batch_end",))
    x, y = data(batches)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    end = times["on_train_batch_end"]
    saving = [i for i in range(batches) if (i + 1) % every == 0]
    idle = [e for i, e in enumerate(end) if i not in set(saving) and i > 1]
    return {"idle_us": stats(idle, 1e6), "stall_ms": stats([end[i] for i in saving], 1e3)}


def python_in_fit(quiet: list[int], in_fit: list[int]) -> dict[str, Any]:
    slowdown = statistics.median(in_fit[2:]) / statistics.median(quiet)
    return {"quiet_us": stats([t * 1e-9 for t in quiet], 1e6), "in_fit_us": stats([t * 1e-9 for t in in_fit[2:]], 1e6),
            "slowdown": round(slowdown, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--every", type=int, default=40, help="save every N batches (both callbacks)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 100],
                        help="hidden Dense layers of the models hooks_vs_loop times (3: the fit parts' MLP)")
    parser.add_argument("--loop-batches", type=int, default=2000, help="batches per hooks_vs_loop block")
    parser.add_argument("--blocks", type=int, default=20, help="hooks_vs_loop block pairs per model")
    parser.add_argument("--fits", type=int, default=6, help="fit_per_batch fits of each kind per width")
    parser.add_argument("--parts", nargs="+", default=["hooks_vs_loop", "fit_per_batch", "reprieve", "orbax"],
                        help="the parts to run")
    args = parser.parse_args()
    parts = {"hooks_vs_loop": lambda root: {str(n): hooks_vs_loop(64, n, args.loop_batches, args.blocks, root)
                                            for n in args.layers},
             "fit_per_batch": lambda root: {str(w): fit_per_batch(w, args.batches, args.fits, root)
                                            for w in (64, args.width)},
             "reprieve": lambda root: reprieve_fit(args.width, args.batches, args.every, root),
             "orbax": lambda root: orbax_fit(args.width, args.batches, args.every, root)}
    out: dict[str, Any] = {"keras": keras.__version__, "batches": args.batches, "every": args.every,
                           "width": args.width, "load": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as root:
        for name in args.parts:
            out["keras_orbax_checkpoint" if name == "orbax" else name] = parts[name](root)
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
