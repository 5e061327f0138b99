"""benchmarks/first_step.py's premise, checked against the installed JAX: a restarted process reads the step from
the persistent compilation cache but traces it again, unless it traced it before touching any device under an
``AbstractMesh`` equal to the real one (then the first call is a hit in jit's trace cache), and it still lowers
the step unless that was done beside the restore (``Job.compile_ahead``); and a step lowered under that
``AbstractMesh`` before the devices (``reprieve.lower_ahead``, the backend JAX makes for it cleared again) compiles,
once they are known, from the cache entry of the step lowered for them (the same module), on the new backend, and
computes the same first step. A JAX upgrade that changes any of these shows here, not as a quietly slower
restart."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import pytest
from localcluster.procs import cache_dir

from tests.benchmark_module import load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # 271 s beside a suite on a slow VM


def test_a_step_traced_before_the_devices_is_not_traced_again_at_its_first_call(tmp_path: Path) -> None:
    """Why this long: five child processes of the first-step benchmark (populate a cache and a checkpoint; then,
    side by side, a plain restart, one traced ahead, one compiled ahead and one lowered ahead), each a cold JAX
    start.

    The cache is the one the e2e jobs and test_example_lm share (``~/.cache/reprieve/xla-cache``, per JAX version):
    the populate run compiles the step cold once per machine and change of the example (~60 CPU-s on 2 cores), not
    once per run. What this test proves is about the trace and the lowering, which no persistent cache holds."""
    bench = load_benchmark("first_step")
    cache = cache_dir() / "xla-cache" / f"jax-{version('jax')}"
    cache.mkdir(parents=True, exist_ok=True)
    ckpt = tmp_path / "ckpt"
    populate = bench.child("populate", cache, 2, ckpt=ckpt)
    assert populate["trace"] > 0, populate
    # the restarts only read the cache and count (no timings): they run side by side
    with ThreadPoolExecutor(4) as pool:
        runs = [pool.submit(bench.child, mode, cache, 2, explain=mode not in ("ahead", "lowered"), ckpt=ckpt)
                for mode in ("plain", "pretrace", "ahead", "lowered")]
        # pretrace asserts that its trace touched no device
        restart, pretraced, ahead, lowered = (run.result() for run in runs)
    assert restart["trace"] > 0 and restart["cache_hits"] == 1, restart  # traced again, compiled from the cache
    # The step's trace is not repeated: JAX's own tracing-cache misses after the devices are known, counted, not
    # timed (the trace left is bookkeeping of tens of microseconds, which a scheduler hiccup could outlast).
    assert restart["step_traces"] >= 1, restart  # the explanations work: the plain restart traces the step
    assert pretraced["pretrace"] > 0 and pretraced["cache_hits"] == 1, pretraced
    assert pretraced["step_traces"] == 0, (pretraced, restart)
    # Compiled beside the restore (what Job.compile_ahead does): the first call lowers nothing in the main thread.
    assert restart["first_lowerings"] >= 1 and pretraced["first_lowerings"] >= 1, (restart, pretraced)
    assert ahead["first_lowerings"] == 0 and ahead["cache_hits"] == 1, ahead
    assert ahead["lower"] > 0, ahead  # ... lowered beside the restore, in compile_ahead's thread
    # Lowered before the devices (the child asserts it left no backend: the one JAX 0.10 makes to lower is cleared):
    # compiled from the populate run's entry (the module an AbstractMesh lowers to is the one the devices' mesh
    # lowers to) on the backend made after, nothing lowered in any thread once the devices are known, the same step.
    assert lowered["pretrace"] > 0 and lowered["cache_hits"] == 1, lowered
    assert lowered["first_lowerings"] == 0 and lowered["lower"] == 0, lowered
    assert lowered["lowering_touched"] is False, lowered
    assert lowered["loss"] == restart["loss"] == ahead["loss"], (lowered, restart, ahead)
