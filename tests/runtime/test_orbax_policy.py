"""reprieve.orbax_policy.AgreedStepPolicy: a MaxText-shaped loop with its own Orbax CheckpointManager (real
orbax-checkpoint, real files, 2 real jax.distributed processes); a notice: Orbax saves the agreed step on every
process, the processes exit with the restart code, the restart resumes at the next step (0 steps lost)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.helpers_agreement import REPO, launch

ocp = pytest.importorskip("orbax.checkpoint")

WORKER = REPO / "tests" / "runtime" / "workers" / "orbax_loop_worker.py"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_a_notice_ends_in_orbax_saving_the_agreed_step_on_every_process_and_the_restart_code(tmp_path: Path) -> None:
    n = 2
    env = {"WORKER_EVERY": "1000"}  # after step 0, the interval never comes
    gang = launch(tmp_path, n, steps=5000, step_seconds=0.02, grace_seconds=5, worker=WORKER, extra_env=env)
    codes = gang.signal_when_running(1, signal.SIGTERM, 120)
    assert codes == [42] * n, gang.tail()
    steps = {int(re.findall(r"agreed save step (\d+)", p.read_text())[-1]) for p in gang.logs}
    assert len(steps) == 1, steps  # one agreed step on every process
    (step,) = steps
    mngr = ocp.CheckpointManager(gang.ckpt)
    assert mngr.all_steps() == [0, step]  # Orbax's own checkpoints: FixedIntervalPolicy's step 0, the agreed one
    import jax

    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # both processes' shards, read by this one
    saved = mngr.restore(step, args=ocp.args.StandardRestore(
        {"x": jax.ShapeDtypeStruct((4 * n,), np.float32, sharding=here)}))
    assert np.array_equal(np.asarray(saved["x"]), np.full((4 * n,), step + 1, np.float32))  # every shard: 0 lost
    again = launch(tmp_path, n, steps=step + 11, step_seconds=0.0, worker=WORKER,
                   extra_env={**env, "REPRIEVE_ATTEMPT": "2"})
    again.assert_resumed(step, 120)
    for p in range(n):
        assert (tmp_path / f"done-{p}").read_text() == f"{float(step + 11)}"


def test_the_policy_says_what_is_missing_without_a_job() -> None:
    from reprieve.orbax_policy import AgreedStepPolicy

    with pytest.raises(RuntimeError, match=r"policy.init\(make_manager\) or call policy.bind\(job\)"):
        AgreedStepPolicy().should_save(None, [], context=None)
