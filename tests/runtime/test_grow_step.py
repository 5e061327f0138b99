"""A grow at an agreed step through the memory tier, for real (issue 47, item 4): a gang of 2 processes trains
over 4 virtual shards; each process gets the supervisor's resize signal (as ``reprieve-supervisor`` sends it when an
assignment grows the gang), at a different step (process 1's is not sent when the gang already agreed on process
0's and ended); the gang agrees one step, holds it in memory on every process
(no storage save), and exits with the restart code; the next attempt on 4 processes (2 of them in new, empty pods)
restores that step from the pods' memory and ends bitwise equal to an uninterrupted full-size run, with 0 steps
lost."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from reprieve.supervisor.contract import RESIZE_SIGNAL

from tests.runtime import helpers_memtier as memtier
from tests.runtime.helpers_agreement import launch
from tests.runtime.workers.virtual_worker import SHARDS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

WORKER = Path(__file__).resolve().parent / "workers" / "virtual_worker.py"
RESTART_CODE = 42  # the contract's default (docs/contract.toml [defaults] restart_exit_code)
SIGNAL_FROM = 3  # process p gets the resize signal once it logged step SIGNAL_FROM + p
AFTER = 4  # steps the grown attempt trains after the restored one


def _steps_logged(workdir: Path, pid: int) -> list[dict]:
    path = workdir / f"batches-{pid}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _params(workdir: Path, step: int) -> dict[str, np.ndarray]:
    with np.load(workdir / f"params-{step}.npz") as data:
        return {k: data[k] for k in data.files}


def test_a_grow_saves_one_agreed_step_to_memory_and_the_larger_gang_resumes_it_with_no_step_lost(
        tmp_path: Path) -> None:
    base = memtier.shm_base(tmp_path)
    work = tmp_path / "grow"
    try:
        pods = [memtier.new_pod(base, "pod-0"), memtier.new_pod(base, "pod-1")]
        supervised = {i: {"REPRIEVE_SUPERVISED": "1"} for i in range(4)}  # the runtime takes the resize signal
        gang = memtier.launch(work, pods, {0: pods[1], 1: pods[0]}, attempt=1, steps=400, mem_every=1,
                              ckpt_every=1000, worker=WORKER, extra=supervised)
        signalled: set[int] = set()
        limit = time.monotonic() + 180
        # process 1's signal may come after the gang already agreed on process 0's notice and ended (the agreement
        # reached process 1 through the leader): a process that ended is not waited for, and its code is checked below
        while len(signalled) < 2 and not (signalled and all(p.poll() is not None for p in gang.procs)):
            assert time.monotonic() < limit, gang.tail(40)
            assert signalled or all(p.poll() is None for p in gang.procs), gang.tail(40)  # none ends before a notice
            for pid in set(range(2)) - signalled:
                if gang.procs[pid].poll() is None and any(r["step"] >= SIGNAL_FROM + pid
                                                          for r in _steps_logged(work, pid)):
                    gang.procs[pid].send_signal(RESIZE_SIGNAL)
                    signalled.add(pid)
            time.sleep(0.02)
        assert gang.wait(120) == [RESTART_CODE] * 2, gang.tail(40)
        first = "\n".join(p.read_text() for p in gang.logs)
        agreed = {int(s) for s in re.findall(r"agreed step (\d+) held in memory by all 2 process", first)}
        assert len(agreed) == 1, first[-4000:]  # both processes said it, of the same step
        step = agreed.pop()
        last = max(r["step"] for pid in range(2) for r in _steps_logged(work, pid))
        assert last == step, f"attempt 1 computed step {last} but agreed {step}: {last - step} step(s) lost"
        assert memtier.storage_steps(work) == [], "attempt 1 saved to storage"

        pods += [memtier.new_pod(base, "pod-2"), memtier.new_pod(base, "pod-3")]
        ring = {i: pods[(i + 1) % 4] for i in range(4)}
        grown = memtier.launch(work, pods, ring, attempt=2, steps=step + 1 + AFTER, mem_every=1,
                               ckpt_every=1000, worker=WORKER, extra=supervised)
        assert grown.wait(240) == [0] * 4, grown.tail(40)
        second = "\n".join(p.read_text() for p in grown.logs)
    finally:
        memtier.kill_launched()
        shutil.rmtree(base, ignore_errors=True)
    assert f"resuming at step {step + 1}" in second, second[-4000:]
    # the kept processes read their own pod's memory; the newcomers, whose pods are empty, a peer's over the network
    for pid in (0, 1):
        assert re.search(rf"restored step {step} on process {pid} from its own pod's memory", second), second[-4000:]
    for pid in (2, 3):
        assert re.search(rf"restored step {step} on process {pid} from a peer's memory over the network",
                         second), second[-4000:]
    assert step not in memtier.storage_steps(work), "a storage checkpoint of the agreed step exists"

    full = tmp_path / "full"  # the uninterrupted run at full size (1 process, 4 devices), as long
    ref = launch(full, 1, steps=step + 1 + AFTER, worker=WORKER,
                 extra_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert ref.wait(180) == [0], ref.tail()
    final = step + AFTER
    want, got = _params(full, final), _params(work, final)
    assert [k for k in want if k.startswith("canonical") and not np.array_equal(want[k], got[k])] == []
    positions: dict[int, dict[str, int]] = {}
    for pid in range(4):
        for rec in _steps_logged(work, pid):
            positions.setdefault(rec["step"], {}).update(rec["shards"])
    assert positions == {s: {str(v): s for v in range(SHARDS)} for s in range(final + 1)}
