"""CheckpointManager: asynchronous, atomic, fenced checkpoints of a JAX training state.

Commit protocol of one save (all processes run it in a background thread)::

    snapshot (the only blocking part)  ->  write own shards into the unfinished checkpoint
    -> publish own per-process extra and status (KV)  ->  barrier  ->  process 0: every status ok?
    newer fence?  ->  process 0: rewrite reprieve.json with every process's extra (if any)
    -> process 0: fsync dirs + rename (filesystem) / write commit marker (object store)
    -> process 0 publishes the outcome (KV)  ->  every process learns it  ->  on_commit, retention

See docs/checkpoint.md for the format, the fencing rule and the measurements.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Self

from ..config import START_OVER_QUARANTINED
from ..coordination import Coordinator, LocalCoordinator
from ..data import to_json_value
from ..env import Env, env_attempt
from . import fencing, layout, retention
from . import read_once as read_once_mod
from . import save as save_mod
from .exchange import Peers
from .faults import maybe_crash
from .fencing import FencedError
from .layout import CheckpointName
from .metadata import CheckpointCorruptError, CheckpointMeta, CheckpointUnavailableError
from .restore import ReadStats, read_failure, restore_tree
from .storage import Storage, open_storage

log = logging.getLogger(__name__)

_KV = "reprieve/ckpt"
_UNAVAILABLE = "unavailable: "  # a restore verdict's prefix: the storage did not serve the bytes
_instances = itertools.count()
# Chunk files of at most 16 MiB: TensorStore reads a chunk into a fresh buffer and decodes it into another;
# glibc serves blocks up to its 32 MiB mmap-threshold ceiling from reusable heap memory, bigger ones from fresh
# mmaps whose every page faults in again. On the benchmark VM (slow page faults) 4 GiB restored at 0.79-1.05
# GiB/s with 16 MiB chunks against 0.46-0.68 GiB/s with one 64 MiB chunk per shard, and resharding reads
# finer pieces. Files per checkpoint grow accordingly (256 for 4 GiB instead of 64).
DEFAULT_MAX_CHUNK_BYTES = 16 << 20
_TS_SPEC = re.compile(r" ?\[tensorstore_spec='.*?'\]")
# How long a new attempt waits for a storage that refuses its fence (the bound a failed periodic save has too).
STORAGE_WAIT_SECONDS = 60.0  # test-only fault injection: a commit-protocol point name


class CheckpointSaveError(RuntimeError):
    """A background save failed on some process; the checkpoint was not committed.

    ``storage``: the storage refused a process's write or the commit (full, read-only, unreachable), as every
    process of the save learns it alike; False for a failure of anything else (the coordination service)."""

    def __init__(self, message: str, *, storage: bool = False) -> None:
        super().__init__(message)
        self.storage = storage


class OnlyQuarantinedError(RuntimeError):
    """``restore(step=None)`` found no usable checkpoint, only quarantined ones: starting at step 0 would throw their
    training away (a transient read error on an object store can quarantine every copy). Not a FileNotFoundError, so
    ``Job.restore_or`` does not start from scratch; ``start_over_quarantined`` (``REPRIEVE_START_OVER_QUARANTINED=1``)
    lets it."""


class RestoreResult(tuple):  # type: ignore[type-arg]
    """``(step, state, extra)`` as every checkpointer returns it, plus ``process_extra``: what each process
    gave as ``save(..., process_extra=)`` (index = the saving process), or None when none was saved."""

    process_extra: list[Any] | None

    def __new__(cls, step: int, state: Any, extra: dict[str, Any],
                process_extra: list[Any] | None = None) -> Self:
        self = super().__new__(cls, (step, state, extra))
        self.process_extra = process_extra
        return self


def _brief(err: BaseException) -> str:
    """``err`` without the TensorStore spec that its errors append (a kilobyte of JSON that names nothing new)."""
    return _TS_SPEC.sub("", str(err))


class CheckpointManager:
    """Asynchronous sharded checkpoints under ``uri`` (path, ``file://``, ``gs://``, ``s3://``).

    Every process of the job constructs one (the constructor meets the other processes once, through
    ``coordinator``) and calls the same methods in the same order.

    Args:
        uri: checkpoint root.
        coordinator: the job's :class:`~reprieve.coordination.Coordinator`; ``None`` means a
            single-process :class:`LocalCoordinator`.
        attempt: gang attempt number (``REPRIEVE_ATTEMPT``); ``None`` reads the environment, default 1.
            Starting attempt ``A`` fences out every older attempt (see :mod:`.fencing`).
        keep: how many newest complete checkpoints retention keeps (>= 1).
        keep_every: additionally keep every checkpoint whose step is a multiple of this.
        barrier_timeout_s: how long a save's commit barrier (and the init handshake) may wait.
        fsync: make commits durable (fsync files and directories). Off only for benchmarks of the floor.
        sync_mode: ``"files"`` (fsync this checkpoint's files, in parallel) or ``"syncfs"`` (one
            ``syncfs(2)`` per process; fewest syscalls, but also flushes other tenants' dirty data).
        host_copy: ``"staged"`` (reusable host buffers, default) or ``"device"``: see :func:`.save.snapshot`.
        restore_memory_limit_bytes: host bytes of reads in flight during restore; None (default): 1/32 of
            the state this host restores, within 32 MiB .. 1 GiB.
        max_chunk_bytes: shards bigger than this are stored as several chunk files (each still inside one
            shard); None stores one chunk per shard. See ``DEFAULT_MAX_CHUNK_BYTES``.
        fallback: on a corrupt checkpoint, ``restore(step=None)`` falls back to the previous one.
        start_over_quarantined: where the root holds quarantined checkpoints and no usable one, ``restore(step=None)``
            raises FileNotFoundError ("start at step 0") instead of :class:`OnlyQuarantinedError`; None reads
            ``REPRIEVE_START_OVER_QUARANTINED`` (default 0).
        on_commit: ``f(step)`` called (in the background thread, on every process) after each commit.
        request_retries: how often an object store request is retried before it fails (backoff 1 s doubling to
            32 s); None keeps TensorStore's 32 (about 15 minutes of an outage).
        read_once: ``"auto"`` (default), ``"on"`` or ``"off"``: whether a restore reads each replicated piece of
            the state from storage once, on one of the processes that need it, and sends it to the others
            (:mod:`.read_once`); auto: when the job's processes span several hosts.
        map_files: a restore from a local filesystem whose page cache holds the chunk files makes them the arrays'
            buffers, mapped private (no copy, no memory of its own; :func:`.chunk_files.map_chunks`), each file's
            crc32c checked at restore (default on). Off: they are read into memory of the restore's own, as from
            a cold disk (docs/checkpoint.md, "Copies a byte makes": what a mapping leaves to the device).

    Attributes:
        last_save_seconds: save() call -> durable commit known to this process, of the last save.
        last_restore_stats: where this process's last restored checkpoint came from (storage and peer bytes).
        committed_step: step of the last checkpoint this manager committed (None before any).
    """

    def __init__(
        self,
        uri: str,
        *,
        coordinator: Coordinator | None = None,
        attempt: int | None = None,
        keep: int = 3,
        keep_every: int | None = None,
        barrier_timeout_s: float = 1800.0,
        fsync: bool = True,
        sync_mode: str = "files",
        host_copy: str = "staged",
        restore_memory_limit_bytes: int | None = None,
        max_chunk_bytes: int | None = DEFAULT_MAX_CHUNK_BYTES,
        fallback: bool = True,
        on_commit: Callable[[int], None] | None = None,
        storage_wait_s: float = STORAGE_WAIT_SECONDS,
        start_over_quarantined: bool | None = None,
        request_retries: int | None = None,
        read_once: str = read_once_mod.AUTO,
        map_files: bool = True,
    ) -> None:
        if keep < 1:
            raise ValueError(f"CheckpointManager keep must be >= 1, got {keep}")
        self._coord = coordinator or LocalCoordinator()
        self.attempt = env_attempt() if attempt is None else int(attempt)
        self.keep, self.keep_every = keep, keep_every
        self._retention_deferred = False
        self._timeout = barrier_timeout_s
        self._storage_wait_s = storage_wait_s
        if host_copy not in ("staged", "device"):
            raise ValueError(f"CheckpointManager host_copy must be 'staged' or 'device', got {host_copy!r}")
        self._host_copy = host_copy
        self._staging = save_mod.Staging()
        if restore_memory_limit_bytes is not None and restore_memory_limit_bytes <= 0:
            raise ValueError(f"CheckpointManager restore_memory_limit_bytes must be > 0 or None (auto), "
                             f"got {restore_memory_limit_bytes}")
        self._mem_limit = restore_memory_limit_bytes
        if max_chunk_bytes is not None and max_chunk_bytes <= 0:
            raise ValueError(f"CheckpointManager max_chunk_bytes must be > 0 or None, got {max_chunk_bytes}")
        self._max_chunk_bytes = max_chunk_bytes
        self._fallback = fallback
        if read_once not in read_once_mod.MODES:
            raise ValueError(f"CheckpointManager read_once must be one of {read_once_mod.MODES}, got {read_once!r}")
        self._read_once = read_once
        self._map_files = bool(map_files)
        self.last_restore_stats = ReadStats()
        self._start_over_quarantined = (Env(os.environ).flag(START_OVER_QUARANTINED, False)
                                        if start_over_quarantined is None else start_over_quarantined)
        self._on_commit = on_commit
        self._restore_check: Callable[[Any, list[tuple[str, Any]], str], None] | None = None
        self._pid, self._nproc = self._coord.process_id, self._coord.num_processes
        self._storage: Storage = open_storage(uri, fsync=fsync, sync_mode=sync_mode, request_retries=request_retries)
        self.uri = self._storage.loc.uri()
        self._inst = next(_instances)
        self._restores = itertools.count()
        self._thread: threading.Thread | None = None
        self._inflight_step: int | None = None
        self._error: BaseException | None = None
        self._last_step: int | None = None
        self.last_save_seconds: float | None = None
        self.committed_step: int | None = None
        self._deletions: queue.Queue[Any] = queue.Queue()
        self._deleter: threading.Thread | None = None
        self._startup()

    # -- startup: fence + leftovers -----------------------------------------------------------------
    def _startup(self) -> None:
        key = f"{_KV}/a{self.attempt}/i{self._inst}/init"
        if self._pid == 0:
            outcome = "ok"
            try:
                self._fence_waiting_for_storage()
            except Exception as err:
                outcome = f"error: {type(err).__name__}: {err}"
                self._coord.set(key, outcome, overwrite=True)
                raise
            self._coord.set(key, outcome, overwrite=True)
        else:
            outcome = self._coord.get(key, self._timeout)
            if outcome != "ok":
                raise (FencedError if "FencedError" in outcome else RuntimeError)(
                    f"checkpoint init on process 0 failed: {outcome}")

    def _fence_waiting_for_storage(self) -> None:
        """The fence, retried while the storage refuses it (read-only, full, unreachable) for at most
        ``storage_wait_s``: an attempt that starts during a short storage outage waits it out, as a failed periodic
        save is retried (``reprieve.policy``), instead of failing the job. A newer fence is final at once."""
        deadline = time.monotonic() + self._storage_wait_s
        while True:
            try:
                self._fence_and_clean()
                return
            except FencedError:
                raise
            except Exception as err:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                log.warning("checkpoint storage %s refused attempt %d's fence (%s: %s); retrying for up to %.0f s "
                            "more", self.uri, self.attempt, type(err).__name__, str(err)[:300], left)
                time.sleep(min(2.0, left))

    def _fence_and_clean(self) -> None:
        st = self._storage
        fences = st.read_fences()
        newer = fencing.newer_fences(fences, self.attempt)
        if newer:
            raise FencedError(f"checkpoints at {self.uri}: attempt {self.attempt} is stale, attempts {newer} "
                              "have started; this writer must stop")
        entries = st.list_entries()
        if self.attempt not in fences:
            vis = fencing.visible([e for e in entries if e.state == "committed"], fences)
            st.write_fence(self.attempt, [v.committed for v in vis])
        else:  # a re-run of this attempt writes its fence again, byte for byte: the probe that the storage still
            st.write_fence(self.attempt, sorted(fences[self.attempt]))  # takes writes, now and not at the last save
        for e in entries:
            if e.state == "deleting" or (e.state == "tmp" and e.attempt <= self.attempt):
                log.info("checkpoint: removing leftover %s/%s", self.uri, e)
                try:
                    st.delete(e)
                except Exception as err:  # noqa: BLE001 - never restored; retention tries again after a commit
                    log.warning("checkpoint: leftover %s/%s not removed (%s); retention removes it later",
                                self.uri, e, err)

    def set_restore_check(self, check: Callable[[Any, list[tuple[str, Any]], str], None] | None) -> None:
        """``check(reprieve_record, saved_structure, where)`` before a checkpoint's arrays are read (on every
        process): the job refuses another run's checkpoint there (:mod:`reprieve.identity`); what it raises is
        raised by :meth:`restore` as is (no fallback, no quarantine: the checkpoint is fine, it is not ours)."""
        self._restore_check = check

    def set_commit_callback(self, on_commit: Callable[[int], None] | None) -> None:
        """``on_commit(step)`` after every commit, in the background thread of every process (what
        :func:`reprieve.init` wires to the job: metrics and the progress annotation)."""
        self._on_commit = on_commit

    # -- save ---------------------------------------------------------------------------------------
    supports_process_extra = True
    lands_in_host_buffers = True  # capabilities.HostLanding: a restore reads into arrays.host_buffer's buffers
    _donated = False  # set_donated: the job's step donates the state (the metadata records owned_bytes)

    def set_donated(self, donated: bool) -> None:
        """capabilities.HostLanding: whether the job's step donates the state; the checkpoints written after it record
        the bytes a restore copies into memory XLA allocates (``owned_bytes``: what a spare populates ahead)."""
        self._donated = donated

    def check_state(self, state: Any) -> None:
        """Raise the TypeError a save of ``state`` would raise (a leaf that cannot be saved), copying nothing."""
        save_mod.check_leaves(state)

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None,
             process_extra: Any = None) -> None:
        """Snapshot ``state`` and write it in the background; returns once ``state`` may be donated.

        At most one save is in flight: if one is, this call first waits for it (and logs that it had
        to). A failure of an earlier background save is raised here. ``extra`` (one JSON object for the
        checkpoint) and ``process_extra`` (this process's own JSON value, e.g. its data position; every
        process's comes back from :meth:`restore`) must be JSON-serialisable.
        """
        t0 = time.monotonic()
        self._raise_pending()
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"checkpoint save: step must increase, got {step} after {self._last_step}")
        extra_json = to_json_value(extra or {}, f"checkpoint save step {step}: extra")
        process_json = None if process_extra is None else json.dumps(
            to_json_value(process_extra, f"checkpoint save step {step}: process {self._pid}'s process_extra"))
        if self._thread is not None and self._thread.is_alive():
            log.info("checkpoint save of step %d waits for the in-flight save of step %d", step, self._inflight_step)
            self._thread.join()
            self._raise_pending()
        snap = save_mod.snapshot(state, host_copy=self._host_copy, staging=self._staging,
                                 max_chunk_bytes=self._max_chunk_bytes)
        self._last_step = step
        self._inflight_step = step
        self._thread = threading.Thread(
            target=self._background_save, args=(step, snap, extra_json, process_json, t0),
            name=f"reprieve-ckpt-save-{step}",
            daemon=True)
        self._thread.start()
        log.debug("checkpoint save of step %d: blocked %.4fs", step, time.monotonic() - t0)

    def _background_save(self, step: int, snap: save_mod.Snapshot, extra: dict[str, Any],
                         process_extra: str | None, t0: float) -> None:
        try:
            self._save_protocol(step, snap, extra, process_extra, t0)
        except BaseException as err:  # surfaced on the next call / wait()  # noqa: BLE001
            log.error("checkpoint save of step %d failed: %s", step, err)
            self._error = err

    def _save_protocol(self, step: int, snap: save_mod.Snapshot, extra: dict[str, Any],
                       process_extra: str | None, t0: float) -> None:
        st, pid = self._storage, self._pid
        base = f"{_KV}/a{self.attempt}/i{self._inst}/s{step}"
        ddir = st.data_dir(step, self.attempt)
        local_err: BaseException | None = None
        if process_extra is not None:
            self._coord.set(f"{base}/extra/{pid}", process_extra, overwrite=True)
        try:
            save_mod.write_snapshot(st, ddir, snap, process_index=pid)
            if pid == 0:  # beside the shards; rewritten at commit if some process gave a process_extra
                st.write_file(f"{ddir}/{layout.METADATA_FILE}", save_mod.build_metadata(
                    step, self.attempt, self._nproc, snap, extra, donated=self._donated).to_json())
            if pid != 0:
                st.make_durable(ddir)  # process 0 does it at commit time, after everybody wrote
        except Exception as err:  # noqa: BLE001  (reported to every process, then raised)
            local_err = err
        if self._host_copy == "staged" and local_err is None:  # after a failure TensorStore may still hold them
            self._staging.give_back([sc.data for sc in snap.shards])
        snap.shards.clear()  # drop the copies as soon as they are on storage
        status = "ok" if local_err is None else f"error: {type(local_err).__name__}: {_brief(local_err)}"[:2000]
        self._coord.set(f"{base}/written/{pid}", status, overwrite=True)
        maybe_crash("before_barrier", pid)
        self._coord.barrier(f"ckpt-a{self.attempt}-i{self._inst}-s{step}", self._timeout)
        maybe_crash("after_barrier", pid)
        if pid == 0:
            outcome = self._commit(step, base, lambda process_extra: save_mod.build_metadata(
                step, self.attempt, self._nproc, snap, extra, process_extra, donated=self._donated))
            self._coord.set(f"{base}/commit", outcome, overwrite=True)
        else:
            outcome = self._coord.get(f"{base}/commit", self._timeout)
        if outcome.startswith("fenced"):
            raise FencedError(f"checkpoint step {step} at {self.uri} not committed: {outcome}")
        if outcome != "ok" or local_err is not None:
            if pid == 0 and not self._retention_deferred:
                # What retention owes (checkpoints past ``keep`` that an attempt leaving for a restart left, its
                # unfinished saves) may be what filled the storage: free it now, not only after a commit that
                # cannot come while the storage is full; the next save retries into the room.
                self._schedule_retention()
            # the same error (and verdict) on every process, whichever process's storage refused it
            raise CheckpointSaveError(f"checkpoint step {step} at {self.uri} not committed: {outcome}",
                                      storage=outcome.startswith("error: ")) from local_err
        self.last_save_seconds = time.monotonic() - t0
        self.committed_step = step
        log.info("checkpoint step %d committed: %d bytes from this process, %.3fs save->commit",
                 step, snap.local_bytes, self.last_save_seconds)
        if self._on_commit is not None:
            self._on_commit(step)
        if pid == 0 and not self._retention_deferred:
            self._schedule_retention()
        elif pid == 0:
            log.info("checkpoint retention left to the next attempt (this process is leaving)")

    def _commit(self, step: int, base: str, metadata: Callable[[list[Any] | None], CheckpointMeta]) -> str:
        st = self._storage
        statuses = self._coord.dir_get(f"{base}/written/")
        bad = {k.rsplit("/", 1)[-1]: v for k, v in statuses.items() if v != "ok"}
        missing = [p for p in range(self._nproc) if not any(k.endswith(f"/{p}") for k in statuses)]
        if bad or missing:
            try:  # best effort: on a full or read-only storage this fails too; retention or the next attempt retries
                st.delete(CheckpointName(step, self.attempt, "tmp"))
            except Exception as err:  # noqa: BLE001
                log.warning("checkpoint: could not remove the unfinished %s/%s: %s", self.uri,
                            CheckpointName(step, self.attempt, "tmp"), err)
            return f"error: processes failed {bad} missing {missing}"
        newer = fencing.newer_fences(st.read_fences(), self.attempt)
        if newer:
            return f"fenced: attempts {newer} started after attempt {self.attempt}"
        try:
            # Every process's extra arrives in the KV before its status: only process 0, after the barrier, has
            # them all, so the metadata written beside the shards is rewritten with them (when there are any).
            extras = {int(k.rsplit("/", 1)[-1]): json.loads(v) for k, v in self._coord.dir_get(f"{base}/extra/").items()}
            if extras:
                st.write_file(f"{st.data_dir(step, self.attempt)}/{layout.METADATA_FILE}",
                              metadata([extras.get(p) for p in range(self._nproc)]).to_json())
            st.commit(step, self.attempt)
        except Exception as err:  # noqa: BLE001  (reported to every process, then raised)
            return f"error: commit failed: {type(err).__name__}: {err}"
        maybe_crash("after_commit", 0)
        return "ok"

    def wait(self) -> None:
        """Block until the in-flight save is durably committed on all processes; raise its error."""
        if self._thread is not None:
            self._thread.join()
        self._raise_pending()

    def _raise_pending(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise err

    # -- retention ----------------------------------------------------------------------------------
    def defer_retention(self) -> None:
        """Run no retention pass after the next commits: the process saves for a restart and exits right after
        the commit, and :meth:`close` would wait for the deletions (a restart gap; 0.08 s measured for the
        example's checkpoint on local disk, more on an object store). The next attempt's first commit (or its first
        failed save: the room may be what it lacked) deletes whatever retention owes; until then one checkpoint
        more than ``keep`` stays."""
        self._retention_deferred = True

    def _schedule_retention(self) -> None:
        if self._deleter is None or not self._deleter.is_alive():
            self._deleter = threading.Thread(target=self._deletion_worker, name="reprieve-ckpt-retention",
                                             daemon=True)
            self._deleter.start()
        self._deletions.put("pass")

    def _deletion_worker(self) -> None:
        while True:
            item = self._deletions.get()
            if item is None:
                return
            try:
                self._retention_pass()
            except Exception as err:  # never fatal: the next pass retries  # noqa: BLE001
                log.warning("checkpoint retention at %s failed: %s", self.uri, err)

    def _retention_pass(self) -> None:
        st = self._storage
        fences = st.read_fences()
        if fencing.newer_fences(fences, self.attempt):
            return  # a newer attempt owns the directory now
        entries = st.list_entries()
        committed = [e for e in entries if e.state == "committed"]
        for name in retention.select_abandoned(entries, attempt=self.attempt, committed_step=self.committed_step):
            log.info("checkpoint retention: deleting the unfinished %s/%s (its save failed)", self.uri, name)
            st.delete(name)
        vis = fencing.visible(committed, fences)
        invisible = [c for c in committed if c not in set(vis)]
        for c in retention.select_deletions(vis, invisible, keep=self.keep, keep_every=self.keep_every):
            log.info("checkpoint retention: deleting %s/%s", self.uri, c)
            st.delete(c)
        for qid in retention.select_quarantined(st.quarantined(), keep=self.keep):
            log.info("checkpoint retention: deleting the quarantined copy %s/%s (the %d newest are kept)", self.uri,
                     qid, self.keep)
            st.delete_quarantined(qid)

    # -- lookup & restore ---------------------------------------------------------------------------
    def _visible(self) -> list[CheckpointName]:
        return fencing.visible(self._storage.list_entries(uncommitted=False), self._storage.read_fences())

    def all_steps(self) -> list[int]:
        """Steps of every complete, visible checkpoint, oldest first."""
        return [c.step for c in self._visible()]

    def latest_step(self) -> int | None:
        """Step of the latest complete (committed, not fenced-out) checkpoint; never a partial one."""
        v = self._visible()
        return v[-1].step if v else None

    # -- memory tier hooks (reprieve.memtier.restore_round): the listing and one process's read alone ------------
    def visible_checkpoints(self) -> list[tuple[int, int]]:
        """``(step, attempt)`` of every complete, visible checkpoint, oldest first."""
        return [(c.step, c.attempt) for c in self._visible()]

    def read_step(self, step: int, attempt: int, abstract_state: Any, *, among: Sequence[int] | None = None,
                  key: str | None = None) -> RestoreResult:
        """This process's part of checkpoint ``(step, attempt)``, read without the other processes (a memory tier
        restore where only some processes need storage). ``CheckpointCorruptError`` when it is unreadable; no
        quarantine (the collective :meth:`restore` does that).

        ``among`` (with ``key``, unique to this read): the processes that read this checkpoint now, this one among
        them, every one of them passing the same; the replicated pieces they share are read from storage once and
        sent between them, as in a collective restore (``read_once``; docs/checkpoint.md, "Each replicated byte
        read once"). The other processes are not waited for."""
        name = layout.committed_name(step, attempt)
        members = None if among is None else tuple(sorted({int(p) for p in among}))
        if members is not None and len(members) > 1 and key is None:
            raise ValueError("CheckpointManager.read_step: among= needs key= (the same on every process among them)")
        shared = None if members is None or len(members) < 2 else f"{_KV}/read/{key}/{name}/exchange"
        meta, state = self._restore_one(name, abstract_state, exchange_key=shared, members=members)
        return RestoreResult(meta.step, state, meta.extra, meta.process_extra)

    def restore(self, abstract_state: Any, *, step: int | None = None) -> RestoreResult:
        """Restore into the shardings/dtypes of ``abstract_state``; returns ``(step, state, extra)`` (a
        :class:`RestoreResult`, whose ``process_extra`` holds every process's ``save(process_extra=)``).

        ``step=None`` takes the latest complete checkpoint and, if it is corrupt and ``fallback`` is
        on, the previous ones in turn. All processes agree on the checkpoint they restore. A checkpoint
        every process could not read is quarantined (renamed ``<name>.corrupt``, logged, never listed
        again), so a later save of the same step commits normally. A read the storage did not serve (unreachable,
        timed out after ``request_retries``, not permitted) on any process raises
        :class:`CheckpointUnavailableError` on every process: nothing is quarantined or fallen back past, and no
        array is returned partly filled.
        """
        self.wait()
        n = next(self._restores)
        key = f"{_KV}/a{self.attempt}/i{self._inst}/r{n}"
        if self._pid == 0:
            try:
                vis = self._visible()
            except Exception as listing:  # the others wait for the plan: they hear why there is none, not a timeout
                self._coord.set(f"{key}/plan", json.dumps({"error": f"{type(listing).__name__}: {listing}"}),
                                overwrite=True)
                raise
            if step is not None:
                vis = [c for c in vis if c.step == step]
                if not vis:
                    plan = []
                else:
                    plan = [vis[-1].committed]
            else:
                plan = [c.committed for c in reversed(vis)]
                if not self._fallback:
                    plan = plan[:1]
            self._coord.set(f"{key}/plan", json.dumps(plan), overwrite=True)
        else:
            plan = json.loads(self._coord.get(f"{key}/plan", self._timeout))
            if isinstance(plan, dict):
                raise CheckpointUnavailableError(
                    f"process 0 could not list the checkpoints under {self.uri}: {plan.get('error')}")
        if not plan:
            if step is None:  # process 0 reads the root; every process raises the same
                if self._pid == 0:
                    refusal = self._only_quarantined()
                    self._coord.set(f"{key}/refusal", json.dumps(refusal), overwrite=True)
                else:
                    refusal = json.loads(self._coord.get(f"{key}/refusal", self._timeout))
                if refusal is not None:
                    raise OnlyQuarantinedError(refusal)
            what = f"step {step}" if step is not None else "any step"
            raise FileNotFoundError(f"no complete checkpoint for {what} under {self.uri}")
        first_err: BaseException | None = None
        for name in plan:
            t0 = time.monotonic()
            err: BaseException | None = None
            result = None
            try:
                result = self._restore_one(name, abstract_state, exchange_key=f"{key}/{name}/exchange")
            except (CheckpointCorruptError, CheckpointUnavailableError) as e:
                err = e
            verdict = "ok" if err is None else (_UNAVAILABLE if isinstance(err, CheckpointUnavailableError) else "") + \
                str(err)[:2000]
            self._coord.set(f"{key}/{name}/{self._pid}", verdict, overwrite=True)
            verdicts = [self._coord.get(f"{key}/{name}/{p}", self._timeout) for p in range(self._nproc)]
            unserved = [f"process {p}: {v.removeprefix(_UNAVAILABLE)}" for p, v in enumerate(verdicts)
                        if v.startswith(_UNAVAILABLE)]
            if unserved:  # the storage's failure, not the checkpoint's: every process raises it, nothing quarantined
                raise CheckpointUnavailableError(
                    f"checkpoint {self.uri}/{name}: the storage did not serve it ({'; '.join(unserved)}); not "
                    "quarantined and not fallen back past: restore again once the storage answers") from err
            failed = [f"process {p}: {v}" for p, v in enumerate(verdicts) if v != "ok"]
            if not failed and result is not None:
                meta, state = result
                rs = self.last_restore_stats
                log.info("checkpoint restored %s/%s: step %d, %d bytes, %.3fs (this process: %d bytes from storage, "
                         "%d of them mapped from the page cache, %d from other processes)", self.uri, name, meta.step,
                         meta.array_bytes, time.monotonic() - t0, rs.storage_bytes, rs.mapped_bytes, rs.peer_bytes)
                return RestoreResult(meta.step, state, meta.extra, meta.process_extra)
            first_err = first_err or err or CheckpointCorruptError("; ".join(failed))
            log.error("checkpoint %s/%s is unusable (%s)%s", self.uri, name, "; ".join(failed),
                      "; falling back to the previous one" if name != plan[-1] else "")
            self._quarantine(name, "; ".join(failed), f"{key}/{name}")
        assert first_err is not None
        raise first_err

    def _only_quarantined(self) -> str | None:
        """Why the root, which holds no usable checkpoint, must not start at step 0: what it quarantined and why;
        None when nothing was quarantined or ``start_over_quarantined`` (then logged)."""
        from .reader import quarantined

        copies = quarantined(self._storage)
        if not copies:
            return None
        listed = "; ".join(f"{name} ({reason})" for name, reason in copies)
        if self._start_over_quarantined:
            log.warning("checkpoint root %s holds no usable checkpoint, only %d quarantined as corrupt: %s; "
                        "%s=1: starting at step 0", self.uri, len(copies), listed, START_OVER_QUARANTINED)
            return None
        put_back = ("" if self._storage.loc.is_object_store else  # an object store deleted their data
                    "to resume from one you trust, rename it to its committed name (without .corrupt); ")
        return (f"checkpoint root {self.uri} holds no usable checkpoint, only {len(copies)} quarantined as corrupt by "
                f"earlier restores: {listed}. Starting at step 0 would throw their training away (a transient read "
                f"error can quarantine a good copy): {put_back}to start at step 0 anyway, set "
                f"{START_OVER_QUARANTINED}=1")

    def _quarantine(self, name: str, reason: str, key: str) -> None:
        """Process 0 takes a checkpoint that every process found unusable out of the listing, then all
        processes go on together (a later save of the same step must not meet it under its name)."""
        if self._pid == 0:
            parsed = layout.parse_name(name)
            assert parsed is not None
            try:
                where = self._storage.quarantine(parsed, reason)
                log.warning("checkpoint %s/%s quarantined as %s: never listed again (%s)", self.uri, name, where,
                            reason)
            except Exception as err:  # noqa: BLE001 - a commit over it still works (it replaces the name)
                log.error("checkpoint %s/%s: quarantine failed (%s); it stays listed", self.uri, name, err)
            self._coord.set(f"{key}/quarantined", "done", overwrite=True)
        else:
            self._coord.get(f"{key}/quarantined", self._timeout)

    def _restore_one(self, name: str, abstract: Any, *, exchange_key: str | None = None,
                     members: tuple[int, ...] | None = None) -> tuple[CheckpointMeta, Any]:
        """One checkpoint read into ``abstract``; ``exchange_key``: a collective restore (every process of
        ``members``, None: of the job, reads this checkpoint now), whose replicated pieces they may share under
        that key."""
        where = f"{self.uri}/{name}/{layout.METADATA_FILE}"
        try:
            raw = self._storage.read_file(f"{name}/{layout.METADATA_FILE}")
        except Exception as err:  # named: unavailable or corrupt, as a chunk's read is
            raise read_failure(f"checkpoint {self.uri}/{name}: reading {where} failed: {err}", err) from err
        if raw is None:
            raise CheckpointCorruptError(f"checkpoint {self.uri}/{name}: metadata file {where} is missing")
        meta = CheckpointMeta.from_json(raw, where)
        parsed = layout.parse_name(name)
        assert parsed is not None
        problems = meta.problems(parsed.step, parsed.attempt)
        if problems:
            raise CheckpointCorruptError(f"checkpoint {self.uri}/{name}: {'; '.join(problems)} ({where}); the "
                                         "checkpoint disagrees with itself")
        if self._restore_check is not None:
            self._restore_check(meta.extra.get("reprieve"), meta.structure(), f"{self.uri}/{name}")
        peers = None
        if exchange_key is not None and self._nproc > 1:  # off too: it says so, and the others need not wait
            peers = Peers(self._coord, exchange_key, mode=self._read_once, timeout_s=min(self._timeout, 300.0),
                          members=members)
        self.last_restore_stats = stats = ReadStats()
        state = restore_tree(self._storage, name, meta, abstract, memory_limit_bytes=self._mem_limit, peers=peers,
                             stats=stats, map_files=self._map_files)
        return meta, state

    def close(self) -> None:
        """Wait for the in-flight save (raising its error) and for queued deletions, then stop."""
        try:
            self.wait()
        finally:
            self._staging.close()
            if self._deleter is not None and self._deleter.is_alive():
                self._deletions.put(None)
                self._deleter.join(timeout=self._timeout)

    def __enter__(self) -> CheckpointManager:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
