"""A checkpoint storage that is read-only, then full, for a while costs no failure (issue #25): a real Job with the
real CheckpointManager (TensorStore) on a small tmpfs mounted by the test (root only; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import pytest
import reprieve
from localcluster.testing import wait_for
from reprieve.checkpoint import CheckpointManager, layout
from reprieve.targets import StorageTarget

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

STATE_BYTES = 256 * 1024  # one float32 leaf of 64Ki elements
TMPFS_BYTES = 8 * STATE_BYTES  # keep=3 checkpoints, one being written, and room to spare


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "ckpt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mnt)],
                         check=False, capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(ballast: Path) -> None:
    """Write ``ballast`` until its file system is full."""
    with open(ballast, "wb") as f:
        while True:
            try:
                f.write(b"\0" * 65536)
                f.flush()
            except OSError:
                return


def _remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True, capture_output=True)


def test_read_only_then_full_storage_costs_no_failure(tmpfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmpfs), "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "2"}
    job = reprieve.init(env=env, install_sigterm=False)
    ballast = tmpfs / "ballast"
    state, start = job.restore_or(lambda: {"w": jnp.zeros((STATE_BYTES // 4,), jnp.float32)})
    with job:  # saves after steps 1, 3, ..., 15; a failure surfaces when the next save starts
        for step in job.steps(start, 16):
            state = {"w": state["w"] + 1}
            if step in (2, 6, 8, 10):  # the save before this step has settled (its error, if any, left for the
                job.checkpointer._thread.join()  # job to find): the fault hits the saves after this step only
            if step == 2:
                _remount(tmpfs, "ro")  # the saves of steps 3 and 5 fail (EROFS)
            elif step == 6:
                _remount(tmpfs, "rw")
                # what a save interrupted by the remount leaves: retention removes it after the next commit
                (tmpfs / layout.tmp_name(5, 1) / "arrays").mkdir(parents=True)
            elif step == 8:  # the save of step 9 fails (ENOSPC) and cleans up after itself
                _fill(ballast)
            elif step == 10:
                ballast.unlink()
            job.save(step, state)
    assert job.metrics.get("reprieve_save_failures_total") == 3
    assert "checkpoint save of step 5 failed (2 in a row" in caplog.text
    assert "checkpoint save of step 9 failed (1 in a row" in caplog.text
    assert job.loop.failed_saves == 0 and (job.loop.last_save_error or "").startswith("step 9: CheckpointSaveError")
    assert sorted(p.name for p in tmpfs.iterdir()) == [layout.FENCES_DIR, *(layout.committed_name(s, 1)
                                                                           for s in (11, 13, 15))]
    with CheckpointManager(str(tmpfs)) as mgr:
        step, restored, _ = mgr.restore({"w": jnp.zeros((STATE_BYTES // 4,), jnp.float32)})
    assert step == 15 and float(restored["w"][0]) == 16.0


def test_storage_read_only_for_good_fails_the_job_after_the_bound(tmpfs: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StorageTarget, "min_failing_seconds", 0.0)  # the bound at once, not after a minute
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmpfs), "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "1",
           "REPRIEVE_MAX_FAILED_SAVES": "2"}
    job = reprieve.init(env=env, install_sigterm=False)
    state, start = job.restore_or(lambda: {"w": jnp.zeros((16,), jnp.float32)})
    _remount(tmpfs, "ro")
    with pytest.raises(RuntimeError, match=r"save of step 1 failed .*2 consecutive checkpoint saves failed over "
                                           r"\d+ s \(REPRIEVE_MAX_FAILED_SAVES=2\)") as raised, job:
        for step in job.steps(start, 10):
            job.save(step, state)
    assert "Read-only file system" in str(raised.value)
    assert [p.name for p in tmpfs.iterdir()] == [layout.FENCES_DIR]


def test_a_new_attempt_waits_out_a_short_storage_outage_at_start(tmpfs: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A restart that begins while the storage is read-only (the outage that ended the last attempt, say): its
    fence is retried until the storage takes it, within the bound; past the bound it fails as before."""
    import threading

    _remount(tmpfs, "ro")
    threading.Timer(3.0, _remount, (tmpfs, "rw")).start()
    with CheckpointManager(str(tmpfs), attempt=2, storage_wait_s=30) as mgr:
        assert mgr.latest_step() is None
    assert "refused attempt 2's fence" in caplog.text
    assert (tmpfs / layout.FENCES_DIR).is_dir() and any((tmpfs / layout.FENCES_DIR).iterdir())
    _remount(tmpfs, "ro")
    with pytest.raises(Exception, match="Read-only file system"):
        CheckpointManager(str(tmpfs), attempt=3, storage_wait_s=1)


def test_a_rerun_into_a_root_that_became_read_only_is_refused_at_init(tmpfs: Path) -> None:
    """Issue 46: a plain re-run (this attempt's fence already there) wrote nothing at init, restored, trained every
    step and failed at the last save (CheckpointSaveError, exit 1), every step since the restore lost. The fence
    written again is the probe: refused at init, after the same bounded wait as a new attempt's fence."""
    zeros = {"w": jnp.zeros((16,), jnp.float32)}
    with CheckpointManager(str(tmpfs)) as mgr:
        mgr.save(1, zeros)
    fence = tmpfs / layout.FENCES_DIR / layout.fence_name(1)
    written = fence.read_bytes()
    with CheckpointManager(str(tmpfs)) as mgr:  # a writable re-run: the same fence, byte for byte
        assert mgr.latest_step() == 1
    assert fence.read_bytes() == written
    _remount(tmpfs, "ro")
    with pytest.raises(OSError, match="Read-only file system"):
        CheckpointManager(str(tmpfs), storage_wait_s=1)


def test_a_storage_filled_by_what_retention_owes_frees_it_after_a_failed_save(tmpfs: Path) -> None:
    """Found by the 30-minute soak: an attempt that left for a restart leaves checkpoints past ``keep`` (its
    retention deferred, or a pass its exit cut short), and retention ran only after a commit. On a storage with no
    room for one more, every save of the next attempt failed, no commit ever came to free the room, and after the
    bound every attempt failed. A failed save now frees what retention owes, so the next save commits."""
    zeros = {"w": jnp.zeros((STATE_BYTES // 4,), jnp.float32)}
    with CheckpointManager(str(tmpfs), attempt=1, keep=2) as mgr:  # the attempt that leaves: 4 checkpoints
        mgr.defer_retention()
        for step in (1, 2, 3, 4):
            mgr.save(step, {"w": zeros["w"] + step})
            mgr.wait()
    (tmpfs / layout.tmp_name(5, 1) / "arrays").mkdir(parents=True)  # and a save its exit interrupted
    _fill(tmpfs / "ballast")  # then room for the new attempt's fence, not for one more checkpoint
    os.truncate(tmpfs / "ballast", (tmpfs / "ballast").stat().st_size - STATE_BYTES // 4)
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmpfs), "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "2",
           "REPRIEVE_CHECKPOINT_KEEP": "2", "REPRIEVE_ATTEMPT": "2"}
    job = reprieve.init(env=env, install_sigterm=False)
    state, start = job.restore_or(lambda: zeros)
    assert start == 5 and float(state["w"][0]) == 4.0
    with job:  # saves after steps 5 (fails: full), 7 (commits into the room the failure freed), 9
        for step in job.steps(start, 10):
            state = {"w": state["w"] + 1}
            if step == 7:  # the failed save of step 5 has settled and its retention pass freed what was owed
                job.checkpointer._thread.join()
                wait_for(lambda: not (tmpfs / layout.committed_name(2, 1)).exists(), 10,
                         "the retention pass after the failed save to delete what attempt 1 left past keep",
                         interval=0.01)
            job.save(step, state)
    assert job.metrics.get("reprieve_save_failures_total") == 1
    assert sorted(p.name for p in tmpfs.iterdir() if p.name != "ballast") == [
        layout.FENCES_DIR, *(layout.committed_name(s, 2) for s in (7, 9))]


def test_an_orbax_rerun_into_a_root_that_became_read_only_is_refused_at_init(tmpfs: Path) -> None:
    """Issue 46 for reprieve.orbax: its own fencing wrote nothing at init on a re-run (the attempt's fence already
    there), so a read-only root was found at the first save. Its fence is written again at init, byte for byte."""
    pytest.importorskip("orbax.checkpoint")
    from reprieve.orbax import FENCES_DIR, OrbaxCheckpointer

    ckpt = OrbaxCheckpointer(str(tmpfs))
    ckpt.save(1, {"w": jnp.zeros((16,), jnp.float32)})
    ckpt.close()
    fence = tmpfs / FENCES_DIR / layout.fence_name(1)
    written = fence.read_bytes()
    again = OrbaxCheckpointer(str(tmpfs))  # a writable re-run: the same fence, byte for byte
    assert again.latest_step() == 1
    again.close()
    assert fence.read_bytes() == written
    _remount(tmpfs, "ro")
    with pytest.raises(OSError, match=rf"orbax checkpoints at {tmpfs}: attempt 1's fence cannot be written \(.*"
                                      r"Read-only file system.*\), so no save of this run would commit; make the "
                                      r"storage writable or set another REPRIEVE_CHECKPOINT_URI"):
        OrbaxCheckpointer(str(tmpfs))
