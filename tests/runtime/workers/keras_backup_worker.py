"""Keras's own ``BackupAndRestore`` docstring example and a mid-epoch variant, with
``reprieve.keras.BackupAndRestore``: one process fits, an exception stops it, and the same process fits again.

``python keras_backup_worker.py docstring BACKUP_DIR``: the docstring's example verbatim (the drop-in in place of
Keras's callback); prints ``history <len(history)>``.

``python keras_backup_worker.py midepoch BACKUP_DIR OUT EPOCH BATCH SAVE_FREQ``: a shuffled fit through a Dropout
layer, interrupted by an exception in ``on_train_batch_begin`` at batch BATCH of epoch EPOCH, then fit again;
prints which epochs and batches the second fit trained, writes its weights to ``OUT/resumed.npz`` and those of
an uninterrupted fit (no callback) to ``OUT/reference.npz``; ``SAVE_FREQ`` ``epoch``, ``false`` or an int.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np
from reprieve.keras import BackupAndRestore


def docstring(backup_dir: str) -> None:
    class InterruptingCallback(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            if epoch == 4:
                raise RuntimeError('Interrupting!')
    callback = BackupAndRestore(backup_dir=backup_dir)
    model = keras.models.Sequential([keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(), loss='mse')
    model.build(input_shape=(None, 20))
    try:
        model.fit(np.arange(100).reshape(5, 20), np.zeros(5), epochs=10,
                  batch_size=1, callbacks=[callback, InterruptingCallback()],
                  verbose=0)
    except:  # noqa: E722, S110 - the docstring's own
        pass
    history = model.fit(np.arange(100).reshape(5, 20), np.zeros(5),
                        epochs=10, batch_size=1, callbacks=[callback],
                        verbose=0)
    print("history", len(history.history['loss']))


class Interrupt(keras.callbacks.Callback):
    def __init__(self, epoch: int, batch: int) -> None:
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, -1

    def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
        self.current = epoch

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if (self.current, batch) == (self.epoch, self.batch):
            raise RuntimeError(f"interrupted at epoch {self.epoch}, batch {batch}")


class Trained(keras.callbacks.Callback):
    """The (epoch, batch) pairs ``fit`` trained (the drop-in's skipped batches have empty logs)."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch, self.seen = -1, []  # type: ignore[var-annotated]

    def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if logs:
            self.seen.append((self.epoch, batch))


def model() -> keras.Model:
    keras.utils.set_random_seed(0)  # weights, Dropout's SeedGenerator, NumPy's shuffle: one seed for both runs
    m = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    m.compile(keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    m.build((None, 8))
    return m


def midepoch(backup_dir: str, out: str, epoch: int, batch: int, save_freq: str) -> None:
    x = np.random.RandomState(1).normal(size=(64, 8)).astype("float32")
    y = (x @ np.arange(8.0, dtype="float32") + 1.0)[:, None]
    freq: str | int = {"epoch": "epoch", "false": False}.get(save_freq, save_freq)
    freq = int(freq) if isinstance(freq, str) and freq.isdigit() else freq
    ref = model()
    ref.fit(x, y, epochs=3, batch_size=8, verbose=0)
    np.savez(os.path.join(out, "reference.npz"), *[np.asarray(v.value) for v in ref.weights])
    m = model()
    callback = BackupAndRestore(backup_dir, save_freq=freq)
    try:
        m.fit(x, y, epochs=3, batch_size=8, verbose=0, callbacks=[callback, Interrupt(epoch, batch)])
    except RuntimeError as err:
        print("first fit:", err)
    print("backup after the exception:", json.dumps(sorted(os.listdir(backup_dir))))
    trained = Trained()
    history = m.fit(x, y, epochs=3, batch_size=8, verbose=0, callbacks=[callback, trained])
    print("trained", json.dumps(trained.seen))
    print("history", len(history.history["loss"]))
    print("backup exists after fit:", os.path.exists(backup_dir))
    np.savez(os.path.join(out, "resumed.npz"), *[np.asarray(v.value) for v in m.weights])


if __name__ == "__main__":
    if sys.argv[1] == "docstring":
        docstring(sys.argv[2])
    else:
        midepoch(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
