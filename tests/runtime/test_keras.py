"""reprieve.keras.ReprieveCallback: real ``model.fit`` processes (Keras 3, JAX backend) under the runtime; a notice
at a random batch, the exit with the restart code, the restart resumes at the next batch: the final weights are
bitwise those of a fit that was never interrupted (also with the memory tier on). Bad input: another backend, another
model. A fit is a process (~2 s of start-up): the uninterrupted fits (``refs``), the notice run and the in-process
checks (``checks``) run once for the module, and every test that proves something about them reads their output."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from localcluster.testing import wait_for

from tests.runtime import helpers_memtier
from tests.runtime.helpers_agreement import REPO, launch, node_notice, write_notice_file
from tests.runtime.test_cli import reprieve
from tests.runtime.test_notice_kube import POD, _apply, _configmap, _identity

WORKER = REPO / "tests" / "runtime" / "workers" / "keras_worker.py"
BACKUP_WORKER = REPO / "tests" / "runtime" / "workers" / "keras_backup_worker.py"
BATCHES = 16  # 128 samples, batch_size 8
RESTART = 42

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240),
              pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras is not installed "
                                 "(pip install reprieve[keras])")]


def fit(workdir: Path, ckpt: Path, attempt: int = 1, **env: str) -> subprocess.CompletedProcess[str]:
    """One attempt of the worker's ``model.fit`` as its own process (what ``reprieve run`` starts)."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "KUBERNETES_", "WORKER_"))}
    base.update({"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
                 "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "WORKER_DIR": str(workdir),
                 "REPRIEVE_CHECKPOINT_URI": str(ckpt), "REPRIEVE_ATTEMPT": str(attempt),
                 "REPRIEVE_NOTICE_POLL_SECONDS": "0.1", "REPRIEVE_SAVE_SECONDS_ESTIMATE": "1", **env})
    return subprocess.run([sys.executable, str(WORKER)], env=base, capture_output=True, text=True, timeout=180,
                          check=False)


class References:
    """Uninterrupted fits, each run once for the module (a fit is a process: ~2 s of start-up) and compared with by
    every test that resumes the same fit."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[tuple[tuple[str, str], ...], Path] = {}

    def one(self, **env: str) -> Path:
        """``final-1.npz`` of a one-process fit with the worker's ``env``."""
        key = tuple(sorted(env.items()))
        if key not in self._made:
            workdir = self.root / f"one-{len(self._made)}"  # a directory per fit: its own checkpoints
            ref = fit(workdir, workdir / "ckpt", **env)
            assert ref.returncode == 0, ref.stderr[-3000:]
            self._made[key] = workdir / "final-1.npz"
        return self._made[key]

    def two(self) -> Path:
        """``final-1.npz`` of the fit on 2 processes (``keras.distribution.DataParallel``)."""
        key = (("processes", "2"),)
        if key not in self._made:
            ref = launch(self.root / "two", 2, worker=WORKER, extra_env={"KERAS_BACKEND": "jax"})
            assert ref.wait(200) == [0, 0], ref.tail()
            self._made[key] = self.root / "two" / "final-1.npz"
        return self._made[key]


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> References:
    return References(tmp_path_factory.mktemp("keras-refs"))


def weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def assert_bitwise(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert len(wa) == len(wb)
    for i, (x, y) in enumerate(zip(wa, wb, strict=True)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), f"weight {i} differs"


@dataclass
class NoticeRun:
    """Three attempts of one fit: a notice mid-epoch 1, a notice pending while the second restores, the third to the
    end; ``after_first``: a copy of the checkpoints as the first attempt left them."""

    run: Path
    after_first: Path
    attempts: list[subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def notice_run(tmp_path_factory: pytest.TempPathFactory) -> NoticeRun:
    root = tmp_path_factory.mktemp("keras-notice")
    run, ckpt = root / "run", root / "ckpt"
    at = random.randint(BATCHES + 2, 2 * BATCHES - 6)  # mid-epoch 1 (the agreed step is a few batches later)
    first = fit(run, ckpt, 1, WORKER_NOTICE_AT=str(at))
    if ckpt.exists():
        shutil.copytree(ckpt, root / "after-first")
    # the next attempt finds a notice already pending (the notice file, deadline 2 s away, delivered to attempt 2
    # as the operator names it, so it is saved at once even when the deadline passed while the process started, as
    # on a loaded run): it restores, saves again at once and exits with the restart code; the one after that trains
    # to the end
    notices = root / "annotations"
    write_notice_file(notices, {**node_notice("maintenance", "node-a", time.time() + 2.0), "attempt": 2})
    attempts = [first] + [fit(run, ckpt, a, REPRIEVE_NOTICE_FILE=str(notices)) for a in (2, 3)]
    return NoticeRun(run, root / "after-first", attempts)


def test_a_notice_mid_epoch_then_a_notice_during_the_restore_resume_at_the_exact_batch(
        notice_run: NoticeRun, refs: References) -> None:
    """Shuffled arrays and a Dropout layer (NumPy's permutation and Keras's SeedGenerator both resume)."""
    first, second, third = notice_run.attempts
    assert first.returncode == RESTART, first.stderr[-3000:]
    assert "agreed checkpoint at step" in first.stderr and not (notice_run.run / "final-1.npz").exists()
    assert second.returncode == RESTART, second.stderr[-3000:]
    assert "resuming fit at epoch" in second.stderr, second.stderr[-3000:]
    assert third.returncode == 0, third.stderr[-3000:]
    assert "resuming fit at epoch" in third.stderr and "batch-exact for arrays;" in third.stderr
    assert_bitwise(refs.one(), notice_run.run / "final-3.npz")


def test_fit_under_reprieve_run_resumes_at_the_exact_batch_after_a_sigterm(tmp_path: Path, refs: References) -> None:
    """What a laptop user runs: ``reprieve run -- python train.py``; a SIGTERM mid-epoch of attempt 1 (as the platform
    sends) is a notice: the agreed batch saved, the restart code, ``reprieve run`` starts attempt 2, which resumes
    fit at the next batch: the final weights bitwise those of a fit never interrupted."""
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "KUBERNETES_", "WORKER_"))}
    env.update({"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "WORKER_DIR": str(run),
                "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1",
                "REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_SAVE_SECONDS_ESTIMATE": "1",
                "WORKER_NOTICE_AT": str(random.randint(BATCHES + 2, 2 * BATCHES - 6)), "WORKER_NOTICE_ATTEMPT": "1",
                "WORKER_NOTICE_SIGTERM": "1", "REPRIEVE_TERMINATION_GRACE_SECONDS": "2"})  # a near deadline: save now
    got = subprocess.run([str(Path(sys.executable).parent / "reprieve"), "run", "--", sys.executable, str(WORKER)],
                         env=env, capture_output=True, text=True, timeout=200, check=False)
    assert got.returncode == 0, got.stderr[-4000:]
    assert "attempt 1: the agreed checkpoint is committed: restart wanted; restarting" in got.stderr, got.stderr[-4000:]
    assert "resuming fit at epoch" in got.stderr and not (run / "final-1.npz").exists(), got.stderr[-4000:]
    assert_bitwise(refs.one(), run / "final-2.npz")


def test_a_notice_written_into_the_jobs_notice_object_ends_fit_at_the_agreed_batch(cluster: Any, namespace: str,
                                                                                     tmp_path: Path) -> None:
    """The operator's route on a cluster: one write of the job's notice object (the ConfigMap ``job-notice``; the
    worker holds exactly the per-job Role), heard by the runtime's watch against a real kube-apiserver while fit is
    mid-epoch 1, ends fit at the agreed batch: that batch committed, the restart code. (The resume from such a save
    is the other tests' own.)"""
    client = _identity(cluster, namespace, tmp_path, notice_object="job-notice")
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    env = {"REPRIEVE_JOB": "job", "REPRIEVE_POD_NAME": POD, "REPRIEVE_NAMESPACE": namespace,
           "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cluster.api_port),
           "REPRIEVE_SERVICEACCOUNT_DIR": client.sa_dir, "WORKER_NOTICE_AT": str(BATCHES + 4),
           "WORKER_NOTICE_OUTSIDE": "1"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        attempt = pool.submit(fit, run, ckpt, 1, **env)
        wait_for(lambda: (run / "waiting").exists() or attempt.done(), 120, "fit to reach batch 4 of epoch 1")
        notice = {**node_notice("maintenance", "node-a", time.time() + 1.0), "id": "maintenance/node-a/keras",
                  "attempt": 1}
        _apply(cluster, namespace, [_configmap("job-notice", notice)])
        first = attempt.result()
    assert first.returncode == RESTART, first.stderr[-3000:]
    assert "(notice maintenance/node-a/keras, maintenance)" in first.stderr, first.stderr[-3000:]
    agreed = agreed_step(first.stderr)
    assert agreed >= BATCHES + 3 and (ckpt / f"step_{agreed:010d}_a1").is_dir(), (agreed, sorted(os.listdir(ckpt)))
    assert not (run / "final-1.npz").exists()


def agreed_step(log: str) -> int:
    """The first agreed save step a process logged."""
    return int(log.split("agreed save step ")[1].split()[0])


def agreed_steps(logs: list[Path]) -> set[int]:
    """The agreed save step each process logged (one value when they agree)."""
    return {agreed_step(log.read_text()) for log in logs}


@pytest.mark.timeout(420)
def test_two_processes_with_keras_distribution_agree_save_and_resume_bitwise_through_a_notice_during_the_restore(
        tmp_path: Path, refs: References) -> None:
    """``keras.distribution.DataParallel`` over 2 real ``jax.distributed`` processes (each feeds its half of the
    samples, 8 batches an epoch); process 0 is notified mid-epoch 1: both save the one agreed step, exit with the
    restart code; the next attempt finds a notice pending while it restores (the operator's, through the notice
    file, to both): both resume at the next batch, agree on one step again and exit with the restart code; the
    third resumes from that step and ends bitwise equal to an uninterrupted fit."""
    env = {"KERAS_BACKEND": "jax"}
    run = tmp_path / "run"
    first = launch(run, 2, worker=WORKER, extra_env=env,
                   process_env={0: {"WORKER_NOTICE_AT": str(random.randint(9, 13))}})
    assert first.wait(200) == [RESTART] * 2, first.tail()
    agreed = agreed_steps(first.logs)
    assert len(agreed) == 1, agreed
    notices = tmp_path / "annotations"
    write_notice_file(notices, {**node_notice("maintenance", "node-a", time.time() + 2.0), "attempt": 2})
    second = launch(run, 2, worker=WORKER,
                    extra_env={**env, "REPRIEVE_ATTEMPT": "2", "REPRIEVE_NOTICE_FILE": str(notices)})
    assert second.wait(200) == [RESTART] * 2, second.tail()
    (step,) = agreed
    for log in second.logs:
        assert f"resuming at step {step + 1}" in log.read_text(), second.tail()
    again = agreed_steps(second.logs)
    assert len(again) == 1 and min(again) > step, (step, again)  # one step, after the restored one
    (step,) = again
    third = launch(run, 2, worker=WORKER,
                   extra_env={**env, "REPRIEVE_ATTEMPT": "3", "REPRIEVE_NOTICE_FILE": str(notices)})
    assert third.wait(200) == [0, 0], third.tail()
    for log in third.logs:
        assert f"resuming at step {step + 1}" in log.read_text(), third.tail()
    assert_bitwise(refs.two(), run / "final-3.npz")


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[list[helpers_memtier.Pod]]:
    """Two pods' memory directories on tmpfs and replica server ports (tests/runtime/helpers_memtier.py)."""
    base = helpers_memtier.shm_base(tmp_path)
    yield [helpers_memtier.new_pod(base, "pod-0"), helpers_memtier.new_pod(base, "pod-1")]
    helpers_memtier.kill_launched()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(420)
def test_two_processes_with_the_memory_tier_resume_from_memory_at_the_exact_batch(
        tmp_path: Path, refs: References, pods: list[helpers_memtier.Pod]) -> None:
    """The memory tier on (each process's copies in its pod's tmpfs and its peer's, every 3 batches), 2 processes,
    a notice mid-epoch 1: the agreed batch is saved to storage and, beside it, to memory on both; the next attempt
    restores it from memory (its own and the peer's, not storage), resumes at the next batch and ends bitwise equal
    to the uninterrupted fit."""
    peers: dict[int, helpers_memtier.Pod | None] = {0: pods[1], 1: pods[0]}
    env = {"KERAS_BACKEND": "jax"}
    first = helpers_memtier.launch(tmp_path, pods, peers, attempt=1, mem_every=3, ckpt_every=0, worker=WORKER,
                                   extra={0: {**env, "WORKER_NOTICE_AT": str(random.randint(9, 13)),
                                              "WORKER_NOTICE_LEAD": "5"}, 1: env})  # saved at once, with room
    # for the memory copy beside the storage save (docs/memory.md, "After a notice")
    assert first.wait(200) == [RESTART] * 2, first.tail(40)
    (step,) = agreed_steps(first.logs)
    for log in first.logs:
        assert f"agreed step {step}: memory copy committed" in log.read_text(), first.tail(40)
    second = helpers_memtier.launch(tmp_path, pods, peers, attempt=2, mem_every=3, ckpt_every=0, worker=WORKER,
                                    extra={0: env, 1: env})
    assert second.wait(200) == [0, 0], second.tail(40)
    text = second.logs[0].read_text()
    restored = re.search(r"restored step (\d+) on process 0 from (\S+) .*\(gang: ([^)]*)\)", text)
    assert restored, text[-3000:]
    assert (int(restored.group(1)), restored.group(3)) == (step, "0=memory, 1=memory"), restored.group(0)
    assert f"resuming fit at epoch {(step + 1) // 8}, batch {(step + 1) % 8} " in text, text[-3000:]
    assert_bitwise(refs.two(), tmp_path / "final-2.npz")


def test_a_model_built_by_fit_resumes_too(tmp_path: Path, refs: References) -> None:
    """A Sequential without an input shape is built by fit before the callbacks start: nothing to refuse. Its resumed
    fit ends bitwise equal to the uninterrupted fit of the same model built before fit (fit builds it alike)."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    first = fit(run, ckpt, 1, WORKER_BUILT="0", WORKER_EPOCHS="2", WORKER_NOTICE_AT=str(random.randint(3, 9)))
    assert first.returncode == RESTART, first.stderr[-3000:]
    second = fit(run, ckpt, 2, WORKER_BUILT="0", WORKER_EPOCHS="2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming fit at epoch 0" in second.stderr  # mid-epoch 0: BackupAndRestore would replay the epoch
    assert_bitwise(refs.one(WORKER_EPOCHS="2"), run / "final-2.npz")


# Four checks of the callback in one process (one start-up of JAX and Keras), each its own job and directory:
# ASYNC and VALIDATION (two fits) print what they saw; UNBUILT, last, ends the process with its error.
UNBUILT = """
model = keras.Sequential([keras.layers.Dense(4)], name="unbuilt")
model.compile("adam", loss="mse")
callback = ReprieveCallback(reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": ROOT + "/unbuilt"}, install_sigterm=False))
callback.set_model(model)
callback.set_params({"epochs": 1, "steps": 4, "verbose": 0})
print("unbuilt: on_train_begin")
callback.on_train_begin()
"""

ASYNC = """
import threading
import keras, numpy as np, reprieve
from reprieve.keras import BackupAndRestore, ReprieveCallback

class Where(keras.callbacks.Callback):
    async_safe = True  # Keras may run its batch ends on a thread
    def __init__(self):
        super().__init__()
        self.main = set()
    def on_train_batch_end(self, batch, logs=None):
        self.main.add(threading.current_thread() is threading.main_thread())

for name, make in (("ReprieveCallback", lambda root: ReprieveCallback(reprieve.init(
                       env={"REPRIEVE_CHECKPOINT_URI": root + "/ckpt"}, install_sigterm=False))),
                   ("BackupAndRestore", lambda root: BackupAndRestore(root + "/backup", save_freq=2))):
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile("sgd", loss="mse")
    where = Where()
    model.fit(np.zeros((16, 4)), np.zeros((16, 1)), batch_size=4, epochs=2, verbose=0,
              callbacks=[make(ROOT), where])
    print(name, "batch ends in the main thread:", sorted(where.main))
"""


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """ASYNC, VALIDATION, then UNBUILT, run in one process."""
    root = tmp_path_factory.mktemp("keras-checks")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "KUBERNETES_"))}
    env.update({"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-c", f"ROOT = {str(root)!r}\n{ASYNC}\n{VALIDATION}\n{UNBUILT}"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def checked(checks: subprocess.CompletedProcess[str], first: str | tuple[str, ...]) -> list[str]:
    """The lines a check printed, from ``first`` on; it ran to its end (the next check, UNBUILT the last, began)."""
    lines = checks.stdout.splitlines()
    assert "unbuilt: on_train_begin" in lines, checks.stdout + checks.stderr[-3000:]
    return [line for line in lines if line.startswith(first)]


def test_the_hooks_run_outside_fit_on_a_model_no_one_built_are_refused_naming_it(
        checks: subprocess.CompletedProcess[str]) -> None:
    """``fit`` builds an unbuilt model and its optimizer before the callbacks start, so through ``fit`` it is restored
    (the test above); the callback's hooks run by hand on a model whose variables do not exist say so, by name."""
    assert checks.returncode != 0
    assert checks.stdout.splitlines()[-1] == "unbuilt: on_train_begin", checks.stdout
    assert ("ValueError: reprieve.keras: model 'unbuilt' is not built at the start of fit (built=False, optimizer "
            "built=False)") in checks.stderr, checks.stderr[-3000:]


def test_keras_keeps_its_async_batch_end_dispatch_with_the_callbacks(checks: subprocess.CompletedProcess[str]) -> None:
    """Keras 3 runs the batch-end hooks on a thread unless a callback overrides them; ours decide each batch at the
    next one's begin, so an async-safe callback beside them still gets its batch ends off the training thread."""
    assert checked(checks, ("ReprieveCallback", "BackupAndRestore")) == [
        "ReprieveCallback batch ends in the main thread: [False]",
        "BackupAndRestore batch ends in the main thread: [False]"], checks.stdout


VALIDATION = """
import keras, numpy as np, reprieve
from reprieve.keras import ReprieveCallback

job = reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": ROOT + "/validation"}, install_sigterm=False)

class AtValidation(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.saved = []
    def on_test_begin(self, logs=None):
        self.saved.append(job.storage.last_saved)

x = np.ones((16, 4), "float32")
at = AtValidation()
model = keras.Sequential([keras.layers.Dense(1)])
model.compile("sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, validation_data=(x, x[:, :1]),
          callbacks=[ReprieveCallback(job, save_at_epoch_end=True), at])
print("saved when validation began:", at.saved)

stopping = reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": ROOT + "/stopped"}, install_sigterm=False)

class StopAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True

model = keras.Sequential([keras.layers.Dense(1)])
model.compile("sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=4, epochs=3, verbose=0,
          callbacks=[ReprieveCallback(stopping, save_at_epoch_end=True), StopAtEpochEnd()])
forced = stopping.metrics.get("reprieve_saves_total", kind="forced") or 0
print("stopped at an epoch's end: forced saves", int(forced), "committed", stopping.committed_step)
"""


def test_an_epochs_last_batch_is_decided_before_its_validation(checks: subprocess.CompletedProcess[str]) -> None:
    """The callback decides a batch at the next one's begin; the epoch's last is decided when validation begins
    (``on_test_begin``), not after it: an epoch-end save (or an agreed one) does not wait for the validation."""
    assert checked(checks, "saved") == ["saved when validation began: [3, 7]"], checks.stdout  # 4 batches an epoch


def test_a_fit_stopped_at_an_epochs_end_saves_its_last_batch_once(checks: subprocess.CompletedProcess[str]) -> None:
    """``save_at_epoch_end`` saves the epoch's last batch; a fit that a callback stops there (EarlyStopping at the
    epoch's end) does not save it a second time when it ends."""
    assert checked(checks, "stopped") == ["stopped at an epoch's end: forced saves 1 committed 3"], checks.stdout


def test_a_fit_stopped_by_a_callback_keeps_its_batch_and_epoch_end_saves_are_kept(tmp_path: Path,
                                                                                 refs: References) -> None:
    """EarlyStopping's way out (``model.stop_training``) mid-epoch: the batch it stopped at is saved and the job
    finished (exit 0); a later fit goes on from there, bitwise as if never stopped. With ``save_at_epoch_end``
    the last batch of each epoch is saved too."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    stopped = fit(run, ckpt, 1, WORKER_EPOCHS="2", WORKER_STOP_AT="21", WORKER_EPOCH_SAVES="1")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_0000000015_a1", "step_0000000020_a1"]
    # Reprieve's own format: the command reads it, the fit position is the data position
    described = json.loads(reprieve("inspect", f"{ckpt}@20", "--json").stdout)
    assert {k: described["data_positions"][0][k] for k in ("epoch", "batch", "batchesPerEpoch")} == \
        {"epoch": 1, "batch": 4, "batchesPerEpoch": BATCHES}, described["data_positions"]
    assert "['trainable']['sequential/dense/kernel']" in {leaf["path"] for leaf in described["leaves"]}, described
    verified = reprieve("verify", str(ckpt))
    assert verified.returncode == 0 and "step_0000000020_a1: OK" in verified.stdout, verified.stdout + verified.stderr
    again = fit(run, ckpt, 2, WORKER_EPOCHS="2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming fit at epoch 1, batch 5 (step 21" in again.stderr, again.stderr[-3000:]
    assert_bitwise(refs.one(WORKER_EPOCHS="2"), run / "final-2.npz")


def test_data_of_unknown_length_resumes_at_the_batch_and_says_it_is_exact_only_if_the_data_repeats(
        tmp_path: Path, refs: References) -> None:
    """A Python generator (``fit`` cannot know its length, nor the callback its position): the resume skips the
    trained batches of a fresh generator and says at start-up that it is batch-exact only if the data repeats its
    order; this one does, so the weights are bitwise those of an uninterrupted fit."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    first = fit(run, ckpt, 1, WORKER_GENERATOR="1", WORKER_NOTICE_AT=str(random.randint(3, 9)))
    assert first.returncode == RESTART, first.stderr[-3000:]
    agreed = agreed_step(first.stderr)
    second = fit(run, ckpt, 2, WORKER_GENERATOR="1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert (f"resuming fit at epoch 0, batch {agreed + 1} (step {agreed + 1}; batch-exact if the data repeats its "
            "order" in second.stderr), second.stderr[-3000:]
    assert_bitwise(refs.one(WORKER_GENERATOR="1"), run / "final-2.npz")


def test_another_model_another_batch_size_or_several_steps_per_execution_are_refused(
        tmp_path: Path, notice_run: NoticeRun) -> None:
    """Each against the checkpoint a notice left mid-epoch (the notice run's first attempt's, copied)."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    first = notice_run.attempts[0]
    assert first.returncode == RESTART, first.stderr[-3000:]
    shutil.copytree(notice_run.after_first, ckpt)
    other = fit(run, ckpt, 2, WORKER_EPOCHS="1", WORKER_MODEL="wide")
    assert other.returncode != 0
    assert "RunMismatchError" in other.stderr and ("['optimizer']['adam/sequential_dense_kernel_momentum']: [8, 16] in the checkpoint, [8, 24] here"
                                             in other.stderr), \
        other.stderr[-3000:]
    assert not (run / "final-2.npz").exists()
    # the same model fed in batches of 16: the saved batch is not the same place in the data
    batches = fit(run, ckpt, 3, WORKER_EPOCHS="1", WORKER_BATCH="16")
    assert batches.returncode != 0
    assert "written with 16 batches per epoch, this fit has 8" in batches.stderr, batches.stderr[-3000:]
    several = fit(run, ckpt, 4, WORKER_EPOCHS="1", WORKER_STEPS_PER_EXECUTION="2")
    assert several.returncode != 0
    assert "model.compile(steps_per_execution=2): ReprieveCallback needs 1" in several.stderr, several.stderr[-3000:]


def in_one_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The backup worker: fit, an exception, fit again, all in one process (a laptop, no ``REPRIEVE_*``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "KUBERNETES_", "WORKER_"))}
    env.update({"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
                "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    return subprocess.run([sys.executable, str(BACKUP_WORKER), *args], env=env, capture_output=True, text=True,
                          timeout=180, check=False)


def test_keras_backup_and_restore_docstring_example_runs_with_the_drop_in(tmp_path: Path) -> None:
    """Keras's own example, verbatim but for the class: interrupted at epoch 4, the second fit runs 6 epochs."""
    out = in_one_process("docstring", str(tmp_path / "backup"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["history", "6"], out.stdout + out.stderr[-3000:]
    assert "resuming fit at epoch 4, batch 0" in out.stderr
    assert not (tmp_path / "backup").exists()  # delete_checkpoint=True: removed when fit ended


@pytest.mark.parametrize(("save_freq", "resumed_at"), [("1", "batch k"), ("epoch", "the epoch's start")])
def test_backup_and_restore_resumes_in_the_same_process_at_the_exact_batch(tmp_path: Path, save_freq: str,
                                                                          resumed_at: str) -> None:
    """An exception in ``on_train_batch_begin`` at batch k of epoch 1; the second ``fit`` in the same process
    resumes at batch k (``save_freq=1``; Keras's own would replay the epoch) or, with ``"epoch"``, at the start of
    epoch 1; both end bitwise equal to an uninterrupted fit without the callback (shuffled data, Dropout)."""
    k = random.randint(1, 7)
    out = in_one_process("midepoch", str(tmp_path / "backup"), str(tmp_path), "1", str(k), save_freq)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"first fit: interrupted at epoch 1, batch {k}" in out.stdout, out.stdout + out.stderr[-3000:]
    first = k if save_freq == "1" else 0
    trained = json.loads(out.stdout.split("trained ")[1].splitlines()[0])
    assert trained == [[1, b] for b in range(first, 8)] + [[2, b] for b in range(8)], (resumed_at, trained)
    assert f"resuming fit at epoch 1, batch {first} " in out.stderr
    assert "backup exists after fit: False" in out.stdout
    assert_bitwise(tmp_path / "reference.npz", tmp_path / "resumed.npz")


def test_backup_and_restore_under_the_runtime_saves_the_agreed_batch_on_a_notice(tmp_path: Path,
                                                                                 refs: References) -> None:
    """The drop-in as the job's callback (``job=``, ``save_freq=False``): a notice mid-epoch ends in the agreed save
    and the restart code; the next process resumes at the next batch, bitwise, and the backup is deleted at the
    end."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    first = fit(run, ckpt, 1, WORKER_EPOCHS="2", WORKER_DROP_IN="1", WORKER_NOTICE_AT=str(random.randint(3, 9)))
    assert first.returncode == RESTART, first.stderr[-3000:]
    agreed = agreed_step(first.stderr)
    second = fit(run, ckpt, 2, WORKER_EPOCHS="2", WORKER_DROP_IN="1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming fit at epoch {(agreed + 1) // BATCHES}, batch {(agreed + 1) % BATCHES} " in second.stderr
    assert_bitwise(refs.one(WORKER_EPOCHS="2"), run / "final-2.npz")
    assert not ckpt.exists()


def test_another_backend_is_refused_at_import() -> None:
    env = {**os.environ, "KERAS_BACKEND": "numpy", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", "import reprieve.keras"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode != 0
    assert "Keras's backend must be 'jax', found 'numpy'" in out.stderr, out.stderr[-2000:]


def test_import_reprieve_does_not_import_keras() -> None:
    out = subprocess.run([sys.executable, "-c", ("import reprieve, sys; assert 'keras' not in sys.modules; "
                          "print(reprieve.keras.ReprieveCallback.__name__)")],
                         env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0 and out.stdout.split() == ["ReprieveCallback"], out.stderr[-2000:]
