"""``OrbaxCheckpointer``: Reprieve's notices, agreed step, fencing and progress on Orbax's on-disk format.

For teams that keep Orbax (its format, ``orbax.checkpoint.CheckpointManager`` tooling, MaxText's layout)::

    job = reprieve.init(checkpointer=lambda cfg, coord: OrbaxCheckpointer(cfg.checkpoint_uri, coordinator=coord,
                                                                         attempt=cfg.attempt))

Install with ``pip install reprieve[orbax]``. Every checkpoint is an ordinary Orbax step directory holding two
items: ``state`` (``StandardSave`` of the train state) and ``reprieve`` (JSON: the attempt that wrote it, the
job's ``extra`` and every process's data position), so ``ocp.CheckpointManager(uri).restore(step,
args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))`` reads it without Reprieve.

Fencing follows :mod:`reprieve.checkpoint.fencing`: each attempt writes ``reprieve_attempts/attempt_<A>.json``
(the steps visible when it started) beside the step directories; a step written by attempt ``a`` is visible iff
no newer attempt has a fence, or the step is in the first newer fence. A stale writer's save fails with
``FencedError`` once it sees a newer fence, and whatever it commits after the fence is never restored and is
deleted when the next attempt starts. Orbax restores without Reprieve's fallback and quarantine (those belong
to the default :class:`~reprieve.checkpoint.CheckpointManager`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

from .checkpoint import fencing
from .checkpoint.fencing import FencedError
from .checkpoint.layout import ORBAX_FENCES_DIR, fence_name, parse_fence_name
from .checkpoint.manager import RestoreResult
from .coordination import Coordinator, LocalCoordinator
from .data import to_json_value
from .env import env_attempt

log = logging.getLogger(__name__)

FENCES_DIR = ORBAX_FENCES_DIR
RECORD_FILE = "reprieve/metadata"  # where Orbax's JsonSave puts the ``reprieve`` item of a step
_KV = "reprieve/orbax"


class _OrbaxInfo(logging.Filter):
    """Drops Orbax's records below WARNING (Orbax logs through absl's ``absl`` logger, from its own files)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


class _OrbaxLeftovers(logging.Filter):
    """Moves asyncio's "exception was never retrieved" for Orbax's own futures to DEBUG: when one leaf of a restore
    fails, the others' failures are left unread in Orbax's event loop and asyncio logs each at garbage collection,
    with its TensorStore spec and a stack, after the restore's own line already said what failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or "never retrieved" not in str(record.msg) or not _a_read_of_orbax(exc):
            return True
        log.debug("orbax left a failed read unretrieved: %s", cause_line(f"{type(exc).__name__}: {exc}"))
        return False


def _a_read_of_orbax(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed read of Orbax's: raised through Orbax's or TensorStore's code, or, when the
    future was failed from TensorStore's C++ side with no Python frame at all, TensorStore's own words (a suite run
    saw such a leftover at ERROR beside the restore's line)."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if f"{os.sep}orbax{os.sep}" in name or f"{os.sep}tensorstore{os.sep}" in name:
            return True
        tb = tb.tb_next
    return exc.__traceback__ is None and bool(_TENSORSTORE_WORDS.search(str(exc)))


_TENSORSTORE_WORDS = re.compile(r'tensorstore_spec|Error opening "\w+" driver|in OCDBT database')


_QUIET = _OrbaxInfo()
_LEFTOVERS = _OrbaxLeftovers()


def quiet_orbax(quiet: bool = True) -> None:
    """Keep Orbax's INFO and DEBUG lines out of the program's log (``quiet``), and asyncio's reports of the failed
    reads a failed restore leaves behind (:class:`_OrbaxLeftovers`), or let them through again. Process-wide:
    Orbax's records all pass through absl's one ``absl`` logger, the leftovers through ``asyncio``'s."""
    for logger, filt in ((logging.getLogger("absl"), _QUIET), (logging.getLogger("asyncio"), _LEFTOVERS)):
        if quiet and filt not in logger.filters:
            logger.addFilter(filt)
        elif not quiet:
            logger.removeFilter(filt)


def cause_line(verdict: str) -> str:
    """The first line of a restore's error, without the TensorStore spec Orbax's errors carry (hundreds of
    characters of JSON, sometimes over lines); at most 300 characters (pure)."""
    line = verdict.strip().splitlines()[0] if verdict.strip() else verdict
    line = _SPEC.sub("", line).rstrip()
    return line if len(line) <= 300 else line[:297] + "..."


_SPEC = re.compile(r"\s*\[tensorstore_spec=.*$")


def fallback_line(step: int, where: str, failed: dict[int, str], later: int | None) -> str:
    """The one line a step Orbax cannot restore gets (pure): the step, the processes it failed on and the first
    line of the first one's cause, what happens next and the command that moves it aside."""
    first = min(failed)
    procs = f"process {first}" if len(failed) == 1 else "processes " + ", ".join(map(str, sorted(failed)))
    nxt = f"falling back to step {later}" if later is not None else "no older step is left"
    return (f"orbax checkpoint step {step} at {where} cannot be restored on {procs} ({cause_line(failed[first])}; "
            f"the whole error at DEBUG): {nxt}; to keep it out of the way: mv {where} {where}.corrupt")


class OrbaxCheckpointer:
    """A :class:`reprieve.Checkpointer` over ``orbax.checkpoint.CheckpointManager`` (async saves).

    Args:
        directory: Orbax's root (a path or ``gs://``), e.g. ``REPRIEVE_CHECKPOINT_URI``.
        coordinator: the job's coordinator (``None``: one process).
        attempt: ``REPRIEVE_ATTEMPT``; ``None`` reads the environment (default 1).
        keep: Orbax's ``max_to_keep``.
        timeout_s: how long process 0 waits for the other processes' data positions at a save.
        options: extra ``ocp.CheckpointManagerOptions`` fields (``max_to_keep`` and async settings are set here).
        orbax_logs: let Orbax's own INFO and DEBUG lines through (about 80 per save and restore); by default only
            its warnings and errors reach the program's log (:func:`quiet_orbax`).
    """

    supports_process_extra = True

    def __init__(self, directory: str, *, coordinator: Coordinator | None = None, attempt: int | None = None,
                 keep: int = 3, timeout_s: float = 600.0, options: dict[str, Any] | None = None,
                 orbax_logs: bool = False) -> None:
        import orbax.checkpoint as ocp
        from etils import epath

        quiet_orbax(not orbax_logs)
        self._ocp = ocp
        self._coord = coordinator or LocalCoordinator()
        self.attempt = env_attempt() if attempt is None else int(attempt)
        # Orbax's background thread refuses a relative path ("Checkpoint path should be absolute") at the first
        # save, which may be the run's last: a local path is made absolute here, where the error would be seen.
        self._root = epath.Path(directory if "://" in directory else os.path.abspath(directory))
        self._timeout = timeout_s
        self._on_commit: Callable[[int], None] | None = None
        self._restore_check: Callable[[Any, Any, str], None] | None = None
        self._inflight: tuple[int, float] | None = None
        self.last_save_seconds: float | None = None
        self.committed_step: int | None = None
        self._restores = 0
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._finalized), **(options or {}))
        self._mgr = ocp.CheckpointManager(self._root, options=opts)
        self._startup()

    # -- fencing ------------------------------------------------------------------------------------
    def _fences(self) -> dict[int, frozenset[str]]:
        out: dict[int, frozenset[str]] = {}
        fdir = self._root / FENCES_DIR
        if not fdir.exists():
            return out
        for path in fdir.iterdir():
            attempt = parse_fence_name(path.name)
            if attempt is not None:
                out[attempt] = frozenset(json.loads(path.read_text())["visible"])
        return out

    def _written_by(self) -> dict[int, int]:
        """``{step: attempt}`` of every step directory Orbax lists (its ``reprieve`` item says the attempt).
        Read as the file Orbax's ``JsonSave`` wrote: ``CheckpointManager.restore`` may meet the other
        processes, and only process 0 lists."""
        self._mgr.reload()
        out = {}
        for step in self._mgr.all_steps():
            try:
                record = json.loads((self._root / str(step) / RECORD_FILE).read_text())
                out[step] = int(record["attempt"])
            except Exception as err:  # noqa: BLE001 - not ours, or unreadable: never restored
                log.warning("orbax checkpoint %s/%d has no readable reprieve record (%s): not restored", self._root,
                            step, err)
        return out

    def _visible(self) -> list[int]:
        written = self._written_by()
        fences = self._fences()
        out = []
        for step, attempt in written.items():
            later = fencing.newer_fences(fences, attempt)
            if not later or str(step) in fences[later[0]]:
                out.append(step)
        return sorted(out)

    def _startup(self) -> None:
        key = f"{_KV}/a{self.attempt}/init"
        if self._coord.process_id == 0:
            try:
                fences = self._fences()
                newer = fencing.newer_fences(fences, self.attempt)
                if newer:
                    raise FencedError(f"orbax checkpoints at {self._root}: attempt {self.attempt} is stale, "
                                      f"attempts {newer} have started; this writer must stop")
                visible = self._visible()
                fdir = self._root / FENCES_DIR
                if self.attempt not in fences:
                    fdir.mkdir(parents=True, exist_ok=True)
                    self._write_fence(json.dumps({"attempt": self.attempt, "visible": [str(s) for s in visible]}))
                else:  # a re-run of this attempt writes its fence again, byte for byte: the probe that the storage
                    self._write_fence((fdir / fence_name(self.attempt)).read_text())  # still takes writes, now
                stale = sorted(set(self._mgr.all_steps()) - set(visible))
            except Exception as err:
                self._coord.set(key, f"error: {type(err).__name__}: {err}", overwrite=True)
                raise
            self._coord.set(key, json.dumps(stale), overwrite=True)
        else:
            outcome = self._coord.get(key, self._timeout)
            if outcome.startswith("error"):
                raise (FencedError if "FencedError" in outcome else RuntimeError)(
                    f"orbax checkpointer init on process 0 failed: {outcome}")
            stale = json.loads(outcome)
        self._mgr.reload()
        for step in stale:  # every process: Orbax's delete meets the others
            log.info("orbax checkpoint %s/%d was written by a fenced-out attempt: deleting it", self._root, step)
            self._mgr.delete(step)

    def _write_fence(self, text: str) -> None:
        """This attempt's fence, written whole (a temporary file renamed): on a storage that takes no writes, an
        error that says so at init, not at the run's first (or last) save."""
        fdir = self._root / FENCES_DIR
        try:
            tmp = fdir / (fence_name(self.attempt) + ".tmp")
            tmp.write_text(text)
            tmp.replace(fdir / fence_name(self.attempt))  # over the fence a re-run writes again
        except OSError as err:
            raise OSError(err.errno, f"orbax checkpoints at {self._root}: attempt {self.attempt}'s fence cannot be "
                                     f"written ({type(err).__name__}: {err}), so no save of this run would commit; "
                                     "make the storage writable or set another REPRIEVE_CHECKPOINT_URI") from err

    # -- the Checkpointer protocol ------------------------------------------------------------------
    def set_commit_callback(self, on_commit: Callable[[int], None] | None) -> None:
        self._on_commit = on_commit

    def set_restore_check(self, check: Callable[[Any, Any, str], None] | None) -> None:
        """``check(reprieve_record, None, where)`` before a step is restored (the job's run identity check)."""
        self._restore_check = check

    def check_state(self, state: Any) -> None:
        """Raise the TypeError for a leaf no checkpoint can hold (a function, an arbitrary object), at once."""
        from .checkpoint.save import check_leaves

        check_leaves(state)

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None, process_extra: Any = None) -> None:
        """Start an async Orbax save of ``state`` (``extra`` and every process's ``process_extra`` in the
        ``reprieve`` item). Raises :class:`FencedError` once a newer attempt has started."""
        t0 = time.monotonic()
        pid, n = self._coord.process_id, self._coord.num_processes
        newer = fencing.newer_fences(self._fences(), self.attempt)
        if newer:
            raise FencedError(f"orbax checkpoint step {step} at {self._root}: attempts {newer} started after "
                              f"attempt {self.attempt}")
        record: dict[str, Any] = {"attempt": self.attempt, "step": step,
                                  "extra": to_json_value(extra or {}, f"checkpoint save step {step}: extra")}
        if process_extra is not None:
            value = json.dumps(to_json_value(process_extra, f"checkpoint save step {step}: process {pid}'s "
                                                            "process_extra"))
            base = f"{_KV}/a{self.attempt}/s{step}/extra"
            self._coord.set(f"{base}/{pid}", value, overwrite=True)
            if pid == 0:  # Orbax writes JSON items from the primary host only: it gathers every process's
                record["process_extra"] = [json.loads(self._coord.get(f"{base}/{p}", self._timeout))
                                           for p in range(n)]
        self.wait()  # one save in flight, as the default manager
        self._inflight = (step, t0)
        args = self._ocp.args.Composite(state=self._ocp.args.StandardSave(state),
                                        reprieve=self._ocp.args.JsonSave(record))
        self._mgr.save(step, args=args, force=True)

    def _finalized(self) -> None:
        if self._inflight is None:
            return
        step, t0 = self._inflight
        self.last_save_seconds = time.monotonic() - t0
        self.committed_step = step
        log.info("orbax checkpoint step %d committed, %.3fs save->commit", step, self.last_save_seconds)
        if self._on_commit is not None:
            self._on_commit(step)

    def wait(self) -> None:
        self._mgr.wait_until_finished()
        if self._inflight is not None and self.committed_step != self._inflight[0]:
            self._finalized()  # an Orbax version that did not call back: the commit is known now
        self._inflight = None

    def all_steps(self) -> list[int]:
        return self._visible()

    def latest_step(self) -> int | None:
        visible = self._visible()
        return visible[-1] if visible else None

    def restore(self, abstract_state: Any, *, step: int | None = None) -> RestoreResult:
        """Restore ``state`` onto ``abstract_state``'s shardings from the latest visible step (or ``step``);
        ``FileNotFoundError`` on every process when there is none.

        ``step=None``: a step that Orbax cannot restore (a missing or damaged file) is logged with the command that
        moves it aside, and the previous visible step is tried, as the default format's fallback does (without its
        quarantine: Orbax's errors do not tell damage from a passing storage failure, so nothing is renamed). All
        processes agree on each step's outcome. A restore check (the job's run identity) that refuses a step ends
        the restore at once: that step is not damaged, it is not this run's."""
        self.wait()
        self._restores += 1
        key = f"{_KV}/a{self.attempt}/r{self._restores}"
        pid, n = self._coord.process_id, self._coord.num_processes
        if pid == 0:
            visible = self._visible()
            plan = sorted(visible, reverse=True) if step is None else [s for s in visible if s == step]
            self._coord.set(key, json.dumps(plan), overwrite=True)
        else:
            plan = json.loads(self._coord.get(key, self._timeout))
        if not plan:
            raise FileNotFoundError(f"no complete orbax checkpoint for {'any step' if step is None else step} "
                                    f"under {self._root}")
        first_err: BaseException | None = None
        for i, chosen in enumerate(plan):
            where = f"{self._root}/{chosen}"
            if self._restore_check is not None:
                written = self._record(chosen)
                self._restore_check((written.get("extra") or {}).get("reprieve") if written else None, None, where)
            err: BaseException | None = None
            try:
                out = self._mgr.restore(chosen, args=self._ocp.args.Composite(
                    state=self._ocp.args.StandardRestore(abstract_state), reprieve=self._ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001 - judged with every process's outcome below
                err = e
            self._coord.set(f"{key}/{chosen}/{pid}", "ok" if err is None else f"{type(err).__name__}: {err}"[:2000],
                            overwrite=True)
            verdicts = [self._coord.get(f"{key}/{chosen}/{p}", self._timeout) for p in range(n)]
            failed = {p: v for p, v in enumerate(verdicts) if v != "ok"}
            if not failed and err is None:
                record = out["reprieve"]
                log.info("orbax checkpoint restored %s", where)
                return RestoreResult(chosen, out["state"], record.get("extra", {}), record.get("process_extra"))
            whole = "; ".join(f"process {p}: {v}" for p, v in failed.items())
            first_err = first_err or err or RuntimeError(f"orbax checkpoint {where}: {whole}")
            later = plan[i + 1] if i + 1 < len(plan) else None
            log.error("%s", fallback_line(chosen, where, failed, later))
            log.debug("orbax checkpoint %s: the whole error: %s", where, whole)
        assert first_err is not None
        raise first_err

    def _record(self, step: int) -> dict[str, Any] | None:
        """The ``reprieve`` item of a step as Orbax's JsonSave wrote it, or None."""
        try:
            value = json.loads((self._root / str(step) / RECORD_FILE).read_text())
        except Exception:  # noqa: BLE001 - not ours or unreadable: nothing to check
            return None
        return value if isinstance(value, dict) else None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._mgr.close()
