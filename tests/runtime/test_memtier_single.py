"""The memory tier in one process (a laptop: own copies only, served by the trainer itself): a restart restores
the newest copy from memory, bit-exact; a corrupt copy falls back to storage; a limit too small turns the tier off
and the job trains on with storage; bad settings are refused at init()."""

from __future__ import annotations

import logging
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from reprieve.memtier.layout import DATA_FILE, MANIFEST_FILE
from reprieve.memtier.manifest import Manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else tmp_path
    d = base / f"reprieve-single-{os.getpid()}-{id(tmp_path)}"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _job(ckpt: Path, mem: Path, **env: str) -> Any:
    return reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(ckpt), "REPRIEVE_MEMORY_DIR": str(mem),
                              "REPRIEVE_MEMORY_INTERVAL_STEPS": "3", "REPRIEVE_MEMORY_PORT": "0", **env},
                         install_sigterm=False, watch_pod=False)


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("d",))


def init_state() -> dict[str, Any]:
    rows = NamedSharding(_mesh(), P("d"))
    rep = NamedSharding(_mesh(), P())
    return {"w": jax.device_put(jnp.arange(24, dtype=jnp.float32).reshape(8, 3), rows),
            "b": jax.device_put(jnp.zeros((2,), jnp.bfloat16), rep),
            "n": jax.device_put(jnp.zeros((), jnp.int32), rep),
            "key": jax.device_put(jax.random.key(7), rep), "host": np.arange(3, dtype=np.int64), "lr": 0.5}


@jax.jit
def _arrays(w: Any, b: Any, n: Any, key: Any) -> dict[str, Any]:
    return {"w": w * 1.5 + 1.0, "b": b + 1, "n": n + 1, "key": jax.random.split(key)[0]}


def step_fn(s: dict[str, Any]) -> dict[str, Any]:
    return {**s, **_arrays(s["w"], s["b"], s["n"], s["key"])}  # numpy and Python leaves stay what they are


def expected(steps: int) -> dict[str, Any]:
    s = init_state()
    for _ in range(steps):
        s = step_fn(s)
    return s


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for k in ("w", "b", "n"):
        assert a[k].sharding.is_equivalent_to(b[k].sharding, a[k].ndim), k
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(a["key"])), np.asarray(jax.random.key_data(b["key"])))
    np.testing.assert_array_equal(a["host"], b["host"])
    assert a["lr"] == b["lr"]


def crash_after(job: Any, state: Any, start: int, stop_at: int) -> Any:
    """Train until ``stop_at`` (inclusive) and leave without a final save: the process 'dies'."""
    for step in job.steps(start, 1000):
        state = step_fn(state)
        job.save(step, state, data={"pos": step + 1})
        job.memory.tier.wait()  # steps of a millisecond: a copy still in the background would skip the next
        if step == stop_at:
            break
    job.abandon()
    return state


class Position:
    def __init__(self) -> None:
        self.state: Any = None

    def get_state(self) -> Any:
        return self.state

    def set_state(self, value: Any) -> None:
        self.state = value


def test_a_restart_restores_the_newest_memory_copy_bit_exactly(tmp_path: Path, shm: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    job = _job(tmp_path / "ckpt", shm)
    state, start = job.restore_or(init_state)
    assert start == 0
    crash_after(job, state, start, 9)  # memory copies after steps 2, 5, 8; storage: none (no interval, no end)
    assert [p.name for p in (shm / "own").iterdir()] == ["s0000000008_a1_p0"]

    job = _job(tmp_path / "ckpt", shm)
    pos = Position()
    with caplog.at_level(logging.INFO):
        restored, start = job.restore_or(init_state, data=pos)
    # Issue #46, 9: one line per restore, true about its source; no second line naming the storage URI
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("restored step")]
    assert len(lines) == 1 and re.fullmatch(r"restored step 8 on process 0 from its own pod's memory in [0-9.]+s "
                                            r"\(gang: 0=memory\): resuming at step 9 \(saved by attempt 1\)",
                                            lines[0]), lines
    assert start == 9 and pos.state == {"pos": 9}
    same(restored, expected(9))
    assert job.loop.restored_from == {"step": 8, "tier": "memory", "sources": ["memory"]}
    # What the pod's next warm process populates (the first-step report): the replicas past each distinct shard's
    # first device, which adopts the own copy's mapped pages ("w" is sharded: nothing of it), and the numpy leaf.
    n = len(jax.devices())
    assert job._landing == (n - 1) * (2 * 2 + 4 + 2 * 4) + 3 * 8, job._landing
    # Storage has no checkpoint: the committed step the job reports (status.lastCheckpointStep, which the soak
    # holds retention to) is storage's, not the memory copy's.
    assert job.committed_step is None
    for step in job.steps(start, 12):
        restored = step_fn(restored)
        job.save(step, restored, data={"pos": step + 1})
    same(restored, expected(12))


def test_a_corrupt_copy_is_never_restored_the_next_source_is(tmp_path: Path, shm: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    job = _job(tmp_path / "ckpt", shm, REPRIEVE_CHECKPOINT_INTERVAL_STEPS="4")  # storage after steps 3 and 7
    state, start = job.restore_or(init_state)
    crash_after(job, state, start, 9)
    job.checkpointer.wait()
    copy = shm / "own" / "s0000000008_a1_p0"
    shard = Manifest.from_bytes((copy / MANIFEST_FILE).read_bytes(), str(copy)).shards[1]
    raw = bytearray((copy / DATA_FILE).read_bytes())
    raw[shard.offset + shard.nbytes // 2] ^= 0x40  # one bit of a shard (the padding between shards is no data)
    (copy / DATA_FILE).write_bytes(bytes(raw))

    job = _job(tmp_path / "ckpt", shm)
    with caplog.at_level(logging.INFO):
        restored, start = job.restore_or(init_state)
    assert start == 8
    same(restored, expected(8))
    assert job.loop.restored_from == {"step": 7, "tier": "storage", "sources": ["storage"]}
    assert "fails its checksum" in caplog.text
    assert not (shm / "own" / "s0000000008_a1_p0").exists(), "the corrupt copy was kept"
    job.abandon()


def test_a_limit_below_the_state_turns_the_tier_off_and_training_goes_on(tmp_path: Path, shm: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    job = _job(tmp_path / "ckpt", shm, REPRIEVE_MEMORY_LIMIT_BYTES="200", REPRIEVE_CHECKPOINT_INTERVAL_STEPS="4")
    with caplog.at_level(logging.INFO):
        state, start = job.restore_or(init_state)
        for step in job.steps(start, 10):
            state = step_fn(state)
            job.save(step, state)
    assert "memory tier OFF" in caplog.text and "REPRIEVE_MEMORY_LIMIT_BYTES is 0.0 MiB (200 bytes)" in caplog.text
    assert list((shm / "own").iterdir()) == []
    job = _job(tmp_path / "ckpt", shm)
    restored, start = job.restore_or(init_state)
    assert start == 10 and job.loop.restored_from["tier"] == "storage"
    same(restored, expected(10))
    job.abandon()


@pytest.mark.parametrize(("env", "message"), [
    ({"REPRIEVE_MEMORY_INTERVAL_STEPS": "-3"}, "REPRIEVE_MEMORY_INTERVAL_STEPS must be >= 0, got '-3'"),
    ({"REPRIEVE_MEMORY_PEER": "127.0.0.1:8477", "REPRIEVE_MEMORY_PORT": "8477"}, "own replica server"),
])
def test_bad_memory_settings_are_refused_at_init(tmp_path: Path, shm: Path, env: dict[str, str],
                                                 message: str) -> None:
    with pytest.raises(reprieve.ConfigError, match=message):
        _job(tmp_path / "ckpt", shm, **env)


def test_a_new_checkpoint_root_does_not_resume_another_roots_memory_copy(tmp_path: Path, shm: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Issue #46, 1: with a fixed memory directory a new run with a fresh, empty REPRIEVE_CHECKPOINT_URI restored
    the previous run's memory copy (and named the new directory as the source). A copy belongs to its storage
    root: another root's is ignored with a line that says so, and stays its own root's to restore."""
    job = _job(tmp_path / "old", shm)
    state, start = job.restore_or(init_state)
    crash_after(job, state, start, 9)  # a memory copy of step 8, nothing in storage

    job = _job(tmp_path / "new", shm)
    with caplog.at_level(logging.INFO):
        _, start = job.restore_or(init_state)
    assert start == 0 and job.loop.restored_from is None, caplog.text
    assert (f"memory copy own/s0000000008_a1_p0 in {shm} belongs to checkpoint root {tmp_path / 'old'}, not this "
            f"run's {tmp_path / 'new'}: ignored") in caplog.text
    assert "restored step 8" not in caplog.text
    job.abandon()

    caplog.clear()
    job = _job(tmp_path / "old", shm)
    with caplog.at_level(logging.INFO):
        restored, start = job.restore_or(init_state)
    assert start == 9 and job.loop.restored_from == {"step": 8, "tier": "memory", "sources": ["memory"]}
    same(restored, expected(9))
    # Issue #46, 9: one line per restore, true about its source (not a second one naming the storage URI).
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("restored step 8")]
    assert len(lines) == 1 and "from its own pod's memory" in lines[0] and lines[0].endswith(
        "resuming at step 9 (saved by attempt 1)"), lines
    job.abandon()


def test_a_run_id_new_root_ignores_the_copy_and_another_run_id_on_the_same_root_is_refused_with_the_fix(
        tmp_path: Path, shm: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue #46, 1, with REPRIEVE_RUN_ID set: a new run with a new, empty REPRIEVE_CHECKPOINT_URI was refused for the
    other run's memory copy, advised to change the URI it had already changed. A new root's run ignores the copy and
    starts at step 0; a run with another id on the copy's own root is refused, naming the copy, its memory directory
    and both ways out (the run id to resume it, the copies to delete to start from storage)."""
    from reprieve.identity import RunMismatchError

    job = _job(tmp_path / "old", shm, REPRIEVE_RUN_ID="first")
    state, start = job.restore_or(init_state)
    crash_after(job, state, start, 9)  # a memory copy of step 8 of run 'first', nothing in storage

    job = _job(tmp_path / "new", shm, REPRIEVE_RUN_ID="second")
    with caplog.at_level(logging.INFO):
        _, start = job.restore_or(init_state)
    assert start == 0 and job.loop.restored_from is None, caplog.text
    assert f"belongs to checkpoint root {tmp_path / 'old'}, not this run's {tmp_path / 'new'}: ignored" in caplog.text
    job.abandon()

    job = _job(tmp_path / "old", shm, REPRIEVE_RUN_ID="second")
    with pytest.raises(RunMismatchError) as refused:
        job.restore_or(init_state)
    text = str(refused.value)
    assert f"memory copy own/s0000000008_a1_p0 in {shm} belongs to run 'first'" in text, text
    assert "to resume that run, set REPRIEVE_RUN_ID=first" in text, text
    assert f"REPRIEVE_MEMORY_DIR ({shm} here): to restore from storage instead, delete the copies there" in text, text
    job.abandon()


def test_a_memory_copy_of_another_structure_is_refused_naming_its_directory(tmp_path: Path, shm: Path) -> None:
    """Issue #46, 1: the structure check was skipped for memory copies; the restore failed with a raw ValueError
    ("restore leaf ['w']: abstract shape ...") that named neither the copy nor its directory."""
    job = _job(tmp_path / "ckpt", shm)
    state, start = job.restore_or(init_state)
    crash_after(job, state, start, 9)

    def wider() -> dict[str, Any]:
        return {**init_state(), "w": jax.device_put(jnp.zeros((8, 4), jnp.float32), NamedSharding(_mesh(), P("d")))}

    job = _job(tmp_path / "ckpt", shm)
    from reprieve.identity import RunMismatchError

    with pytest.raises(RunMismatchError) as refused:
        job.restore_or(wider)
    text = str(refused.value)
    assert "memory copy own/s0000000008_a1_p0 in " + str(shm) in text, text
    assert "another structure" in text and "['w']: [8, 3] in the checkpoint, [8, 4] here" in text, text
    assert f"REPRIEVE_MEMORY_DIR ({shm} here): to restore from storage instead, delete the copies there" in text
    job.abandon()


def _corrupt_storage(ckpt: Path) -> None:
    for d in ckpt.iterdir():
        if (d / "arrays").is_dir():
            chunk = min(p for p in (d / "arrays").rglob("*") if p.is_file() and "/c/" in str(p))
            data = bytearray(chunk.read_bytes())
            data[1] ^= 0x10
            chunk.write_bytes(bytes(data))


def test_a_root_of_quarantined_checkpoints_does_not_start_over_with_the_memory_tier_on(
        tmp_path: Path, shm: Path) -> None:
    """Issue #46, 4: a root holding only quarantined checkpoints refuses to start from step 0; with the memory tier
    on, its round found nothing and started at step 0 without asking storage."""
    from reprieve.checkpoint import CheckpointCorruptError, OnlyQuarantinedError

    job = _job(tmp_path / "ckpt", shm, REPRIEVE_CHECKPOINT_INTERVAL_STEPS="4")  # storage after steps 3 and 7
    state, start = job.restore_or(init_state)
    crash_after(job, state, start, 9)
    job.checkpointer.wait()
    shutil.rmtree(shm / "own")  # the node is gone, and its memory with it
    _corrupt_storage(tmp_path / "ckpt")
    job = _job(tmp_path / "ckpt", shm)
    with pytest.raises(CheckpointCorruptError):
        job.restore_or(init_state)  # falls back through both, quarantining each
    job.abandon()

    job = _job(tmp_path / "ckpt", shm)
    with pytest.raises(OnlyQuarantinedError, match="holds no usable checkpoint, only 2 quarantined"):
        job.restore_or(init_state)
    job.abandon()
    # the documented setting, given to init(env=...), reaches the checkpointer (with the tier and without it)
    for env in ({"REPRIEVE_MEMORY_DIR": str(shm)}, {}):
        job = reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_MEMORY_PORT": "0",
                                 "REPRIEVE_START_OVER_QUARANTINED": "1", **env}, install_sigterm=False,
                            watch_pod=False)
        _, start = job.restore_or(init_state)
        assert start == 0, env
        job.abandon()


def test_a_tier_that_switched_itself_off_says_so_in_the_progress_report(tmp_path: Path, shm: Path) -> None:
    """Issue #46, 8: the tier's OFF was only in the trainer's log; process 0's progress report (the annotation the
    operator reads) now carries memoryOff: why, and what to change."""
    import json

    from reprieve.notice import PROGRESS_ANNOTATION
    from reprieve.progress import progress_annotation

    job = _job(tmp_path / "ckpt", shm, REPRIEVE_MEMORY_LIMIT_BYTES="200")
    state, start = job.restore_or(init_state)
    for step in job.steps(start, 4):
        state = step_fn(state)
        job.save(step, state)
        if step == 3:
            report = json.loads(progress_annotation(step, -1, 1, 0.0, job.loop.fields())[PROGRESS_ANNOTATION])
    assert "REPRIEVE_MEMORY_LIMIT_BYTES is 0.0 MiB (200 bytes): raise the limit (spec.checkpoint.memory)" in \
        report["memoryOff"], report


def test_a_finished_jobs_tier_deletes_its_own_copies_and_only_those(tmp_path: Path, shm: Path) -> None:
    """Issue #46, 1: copies outlived a finished run (a laptop's fixed /dev/shm directory keeps them, and their
    memory). The tier closed for a finished job deletes its root's copies; another root's stay."""
    import dataclasses

    job = _job(tmp_path / "ckpt", shm)
    state, start = job.restore_or(init_state)
    for step in job.steps(start, 1000):
        state = step_fn(state)
        job.save(step, state)
        job.memory.tier.wait()
        if step == 8:
            break
    ours = shm / "own" / "s0000000008_a1_p0"
    theirs = shm / "own" / "s0000000005_a1_p0"  # another root's copy, as another run on this laptop leaves one
    shutil.copytree(ours, theirs)
    m = Manifest.from_bytes((ours / MANIFEST_FILE).read_bytes(), str(ours))
    (theirs / MANIFEST_FILE).write_bytes(dataclasses.replace(m, step=5, root=str(tmp_path / "other")).to_bytes())
    job.memory.tier.close(finished=True)
    assert [p.name for p in (shm / "own").iterdir()] == [theirs.name]
    job.abandon()


def test_a_job_that_finishes_leaves_no_copy_behind(tmp_path: Path, shm: Path) -> None:
    """Issue #46, 1, through the job's own way out: the loop's end (finish) deletes the run's copies (a laptop's
    /dev/shm kept them after the run); a restart keeps them (the restarts in this file restore from them)."""
    job = _job(tmp_path / "ckpt", shm)
    state, start = job.restore_or(init_state)
    seen = []
    for step in job.steps(start, 6):
        state = step_fn(state)
        job.save(step, state)
        job.memory.tier.wait()
        seen.append(len(list((shm / "own").iterdir())))
    assert seen[-2] >= 1  # copies while it ran
    assert list((shm / "own").iterdir()) == []  # none once it finished
