"""The step over virtual shards, for real: the same 4 virtual shards trained on 1, 2 and 4 devices (in this process)
and on 1 and 2 real ``jax.distributed`` processes (gloo), and across a save on 2 processes restored onto 1.

Canonical order gives bitwise the same parameters on every size; the default sum stays within its stated bound
(2 * (count - 1) * u * sum |g_v| per element and step, docs/elastic.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reprieve

from tests.runtime.helpers_agreement import Gang, launch
from tests.runtime.workers.virtual_worker import SHARDS, ShardBatches, init_params, loss_fn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORKER = Path(__file__).resolve().parent / "workers" / "virtual_worker.py"
STEPS, SAVED_AT = 6, 2
U = float(np.finfo(np.float32).eps) / 2  # unit roundoff of float32


def _devices(n: int) -> list[Any]:
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts)")
    return jax.devices()[:n]


def _batches(step: int) -> list[Any]:
    shards = [ShardBatches(v) for v in range(SHARDS)]
    for it in shards:
        it.set_state({"position": step})
    return [next(it) for it in shards]


def _train(devices: int, canonical: bool, steps: int = 3) -> list[dict[str, np.ndarray]]:
    """The parameters after each of ``steps`` SGD steps over the 4 shards on the first ``devices`` devices."""
    step = reprieve.VirtualStep(loss_fn, SHARDS, canonical=canonical, devices=_devices(devices))
    params = step.replicate(init_params())
    update = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - 0.05 * b, p, g))
    out = []
    for s in range(steps):
        _, grads = step(params, _batches(s))
        params = update(params, grads)
        out.append({k: np.asarray(v) for k, v in params.items()})
    return out


def test_canonical_order_is_bitwise_the_same_on_1_2_and_4_devices() -> None:
    full = _train(4, canonical=True)
    for devices in (1, 2):
        got = _train(devices, canonical=True)
        for s, (a, b) in enumerate(zip(full, got, strict=True)):
            for k in a:
                assert np.array_equal(a[k], b[k]), f"{devices} devices, step {s}, {k}: {np.abs(a[k] - b[k]).max()}"


def test_the_default_sum_is_within_its_stated_bound_of_the_full_size() -> None:
    params = init_params()
    terms = [jax.grad(loss_fn)(params, batch) for batch in _batches(0)]
    bound = {k: 2 * (SHARDS - 1) * U * sum(np.abs(np.asarray(t[k])) for t in terms) for k in params}
    results = {}
    for devices in (1, 2, 4):
        step = reprieve.VirtualStep(loss_fn, SHARDS, devices=_devices(devices))
        _, grads = step(step.replicate(params), _batches(0))
        results[devices] = {k: np.asarray(v) for k, v in grads.items()}
    canonical = reprieve.VirtualStep(loss_fn, SHARDS, canonical=True, devices=_devices(4))
    _, exact = canonical(canonical.replicate(params), _batches(0))
    for devices, grads in results.items():
        for k in params:
            assert np.all(np.abs(grads[k] - np.asarray(exact[k])) <= bound[k]), (devices, k)
    # the bound is not vacuous: 2 devices add (g0 + g1) + (g2 + g3), the canonical order ((g0 + g1) + g2) + g3
    assert any(not np.array_equal(results[2][k], np.asarray(exact[k])) for k in params)


def _dropout_loss(params: dict[str, Any], batch: Any, shard: jax.Array) -> jax.Array:
    """``loss_fn`` with dropout on the input: the mask from a key folded with the shard's index."""
    x, y = batch
    keep = jax.random.bernoulli(jax.random.fold_in(jax.random.key(7), shard), 0.7, x.shape)
    return loss_fn(params, (jnp.where(keep, x / 0.7, 0.0), y))


def test_a_shard_index_gives_each_shard_its_own_randomness_on_every_size() -> None:
    grads = {}
    for devices in (1, 2, 4):
        step = reprieve.VirtualStep(_dropout_loss, SHARDS, canonical=True, devices=_devices(devices),
                                    with_shard_index=True)
        _, g = step(step.replicate(init_params()), _batches(0))
        grads[devices] = {k: np.asarray(v) for k, v in g.items()}
    assert all(np.array_equal(grads[4][k], grads[d][k]) for d in (1, 2) for k in grads[4])
    plain = reprieve.VirtualStep(loss_fn, SHARDS, canonical=True, devices=_devices(1))
    _, without = plain(plain.replicate(init_params()), _batches(0))
    assert not np.array_equal(grads[1]["w1"], np.asarray(without["w1"]))  # the masks did apply


def test_a_step_refuses_batches_that_are_not_one_per_owned_shard() -> None:
    step = reprieve.VirtualStep(loss_fn, SHARDS, devices=_devices(2))
    with pytest.raises(reprieve.VirtualShardsError, match=r"got 3 batches.*owns virtual shards \[0, 1, 2, 3\]"):
        step(step.replicate(init_params()), _batches(0)[:3])


def test_a_sharded_parameter_is_refused_by_name() -> None:
    step = reprieve.VirtualStep(loss_fn, SHARDS, devices=_devices(2))
    params = step.replicate(init_params())
    mesh = jax.sharding.Mesh(np.array(_devices(2)), ("x",))
    params["w1"] = jax.device_put(params["w1"], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    with pytest.raises(reprieve.VirtualShardsError, match=r"parameter \['w1'\] is sharded"):
        step(params, _batches(0))


def test_a_shard_count_that_the_devices_do_not_divide_is_refused() -> None:
    with pytest.raises(reprieve.VirtualShardsError, match="4 shards cannot be split evenly over 3"):
        reprieve.VirtualStep(loss_fn, SHARDS, devices=_devices(3))


# -- real processes -------------------------------------------------------------------------------------------

def _run(workdir: Path, processes: int, devices: int = 1, *, steps: int = STEPS, attempt: int = 1) -> Gang:
    return launch(workdir, processes, steps=steps, worker=WORKER,
                  extra_env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
                             "REPRIEVE_ATTEMPT": str(attempt)})


def _params(workdir: Path, step: int) -> dict[str, np.ndarray]:
    with np.load(workdir / f"params-{step}.npz") as data:
        return {k: data[k] for k in data.files}


def _positions(workdir: Path, processes: int) -> dict[int, dict[str, int]]:
    """``{step: {shard: position}}`` over every process's log (a later attempt's record of a step wins)."""
    out: dict[int, dict[str, int]] = {}
    for p in range(processes):
        for line in (workdir / f"batches-{p}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["step"], {}).update(rec["shards"])
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], mode: str) -> list[str]:
    return [k for k in a if k.startswith(mode) and not np.array_equal(a[k], b[k])]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run at full size (1 process, 4 devices): what every shrunk and grown run must equal."""
    work = tmp_path_factory.mktemp("full")
    gang = _run(work, 1, devices=4)
    assert gang.wait(180) == [0], gang.tail()
    return work


def test_shrunk_and_resumed_runs_end_bitwise_equal_to_the_full_size(tmp_path: Path, full: Path) -> None:
    """Full size (1 process, 4 devices), 1 process, 2 processes of 2 devices, and 2 processes saving at step 2 then
    resumed on 1 process: canonical order ends with bitwise the same parameters; the data positions follow the
    shards."""
    one = _run(tmp_path / "one", 1)
    pairs = _run(tmp_path / "pairs", 2, devices=2)
    two = _run(tmp_path / "shrunk", 2, steps=SAVED_AT + 1)
    for gang, n in ((one, 1), (pairs, 2), (two, 2)):
        assert gang.wait(180) == [0] * n, gang.tail()
    resumed = _run(tmp_path / "shrunk", 1, steps=STEPS, attempt=2)
    assert resumed.wait(180) == [0], resumed.tail()
    assert f"resuming at step {SAVED_AT + 1}" in resumed.logs[0].read_text(), resumed.tail()

    expected = _params(full, STEPS - 1)
    assert _same(expected, _params(tmp_path / "one", STEPS - 1), "canonical") == []
    assert _same(expected, _params(tmp_path / "pairs", STEPS - 1), "canonical") == []
    assert _same(_params(full, SAVED_AT), _params(tmp_path / "shrunk", SAVED_AT), "canonical") == []
    assert _same(expected, _params(tmp_path / "shrunk", STEPS - 1), "canonical") == []
    # every shard read its batches in order, one per step, across the restore onto another process count
    positions = _positions(tmp_path / "shrunk", 2)
    assert positions == {s: {str(v): s for v in range(SHARDS)} for s in range(STEPS)}
    # the default order: not bitwise on 2 processes, within rounding of the full size
    shrunk = _params(tmp_path / "shrunk", SAVED_AT)
    at_full = _params(full, SAVED_AT)
    for k in (k for k in at_full if k.startswith("default")):
        np.testing.assert_allclose(shrunk[k], at_full[k], rtol=0, atol=1e-6)


def test_a_gang_that_shrinks_and_grows_through_the_memory_tier_ends_bitwise_equal_to_the_full_size(
        tmp_path: Path, full: Path) -> None:
    """Issue 47's path without storage: 2 processes copy every step to each other's memory (no periodic storage
    save); process 1's node is lost after step 1; the survivor alone restores step 1 from memory (its own copy and
    the lost process's, which it holds for its peer) with every shard's position, trains to step 3 and is stopped;
    the gang grows back to 2 (process 1 in a new, empty pod reads its part from pod 0's memory over the network)
    and ends. Canonical order: bitwise the uninterrupted full-size run's parameters; every shard read its batches
    in order, one a step, across both size changes."""
    from tests.runtime import helpers_memtier as memtier

    base = memtier.shm_base(tmp_path)
    try:
        work = tmp_path / "elastic"
        pods = [memtier.new_pod(base, "pod-0"), memtier.new_pod(base, "pod-1")]
        ring = {0: pods[1], 1: pods[0]}
        common = {"mem_every": 1, "ckpt_every": 1000, "steps": STEPS}
        memtier.run_until_stopped(memtier.launch(work, pods, ring, attempt=1, stop_at=1, worker=WORKER, **common),
                                  2, die=1)
        pods[1].lose()
        memtier.run_until_stopped(memtier.launch(work, pods[:1], {}, attempt=2, stop_at=3, worker=WORKER, **common),
                                  1)
        pods[1] = memtier.new_pod(base, "pod-1b")
        grown = memtier.launch(work, pods, {0: pods[1], 1: pods[0]}, attempt=3, worker=WORKER, **common)
        assert grown.wait(180) == [0, 0], grown.tail(40)
        logs = [p.read_text() for p in sorted(work.glob("a*-worker-*.log"))]
    finally:
        memtier.kill_launched()
        shutil.rmtree(base, ignore_errors=True)
    text = "\n".join(logs)
    # shrunk: the survivor read both copies (its own, and the one it held for the lost peer) from its pod's memory
    assert re.search(r"restored step 1 on process 0 from its own pod's memory .*\(gang: 0=memory\)", text), text[-3000:]
    # grown: the new process read its part from pod 0's memory over the network
    assert re.search(r"restored step 3 on process 1 from a peer's memory over the network .*\(gang: 0=memory, "
                     r"1=peer\)", text), text[-3000:]
    assert not {1, 3} & set(memtier.storage_steps(work)), \
        "a storage checkpoint of a restored step exists: the restore may not have been from memory"
    assert _same(_params(full, STEPS - 1), _params(work, STEPS - 1), "canonical") == []
    assert _positions(work, 2) == {s: {str(v): s for v in range(SHARDS)} for s in range(STEPS)}
