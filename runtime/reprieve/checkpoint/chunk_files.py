"""A local checkpoint's chunk files read straight into the restore's landing buffers (one copy a byte), or mapped
as those buffers where the page cache holds them (none).

TensorStore's file driver reads a chunk file into a buffer of its own and then copies the decoded chunk into the
target (two copies a byte, docs/checkpoint.md "Copies a byte makes"). A chunk of this layout is its raw
little-endian bytes followed by their crc32c (``spec.zarr3_metadata``: codecs ``bytes`` + ``crc32c``; zarr3 stores
an edge chunk whole, padded), so where a whole chunk is one contiguous span of a landing buffer in the stored dtype,
its file is read with ``preadv`` straight into that span, piece by piece, each piece's crc32c taken while it is
still in the CPU's cache: the kernel's copy out of the page cache is the only one, and nothing is allocated.
Several files are read at once in threads (``preadv`` and crc32c release the GIL). A chunk cut by a target's border
or the array's edge, or one that feeds several targets (another sharding), is read the same way whole into a reused
scratch buffer and its parts copied out (``restore._scatter_file``); a cast, a chunk file larger than the read
budget and an object store stay with TensorStore.

Where whole chunk files tile a buffer page by page and the page cache holds most of them, the buffer is the files
themselves: :func:`map_chunks` maps them private one after another into one reservation (a file not wholly cached is
read into its place instead) and :meth:`Mapped.check` takes each file's crc32c over its mapping (docs/checkpoint.md, "Copies a byte makes": what a
mapping leaves to the device, and which filesystems are mapped).

:func:`direct_reads` decides which reads go this way (pure, table-tested); :func:`read_chunk` reads one file. Its
errors begin with the status word TensorStore's would (``DATA_LOSS`` a checksum, ``FAILED_PRECONDITION`` a file of
the wrong size, ``NOT_FOUND`` a missing one, ``PERMISSION_DENIED``...), so ``restore.read_failure`` tells damage
from a store that did not serve the same way for both readers.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import math
import mmap
import os
import sys
from collections.abc import Sequence

import numpy as np

from ..arrays import MADV_POPULATE_WRITE, Region
from ..checksum import crc32c

CRC32C_BYTES = 4  # the crc32c codec's checksum after every chunk's bytes (little-endian)
PIECE_BYTES = 1 << 20  # read, then checksummed while in the CPU's cache (a whole 16 MiB chunk is not)
THREADS = min(16, max(4, os.cpu_count() or 4))  # chunk files read at once: the cores, and a device's queue when cold
PAGE = mmap.PAGESIZE


@dataclasses.dataclass(frozen=True)
class ChunkRead:
    """Chunk ``key`` (its grid index) of a leaf, whole, into elements ``[start, start + count)`` of target buffer
    ``target`` (flat, C order)."""

    key: tuple[int, ...]
    target: int
    start: int
    count: int


def contiguous_span(box: Region, shape: Sequence[int]) -> tuple[int, int] | None:
    """``(first element, elements)`` of the sub-box ``box`` (local coordinates) of a C-order array of ``shape`` when
    its elements are one contiguous run, else None. Pure. Contiguous: every dimension after the first that the box
    does not span whole has extent 1 before it."""
    count = math.prod(hi - lo for lo, hi in box)
    if count == 0:
        return None
    start, stride, partial = 0, 1, False
    for (lo, hi), n in zip(reversed(box), reversed(shape), strict=True):
        if partial and hi - lo != 1:
            return None
        partial = partial or (lo, hi) != (0, n)
        start += lo * stride
        stride *= n
    return start, count


def direct_reads(shape: Sequence[int], chunk_shape: Sequence[int], targets: Sequence[Region],
                 parts: Sequence[tuple[int, Region]]) -> list[ChunkRead] | None:
    """The reads of chunk files straight into target buffers that put the ``parts`` (``(target, region in array
    coordinates)``, from ``restore.plan_reads``: the parts of one chunk) in place, or None when they cannot:
    unless the one part is a whole chunk inside the array (an edge chunk's file holds its padding too) lying as
    one contiguous span in its target's buffer. Pure. (The dtype, the storage and the byte order are the
    caller's to check.)"""
    if len(parts) != 1 or not shape:
        return None
    target, part = parts[0]
    key = tuple(lo // c for (lo, _), c in zip(part, chunk_shape, strict=True))
    whole = tuple((k * c, k * c + c) for k, c in zip(key, chunk_shape, strict=True))
    if part != whole:
        return None
    origin = targets[target]
    span = contiguous_span(tuple((lo - o, hi - o) for (lo, hi), (o, _) in zip(part, origin, strict=True)),
                           [hi - lo for lo, hi in origin])
    return None if span is None else [ChunkRead(key, target, *span)]


def little_endian(dtype: np.dtype) -> bool:
    """Whether ``dtype``'s bytes in memory are the ``bytes`` codec's little-endian ones."""
    return dtype.byteorder == "<" or (dtype.byteorder in ("=", "|") and sys.byteorder == "little")


# The status word a failed system call on a chunk file becomes: absl's table for errno, which TensorStore's file
# driver uses, for the errors a read meets (anything else is UNKNOWN: damage, as TensorStore's would be).
_ERRNO_CODES = {errno.ENOENT: "NOT_FOUND", errno.ENOTDIR: "FAILED_PRECONDITION", errno.EISDIR: "FAILED_PRECONDITION",
                errno.EACCES: "PERMISSION_DENIED", errno.EPERM: "PERMISSION_DENIED", errno.ETIMEDOUT: "DEADLINE_EXCEEDED",
                errno.EAGAIN: "UNAVAILABLE", errno.EINTR: "UNAVAILABLE", errno.ESTALE: "ABORTED",
                errno.ENOMEM: "RESOURCE_EXHAUSTED", errno.EMFILE: "RESOURCE_EXHAUSTED", errno.ENFILE: "RESOURCE_EXHAUSTED"}


def status_word(err: OSError) -> str:
    """The status word TensorStore's file driver would begin its error with for ``err`` (pure)."""
    return _ERRNO_CODES.get(err.errno or 0, "UNKNOWN")


class ChunkFileError(Exception):
    """Reading a chunk file failed; the message begins with a status word and names the file."""


def read_chunk(path: str, out: memoryview) -> None:
    """Read chunk file ``path`` into ``out`` (writable, flat bytes: the chunk's bytes exactly) and check its crc32c.

    Raises:
        ChunkFileError: the file is missing, of another size than ``out`` and its checksum (both named), fails its
            checksum (both named), or a system call failed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise ChunkFileError(f"{status_word(err)}: chunk file {path}: {err.strerror}") from err
    n = len(out)
    try:
        size = os.fstat(fd).st_size
        if size != n + CRC32C_BYTES:
            raise ChunkFileError(f"FAILED_PRECONDITION: chunk file {path} holds {size} bytes, {n + CRC32C_BYTES} "
                                 f"expected ({n} of data and a {CRC32C_BYTES}-byte crc32c; truncated or not "
                                 "fully written)")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a cold file: the kernel reads further ahead
        crc = off = 0
        while off < n:
            with out[off:off + min(PIECE_BYTES, n - off)] as piece:
                got = os.preadv(fd, [piece], off)
            if got == 0:
                raise ChunkFileError(f"FAILED_PRECONDITION: chunk file {path} ended at byte {off} while read, "
                                     f"{n + CRC32C_BYTES} expected (truncated while read)")
            crc = crc32c(out, off, off + got, crc=crc)
            off += got
        tail = os.pread(fd, CRC32C_BYTES + 1, n)
        if len(tail) != CRC32C_BYTES:
            raise ChunkFileError(f"FAILED_PRECONDITION: chunk file {path} holds {n + len(tail)} bytes while read, "
                                 f"{n + CRC32C_BYTES} expected (changed while read)")
        stored = int.from_bytes(tail, "little")
        if stored != crc:
            raise ChunkFileError(f"DATA_LOSS: chunk file {path} fails its checksum: crc32c 0x{crc:08x} of its "
                                 f"{n} bytes, 0x{stored:08x} stored")
    except OSError as err:
        raise ChunkFileError(f"{status_word(err)}: chunk file {path}: {err.strerror}") from err
    finally:
        os.close(fd)


# -- mapped: a buffer that is its chunk files -----------------------------------------------------------------------
# Filesystems (statfs f_type) whose chunk files a restore maps: local ones, where a mapped page the kernel drops
# later is read again from the same device. A network or FUSE filesystem (NFS, gcsfuse) is read instead: a
# dropped page would be fetched again from a server that may be gone by then, and the process would die of SIGBUS.
MAPPABLE_FILESYSTEMS = {0xEF53: "ext2/3/4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
                        0x794C7630: "overlayfs"}


def mappable(reads: Sequence[ChunkRead], count: int, itemsize: int, page: int = PAGE) -> bool:
    """Whether ``reads`` (every read into one target buffer of ``count`` elements of ``itemsize`` bytes) tile that
    buffer exactly, each starting on a page: then the buffer can be the chunk files themselves, mapped one after
    another (:func:`map_chunks`). Pure."""
    pos = 0
    for r in sorted(reads, key=lambda r: r.start):
        if r.start != pos or (r.start * itemsize) % page:
            return False
        pos += r.count
    return count > 0 and pos == count


MAP_MIN_BYTES = 1 << 20  # a smaller buffer is read: a mapping per file costs more than copying so few bytes


def pick_mapped(candidates: dict[object, tuple[int, int]], budget: int, *,
                min_bytes: int = MAP_MIN_BYTES) -> set[object]:
    """Which ``candidates`` (key -> (files, bytes) of a buffer that can be mapped) to map: the largest first, each
    of at least ``min_bytes``, while their files (a mapping each) stay within ``budget``. Pure."""
    out: set[object] = set()
    for key, (files, nbytes) in sorted(candidates.items(), key=lambda kv: -kv[1][1]):
        if nbytes >= min_bytes and files <= budget:
            out.add(key)
            budget -= files
    return out


def map_budget() -> int:
    """How many more mappings a restore may make: half of what the process has left under ``vm.max_map_count``
    (every mapping, malloc's large blocks and threads' stacks too, counts against it; a restore that used them up
    would leave the process unable to allocate). 0 where it cannot be told."""
    try:
        with open("/proc/sys/vm/max_map_count") as fh:
            limit = int(fh.read())
        with open("/proc/self/maps", "rb") as fh:
            used = sum(1 for _ in fh)
    except (OSError, ValueError):
        return 0
    return max(0, (limit - used) // 2)


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 256)]  # struct statfs is 120 bytes on 64-bit Linux


def _libc() -> ctypes.CDLL | None:
    """libc with mmap, mincore and statfs typed, on 64-bit Linux; None elsewhere (nothing is mapped there)."""
    if _LIBC:
        return _LIBC[0]
    lib = None
    if sys.platform.startswith("linux") and sys.maxsize > 2**32:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mmap.restype = ctypes.c_void_p
            lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_long]
            lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            lib.statfs.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Statfs)]
        except (OSError, AttributeError):
            lib = None
    _LIBC.append(lib)
    return lib


_LIBC: list[ctypes.CDLL | None] = []
_MAP_FIXED = 0x10  # Linux's value; Python's mmap module does not export it


def filesystem(path: str) -> int | None:
    """statfs's ``f_type`` of the filesystem holding ``path``; None when it cannot be told."""
    lib = _libc()
    st = _Statfs()
    if lib is None or lib.statfs(os.fsencode(path), ctypes.byref(st)) != 0:
        return None
    return int(st.f_type) & 0xFFFFFFFF


class Mapped:
    """A target buffer that is its chunk files themselves, each mapped private and writable (a write copies the
    page; the file never changes) at its place in one reservation: the page cache's pages, no copy and no fresh
    memory. A file the page cache does not hold whole is read instead, into anonymous memory at its place
    (``unread``). :meth:`complete` checks every mapped file (its crc32c over its mapped bytes: the first read of
    each page maps it, many pages a fault) and reads the others (:func:`read_chunk`). The reservation is
    unmapped, files and all, when the last array over it goes."""

    def __init__(self, mem: mmap.mmap, files: dict[int, tuple[str, int, int]],
                 unread: dict[int, tuple[str, int]] | None = None) -> None:
        self.mem = mem
        self._files = files  # byte offset -> (path, data bytes, stored crc32c): mapped
        self.unread = dict(unread or {})  # byte offset -> (path, data bytes): read by complete()
        self.mapped = frozenset(files)  # byte offsets of the files mapped (the others are read)
        self.mapped_bytes = sum(n for _, n, _ in files.values())
        self.nbytes = self.mapped_bytes + sum(n for _, n in self.unread.values())

    def buffer(self) -> np.ndarray:
        """The buffer's bytes (the reservation without the tail of its last page)."""
        return np.frombuffer(self.mem, np.uint8, count=self.nbytes)

    def complete(self) -> None:
        """:meth:`check` every mapped file and read every other one into its place, in order."""
        for offset in self._files:
            self.check(offset)
        for offset, (path, n) in self.unread.items():
            with contextlib.suppress(OSError, ValueError):  # an older kernel: its pages fault in as they are read
                self.mem.madvise(MADV_POPULATE_WRITE, offset, -(-n // PAGE) * PAGE)
            with memoryview(self.mem) as whole, whole[offset:offset + n] as out:
                read_chunk(path, out)

    def check(self, offset: int) -> None:
        """Raises ChunkFileError (``DATA_LOSS``, naming the file and both checksums) when the file mapped at byte
        ``offset`` fails its checksum."""
        path, n, stored = self._files[offset]
        crc = crc32c(self.mem, offset, offset + n)
        if crc != stored:
            raise ChunkFileError(f"DATA_LOSS: chunk file {path} fails its checksum: crc32c 0x{crc:08x} of its {n} "
                                 f"bytes, 0x{stored:08x} stored")


def map_chunks(paths: Sequence[str], nbytes: Sequence[int]) -> Mapped | None:
    """The chunk files ``paths`` (``nbytes[k]`` data bytes each; every one but the last a whole number of pages)
    mapped one after another into one buffer, each one the page cache holds whole; the others are left to
    :meth:`Mapped.complete` to read into their places (never faulted in from the device: a device's read error
    would be a SIGBUS there, and ``read_chunk`` names it). None where they are not to be mapped, and the caller
    reads them all into a buffer of its own: not 64-bit Linux, a filesystem not in :data:`MAPPABLE_FILESYSTEMS`, a
    file missing or of another size than its data and checksum (:func:`read_chunk` then names it), or fewer than
    half of their bytes in files the page cache holds whole (a warm process's landing memory serves such a read)."""
    lib = _libc()
    if lib is None or not paths or filesystem(paths[0]) not in MAPPABLE_FILESYSTEMS:
        return None
    total = sum(nbytes)
    mem = mmap.mmap(-1, -(-total // PAGE) * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = (ctypes.c_char * 1).from_buffer(mem)
    base = ctypes.addressof(view)
    del view
    files: dict[int, tuple[str, int, int]] = {}
    unread: dict[int, tuple[str, int]] = {}
    done = False
    cached = 0
    try:
        off = 0
        for path, n in zip(paths, nbytes, strict=True):
            length = -(-n // PAGE) * PAGE
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if os.fstat(fd).st_size != n + CRC32C_BYTES:
                    return None
                tail = os.pread(fd, CRC32C_BYTES, n)
                got = lib.mmap(base + off, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | _MAP_FIXED,
                               fd, 0)
            finally:
                os.close(fd)
            if got != base + off or len(tail) != CRC32C_BYTES:
                return None
            vec = bytearray(length // PAGE)  # one byte a page: bit 0 set when the page cache holds it
            if lib.mincore(base + off, length, (ctypes.c_char * len(vec)).from_buffer(vec)) != 0:
                return None
            if (np.frombuffer(vec, np.uint8) & 1).all():
                files[off] = (path, n, int.from_bytes(tail, "little"))
                cached += n
            else:  # anonymous memory in its place again, to be read into
                got = lib.mmap(base + off, length, mmap.PROT_READ | mmap.PROT_WRITE,
                               mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
                if got != base + off:
                    return None
                unread[off] = (path, n)
            off += n
        if 2 * cached < total:
            return None
        done = True
        return Mapped(mem, files, unread)
    except OSError:
        return None
    finally:
        if not done:
            mem.close()  # the reservation and every file mapped into it
