"""``ReprieveCallback``: Keras 3 ``model.fit`` (JAX backend) that saves at Reprieve's agreed step and resumes at
the exact next batch.

    job = reprieve.init()
    model.fit(x, y, epochs=10, callbacks=[reprieve.keras.ReprieveCallback(job)])

Install with ``pip install reprieve[keras]``; run with ``KERAS_BACKEND=jax``. One batch is one step of the job:
``on_train_batch_begin`` is the runtime loop's body, the decision for the batch before (``job.idle_step``, and
``job.save(step, state, data=position)`` when it says something may be due; with a
:class:`~reprieve.deferred.DeferredState`: the state dict is built only when the step is saved, so the cost does not
grow with the variables) and then ``next(steps)``; an epoch's last batch is decided before validation
(``on_test_begin``) or at ``on_epoch_end``. A notice ends in the agreed save on every process and the exit with the
restart code, and ``REPRIEVE_CHECKPOINT_INTERVAL_*`` gives periodic saves. The callback's ``on_train_batch_end``
does nothing and is marked as Keras's default, so it leaves Keras 3's async batch-end dispatch on (docs/keras.md). The state is the model's trainable, non-trainable
(Keras's ``SeedGenerator`` states among them: dropout resumes with the same masks), optimizer and metrics
variables, keyed by variable path, in Reprieve's own format (``reprieve ls/inspect/verify`` read it).

Resume: ``on_train_begin`` restores the variables and sets ``model._initial_epoch`` (as Keras's own
``BackupAndRestore`` does); for the first ``k`` batches of the resumed epoch ``fit``'s train function is
replaced by one that consumes the batch and trains nothing, so ``fit`` goes through the same batches in the same
order and trains from batch ``k`` on. NumPy's global generator (Keras shuffles arrays with
``np.random.permutation`` when an epoch's iterator starts) is saved as it was when the epoch began and put back
when the resumed epoch begins: the resumed epoch sees the same permutation. docs/keras.md says what is
restored and what is not.

``BackupAndRestore``: Keras 3's callback of that name (its arguments) on top of ``ReprieveCallback``, joining a job
per ``fit``, so a second ``fit`` after an exception, in the same process, resumes at the exact next batch too.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Generator, Mapping
from typing import Any, cast

import numpy as np

from .deferred import DeferredState
from .env import Env
from .job import Job

log = logging.getLogger(__name__)

GROUPS = ("trainable", "non_trainable", "optimizer", "metrics")  # the state's top-level keys
_JAX_STATE = {"trainable": "trainable_variables", "non_trainable": "non_trainable_variables",
              "optimizer": "optimizer_variables", "metrics": "metrics_variables"}  # keys of fit's model._jax_state


def _keras() -> Any:
    """Keras, on the JAX backend, or an error that says how to get it."""
    try:
        import keras
    except ImportError as err:
        raise ImportError(f"reprieve.keras: Keras could not be imported ({type(err).__name__}: {err}); install "
                          "it with `pip install reprieve[keras]` and choose its JAX backend with KERAS_BACKEND=jax "
                          f"(KERAS_BACKEND is {os.environ.get('KERAS_BACKEND', 'unset')!r})") from err
    backend = keras.backend.backend()
    if backend != "jax":
        raise ValueError(f"reprieve.keras: Keras's backend must be 'jax', found {backend!r}: set KERAS_BACKEND=jax "
                         "before Keras is imported (or \"backend\": \"jax\" in ~/.keras/keras.json)")
    return keras


class FitPosition:
    """Where ``fit`` is: the epoch, the last batch trained in it, and NumPy's global generator as it was when
    the epoch began. The job's data position (``get_state``/``set_state``), one per process."""

    def __init__(self) -> None:
        self.epoch = 0
        self.batch = -1
        self.batches_per_epoch: int | None = None
        self.numpy_rng: list[Any] | None = None

    def get_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch, "batchesPerEpoch": self.batches_per_epoch,
                "numpyRng": self.numpy_rng}

    def set_state(self, value: Any) -> None:
        if not isinstance(value, dict) or not {"epoch", "batch"} <= value.keys():
            raise ValueError(f"reprieve.keras: the checkpoint's data position is not ReprieveCallback's "
                             f"(expected {{epoch, batch, ...}}, found {str(value)[:200]}): it was not written by "
                             "model.fit with ReprieveCallback")
        self.epoch, self.batch = int(value["epoch"]), int(value["batch"])
        self.batches_per_epoch = value.get("batchesPerEpoch")
        self.numpy_rng = value.get("numpyRng")


def numpy_rng_state() -> list[Any]:
    """NumPy's global generator state as JSON (``np.random.get_state()``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()  # type: ignore[misc]
    return [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def set_numpy_rng_state(value: list[Any]) -> None:
    name, keys, pos, has_gauss, cached = value
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))


def resume_point(epoch: int, batch: int) -> tuple[int, int]:
    """``(initial_epoch, batches to skip)`` after the batch ``batch`` of epoch ``epoch`` was saved. The epoch is
    resumed even when ``batch`` was its last: its ``on_epoch_end`` (and validation) had not run before the exit."""
    return epoch, batch + 1


def _paths(variables: list[Any], group: str) -> list[str]:
    paths = [v.path for v in variables]
    seen: set[str] = set()
    for p in paths:
        if p in seen:
            raise ValueError(f"reprieve.keras: two {group} variables share the path {p!r}: the checkpoint keys "
                             "variables by path; give the layers distinct names")
        seen.add(p)
    return paths


keras = _keras()


class ReprieveCallback(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
    """A Keras callback that makes ``model.fit`` a Reprieve job: restore at ``on_train_begin``, a save decision
    after every batch, the agreed save and the exit with the restart code on a notice.

    Not a drop-in for ``keras.callbacks.BackupAndRestore``: that one expects the same process to call ``fit``
    again after an exception; a Reprieve job exits with the restart code and the next attempt (the operator,
    ``reprieve-supervisor`` or ``reprieve run``) resumes. :class:`BackupAndRestore` below is the drop-in.

    Args:
        job: the job (:func:`reprieve.init`); the callback calls ``restore_or``, ``steps``, ``save`` and
            ``finish`` on it, so the program calls none of them.
        save_at_epoch_end: also save after the last batch of every epoch (``BackupAndRestore``'s
            ``save_freq="epoch"``); off by default (``REPRIEVE_CHECKPOINT_INTERVAL_*`` are the periodic saves).

    Restores the four variable groups, the epoch, the batch and (for in-memory arrays) the order of the
    resumed epoch's batches. ``steps_per_execution`` must be 1; ``fit`` with ``initial_epoch`` set by hand is
    overridden by the checkpoint's epoch.
    """

    def __init__(self, job: Job, *, save_at_epoch_end: bool = False) -> None:
        super().__init__()
        self.job = job
        self.save_at_epoch_end = save_at_epoch_end
        self.position = FitPosition()
        self._paths: dict[str, list[str]] = {}
        self._keyed: tuple[tuple[str, tuple[str, ...], str], ...] = ()
        self._first: tuple[str, str, str] | None = None  # (group, path, fit's state key): the leaf _probe reads
        self._state = DeferredState(self._batch_state, self._probe)  # what job.save gets after every batch
        self._last_batch = -1  # the last batch of an epoch (-1: data of unknown length)
        self._force_at = -1  # the batch whose save is forced (the epoch's last with save_at_epoch_end)
        self._steps: Generator[int, None, None] | None = None
        self._step = -1
        self._pending = False  # the batch of self._step was trained and its save decision not yet made
        self._total: int | None = None
        self._skip = 0  # batches of the resumed epoch to go through without training
        self._resume_epoch: int | None = None
        self._restored: dict[str, Any] | None = None  # the metrics variables, put back when the epoch begins
        self._train_function: Any = None
        self._resumed_rng: list[Any] | None = None

    # state ----------------------------------------------------------------------------------------------
    def _variables(self) -> dict[str, list[Any]]:
        m = self.model
        return {"trainable": list(m.trainable_variables), "non_trainable": list(m.non_trainable_variables),
                "optimizer": list(m.optimizer.variables), "metrics": list(m.metrics_variables)}

    def current_state(self) -> dict[str, dict[str, Any]]:
        """The variables as ``{group: {path: jax.Array}}`` (the model's own values, outside a batch)."""
        return {g: {p: v.value for p, v in zip(self._paths[g], vs, strict=True)}
                for g, vs in self._variables().items()}

    def _batch_state(self) -> dict[str, dict[str, Any]]:
        """The state after the batch: fit keeps the new values in ``model._jax_state`` (Keras: "Setting _jax_state
        enables callbacks to force a state sync") and gives them to the variables only at the epoch's end."""
        js = getattr(self._model, "_jax_state", None)  # self.model would sync the variables at every batch
        if not js:
            return self.current_state()
        # fit builds these lists from the variables themselves: one array per path, in the same order
        return {g: dict(zip(paths, js[key])) for g, paths, key in self._keyed}

    def _probe(self) -> dict[str, dict[str, Any]]:
        """One leaf of :meth:`_batch_state`'s tree at its key path (the finished-step probe's, every batch): the
        first variable's, of the first group that has one."""
        js = getattr(self._model, "_jax_state", None)
        if not js or self._first is None:
            return {}  # outside a batch, or a model without variables: nothing computing to probe
        group, path, key = self._first
        return {group: {path: js[key][0]}}

    def _assign(self, state: dict[str, dict[str, Any]], groups: tuple[str, ...]) -> None:
        variables = self._variables()
        for g in groups:
            for path, var in zip(self._paths[g], variables[g], strict=True):
                var.assign(state[g][path])

    # hooks ------------------------------------------------------------------------------------------------
    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        if not model.built or model.optimizer is None or not model.optimizer.built:
            raise ValueError(f"reprieve.keras: model {model.name!r} is not built at the start of fit (built="
                             f"{model.built}, optimizer built={getattr(model.optimizer, 'built', None)}): build it "
                             "(model.build(input_shape) or call it on a batch) so its variables exist to restore")
        if getattr(model, "steps_per_execution", 1) != 1:
            raise ValueError(f"reprieve.keras: model.compile(steps_per_execution={model.steps_per_execution}): "
                             "ReprieveCallback needs 1 (one batch is one step of the job)")
        self.job = self._job_for_fit()
        self._paths = {g: _paths(vs, g) for g, vs in self._variables().items()}
        self._keyed = tuple((g, tuple(self._paths[g]), _JAX_STATE[g]) for g in GROUPS)  # _batch_state's table
        self._first = next(((g, paths[0], key) for g, paths, key in self._keyed if paths), None)
        per_epoch = self.params.get("steps")
        self._last_batch = -1 if per_epoch is None else int(per_epoch) - 1
        self._force_at = self._last_batch if self.save_at_epoch_end else -1
        epochs = int(self.params.get("epochs") or 1)
        self._total = None if per_epoch is None else epochs * int(per_epoch)
        self.position.batches_per_epoch = per_epoch
        restored = self.job.restore_or(self.current_state, data=self.position)
        state, first = restored
        if restored.step is None:
            log.info("reprieve.keras: no checkpoint: fit starts at epoch 0, batch 0 (%s batches per epoch)",
                     "unknown" if per_epoch is None else per_epoch)
            self.position = FitPosition()
            self.position.batches_per_epoch = per_epoch
        else:
            saved_per_epoch = restored.data.get("batchesPerEpoch") if isinstance(restored.data, dict) else None
            if per_epoch is not None and saved_per_epoch is not None and saved_per_epoch != per_epoch:
                raise ValueError(f"reprieve.keras: the checkpoint of step {restored.step} was written with "
                                 f"{saved_per_epoch} batches per epoch, this fit has {per_epoch}: the same batch "
                                 "size and data are needed to resume at the same batch")
            self._assign(state, ("trainable", "non_trainable", "optimizer"))
            epoch, skip = resume_point(self.position.epoch, self.position.batch)
            self._restored = state if skip else None  # resumed at an epoch's start: fit resets its metrics
            self._resume_epoch, self._skip = epoch, skip
            self._resumed_rng = self.position.numpy_rng
            model._initial_epoch = epoch
            # fit's arrays: their order is NumPy's (restored); a dataset or generator keeps its own position, which
            # the callback cannot see (fit does not hand it to callbacks): exact only if it repeats its batches
            exact = ("batch-exact for arrays; a dataset or generator must yield its batches in the same order again"
                     if per_epoch is not None else "batch-exact if the data repeats its order")
            log.info("reprieve.keras: resuming fit at epoch %d, batch %d (step %d; %s: the first %d batches of the "
                     "epoch are read and not trained%s)", epoch, skip, first, exact, skip,
                     "" if self._resumed_rng is not None else "; no NumPy generator state was saved")
            if skip:
                self._train_function = model.train_function
                model.train_function = _skip_batch
        self._step, self._pending = first - 1, False
        # a generator (Job.steps): closed when fit ends before its last step
        self._steps = cast(Generator[int, None, None], self.job.steps(first, self._total))

    def _job_for_fit(self) -> Job:
        """The job this ``fit`` runs as (called once at each ``on_train_begin``)."""
        return self.job

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if epoch == self._resume_epoch:
            if self._resumed_rng is not None:
                set_numpy_rng_state(self._resumed_rng)  # before fit draws this epoch's permutation
            if self._restored is not None:
                self._assign(self._restored, ("metrics",))  # fit reset them just before this hook
                self._restored = None
        self.position.epoch, self.position.batch = epoch, -1
        self.position.numpy_rng = numpy_rng_state()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        # the runtime loop's body, in its order: the save decision for the batch trained last, then the next step
        # (fit's _jax_state still holds that batch's outputs: the train function has not run yet)
        if self._pending:
            if not self.job.idle_step(self._step, self._state):  # the interval's step, a notice: save decides
                self.job.save(self._step, self._state, data=self.position)
        else:  # the epoch's first batch, or a batch of the resumed epoch trained before the restart
            if batch < self._skip:
                return
            if self._skip:
                self._stop_skipping()
            self._pending = True
        self._step = next(self._steps)  # type: ignore[arg-type]  # set at on_train_begin, before any batch
        self.position.batch = batch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        """Nothing: the batch is decided at the next ``on_train_batch_begin``. Overridden only to skip the base's
        forward to ``on_batch_end`` (a second call per batch when Keras dispatches in the training thread), and
        marked as Keras's default (``keras.src.utils.python_utils.default``) so that Keras keeps its async batch-end
        dispatch as if it were not overridden."""

    on_train_batch_end._is_default = True  # type: ignore[attr-defined]

    def _decide(self) -> None:
        """The save decision for the epoch's last batch trained, if not made yet: before validation replaces fit's
        ``_jax_state`` (``on_test_begin``) or at the epoch's end; forced at the epoch's last batch with
        ``save_at_epoch_end``."""
        if self._pending:
            self._pending = False
            self._save(force=self.position.batch == self._force_at)

    def _save(self, *, force: bool) -> bool:
        """The save decision for the last batch trained (``job.save``: True when a save was started)."""
        return self.job.save(self._step, self._state, data=self.position, force=force)

    def on_test_begin(self, logs: Any = None) -> None:
        self._decide()  # fit's validation: evaluate sets _jax_state to its own, then None

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._decide()
        if self._skip:
            self._stop_skipping()  # every batch of the resumed epoch had been trained

    def on_train_end(self, logs: Any = None) -> None:
        if self._steps is None:
            return
        steps, self._steps = self._steps, None
        if self._total is not None and self._step == self._total - 1:
            next(steps, None)  # the last step was saved (the job's last-step save): the generator finishes the job
            return
        steps.close()
        # stopped early (EarlyStopping) or data of unknown length: keep where it ended, unless saved already (an
        # epoch-end save of the batch it stopped at)
        if self._step >= 0 and self.job.storage.last_saved != self._step:
            self.job.save(self._step, self.current_state(), data=self.position, force=True)
        self.job.finish()

    def _stop_skipping(self) -> None:
        self._skip = 0
        self._resume_epoch = None
        self._model.train_function = self._train_function
        self._train_function = None


def _skip_batch(state: Any, iterator: Any) -> tuple[dict[str, Any], Any]:
    """``fit``'s train function for a batch already trained before the restart: the batch is read from fit's
    iterator (the train function pulls it), the state is unchanged."""
    next(iterator)
    return {}, state


def backup_uri(environ: Mapping[str, str], backup_dir: str) -> str:
    """Where :class:`BackupAndRestore` keeps its checkpoints: ``REPRIEVE_CHECKPOINT_URI`` when the environment names
    one (the operator sets it: a pod's local ``backup_dir`` would not outlive the pod), else ``backup_dir``."""
    return Env(environ).text("REPRIEVE_CHECKPOINT_URI", backup_dir)


def backup_env(environ: Mapping[str, str], uri: str, save_freq: str | int) -> dict[str, str]:
    """The environment :class:`BackupAndRestore` joins its jobs with: the checkpoints under ``uri``, and an int
    ``save_freq`` N as ``REPRIEVE_CHECKPOINT_INTERVAL_STEPS`` (after every N-th batch, counted from the start of
    ``fit``'s first epoch, so every process saves the same one); ``"epoch"`` and ``False`` leave the environment's
    intervals as they are."""
    env = {**environ, "REPRIEVE_CHECKPOINT_URI": uri}
    if isinstance(save_freq, (str, bool)):
        return env
    return {**env, "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": str(save_freq)}


def local_dir(uri: str) -> str | None:
    """The local directory of a checkpoint URI (a path or ``file://``), None for object storage."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return None if "://" in uri else uri


class BackupAndRestore(ReprieveCallback):
    """A drop-in for ``keras.callbacks.BackupAndRestore`` (Keras 3's arguments) that resumes at the exact next
    batch, in the same process and in the next one.

    When ``fit`` stops with an exception, the next ``fit`` with this callback (in the same process, as Keras's
    docstring example does, or in the next process) restores the last save and resumes at the batch after it;
    Keras's own restores only the epoch. Under ``reprieve run`` or the operator it is a :class:`ReprieveCallback`:
    a notice ends in the agreed save on every process and the exit with the restart code.

    Args:
        backup_dir: where the checkpoints go (Reprieve's format), unless ``REPRIEVE_CHECKPOINT_URI`` is set: the
            operator's URI wins, as a pod's local directory would not outlive the pod.
        save_freq: ``"epoch"`` saves at the end of every epoch (after its validation; the resume starts the next
            epoch), an int N after every N batches, ``False`` only on a notice (and after the last batch).
        double_checkpoint: accepted for Keras's signature; Reprieve keeps ``REPRIEVE_CHECKPOINT_KEEP`` (3)
            committed checkpoints and restores the newest committed one, so it changes nothing.
        delete_checkpoint: remove the checkpoints (a local ``backup_dir``) when ``fit`` ends normally.
        job: the job to run the first ``fit`` as (:func:`reprieve.init` before the model is built, needed with
            several processes); by default each ``fit`` joins its own with :func:`reprieve.init`.
    """

    def __init__(self, backup_dir: str, save_freq: str | int = "epoch", double_checkpoint: bool = False,
                 delete_checkpoint: bool = True, *, job: Job | None = None) -> None:
        if not backup_dir:
            raise ValueError("reprieve.keras.BackupAndRestore: backup_dir is empty: give the directory to keep "
                             "the checkpoints in")
        if not (save_freq == "epoch" or save_freq is False
                or (isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq >= 1)):
            raise ValueError(f"reprieve.keras.BackupAndRestore: save_freq must be 'epoch', an int >= 1 or False, "
                             f"got {save_freq!r}")
        super().__init__(cast(Job, job))  # None until the first fit joins its job (_job_for_fit)
        self.backup_dir, self.save_freq = backup_dir, save_freq
        self.double_checkpoint, self.delete_checkpoint = double_checkpoint, delete_checkpoint
        self.uri = job.config.checkpoint_uri if job is not None else backup_uri(os.environ, backup_dir)
        self._given = job
        interval = None if job is None else job.policy.interval_steps
        if job is not None and not isinstance(save_freq, (str, bool)) and interval != save_freq:
            raise ValueError(f"reprieve.keras.BackupAndRestore: save_freq={save_freq} but the job saves every "
                             f"{interval or 'no'} batches (REPRIEVE_CHECKPOINT_INTERVAL_STEPS={interval or 0}): a "
                             "given job keeps its own interval; set the variable to match, or leave save_freq 'epoch'"
                             " or False")

    def _job_for_fit(self) -> Job:
        if self.save_freq == "epoch" and self.params.get("steps") is None:
            raise ValueError("reprieve.keras.BackupAndRestore: save_freq='epoch' needs fit to know the batches of an "
                             "epoch (arrays, or steps_per_epoch=), found data of unknown length: give an int "
                             "save_freq")
        given, self._given = self._given, None
        if given is not None:
            return given
        previous = self.job
        if previous is not None and not previous.phase.terminal:
            # the last fit ended with an exception (Keras calls no hook then): wait for its saves' commit
            if previous.num_processes > 1:
                raise RuntimeError("reprieve.keras.BackupAndRestore: fit again after an exception in a job of "
                                   f"{previous.num_processes} processes: not supported (jax.distributed joins once "
                                   "a process); let the process end, the next attempt resumes")
            if self._skip:
                self._stop_skipping()  # the exception came while the resumed epoch skipped its trained batches
            if self._steps is not None:
                self._steps.close()
                self._steps = None
            previous.finish()
        from .bootstrap import init

        return init(env=backup_env(os.environ, self.uri, self.save_freq))

    def on_test_begin(self, logs: Any = None) -> None:
        if self.save_freq != "epoch":  # "epoch": the epoch's last batch is decided at on_epoch_end, after validation
            super().on_test_begin(logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.save_freq != "epoch":
            super().on_epoch_end(epoch, logs)
            return
        skipped_all = bool(self._skip)  # the whole resumed epoch had been trained: its last batch is saved
        pending, self._pending = self._pending, False  # decided here, once the epoch has ended
        super().on_epoch_end(epoch, logs)
        if skipped_all or not pending:
            return
        self.position.epoch, self.position.batch = epoch + 1, -1  # the resume starts the next epoch
        self.position.numpy_rng = numpy_rng_state()  # what the next epoch's permutation is drawn from
        self._save(force=True)

    def on_train_end(self, logs: Any = None) -> None:
        super().on_train_end(logs)
        if not self.delete_checkpoint:
            return
        where = local_dir(self.uri)
        if where is None:
            log.info("reprieve.keras: delete_checkpoint: %s is not a local directory: kept", self.uri)
        elif self.job.process_id == 0 and os.path.isdir(where):
            shutil.rmtree(where)
            log.info("reprieve.keras: fit finished: deleted the backup %s", where)
