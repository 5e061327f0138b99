"""Landing memory populated ahead: a pre-warmed process makes the memory its restore will land in while it waits
for its assignment, so that the restore writes into pages the process already has (docs/restarts.md, "Pre-warmed
next attempt"; docs/checkpoint.md, "Copies a byte makes").

Every restored byte lands in a fresh host buffer (:func:`reprieve.arrays.host_buffer`), and fresh memory has to be
populated by the kernel before the first write: on a virtual machine that is the largest part of a storage restore
from the page cache and of a restore from a peer's memory (benchmarks/RESULTS.md, "Restore floors"). A warm process
parks for the whole previous attempt, with nothing else to do. The supervisor tells it how many bytes the last
trainer's restore landed (``REPRIEVE_WARM_LANDING_BYTES``, from that trainer's first-step event; a spare, in whose
pod no trainer ran, reads what the latest checkpoint records instead: ``reprieve.prewarm.LandingAhead``), and
:func:`reserve` populates one mapping of that size there, if the pod's memory has room for it twice over (the
running trainer still grows: its saves snapshot the state). :func:`take` then hands out page-aligned pieces of it
to the restore's buffers, and :func:`release` gives back what the restore did not use. A piece's pages go back to
the kernel when its last array is gone (``MADV_DONTNEED``), so one piece kept alive never holds the whole mapping's
memory.

One pool per process, made once: it is the process's memory, like the allocator's, not any object's. Nothing here
is needed for a restore to work; a restore without a pool, or past its end, makes fresh buffers as before.
"""

from __future__ import annotations

import logging
import math
import mmap
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
MIN_BYTES = 64 << 20  # below this a restore's fresh memory costs too little to be worth a pool


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


def room_problem(nbytes: int, *, current: int | None, limit: int | None, available: int | None) -> str | None:
    """Why ``nbytes`` of landing memory must not be populated now (pure): the pod's cgroup (``current`` of
    ``limit`` bytes in use) or the machine (``available``) would not have room for it twice over. None: room."""
    if limit is not None and current is not None and current + 2 * nbytes > limit:
        return (f"the pod's memory limit is {limit} bytes with {current} in use: {nbytes} bytes of landing memory "
                f"need twice that free")
    if available is not None and available < 2 * nbytes:
        return f"the machine has {available} bytes available: {nbytes} bytes of landing memory need twice that"
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            raw = fh.read().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


def _available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_now() -> dict[str, int | None]:
    """This process's cgroup (v2) memory in use and its limit (None: no limit), and the machine's available memory."""
    return {"current": _read_int("/sys/fs/cgroup/memory.current"), "limit": _read_int("/sys/fs/cgroup/memory.max"),
            "available": _available()}


class Pool:
    """One populated mapping of ``size`` bytes, handed out in page-aligned pieces from its start (thread-safe)."""

    def __init__(self, size: int) -> None:
        self.size = _pages(size)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        self._mem = mmap.mmap(-1, self.size, flags=flags)
        self._next = 0
        self._closed = False
        self._lock = threading.Lock()
        self.taken = 0

    def take(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of populated memory (a uint8 array, page-aligned), or None when the pool cannot hold them."""
        span = _pages(max(nbytes, 1))
        with self._lock:
            if self._closed or self._next + span > self.size:
                return None
            start, self._next = self._next, self._next + span
            self.taken += nbytes
        piece = np.frombuffer(self._mem, dtype=np.uint8, count=nbytes, offset=start)
        weakref.finalize(piece, _give_back, self._mem, start, span)
        return piece

    def release(self) -> int | None:
        """No more pieces: the part never handed out goes back to the kernel now; the bytes given back (None: it
        was released before)."""
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            start = self._next
        left = self.size - start
        if left:
            _give_back(self._mem, start, left)
        return left


def _give_back(mem: mmap.mmap, start: int, length: int) -> None:
    try:
        mem.madvise(mmap.MADV_DONTNEED, start, length)
    except (OSError, ValueError):  # closed, or a kernel without it: the memory goes with the mapping instead
        pass


_pool: list[Pool] = []  # this process's, once made (see the module docstring)


def reserve(nbytes: int, memory: Mapping[str, int | None] | None = None, *, minimum: int = MIN_BYTES) -> Pool | None:
    """Populate ``nbytes`` of landing memory for this process's next restore, when there is room
    (:func:`room_problem`); None when there is not, when it is below ``minimum`` (too small to matter), or when one
    exists already."""
    if _pool or nbytes < max(minimum, 1):
        return None
    m = memory_now() if memory is None else memory
    problem = room_problem(nbytes, current=m.get("current"), limit=m.get("limit"), available=m.get("available"))
    if problem is not None:
        log.info("landing memory not populated ahead: %s", problem)
        return None
    t = time.perf_counter()
    try:
        pool = Pool(nbytes)
    except (OSError, ValueError) as err:
        log.info("landing memory not populated ahead: %s", err)
        return None
    _pool.append(pool)
    log.info("landing memory: %d bytes populated ahead in %.2fs for the next restore", pool.size,
             time.perf_counter() - t)
    return pool


def take(nbytes: int) -> np.ndarray | None:
    """A piece of this process's pool (:meth:`Pool.take`), None without one or past its end."""
    return _pool[0].take(nbytes) if _pool else None


def release() -> int:
    """:meth:`Pool.release` of this process's pool (0 without one, or once released): logged the first time."""
    if not _pool:
        return 0
    pool = _pool[0]
    left = pool.release()
    if left is None:
        return 0
    log.info("landing memory: %d of %d bytes populated ahead were used by the restore; %d given back", pool.taken,
             pool.size, left)
    return left


def leaf_bytes(x: Any, *, adopted_once: bool = False) -> int:
    """The host bytes a restore of one leaf lands in this process: a ``jax.Array``, or a ``jax.ShapeDtypeStruct``
    with a sharding, once per addressable device (each replica is a buffer of its own; a typed PRNG key as its key
    data), a numpy array whole; anything else 0. Abstract: no array is read or made.

    ``adopted_once``: the restore hands each distinct shard to its first device as the source's own pages (the
    pod's own memory-tier copy, mapped: docs/memory.md), so only the other replicas land."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    sharding = getattr(x, "sharding", None)
    if sharding is None or "jax" not in sys.modules:
        return 0
    import jax

    shape, dtype = tuple(x.shape), x.dtype
    words = 1
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # what a restore lands: the key's words
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
        words, dtype = math.prod(data.shape[len(shape):]), data.dtype
    buffers = len(sharding.addressable_devices)
    if adopted_once:  # the distinct shards (slices are not hashable: their (start, stop, step) are)
        buffers -= len({tuple(sl.indices(n) for sl, n in zip(index, shape, strict=True))
                        for index in sharding.addressable_devices_indices_map(shape).values()})
    return math.prod(sharding.shard_shape(shape)) * words * np.dtype(dtype).itemsize * buffers


def landing_bytes(state: Any, *, adopted_once: bool = False) -> int | None:
    """:func:`leaf_bytes` over every leaf of ``state`` (arrays or their abstract); None when it cannot tell."""
    if "jax" not in sys.modules:
        return None
    import jax

    try:
        return sum(leaf_bytes(x, adopted_once=adopted_once) for x in jax.tree.leaves(state))
    except Exception as err:  # noqa: BLE001 - a hint for the next warm process, never a reason to fail
        log.debug("landing bytes of the state not known: %s", err)
        return None
