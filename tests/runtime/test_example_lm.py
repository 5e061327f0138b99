"""The example language model (examples/train_lm.py: flax NNX transformer with dropout, bf16 activations,
optax, grain) as a real 2-process job without Kubernetes: preempted by SIGTERM mid-run, restarted, it ends with
the same parameters, bit for bit, as an uninterrupted run (the e2e tier does the same through the operator), with
the state-size option the benchmarks use (``TRAIN_STATE_MIB``: its sparsely trained rows restored bit for bit too). The
restarted run traces its step before ``reprieve.init()`` for the devices the checkpoint records, and its first step
finds that trace (JAX's own cache-miss explanations say so); it lowers and compiles the step beside the restore, so
the first step lowers nothing."""

from __future__ import annotations

import json
import re
import signal
from importlib.metadata import version
from pathlib import Path

import pytest
from localcluster.procs import cache_dir

from tests.runtime.helpers_agreement import REPO, Gang, launch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

EXAMPLE = REPO / "examples" / "train_lm.py"
STEPS = 60
STATE_MIB = 4  # the benchmarks' state-size option (a trained n-gram memory): its rows are in the sha256 compared


def _env(workdir: Path, attempt: int = 1) -> dict[str, str]:
    """The runs share the persistent compilation cache the end-to-end jobs use (``~/.cache/reprieve/xla-cache``,
    per JAX version), as a job's attempts do: a cold compile of the 2-device step (~40 CPU-s a process on 2 cores)
    is paid once per machine and change of the example, not once per run. What this test proves is the trace and
    the lowering ahead, which no persistent cache holds."""
    cache = cache_dir() / "xla-cache" / f"jax-{version('jax')}"
    cache.mkdir(parents=True, exist_ok=True)
    return {"TRAIN_STEPS": str(STEPS), "TRAIN_RESULT": str(workdir / "result.json"), "REPRIEVE_ATTEMPT": str(attempt),
            "TRAIN_STEP_SLEEP": "0.02", "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "25",
            "REPRIEVE_COMPILATION_CACHE_DIR": str(cache), "TRAIN_STATE_MIB": str(STATE_MIB)}


def test_the_example_lm_resumes_bit_identical_after_a_preemption(tmp_path: Path) -> None:
    """Why this long: the example LM (2 processes x 2 devices, the path the e2e jobs no longer take) runs twice, once
    uninterrupted and once preempted and resumed, to compare the parameters bit for bit."""
    steady = launch(tmp_path / "steady", 2, worker=EXAMPLE, extra_env=_env(tmp_path / "steady"))
    assert steady.wait(300) == [0, 0], steady.tail()
    want = json.loads((tmp_path / "steady" / "result.json").read_text())

    work = tmp_path / "preempted"
    # A 7 s notice is no more than the 5 s margin plus twice the 1 s save estimate (no save is measured yet): the
    # plan is to save at the earliest step, whatever the step rate, so the agreed save lands a few steps in and
    # the restart has steps left to take. (A longer notice trains on, and a fast machine reaches the last step.)
    gang = launch(work, 2, worker=EXAMPLE, grace_seconds=7, extra_env=_env(work))
    try:
        limit_log = gang.logs[0]
        import time

        deadline = time.monotonic() + 240
        while "step 0 loss" not in (limit_log.read_text() if limit_log.exists() else ""):
            assert time.monotonic() < deadline and all(p.poll() is None for p in gang.procs), gang.tail()
            time.sleep(0.1)
        time.sleep(0.3)  # a few steps in
        gang.signal(1, signal.SIGTERM)
        assert gang.wait(120) == [42, 42], gang.tail()
    finally:
        gang.kill()
    log0 = gang.logs[0].read_text()
    planned = re.findall(r"agreed save step (\d+) \(round 0, [^\n]*save at the earliest step", log0)
    saved = int(re.findall(r"agreed checkpoint at step (\d+)", log0)[-1])
    assert planned == [str(saved)], (planned, saved, gang.tail())
    assert 0 <= saved < STEPS - 1
    again = launch(work, 2, worker=EXAMPLE, extra_env={**_env(work, attempt=2), "JAX_EXPLAIN_CACHE_MISSES": "1"})
    assert again.wait(300) == [0, 0], again.tail()
    for log in again.logs:
        text = log.read_text()
        assert "traced ahead for 2 cpu device(s) of 2 process(es)" in text, text[-3000:]
        assert re.search(r"compiled step ahead in [0-9.]+s beside the restore", text), text[-3000:]
        # the step donates the state: restored into memory XLA owns, shard by shard (arrays of two processes)
        assert "copied into memory the CPU devices own" in text, text[-3000:]
        after_init = text[text.index("starting at step"):]
        assert "the first step lowered" not in after_init, after_init[:3000]
        missed = re.findall(r"TRACING CACHE MISS at [^\n]*train_lm\.py[^\n]*", after_init)
        assert not missed, f"the first step after the restart traced again: {missed}\n{after_init[:3000]}"
    got = json.loads((work / "result.json").read_text())
    assert got["resumedFrom"] == saved + 1
    assert got["sha256"] == want["sha256"], "the resumed run's parameters differ from the uninterrupted run's"


VIRTUAL_STEPS, SHRUNK_AT, GROWN_AT = 8, 2, 5


def test_the_example_lm_over_virtual_shards_shrinks_and_grows_back_bit_identical(tmp_path: Path) -> None:
    """Issue 47's "same maths" on the example: 4 virtual shards (REPRIEVE_VIRTUAL_SHARDS, canonical order by
    default) trained uninterrupted on 2 processes, and the same run stopped with a save after step 2, resumed on 1
    process (it owns all 4 shards, and every shard's data position) to step 5, and grown back to 2: the same
    parameters, bit for bit. The reference run starts beside the first part of the elastic one, and beside both a run
    asking for the state-size option over virtual shards, refused before ``reprieve.init()``."""
    def run(work: Path, processes: int, steps: int, attempt: int, state_mib: int = 0) -> Gang:
        env = {**_env(work, attempt), "TRAIN_STEPS": str(steps), "REPRIEVE_VIRTUAL_SHARDS": "4",
               "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "0", "TRAIN_STEP_SLEEP": "0", "TRAIN_STATE_MIB": str(state_mib)}
        return launch(work, processes, worker=EXAMPLE, extra_env=env)

    def result(work: Path) -> dict[str, object]:
        return dict(json.loads((work / "result.json").read_text()))

    full, elastic = tmp_path / "full", tmp_path / "elastic"
    gangs = [run(full, 2, VIRTUAL_STEPS, 1), run(elastic, 2, SHRUNK_AT + 1, 1)]
    refused = run(tmp_path / "refused", 1, VIRTUAL_STEPS, 1, state_mib=STATE_MIB)  # bad input: refused up front
    assert refused.wait(120) == [1], refused.tail()
    text = refused.logs[0].read_text()
    assert "TRAIN_STATE_MIB (the n-gram memory) is not supported over virtual shards" in text, text[-2000:]
    assert "starting at step" not in text and "no checkpoint under" not in text, text[-2000:]  # before reprieve.init
    for gang in gangs:
        assert gang.wait(300) == [0, 0], gang.tail()
    assert "training over 4 virtual shards (this process: [2, 3]), canonical order" in gangs[1].logs[1].read_text()
    for processes, until, attempt, owned in ((1, GROWN_AT + 1, 2, "[0, 1, 2, 3]"), (2, VIRTUAL_STEPS, 3, "[0, 1]")):
        resumed = result(elastic)["steps"]
        gang = run(elastic, processes, until, attempt)
        assert gang.wait(300) == [0] * processes, gang.tail()
        assert f"(this process: {owned})" in gang.logs[0].read_text(), gang.tail()
        assert result(elastic)["resumedFrom"] == resumed, gang.tail()
    assert result(elastic)["sha256"] == result(full)["sha256"], \
        "the run that shrank to 1 process and grew back to 2 ends with other parameters than the uninterrupted one"


@pytest.mark.timeout(120)
def test_the_n_gram_memory_is_drawn_a_block_at_a_time_into_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """``memory_init`` (the state-size option's rows): every row drawn (the last block ends at the last row, also
    when the rows are not a whole number of blocks), N(0, 0.02), the same rows for the same key; blocks of 64 rows
    here."""
    import importlib.util

    import jax
    import numpy as np

    spec = importlib.util.spec_from_file_location("train_lm_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm)
    monkeypatch.setattr(lm, "MEMORY_INIT_ROWS", 64)
    for rows in (64 * 40 + 17, 64 * 40, 30):  # a partial last block, whole blocks, fewer rows than a block
        key = jax.random.key(7)
        got = np.asarray(jax.jit(lm.memory_init, static_argnums=1)(key, rows))
        assert got.shape == (rows, lm.D_MODEL) and got.dtype == np.float32
        assert np.all(np.any(got != 0, axis=1)), f"{rows} rows: some were never drawn"
        assert abs(float(got.std()) - 0.02) < 0.002, got.std()
        again = np.asarray(jax.jit(lm.memory_init, static_argnums=1)(key, rows))
        assert np.array_equal(got, again)
    # the first block is its own stream, not the start of one draw of everything (to an ulp: fused under jit)
    first = np.asarray(jax.random.normal(jax.random.fold_in(jax.random.key(7), 0), (64, lm.D_MODEL)) * 0.02)
    assert np.allclose(np.asarray(jax.jit(lm.memory_init, static_argnums=1)(jax.random.key(7), 64 * 40))[:64],
                       first, rtol=1e-5, atol=0)
