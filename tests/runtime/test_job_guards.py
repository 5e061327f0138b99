"""What the job says and refuses early, in one process with the real CheckpointManager on real files: a state no
checkpoint can hold, periodic saves that are off, another run's checkpoint, a checkpoint past the total."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reprieve

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _job(root: Path, **env: str) -> Any:
    return reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(root), **env}, install_sigterm=False, watch_pod=False)


def _init(width: int = 4) -> dict[str, Any]:
    return {"w": jnp.zeros((width,), jnp.float32), "step": 0}


def _train(job: Any, total: int, width: int = 4) -> Any:
    state, start = job.restore_or(lambda: _init(width))
    for step in job.steps(start, total):
        state = {"w": state["w"] + 1, "step": step + 1}
        job.save(step, state)
    return state


def test_a_leaf_no_checkpoint_can_hold_is_refused_at_the_first_save_call(tmp_path: Path) -> None:
    """A function in the state was reported at the first real save: with no periodic save, the last step, after
    the whole run had trained. Now the first job.save() call says so, whether it saves or not."""
    with _job(tmp_path) as job:
        state, start = job.restore_or(_init)
        steps = job.steps(start, 1000)
        step = next(steps)
        with pytest.raises(TypeError, match=r"checkpoint leaf \['apply'\]: expected jax.Array.*functions and other "
                                            r"Python objects are not state"):
            job.save(step, {**state, "apply": jax.nn.relu})
        job.abandon()


def test_the_log_says_when_periodic_saves_are_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="reprieve.job"):
        with _job(tmp_path / "a") as job:
            _train(job, 2)
        off = [r.getMessage() for r in caplog.records if "periodic saves are off" in r.getMessage()]
        assert len(off) == 1 and "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS" in off[0], caplog.text
        caplog.clear()
        with _job(tmp_path / "b", REPRIEVE_CHECKPOINT_INTERVAL_SECONDS="600") as job:
            _train(job, 2)
        assert not [r for r in caplog.records if "periodic saves are off" in r.getMessage()], caplog.text
    np.testing.assert_array_equal(np.asarray(_restored(tmp_path / "b")["w"]), np.full((4,), 2.0, np.float32))


def _restored(root: Path) -> Any:
    with _job(root) as job:
        state, _ = job.restore_or(_init)
        job.abandon()
    return state


def test_a_second_run_with_another_run_id_is_refused_naming_both(tmp_path: Path) -> None:
    """A second run with another seed in the same directory silently resumed the first run's checkpoint."""
    with _job(tmp_path, REPRIEVE_RUN_ID="seed-1") as job:
        _train(job, 3)
    with _job(tmp_path, REPRIEVE_RUN_ID="seed-2") as job:
        with pytest.raises(ValueError, match=r"belongs to run 'seed-1', and this is run 'seed-2' \(REPRIEVE_RUN_ID\): "
                                             r"a new run needs its own REPRIEVE_CHECKPOINT_URI"):
            job.restore_or(_init)
        job.abandon()
    with _job(tmp_path) as job:  # no run id at all is another run too
        with pytest.raises(ValueError, match=r"belongs to run 'seed-1', and this run has no REPRIEVE_RUN_ID: "):
            job.restore_or(_init)
        job.abandon()
    with _job(tmp_path, REPRIEVE_RUN_ID="seed-1") as job:  # the same run resumes
        assert job.restore_or(_init).step == 2
        job.abandon()


def test_a_state_of_another_structure_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    with _job(tmp_path) as job:
        _train(job, 2)
    with _job(tmp_path) as job:
        with pytest.raises(ValueError, match=r"holds a state of another structure than this program's \(1 leaves of "
                                             r"another shape \(\['w'\]: \[4\] in the checkpoint, \[8\] here\)\)"):
            job.restore_or(lambda: _init(8))
        with pytest.raises(ValueError, match=r"1 leaves only in this program's state \(\['extra'\]\)"):
            job.restore_or(lambda: {**_init(), "extra": jnp.zeros(2)})
        job.abandon()


def test_a_shorter_run_is_told_the_checkpoint_is_past_total_steps(tmp_path: Path) -> None:
    with _job(tmp_path) as job:
        _train(job, 10)
    with _job(tmp_path) as job:
        _, start = job.restore_or(_init)
        with pytest.raises(ValueError, match=r"Job.steps: the checkpoint is past total steps: it holds step 9 and "
                                             r"this run has total=5"):
            next(iter(job.steps(start, 5)))
        job.abandon()
    with _job(tmp_path) as job:  # the same total: finished already, nothing to train
        _, start = job.restore_or(_init)
        assert list(job.steps(start, 10)) == []


def test_an_unwritable_checkpoint_uri_names_the_setting(tmp_path: Path) -> None:
    """It was a raw OSError from os.makedirs that did not say which setting to change."""
    (tmp_path / "a-file").write_text("not a directory")
    where = tmp_path / "a-file" / "ckpt"
    with pytest.raises(reprieve.ConfigError, match=rf"REPRIEVE_CHECKPOINT_URI='{where}': the checkpoint location "
                                                   r"cannot be opened for writing \(NotADirectoryError"):
        _job(where)


def test_sys_exit_with_the_restart_code_in_a_with_block_is_said_loudly(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    with (caplog.at_level(logging.CRITICAL, logger="reprieve.job"), pytest.raises(SystemExit),
          _job(tmp_path, REPRIEVE_CHECKPOINT_INTERVAL_STEPS="2") as job):
        state, start = job.restore_or(_init)
        for step in job.steps(start, 100):
            job.save(step, state)
            if step == 4:
                raise SystemExit(42)  # a user's own "preemption" exit
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("process 0: sys.exit(42) without an agreed save"), line
    assert re.search(r"the last checkpoint is step [13]\)", line), line  # step 3's save may not be confirmed yet


def test_an_exception_before_the_restore_names_the_last_checkpoint_in_storage(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An exception before (or inside) restore_or warned "the last checkpoint is step none" beside checkpoints:
    the exit line names the newest one in storage, and says "no checkpoint yet" only when there is none."""
    with _job(tmp_path / "a") as job:
        _train(job, 3)

    def _abandoned(root: Path) -> str:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reprieve.job"), pytest.raises(ValueError), _job(root) as job:
            job.restore_or(lambda: _init(8))  # another structure: refused before anything is read
        (line,) = [r.getMessage() for r in caplog.records if "without finishing job.steps()" in r.getMessage()]
        return line

    assert "(the last checkpoint is step 2)" in _abandoned(tmp_path / "a")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="reprieve.job"), pytest.raises(RuntimeError), _job(tmp_path / "b"):
        raise RuntimeError("the user's own code fails before any restore")
    (line,) = [r.getMessage() for r in caplog.records if "without finishing job.steps()" in r.getMessage()]
    assert "(there is no checkpoint yet)" in line and "step none" not in line, line


@pytest.mark.parametrize(("env", "words"), [
    ({"REPRIEVE_CHECKPOINT_URI": "s3:/bucket/x"}, "REPRIEVE_CHECKPOINT_URI='s3:/bucket/x'"),
    ({"REPRIEVE_CHECKPOINT_URI": "ckpt", "REPRIEVE_NUM_PROCESSES": "two"}, "REPRIEVE_NUM_PROCESSES"),
])
def test_a_config_error_nobody_catches_is_one_line_not_a_traceback(tmp_path: Path, env: dict[str, str],
                                                                   words: str) -> None:
    """Issue 46 item 9: ``python train.py`` (or a pod's trainer) with a bad setting printed the ConfigError's whole
    traceback through the runtime; now one line naming the setting and what is accepted, exit 1. A caller that
    catches ConfigError still gets it, and any other exception keeps its traceback."""
    import os
    import subprocess
    import sys

    program = ("import reprieve, sys\n"
               "try:\n    reprieve.init(install_sigterm=False, watch_pod=False)\n"
               "except reprieve.ConfigError as err:\n    print('caught', type(err).__name__)\n"
               "reprieve.init(install_sigterm=False, watch_pod=False)\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    done = subprocess.run([sys.executable, "-c", program], check=False, cwd=tmp_path, env=base | env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert done.stdout.strip() == "caught ConfigError", done
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    assert lines[0].startswith("reprieve: ") and words in lines[0], lines
    boom = "import reprieve\nreprieve.init(install_sigterm=False, watch_pod=False)\nraise RuntimeError('boom')"
    other = subprocess.run([sys.executable, "-c", boom], check=False, cwd=tmp_path,
                           env=base | {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ok")}, capture_output=True,
                           text=True, timeout=60)
    assert "Traceback" in other.stderr and "RuntimeError: boom" in other.stderr, other.stderr
