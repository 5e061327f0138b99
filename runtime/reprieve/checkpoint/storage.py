"""The one place that opens TensorStore and touches storage (filesystems and object stores).

Two backends with one interface:

* :class:`LocalStorage` (paths, ``file://``): data goes to ``<name>.tmp/``. TensorStore writes
  without fsync; each process then fsyncs the checkpoint's files and directories 16 at a time
  (``sync_mode="files"``, scoped to the checkpoint) or issues one ``syncfs(2)`` (``"syncfs"``: fewest
  syscalls, but it also flushes other tenants' dirty data); process 0 then renames the tree to
  ``<name>/`` and fsyncs the root. Deletion renames to ``<name>.deleting/`` first, so a crash in the
  middle of a delete never leaves a half-deleted checkpoint that looks complete. A corrupt checkpoint is
  quarantined by renaming it to ``<name>.corrupt/`` (kept for inspection, never listed as committed).
* :class:`ObjectStorage` (``gs://``, ``s3://``): no rename and no fsync; data goes straight under
  ``<name>/`` and the commit is one PUT of the marker ``commits/<name>`` (single-object writes are
  atomic on GCS and S3). Deletion removes the marker first, then the data. Quarantine writes
  ``corrupt/<name>-<unix ms>.json`` (why), removes the marker, then the data (an object store cannot rename it aside,
  and the name must be free for the next save of that step).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tensorstore as ts

from . import layout, spec
from .layout import CheckpointName, Location

log = logging.getLogger(__name__)


class Storage:
    """Backend interface; ``data_dir`` is where a checkpoint's files go before it is committed."""

    loc: Location

    def __init__(self, loc: Location, *, fsync: bool = True, sync_mode: str = "files",
                 file_io_concurrency: int = 64, request_retries: int | None = None) -> None:
        if sync_mode not in ("files", "syncfs"):
            raise ValueError(f"checkpoint sync_mode must be 'files' or 'syncfs', got {sync_mode!r}")
        self.loc = loc
        self.fsync = fsync
        self.sync_mode = sync_mode
        # Local data files are made durable in bulk by make_durable(); TensorStore need not fsync each.
        per_file_sync = fsync and loc.is_object_store
        self._file_io_concurrency = file_io_concurrency
        self._retries = request_retries
        self.context = ts.Context(spec.context_spec(fsync=per_file_sync, file_io_concurrency=file_io_concurrency,
                                                    request_retries=request_retries))

    def read_context(self, cache_bytes: int) -> Any:
        """A context for one restore: like :attr:`context`, with a chunk cache of ``cache_bytes``."""
        return ts.Context(spec.context_spec(fsync=False, file_io_concurrency=self._file_io_concurrency,
                                            cache_bytes=cache_bytes, request_retries=self._retries))

    # -- arrays -------------------------------------------------------------------------------------
    def kvstore(self, subpath: str) -> dict[str, Any]:
        return spec.kvstore_spec(self.loc, subpath)

    def open_array(self, subpath: str, metadata: dict[str, Any], *, create: bool, read: bool = False,
                   context: Any = None) -> Any:
        """Future of an opened zarr3 array; ``create`` writes ``zarr.json``. ``read``: its ``zarr.json`` is
        read and must match ``metadata`` (an array that disagrees with ``reprieve.json`` is an error, not
        bytes read with the wrong shape); otherwise the metadata is assumed. ``context``: for reads, instead
        of :attr:`context` (see :meth:`read_context`)."""
        s = spec.zarr3_spec(self.kvstore(subpath), metadata)
        if create:
            return ts.open(s, create=True, delete_existing=False, context=self.context)
        if read:
            return ts.open(s, open=True, read=True, write=False,
                           context=self.context if context is None else context)
        return ts.open(s, open=True, assume_metadata=True, write=True, context=self.context)

    @staticmethod
    def read_into(store: Any, region: tuple[slice, ...], out: Any) -> Any:
        """Future that reads ``store[region]`` straight into the numpy array ``out`` (converting dtype)."""
        src = store[region] if region else store
        if src.dtype.numpy_dtype != out.dtype:
            src = ts.cast(src, out.dtype)
        return ts.array(out, copy=False, write=True).write(src)

    @staticmethod
    def read(store: Any, region: tuple[slice, ...], dtype: Any) -> Any:
        """Future of ``store[region]`` as a new numpy array of ``dtype``."""
        src = store[region] if region else store
        if src.dtype.numpy_dtype != dtype:
            src = ts.cast(src, dtype)
        return src.read()

    def make_durable(self, ckpt_dir: str) -> None:
        """Make the files under ``ckpt_dir`` durable (no-op where the store has no such notion)."""

    # -- checkpoints --------------------------------------------------------------------------------
    def data_dir(self, step: int, attempt: int) -> str:
        raise NotImplementedError

    def list_entries(self, *, uncommitted: bool = True) -> list[CheckpointName]:
        """Checkpoint-like entries under the root: committed ones, plus (``uncommitted``) unfinished
        and being-deleted ones. Object stores list every data key only for ``uncommitted``."""
        raise NotImplementedError

    def commit(self, step: int, attempt: int) -> None:
        raise NotImplementedError

    def delete(self, name: CheckpointName) -> None:
        raise NotImplementedError

    def quarantine(self, name: CheckpointName, reason: str) -> str:
        """Take the committed checkpoint ``name`` out of every listing for good; returns where it went."""
        raise NotImplementedError

    def quarantined(self) -> list[tuple[int, int, int, str]]:
        """Every quarantined copy as ``(step, attempt, order, id)`` (:mod:`.retention`); ``id`` for
        :meth:`delete_quarantined`."""
        raise NotImplementedError

    def delete_quarantined(self, qid: str) -> None:
        raise NotImplementedError

    # -- small files --------------------------------------------------------------------------------
    def write_file(self, key: str, data: bytes) -> None:
        """Durably write one small file (metadata, fence) atomically."""
        raise NotImplementedError

    def read_file(self, key: str) -> bytes | None:
        raise NotImplementedError

    def list_dir(self, subdir: str) -> list[str]:
        raise NotImplementedError

    def local_path(self, key: str) -> str | None:
        """The file that holds ``key`` where the storage is a local filesystem (the restore reads chunk files
        itself there: :mod:`.chunk_files`); None for an object store."""
        return None

    knows_sizes = False  # whether file_size() answers without reading the file

    def file_size(self, key: str) -> int | None:
        """Bytes of the file ``key``; None when it is missing (or :attr:`knows_sizes` is False)."""
        return None

    # -- fences -------------------------------------------------------------------------------------
    def read_fences(self, fences_dir: str = layout.FENCES_DIR) -> dict[int, frozenset[str]]:
        """``{attempt: visible names}``; ``fences_dir``: ``layout.ORBAX_FENCES_DIR`` for ``reprieve.orbax``'s."""
        fences: dict[int, frozenset[str]] = {}
        for fname in self.list_dir(fences_dir):
            attempt = layout.parse_fence_name(fname)
            if attempt is None:
                continue
            data = self.read_file(f"{fences_dir}/{fname}")
            if data is None:
                continue
            try:
                fences[attempt] = frozenset(json.loads(data)["visible"])
            except (ValueError, KeyError, TypeError) as err:
                # A fence is written atomically, so this is outside damage; fencing everything out
                # would make every older checkpoint unusable, so name it loudly and ignore it.
                log.error("checkpoint fence %s/%s/%s is unreadable (%s); ignoring it",
                          self.loc.uri(), fences_dir, fname, err)
        return fences

    def write_fence(self, attempt: int, visible: list[str]) -> None:
        body = json.dumps({"attempt": attempt, "visible": sorted(visible)}).encode()
        self.write_file(f"{layout.FENCES_DIR}/{layout.fence_name(attempt)}", body)


class LocalStorage(Storage):
    def __init__(self, loc: Location, *, create: bool = True, **kw: Any) -> None:
        super().__init__(loc, **kw)
        if create:
            os.makedirs(loc.path, exist_ok=True)
        elif not os.path.isdir(loc.path):
            raise FileNotFoundError(f"no checkpoint directory at {loc.path}")

    def _p(self, *parts: str) -> str:
        return os.path.join(self.loc.path, *parts)

    def data_dir(self, step: int, attempt: int) -> str:
        return layout.tmp_name(step, attempt)

    def list_entries(self, *, uncommitted: bool = True) -> list[CheckpointName]:
        out = []
        for entry in os.listdir(self.loc.path):
            parsed = layout.parse_name(entry)
            if parsed is not None and (uncommitted or parsed.state == "committed"):
                out.append(parsed)
        return out

    def _fsync_dir(self, path: str) -> None:
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def make_durable(self, ckpt_dir: str) -> None:
        if not self.fsync:
            return
        if self.sync_mode == "syncfs":  # one call; also flushes other writers' dirty data on this filesystem
            fd = os.open(self.loc.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                if _libc_syncfs(fd) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"syncfs({self.loc.path}) failed: {os.strerror(err)}")
            finally:
                os.close(fd)
            return
        # fsync every file, then every directory, of this checkpoint only, many at a time (concurrent
        # fsyncs share journal commits; one at a time would pay a commit each).
        files, dirs = [], []
        for dirpath, _dirs, names in os.walk(self._p(ckpt_dir)):
            dirs.append(dirpath)
            files += [os.path.join(dirpath, n) for n in names]
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="reprieve-ckpt-fsync") as pool:
            list(pool.map(_fsync_path, files))
            list(pool.map(_fsync_path, dirs))

    def commit(self, step: int, attempt: int) -> None:
        src = self._p(layout.tmp_name(step, attempt))
        dst = self._p(layout.committed_name(step, attempt))
        self.make_durable(layout.tmp_name(step, attempt))  # every process's files and directories
        if os.path.lexists(dst):
            # The same step saved again by the same attempt (a run outside the operator always has attempt 1,
            # or a restore(step=...) went back): the new, complete checkpoint supersedes the old one. Renaming
            # onto a non-empty directory fails (ENOTEMPTY), so the old one is deleted first.
            log.warning("checkpoint %s/%s already exists: replaced by the new save of step %d",
                        self.loc.uri(), layout.committed_name(step, attempt), step)
            self.delete(CheckpointName(step, attempt))
        os.rename(src, dst)
        self._fsync_dir(self.loc.path)

    def delete(self, name: CheckpointName) -> None:
        path = self._p(str(name))
        if name.state in ("committed", "corrupt"):
            doomed = self._p(layout.deleting_name(name.committed))
            if os.path.lexists(doomed):  # an interrupted earlier deletion of the same name
                shutil.rmtree(doomed, ignore_errors=True)
            os.rename(path, doomed)
            self._fsync_dir(self.loc.path)
            path = doomed
        shutil.rmtree(path, ignore_errors=True)

    def quarantine(self, name: CheckpointName, reason: str) -> str:
        target = layout.quarantine_name(name.committed, set(os.listdir(self.loc.path)))
        os.rename(self._p(name.committed), self._p(target))
        self._fsync_dir(self.loc.path)
        try:  # the reason beside the evidence; best effort (the rename is what matters)
            with open(self._p(target, "QUARANTINED.json"), "w") as f:
                json.dump({"name": name.committed, "reason": reason}, f)
        except OSError as err:
            log.warning("could not write the quarantine reason into %s: %s", target, err)
        return self._p(target)

    def quarantined(self) -> list[tuple[int, int, int, str]]:
        return [(e.step, e.attempt, e.copy, str(e)) for e in self.list_entries() if e.state == "corrupt"]

    def delete_quarantined(self, qid: str) -> None:
        name = layout.parse_name(qid)
        if name is None or name.state != "corrupt":
            raise ValueError(f"not a quarantined checkpoint: {qid!r}")
        self.delete(name)

    def write_file(self, key: str, data: bytes) -> None:
        path = self._p(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.partial.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.rename(tmp, path)
        self._fsync_dir(os.path.dirname(path))

    def read_file(self, key: str) -> bytes | None:
        try:
            with open(self._p(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def list_dir(self, subdir: str) -> list[str]:
        try:
            return sorted(os.listdir(self._p(subdir)))
        except FileNotFoundError:
            return []

    def local_path(self, key: str) -> str | None:
        return self._p(key)

    knows_sizes = True

    def file_size(self, key: str) -> int | None:
        try:
            return os.path.getsize(self._p(key))
        except FileNotFoundError:
            return None


def _fsync_path(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    except FileNotFoundError:
        # Another process's TensorStore temp file, renamed away since the walk; its writer (which
        # makes its own files durable before the barrier) is responsible for it.
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _libc_syncfs(fd: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "syncfs"):  # not Linux: fall back to a global sync
        os.sync()
        return 0
    return int(libc.syncfs(fd))


def _prefix_range(prefix: str) -> Any:
    lo = prefix.encode()
    hi = lo[:-1] + bytes([lo[-1] + 1]) if lo else b""
    return ts.KvStore.KeyRange(inclusive_min=lo, exclusive_max=hi)


class ObjectStorage(Storage):
    def __init__(self, loc: Location, *, create: bool = True, **kw: Any) -> None:
        super().__init__(loc, **kw)  # nothing to create: a prefix exists once a key is written under it
        self._kv = ts.KvStore.open(spec.kvstore_spec(loc), context=self.context).result()

    def data_dir(self, step: int, attempt: int) -> str:
        return layout.committed_name(step, attempt)

    def _keys(self, prefix: str) -> list[str]:
        return sorted(k.decode() for k in self._kv.list(_prefix_range(prefix)).result())

    def list_entries(self, *, uncommitted: bool = True) -> list[CheckpointName]:
        committed = {k.split("/", 1)[1] for k in self._keys(layout.COMMITS_DIR + "/")}
        tops = {k.split("/", 1)[0] for k in self._keys("step_")} if uncommitted else set()
        out = []
        for top in sorted(tops | committed):
            parsed = layout.parse_name(top)
            if parsed is None or parsed.state != "committed":
                continue
            out.append(parsed if top in committed else CheckpointName(parsed.step, parsed.attempt, "tmp"))
        return out

    def commit(self, step: int, attempt: int) -> None:
        name = layout.committed_name(step, attempt)
        self.write_file(f"{layout.COMMITS_DIR}/{name}", name.encode())

    def delete(self, name: CheckpointName) -> None:
        if name.state == "committed":
            self._kv.delete_range(_prefix_range(f"{layout.COMMITS_DIR}/{name.committed}")).result()
        self._kv.delete_range(_prefix_range(name.committed + "/")).result()

    def quarantine(self, name: CheckpointName, reason: str) -> str:
        record = f"{layout.CORRUPT_DIR}/{name.committed}-{int(time.time() * 1000)}.json"
        self.write_file(record, json.dumps({"name": name.committed, "reason": reason}).encode())
        self.delete(name)  # marker first, then the data: the name is free for the next save of this step
        return f"{self.loc.uri()}/{record}"

    def quarantined(self) -> list[tuple[int, int, int, str]]:
        out = []
        for record in self.list_dir(layout.CORRUPT_DIR):
            parsed = layout.parse_quarantine_record(record)
            if parsed is not None:
                out.append((*parsed, record))
        return out

    def delete_quarantined(self, qid: str) -> None:
        self._kv.delete_range(_prefix_range(f"{layout.CORRUPT_DIR}/{qid}")).result()

    def write_file(self, key: str, data: bytes) -> None:
        self._kv.write(key, data).result()

    def read_file(self, key: str) -> bytes | None:
        res = self._kv.read(key).result()
        return bytes(res.value) if res.state == "value" else None

    def list_dir(self, subdir: str) -> list[str]:
        prefix = subdir.strip("/") + "/" if subdir.strip("/") else ""  # "": every key under the root
        return [k[len(prefix):] for k in self._keys(prefix)]


def open_storage(uri: str, **kw: Any) -> Storage:
    """The storage of checkpoint root ``uri``. ``create=False``: only read (a missing local root is a
    FileNotFoundError, not a new directory)."""
    loc = layout.parse_uri(uri, os.getcwd())
    return ObjectStorage(loc, **kw) if loc.is_object_store else LocalStorage(loc, **kw)
