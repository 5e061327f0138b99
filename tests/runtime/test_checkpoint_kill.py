"""kill -9 of a writer at seeded random moments: the latest complete checkpoint always restores
bit-exactly, is never older than the last commit the writer reported, and leftovers get cleaned."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ckpt_workers import launch
from jax.sharding import SingleDeviceSharding
from reprieve.checkpoint import CheckpointManager

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TRIALS = 20


def _expected_w(step: int) -> np.ndarray:  # mirrors crash_worker.state
    return np.arange(4096 * 4, dtype=np.float32).reshape(64, 256) + step


def wait_for_a_save_in_flight(root, limit_s: float) -> None:
    """Until a save's temporary directory exists (the writer is inside the save protocol)."""
    limit = time.monotonic() + limit_s
    while not any(n.endswith(".tmp") for n in os.listdir(root)):
        assert time.monotonic() < limit, f"no save in flight within {limit_s}s: {os.listdir(root)}"
        time.sleep(0.002)


def test_kill_minus_nine_at_random_moments(tmp_path) -> None:
    """Why this long: 20 trials in sequence, each a fresh JAX process that restores the previous trial's checkpoint
    before it is killed (about 2 s each on a quiet machine, 95 s under CI's load); the trials build on one another's
    leftovers, so they cannot run side by side, and fewer trials hit fewer moments of the save protocol."""
    rnd = random.Random(20261122)
    sharding = SingleDeviceSharding(jax.devices()[0])
    abstract = {"w": jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=sharding),
                "b": jax.ShapeDtypeStruct((32,), jnp.int32, sharding=sharding), "step": 0}
    reported = 0
    mid_save_kills = 0
    for trial in range(TRIALS):
        attempt = 2 * trial + 1  # the verifying reader below takes 2 * trial + 2
        cmd = [sys.executable, "-u", str(launch.WORKERS / "crash_worker.py"), str(tmp_path), str(attempt),
               "--kill-loop", str(trial)]
        proc = subprocess.Popen(cmd, env=launch.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        lines = []
        while True:  # wait until it restored and started saving
            line = proc.stdout.readline()
            assert line, f"trial {trial}: writer exited early: {''.join(lines)}"
            lines.append(line)
            if line.startswith("READY"):
                break
        pause = rnd.uniform(0.0, 0.4)
        if trial % 2:  # every other trial aims inside the protocol, whatever the machine's speed or load
            wait_for_a_save_in_flight(tmp_path, limit_s=20.0)
            pause = rnd.uniform(0.0, 0.005)
        time.sleep(pause)
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        lines += rest.splitlines(keepends=True)
        assert proc.returncode == -signal.SIGKILL, "".join(lines)
        commits = [int(ln.split()[1]) for ln in lines if ln.startswith("COMMITTED")]
        reported = max([reported, *commits])
        mid_save_kills += any(n.endswith(".tmp") for n in os.listdir(tmp_path))
        # Read with a manager of a *newer* attempt, as the next gang would.
        mgr = CheckpointManager(str(tmp_path), attempt=attempt + 1)
        latest = mgr.latest_step()
        if latest is None:  # killed before its first commit (the kill may come before the first save ends)
            assert reported == 0, (trial, reported, "".join(lines))
            continue
        assert latest >= reported, (trial, latest, reported, "".join(lines))
        step, got, _ = mgr.restore(abstract)
        assert step == latest
        np.testing.assert_array_equal(np.asarray(got["w"]), _expected_w(step))
        assert got["step"] == step and int(got["b"][0]) == step
    print(f"{mid_save_kills}/{TRIALS} kills landed in the middle of a save; last commit {reported}")
    assert mid_save_kills >= TRIALS // 4  # the trials do exercise kills inside the protocol
    # every leftover of the killed attempts is gone once a manager started after them
    names = os.listdir(tmp_path)
    assert not any(n.endswith((".tmp", ".deleting")) for n in names), names
