"""The one place that reads and writes a memory directory (``docs/memory.md``, "Layout"; names in :mod:`.layout`).

Both writers of a pod's directory go through here: the trainer (its own copies) and the replica server in
reprieve-supervisor (copies received from a peer). One copy is in flight per pod at a time: the writer holds
``flock(.lock)`` from creating ``<name>.tmp/`` until the rename that commits it, so the directory holds at most
the own copy, the peers' copies and one copy in flight. ``.tmp`` directories found under the lock are leftovers
of a writer that died; they are removed. A copy is deleted by renaming it back to ``.tmp`` (invisible at once)
and removing that. No JAX here: reprieve-supervisor imports this module.

A deleted copy's ``data.bin`` is kept in ``.free/`` (one at most) when no reader holds it, and the next copy in
flight, own save or receive, writes over it: its pages are already the volume's, so a copy of a large state
allocates (and the kernel zeroes) no memory and frees none (1 GiB on the benchmark VM: fallocate 0.32-0.44 CPU-s and
the delete 0.16-0.19 CPU-s saved, each copy and each pod). A reader holds a copy's data file with ``flock(LOCK_SH)``
(:func:`hold_for_reading`; a restore's mapping as long as the mapping lives, since its arrays may be built on the
file's pages); a copy whose data file is held is deleted as before, its pages staying the reader's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import shutil
import threading
import time
import weakref
from collections.abc import Collection, Iterator
from typing import Any

from ..checkpoint.layout import fence_name, parse_fence_name  # one fence name in both tiers
from . import decide, layout
from .layout import CopyName
from .manifest import CopyCorruptError, Manifest, crc32c

log = logging.getLogger(__name__)


class CopyBusyError(RuntimeError):
    """Another copy is in flight in this pod's memory directory (the lock is held)."""


class CopyRefusedError(RuntimeError):
    """A copy may not be written here: a newer attempt fenced its writer, or it does not fit the limit."""


class MemoryDir:
    """A pod's memory directory. ``limit_bytes``: what its copies may take together (None: unchecked)."""

    def __init__(self, path: str, *, limit_bytes: int | None = None) -> None:
        self.path = os.path.abspath(path)
        self.limit_bytes = limit_bytes
        for sub in (*layout.TREES, layout.FENCES_DIR, layout.FREE_DIR):
            os.makedirs(os.path.join(self.path, sub), exist_ok=True)

    def copy_dir(self, tree: str, name: CopyName) -> str:
        return os.path.join(self.path, tree, str(name))

    # -- the one copy in flight --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def in_flight(self, *, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the pod's in-flight lock (``timeout_s`` None: wait as long as it takes; 0: do not wait at all,
        :class:`CopyBusyError`). Leftover ``.tmp`` copies are removed once it is held."""
        fd = os.open(os.path.join(self.path, layout.LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise CopyBusyError(f"memory directory {self.path}: another copy is in flight") from None
                    time.sleep(0.01)
            self._remove_leftovers()
            yield
        finally:
            os.close(fd)  # releases the lock

    def _remove_leftovers(self) -> None:
        for tree in layout.TREES:
            for entry in _listdir(os.path.join(self.path, tree)):
                name = layout.parse_name(entry)
                if name is None or name.tmp:
                    log.info("memory: removing leftover %s/%s", tree, entry)
                    shutil.rmtree(os.path.join(self.path, tree, entry), ignore_errors=True)

    # -- listing -------------------------------------------------------------------------------------------------
    def names(self, tree: str) -> list[CopyName]:
        """Committed copies of ``tree`` (``own`` or ``peer``), oldest first."""
        out = []
        for entry in _listdir(os.path.join(self.path, tree)):
            name = layout.parse_name(entry)
            if name is not None and not name.tmp:
                out.append(name)
        return sorted(out)

    def manifest(self, tree: str, name: CopyName) -> Manifest:
        """The committed copy's manifest, checked against its name; :class:`CopyCorruptError` otherwise (also
        when the copy vanished: a retention pass deleted it)."""
        where = f"{self.copy_dir(tree, name)}/{layout.MANIFEST_FILE}"
        try:
            with open(where, "rb") as fh:
                raw = fh.read()
        except OSError as err:
            raise CopyCorruptError(f"{where}: cannot read the manifest ({err.strerror or err})") from None
        m = Manifest.from_bytes(raw, where)
        problems = m.problems(name)
        if problems:
            raise CopyCorruptError(f"{where}: {'; '.join(problems)}")
        try:
            size = os.stat(os.path.join(self.copy_dir(tree, name), layout.DATA_FILE)).st_size
        except OSError:
            size = -1
        if size != m.data_bytes:
            raise CopyCorruptError(f"{where}: data.bin has {size} bytes, the manifest says {m.data_bytes}")
        return m

    def holdings(self, location: str) -> list[decide.Holding]:
        """Every committed copy here as a :class:`~.decide.Holding` at ``location``; unreadable ones are logged and
        left out (they are not restored)."""
        out = []
        for tree in layout.TREES:
            for name in self.names(tree):
                try:
                    m = self.manifest(tree, name)
                except CopyCorruptError as err:
                    log.warning("memory copy %s/%s is unusable: %s", tree, name, err)
                    continue
                out.append(decide.Holding(name, m.num_processes, location, tree, m.base, m.data_bytes, m.root))
        return out

    def usage_bytes(self) -> int:
        """Bytes the copies here take (committed and in flight)."""
        total = 0
        for tree in layout.TREES:
            for entry in _listdir(os.path.join(self.path, tree)):
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(self.path, tree, entry, layout.DATA_FILE)).st_size
        return total

    # -- fences ----------------------------------------------------------------------------------------------------
    def fences(self) -> dict[int, tuple[int, int] | None]:
        out: dict[int, tuple[int, int] | None] = {}
        for entry in _listdir(os.path.join(self.path, layout.FENCES_DIR)):
            attempt = parse_fence_name(entry)
            if attempt is None:
                continue
            try:
                with open(os.path.join(self.path, layout.FENCES_DIR, entry), "rb") as fh:
                    base = json.loads(fh.read())["base"]
                out[attempt] = None if base is None else (int(base[0]), int(base[1]))
            except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
                log.warning("memory fence %s is unreadable (%s); ignoring it", entry, err)
        return out

    def write_fence(self, attempt: int, base: tuple[int, int] | None) -> bool:
        """Record that ``attempt`` started from ``base`` (written once, never changed: True when this call wrote
        it)."""
        path = os.path.join(self.path, layout.FENCES_DIR, fence_name(attempt))
        # one name per thread: the trainer and the replica server it runs (outside reprieve-supervisor) are one process,
        # and both write this attempt's fence here when the trainer is its own peer's peer
        tmp = f"{path}.{_writer_id()}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"attempt": attempt, "base": None if base is None else list(base)}, fh)
        try:
            os.link(tmp, path)  # fails if it exists: first writer wins
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def newest_fence(self) -> int:
        return max(self.fences(), default=0)

    # -- writing (the caller holds in_flight()) --------------------------------------------------------------------
    def begin(self, tree: str, name: CopyName, data_bytes: int, *, attempt: int) -> str:
        """Create ``<name>.tmp/`` with a ``data.bin`` of ``data_bytes`` (pages allocated up front, so a full
        volume fails here rather than half-way) after checking the fence and the limit; returns the tmp dir."""
        newest = self.newest_fence()
        if newest > attempt:
            raise CopyRefusedError(f"memory copy {tree}/{name}: attempt {newest} has started in this pod, so attempt "
                                   f"{attempt} may no longer write copies here (fenced)")
        if self.limit_bytes is not None:
            held = self.usage_bytes()
            if held + data_bytes > self.limit_bytes:
                raise CopyRefusedError(
                    f"memory copy {tree}/{name} of {_size(data_bytes)} does not fit: the directory holds "
                    f"{_size(held)} and its limit is {_size(self.limit_bytes)} (REPRIEVE_MEMORY_LIMIT_BYTES); it "
                    "must hold the own copy, the peer's copy and one in flight")
        tmp = self.copy_dir(tree, name.in_flight)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        data = os.path.join(tmp, layout.DATA_FILE)
        reused = self._take_free(data)
        fd = os.open(data, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if reused > data_bytes:
                os.ftruncate(fd, data_bytes)
            if data_bytes > reused:
                try:
                    os.posix_fallocate(fd, reused, data_bytes - reused)
                except OSError as err:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if err.errno == errno.ENOSPC:
                        raise CopyRefusedError(f"memory copy {tree}/{name}: the memory volume {self.path} is full "
                                               f"({_size(data_bytes)} needed): raise its size limit") from None
                    raise
        finally:
            os.close(fd)
        return tmp

    def commit(self, tree: str, name: CopyName, manifest: Manifest, *,
               keep: Collection[CopyName] = ()) -> list[CopyName]:
        """Write the manifest, rename ``<name>.tmp`` to ``<name>`` (the commit) and delete the copies it replaces
        (:meth:`prune`: a received copy replaces its writer's only); returns those."""
        tmp = self.copy_dir(tree, name.in_flight)
        with open(os.path.join(tmp, layout.MANIFEST_FILE), "wb") as fh:
            fh.write(manifest.to_bytes())
        os.rename(tmp, self.copy_dir(tree, name))
        return self.prune(tree, keep=keep, writer=name.writer if tree == layout.PEER else None, committed=name)

    def prune(self, tree: str, *, keep: Collection[CopyName] = (), writer: int | None = None,
              committed: CopyName | None = None) -> list[CopyName]:
        """Delete the committed copies of ``tree`` that :func:`~.decide.select_deletions` lets go (``writer``'s
        only, unless None), never the one just ``committed``; returns them."""
        gone = [n for n in decide.select_deletions(self.names(tree), keep=keep, writer=writer) if n != committed]
        for old in gone:
            self.delete(tree, old)
        return gone

    def make_room(self, tree: str, nbytes: int, *, keep: Collection[CopyName] = (),
                  writer: int | None = None) -> list[CopyName]:
        """Before writing a copy of ``nbytes`` (the caller holds :meth:`in_flight`), only when the limit has no
        room for it: delete what its commit would delete anyway, then the kept copies too, the newest first (the
        gang step's, the oldest, last: the one step known complete); the newest copy stays. Returns what it
        deleted (:meth:`begin` then refuses a copy that still does not fit)."""
        gone: list[CopyName] = []
        kept = sorted({n.committed for n in keep}, key=lambda n: (n.attempt, n.step))
        pruned = False
        while self.limit_bytes is not None and self.usage_bytes() + nbytes > self.limit_bytes:
            if pruned and not kept:
                break
            if pruned:
                kept.pop()
            pruned = True
            gone += self.prune(tree, keep=kept, writer=writer)
        return gone

    def abort(self, tree: str, name: CopyName) -> None:
        shutil.rmtree(self.copy_dir(tree, name.in_flight), ignore_errors=True)

    def delete(self, tree: str, name: CopyName, *, reuse: bool = True) -> None:
        """Make the copy invisible (rename to ``.tmp``), then remove it; its data file is kept for the next copy in
        flight to write over (``reuse``, when no reader holds it and none is kept yet). Readers that mapped it keep
        their pages."""
        src, dst = self.copy_dir(tree, name), self.copy_dir(tree, name.in_flight) + f".{_writer_id()}"
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return
        if reuse:
            self._keep_free(os.path.join(dst, layout.DATA_FILE))
        shutil.rmtree(dst, ignore_errors=True)
        log.debug("memory: deleted %s/%s", tree, name)

    def _keep_free(self, path: str) -> None:
        """Move a deleted copy's data file into ``.free/`` unless a reader holds it, one is kept already, or the pod
        or the machine lacks the room for it twice over (``room``: the landing memory's rule; a kept file holds the
        volume at its peak between copies, and at 1 GiB a process a 24 GiB machine's soak stalled on memory)."""
        free = os.path.join(self.path, layout.FREE_DIR)
        if _listdir(free):
            return
        try:
            size = os.stat(path).st_size
        except OSError:
            return
        if self.room(size) is None:
            _move_unheld(path, os.path.join(free, f"data.{_writer_id()}"))

    @staticmethod
    def room(nbytes: int) -> str | None:
        """Why a deleted copy's ``nbytes`` must not be kept now (None: they may)."""
        from .. import landing

        return landing.room_problem(nbytes, what="a deleted memory copy kept for the next", **landing.memory_now())

    def _take_free(self, dst: str) -> int:
        """Move a kept data file to ``dst`` (a copy in flight's ``data.bin``); its size, 0 when there was none.
        Any other kept file is removed (one copy is in flight at a time), and so is one a reader holds (it opened
        the file just before its copy was deleted)."""
        free = os.path.join(self.path, layout.FREE_DIR)
        taken: int | None = None
        for entry in sorted(_listdir(free)):
            src = os.path.join(free, entry)
            if taken is None:
                taken = _move_unheld(src, dst)
                if taken is not None:
                    continue
            with contextlib.suppress(OSError):
                os.unlink(src)
        return taken or 0

    def remove_root(self, root: str | None) -> list[str]:
        """A finished run's cleanup: delete every committed copy of the storage root ``root`` (and any copy whose
        manifest is unreadable: of no use to anyone), then the fence records once no copy is left. The copies it
        deleted (``tree/name``)."""
        deleted: list[str] = []
        for tree in layout.TREES:
            for name in self.names(tree):
                try:
                    ours = self.manifest(tree, name).root == root
                except CopyCorruptError:
                    ours = True
                if ours:
                    self.delete(tree, name, reuse=False)
                    deleted.append(f"{tree}/{name}")
        if not any(self.names(tree) for tree in layout.TREES):
            for sub in (layout.FENCES_DIR, layout.FREE_DIR):
                for entry in _listdir(os.path.join(self.path, sub)):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.path, sub, entry))
        return deleted

    # -- reading -------------------------------------------------------------------------------------------------
    def open_data(self, tree: str, name: CopyName) -> mmap.mmap | None:
        """A private, writable mapping of the copy's ``data.bin`` (writes copy pages, the file never changes);
        None for an empty file.

        Not populated (``MAP_POPULATE``): on a private writable mapping that populates by write faults, so it
        copied the whole copy into fresh memory before the restore read a byte (0.53 s of a 0.66 s own restore of
        1 GiB). The restore's checksum reads every page anyway, on several threads (:func:`verify`), and a read
        fault maps the page cache's page without a copy.

        The file is held (:func:`hold_for_reading`) as long as the mapping lives: arrays built on its pages must
        never see it written over by a later copy."""
        path = os.path.join(self.copy_dir(tree, name), layout.DATA_FILE)
        fd = os.open(path, os.O_RDONLY)
        try:
            hold_for_reading(fd, path)
            size = os.fstat(fd).st_size
            if size == 0:
                os.close(fd)
                return None
            mem = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        weakref.finalize(mem, os.close, fd)  # the hold ends with the mapping
        return mem


def _move_unheld(src: str, dst: str) -> int | None:
    """Rename the data file ``src`` to ``dst`` unless a reader holds it (:func:`hold_for_reading`) or it is gone; its
    size, None when it was not moved."""
    try:
        fd = os.open(src, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        size = os.fstat(fd).st_size
        os.rename(src, dst)
        return size
    except OSError:  # BlockingIOError: a reader holds it (its pages stay its own)
        return None
    finally:
        os.close(fd)


def hold_for_reading(fd: int, path: str) -> None:
    """Hold the data file open as ``fd`` against being written over by a later copy (``flock(LOCK_SH)``, as long as
    ``fd`` is open). A copy deleted between the open and the hold is :class:`FileNotFoundError`, as if the open had
    come after the delete."""
    fcntl.flock(fd, fcntl.LOCK_SH)
    st, now = os.fstat(fd), os.stat(path)  # FileNotFoundError: deleted
    if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
        raise FileNotFoundError(errno.ENOENT, "memory copy deleted while it was being opened", path)


VERIFY_THREADS = min(8, os.cpu_count() or 1)
VERIFY_PARALLEL_BYTES = 64 << 20  # below this, one thread: starting the others costs more than they save


def verify(data: Any, manifest: Manifest, indices: list[int] | None = None, *, where: str,
           threads: int = VERIFY_THREADS) -> None:
    """Check the crc32c of the shards ``indices`` (all: None) of ``data`` (the copy's bytes, indexed from 0).

    Shards are checked on up to ``threads`` threads when there is enough to check (the checksum releases the GIL,
    and a mapped copy's first read of each page, its fault, happens inside it too); a corrupt shard is reported
    by the lowest index, as one thread would."""
    ks = list(range(len(manifest.shards)) if indices is None else indices)

    def check(k: int) -> int:
        s = manifest.shards[k]
        return crc32c(data, s.offset, s.offset + s.nbytes)

    total = sum(manifest.shards[k].nbytes for k in ks)
    if threads > 1 and len(ks) > 1 and total >= VERIFY_PARALLEL_BYTES:
        with concurrent.futures.ThreadPoolExecutor(min(threads, len(ks)), thread_name_prefix="memtier-verify") as ex:
            got = list(ex.map(check, ks))
    else:
        got = [check(k) for k in ks]
    for k, crc in zip(ks, got, strict=True):
        check_shard(manifest, k, crc, where=where)


def check_shard(manifest: Manifest, k: int, crc: int, *, where: str) -> None:
    """CopyCorruptError naming shard ``k`` when ``crc`` (of its bytes as read) is not the one its manifest records."""
    s = manifest.shards[k]
    if crc != s.crc32c:
        raise CopyCorruptError(f"{where}: shard {k} (leaf {manifest.leaves[s.leaf].get('path')}, region "
                               f"{list(s.region)}) fails its checksum (crc32c {crc:08x}, recorded {s.crc32c:08x})")


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n} bytes)" if n >= 2**30 else f"{n / 2**20:.1f} MiB ({n} bytes)"


def _writer_id() -> str:
    """Unique per process and thread: names of temporary files no other writer uses at the same time."""
    return f"{os.getpid()}-{threading.get_ident()}"
