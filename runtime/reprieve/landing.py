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

**Memory XLA allocates, populated ahead.** On CPU devices a step that donates the state needs the restored state
copied into memory XLA allocates (:func:`reprieve.arrays.owned_by_cpu_devices`): a second state's worth of fresh
memory, populated by the kernel at the copy, on the first step's path (benchmarks/RESULTS.md, "A donated step's
first call after a restore"). The trainer reports those bytes too (``REPRIEVE_WARM_OWNED_BYTES``), and
:func:`reserve_owned` makes them part of the process's C heap ahead: glibc's ``malloc`` is told to keep large blocks
in its heap (``mallopt``: no ``mmap``, no trimming), and one block of that size is populated and freed, so XLA's
allocations for the copy reuse populated pages.
:func:`owned_done` sets glibc's thresholds to their steady values after the copy and gives the unused rest back
(``malloc_trim``). Only with glibc; elsewhere the copy writes fresh memory, as without a hint.
"""

from __future__ import annotations

import ctypes
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


def room_problem(nbytes: int, *, current: int | None, limit: int | None, available: int | None,
                 what: str = "landing memory") -> str | None:
    """Why ``nbytes`` of landing memory (or ``what``) must not be populated now (pure): the pod's cgroup (``current``
    of ``limit`` bytes in use) or the machine (``available``) would not have room for it twice over. None: room."""
    if limit is not None and current is not None and current + 2 * nbytes > limit:
        return (f"the pod's memory limit is {limit} bytes with {current} in use: {nbytes} bytes of {what} "
                f"need twice that free")
    if available is not None and available < 2 * nbytes:
        return f"the machine has {available} bytes available: {nbytes} bytes of {what} need twice that"
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

    def unused(self) -> int:
        """The bytes not handed out (0 once released)."""
        with self._lock:
            return 0 if self._closed else self.size - self._next

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


def release(why: str | None = None) -> int:
    """:meth:`Pool.release` of this process's pool (0 without one, or once released): logged the first time, with
    ``why`` when no restore took from it."""
    if not _pool:
        return 0
    pool = _pool[0]
    left = pool.release()
    if left is None:
        return 0
    if why is None:
        log.info("landing memory: %d of %d bytes populated ahead were used by the restore; %d given back",
                 pool.taken, pool.size, left)
    else:
        log.info("landing memory: %d bytes populated ahead given back %s", left, why)
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


def on_cpu_devices(x: Any) -> bool:
    """Whether ``x`` (an array or its abstract, with a sharding) lives on CPU devices only: what
    :func:`reprieve.arrays.owned_by_cpu_devices` copies. A numpy array or a leaf without a sharding: False."""
    sharding = getattr(x, "sharding", None)
    return sharding is not None and not isinstance(x, np.ndarray) and all(
        str(getattr(d, "platform", "")) == "cpu" for d in sharding.device_set)


def owned_bytes(state: Any) -> int | None:
    """What :func:`reprieve.arrays.owned_by_cpu_devices` copies of ``state`` (arrays or their abstract): the
    :func:`leaf_bytes` of its leaves on CPU devices; None when it cannot tell."""
    if "jax" not in sys.modules:
        return None
    import jax

    try:
        return sum(leaf_bytes(x) for x in jax.tree.leaves(state) if on_cpu_devices(x))
    except Exception as err:  # noqa: BLE001 - a hint for the next warm process, never a reason to fail
        log.debug("bytes of the state on CPU devices not known: %s", err)
        return None


# -- memory XLA allocates, populated ahead (see the module docstring) ------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameters (malloc.h)
# After the copy: what glibc's dynamic thresholds reach once a large block was freed (DEFAULT_MMAP_THRESHOLD_MAX on
# 64-bit, the trim threshold twice it); a mallopt call turns the dynamic thresholds off, so they are set, not restored.
_STEADY = ((_M_MMAP_MAX, 65536), (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 64 << 20))
_SLACK = 32 << 20  # beyond the hint: the restore's own small allocations come from the same heap
_heap: list[int] = []  # the bytes this process populated in its heap ahead, once; emptied by owned_done


def _glibc() -> Any | None:
    """This process's C library when it is glibc (``mallopt``, ``malloc_trim``, ``gnu_get_libc_version``)."""
    try:
        lib = ctypes.CDLL(None)
        lib.gnu_get_libc_version  # noqa: B018 - glibc's own: musl has mallopt as a no-op
        lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        lib.free.argtypes = [ctypes.c_void_p]
        lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.malloc_trim.argtypes = [ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):
        return None


def _resident() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def reserve_owned(nbytes: int, memory: Mapping[str, int | None] | None = None, *, minimum: int = MIN_BYTES) -> bool:
    """Populate ``nbytes`` (and a little more) of this process's C heap for the memory XLA allocates at the restore's
    copy (see the module docstring), when there is room (:func:`room_problem`, with what is in use now): whether it
    did. Not below ``minimum``, not twice, not without glibc."""
    if _heap or nbytes < max(minimum, 1):
        return False
    m = memory_now() if memory is None else memory
    size = nbytes + _SLACK
    problem = room_problem(size, current=m.get("current"), limit=m.get("limit"), available=m.get("available"),
                           what="memory XLA allocates")
    if problem is not None:
        log.info("memory XLA allocates not populated ahead: %s", problem)
        return False
    lib = _glibc()
    if lib is None:
        log.info("memory XLA allocates not populated ahead: the C library is not glibc (no mallopt to keep it)")
        return False
    t = time.perf_counter()
    # M_TRIM_THRESHOLD is a size_t behind mallopt's int: -1 is "never", whatever the state's size
    if not (lib.mallopt(_M_MMAP_MAX, 0) and lib.mallopt(_M_TRIM_THRESHOLD, -1)):
        _steady(lib)
        log.info("memory XLA allocates not populated ahead: glibc refused the mallopt settings")
        return False
    block = lib.malloc(size)
    if not block:
        _steady(lib)
        log.info("memory XLA allocates not populated ahead: malloc(%d) failed", size)
        return False
    ctypes.memset(block, 0, size)  # the kernel populates each page at its first write
    lib.free(block)  # into the heap's free top, kept (no trimming): XLA's allocations reuse it
    _heap.append(size)
    log.info("memory XLA allocates: %d bytes populated ahead in %.2fs for the restore's copy", size,
             time.perf_counter() - t)
    return True


def _steady(lib: Any) -> None:
    for param, value in _STEADY:
        lib.mallopt(param, value)


def owned_ahead() -> bool:
    """Whether this process populated heap memory ahead that :func:`owned_done` has not given back yet."""
    return bool(_heap)


def owned_done(why: str = "after the restore's copy") -> int | None:
    """The restore's copy is made (or none was): glibc's thresholds set to their steady values and the heap's unused
    populated memory given back (``malloc_trim``); the bytes given back, logged with ``why``. None when nothing was
    populated ahead (or once done)."""
    if not _heap:
        return None
    size = _heap.pop()
    lib = _glibc()
    if lib is None:
        return None
    before = _resident()
    _steady(lib)
    lib.malloc_trim(0)
    back = max(before - _resident(), 0)
    log.info("memory XLA allocates: %d bytes populated ahead; %d given back %s", size, back, why)
    return back


# -- giving it back when the machine runs short ------------------------------------------------------------------
def held_ahead() -> int:
    """The bytes this process holds populated ahead for a restore that has not come: its pool's part not handed out
    and the heap block for XLA's copy (0: none)."""
    pool = _pool[0].unused() if _pool else 0
    return pool + (_heap[0] if _heap else 0)


def tight_problem(held: int, *, current: int | None, limit: int | None, available: int | None) -> str | None:
    """Why ``held`` bytes populated ahead must go back now (pure): the room that let a warm process make them (twice
    over, :func:`room_problem`) has fallen below once over: the pod's headroom under its limit (``limit - current``)
    or the machine's available memory is less than ``held``, so another process's next allocation (a restore, a
    save's host copy, a new pod) would push the pod towards its limit or the machine into reclaim and stalls, for a
    head start on a restore that may not come. None: keep it (nothing held, or room once over)."""
    if held <= 0:
        return None
    if limit is not None and current is not None and limit - current < held:
        return (f"the pod's memory limit is {limit} bytes with {current} in use: less than the {held} bytes held "
                "ahead are left")
    if available is not None and available < held:
        return f"the machine has {available} bytes available, less than the {held} bytes held ahead"
    return None


def give_back_if_tight(memory: Mapping[str, int | None] | None = None) -> int:
    """A warm process's check while it waits: when :func:`tight_problem` says so, its pool and its heap block go back
    to the kernel (the restore then makes fresh buffers, as without them), logged with the numbers; the bytes given
    back (0: nothing held, or kept). Not populated again: the machine was short once."""
    held = held_ahead()
    if not held:
        return 0
    m = memory_now() if memory is None else memory
    problem = tight_problem(held, current=m.get("current"), limit=m.get("limit"), available=m.get("available"))
    if problem is None:
        return 0
    log.warning("memory populated ahead for the next restore given back: %s (the restore makes fresh buffers)",
                problem)
    return release("as the machine runs short") + (owned_done("as the machine runs short") or 0)
