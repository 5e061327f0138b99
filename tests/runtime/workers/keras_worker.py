"""A Keras 3 ``model.fit`` (JAX backend) under the runtime with ``reprieve.keras.ReprieveCallback``.

Environment: ``WORKER_DIR`` (writes ``final-<attempt>.npz``: the model's weights after fit), ``WORKER_EPOCHS``,
``WORKER_NOTICE_AT`` (the global batch, counted from this attempt's first, after which the worker notifies the job
of a notice due in ``WORKER_NOTICE_LEAD`` seconds), ``WORKER_SHUFFLE`` (fit's shuffle), ``WORKER_DROPOUT``,
``WORKER_MODEL`` (``dense``, or ``wide``: another model), ``WORKER_BUILT`` (1: built before fit, 0: fit builds it),
``WORKER_STOP_AT`` (the batch, counted as the notice's, after which another callback stops fit, as EarlyStopping
does), ``WORKER_EPOCH_SAVES`` (1: ``ReprieveCallback(save_at_epoch_end=True)``), ``WORKER_BATCH`` (fit's batch size, 8),
``WORKER_STEPS_PER_EXECUTION`` (compile's, 1), ``WORKER_DROP_IN`` (1: ``reprieve.keras.BackupAndRestore(job=job,
save_freq=False)`` in place of ``ReprieveCallback``), ``WORKER_GENERATOR`` (1: the samples from a Python generator, in
order, one epoch: data of unknown length), ``WORKER_NOTICE_ATTEMPT`` (the notice only in this attempt),
``WORKER_NOTICE_SIGTERM`` (1: the notice is a SIGTERM to the process, as the platform sends), ``WORKER_NOTICE_OUTSIDE``
(1: the notice comes from outside the process: at ``WORKER_NOTICE_AT`` the worker touches ``WORKER_DIR/waiting`` and
waits up to 60 s for the job to hear one).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import keras
import numpy as np
import reprieve
from reprieve.keras import BackupAndRestore, ReprieveCallback

from tests.runtime.helpers_agreement import worker_start


def data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.RandomState(1).normal(size=(128, 8)).astype("float32")
    return x, (x @ np.arange(8.0, dtype="float32") + 1.0)[:, None]


def model() -> keras.Model:
    width = 16 if os.environ.get("WORKER_MODEL", "dense") == "dense" else 24
    layers = [keras.layers.Dense(width, activation="relu")]
    if os.environ.get("WORKER_DROPOUT", "1") == "1":
        layers.append(keras.layers.Dropout(0.2))  # a SeedGenerator: the state holds its RNG
    m = keras.Sequential([*layers, keras.layers.Dense(1)])
    m.compile(keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"],
              steps_per_execution=int(os.environ.get("WORKER_STEPS_PER_EXECUTION", "1")))
    if os.environ.get("WORKER_BUILT", "1") == "1":
        m.build((None, 8))
    return m


class Stop(keras.callbacks.Callback):
    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.seen += 1
        if self.seen == self.at:
            self.model.stop_training = True


class Notice(keras.callbacks.Callback):
    def __init__(self, job: reprieve.Job, at: int, lead: float) -> None:
        super().__init__()
        self.job, self.at, self.lead, self.seen = job, at, lead, 0
        self.attempt = os.environ.get("REPRIEVE_ATTEMPT", "1")

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.seen += 1
        if self.seen == self.at and os.environ.get("WORKER_NOTICE_ATTEMPT", self.attempt) == self.attempt:
            outside = os.environ.get("WORKER_NOTICE_OUTSIDE") == "1"
            if outside:
                (Path(os.environ["WORKER_DIR"]) / "waiting").touch()  # the test sends the notice now
            elif os.environ.get("WORKER_NOTICE_SIGTERM") == "1":
                os.kill(os.getpid(), signal.SIGTERM)  # what the platform sends: the runtime takes it as a notice
            else:
                self.job.notify("test", time.time() + self.lead)
            # the agreement plans the save in its own thread: a 2 ms loop would otherwise reach the fit's last batch
            # before the plan exists and end with exit 0 (a 16-batch epoch took 32 ms)
            until = time.monotonic() + (60.0 if outside else 10.0)
            while self.job.agreement.target is None and time.monotonic() < until:
                time.sleep(0.01)


def main() -> None:
    _, workdir, _, _ = worker_start(0)
    job = reprieve.init()  # before the model: with several processes, jax.distributed is up before any variable
    if job.num_processes > 1:  # one data-parallel replica per process; each feeds its own half of the samples
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices(),
                                                                            auto_shard_dataset=False))
    keras.utils.set_random_seed(0)
    x, y = data()
    x, y = x[job.process_id::job.num_processes], y[job.process_id::job.num_processes]
    m = model()
    callbacks: list[keras.callbacks.Callback] = [
        BackupAndRestore(job.config.checkpoint_uri, save_freq=False, job=job)
        if os.environ.get("WORKER_DROP_IN") == "1" else
        ReprieveCallback(job, save_at_epoch_end=os.environ.get("WORKER_EPOCH_SAVES") == "1")]
    at = int(os.environ.get("WORKER_NOTICE_AT", "0"))
    if at:
        callbacks.append(Notice(job, at, float(os.environ.get("WORKER_NOTICE_LEAD", "0.5"))))
    stop = int(os.environ.get("WORKER_STOP_AT", "0"))
    if stop:
        callbacks.append(Stop(stop))
    batch = int(os.environ.get("WORKER_BATCH", "8"))
    if os.environ.get("WORKER_GENERATOR") == "1":  # fit cannot know how many batches it yields
        history = m.fit(((x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)), epochs=1, verbose=0,
                        callbacks=callbacks)
    else:
        history = m.fit(x, y, epochs=int(os.environ.get("WORKER_EPOCHS", "3")), batch_size=batch, verbose=0,
                        shuffle=os.environ.get("WORKER_SHUFFLE", "1") == "1", callbacks=callbacks)
    attempt = os.environ.get("REPRIEVE_ATTEMPT", "1")
    if job.process_id:
        return
    np.savez(workdir / f"final-{attempt}.npz", *[np.asarray(v.value) for v in m.weights])
    (workdir / f"epochs-{attempt}.txt").write_text(str(len(history.history.get("loss", []))))


if __name__ == "__main__":
    main()
