"""Array helpers both tiers share: shard regions, the aligned host buffers every restore lands in, shardings
and typed PRNG keys. ``reprieve.checkpoint`` (storage) and ``reprieve.memtier`` (memory) import them from here;
neither imports the other's private helpers."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import mmap
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from . import landing

Region = tuple[tuple[int, int], ...]


def region_of(index: tuple[Any, ...], shape: tuple[int, ...]) -> Region:
    """Normalise a shard index (tuple of slices) to ((start, stop), ...)."""
    out = []
    for sl, n in zip(index, shape, strict=True):
        start, stop, step = sl.indices(n)
        if step != 1:
            raise ValueError(f"shard index {index} has a strided slice; only contiguous shards are supported")
        out.append((start, stop))
    return tuple(out)


def addressable_regions(sharding: Any, shape: tuple[int, ...]) -> tuple[list[Region], list[list[Any]]]:
    """The regions of a ``shape`` array this process's devices hold under ``sharding``, each with its devices (a
    replicated region once, with every device holding it); no sharding: the whole array, no device."""
    if sharding is None:
        return [tuple((0, n) for n in shape)], [[]]
    by_region: dict[Region, list[Any]] = collections.defaultdict(list)
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        by_region[region_of(index, shape)].append(device)
    return list(by_region), list(by_region.values())


def process_regions(sharding: Any, shape: tuple[int, ...]) -> dict[int, set[Region]]:
    """The regions of a ``shape`` array that every process of the job holds under ``sharding`` (all its devices, not
    only this process's), by process index."""
    out: dict[int, set[Region]] = collections.defaultdict(set)
    for device, index in sharding.devices_indices_map(shape).items():
        out[device.process_index].add(region_of(index, shape))
    return dict(out)


def region_slices(region: Region) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in region)


def intersect(a: Region, b: Region) -> Region | None:
    """The overlap of two regions; None when they do not overlap (a 0-d region overlaps itself)."""
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return out if all(lo < hi for lo, hi in out) or not out else None


def region_size(r: Region) -> int:
    """Elements in ``r``."""
    return int(np.prod([hi - lo for lo, hi in r], dtype=np.int64))


def local_slices(part: Region, origin: Region) -> tuple[slice, ...]:
    """``part`` (array coordinates) as slices of the buffer that holds region ``origin``."""
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(part, origin, strict=True))


def describe_sharding(sharding: Any) -> dict[str, Any]:
    """What the array was saved with (for humans and debugging; restore uses the caller's sharding)."""
    desc: dict[str, Any] = {"type": type(sharding).__name__}
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and hasattr(mesh, "shape"):
        desc["mesh"] = {str(k): int(v) for k, v in dict(mesh.shape).items()}
    if hasattr(sharding, "spec"):
        desc["spec"] = str(sharding.spec)
    desc["num_devices"] = len(sharding.device_set)
    return desc


_ALIGN = 64  # XLA's CPU client adopts host buffers with this alignment instead of copying them
_POPULATE_MIN = 1 << 20
_HUGE_MIN = 8 << 20  # buffers from this size on use transparent huge pages where the kernel lends them on request
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14; Python 3.11's mmap lacks the name


_PROBE_BYTES = 16 << 20  # small pages populated once per process: the rate huge pages must beat


@functools.cache
def _huge_pages_offered() -> bool:
    """Whether the kernel gives transparent huge pages to memory that asks for them (``always`` or ``madvise``)
    and can populate memory on request (MADV_POPULATE_WRITE)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            mode = fh.read()
    except OSError:
        return False
    if "[never]" in mode:
        return False
    probe = mmap.mmap(-1, 1 << 21, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        probe.madvise(MADV_POPULATE_WRITE)
    except OSError:
        return False
    finally:
        probe.close()
    return True


@functools.cache
def _small_pages_seconds_per_byte() -> float:
    """Seconds per byte to populate fresh memory in 4 KiB pages with ``MAP_POPULATE`` (measured once)."""
    t = time.perf_counter()
    mmap.mmap(-1, _PROBE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE).close()
    return (time.perf_counter() - t) / _PROBE_BYTES


_huge_slower = [False]  # a huge-page buffer of this process populated slower than small pages would have


def _huge_pages() -> bool:
    """Whether the next large host buffer uses transparent huge pages: where the kernel offers them, until one
    populates slower than small pages would have (then small pages for the rest of the process).

    Which is faster depends on the machine and its state, not the code: on the 16-core device host huge pages
    halved the restores; on the shared 2-core VM a fresh process populated 1 GiB of huge pages at 0.3-0.4 GiB/s
    against 2.9 GiB/s for small pages, which made allocating the landing buffers 60-80 % of a page-cached storage
    restore (benchmarks/RESULTS.md, "Restore floors"). A small probe cannot tell: the first few huge pages came at
    20 GiB/s there (a virtual machine whose host takes back the guest's free 2 MiB blocks faults most huge pages
    in from the host page by page; small pages come from blocks it still backs), so each buffer is judged as it
    is made."""
    return _huge_pages_offered() and not _huge_slower[0]


def host_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A writable, 64-byte aligned buffer (CPU devices adopt such buffers without a copy) whose pages are populated by the kernel up front.

    Faulting fresh memory in page by page from user space is the single largest cost of a restore on
    virtual machines (measured 0.3-4 s/GiB on the benchmark VM, against ~0.5 s/GiB for one
    ``MAP_POPULATE`` mmap); every restored byte lands in memory populated this way.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes >= _POPULATE_MIN and (piece := landing.take(nbytes)) is not None:
        return piece.view(dtype).reshape(shape)  # populated ahead by a warm process (reprieve.landing), page-aligned
    if nbytes >= _HUGE_MIN and _huge_pages():
        # Transparent huge pages where the kernel offers them on request (``madvise`` mode): one fault per 2 MiB
        # instead of per 4 KiB, populated by the kernel up front (MADV_POPULATE_WRITE, Linux 5.14); measured
        # against MAP_POPULATE's small pages by benchmarks/memtier.py --small-pages
        mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        t = time.perf_counter()
        try:
            mem.madvise(mmap.MADV_HUGEPAGE)
            mem.madvise(MADV_POPULATE_WRITE)
        except OSError:  # an older kernel: its pages fault in on first touch instead, as with np.empty
            pass
        if time.perf_counter() - t > nbytes * _small_pages_seconds_per_byte():
            _huge_slower[0] = True
        return np.frombuffer(mem, dtype=dtype).reshape(shape)
    if nbytes >= _POPULATE_MIN and hasattr(mmap, "MAP_POPULATE"):
        mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        return np.frombuffer(mem, dtype=dtype).reshape(shape)
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    off = (-raw.ctypes.data) % _ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def host_buffers(specs: list[tuple[tuple[int, ...], np.dtype]], pool: concurrent.futures.Executor) -> list[np.ndarray]:
    """:func:`host_buffer` of every ``(shape, dtype)``, made in ``pool`` (the kernel populates each as it is made,
    without the GIL: the population spreads over the cores). The first large one is made alone: it judges huge
    pages for the rest (made at once, every one of them would try them, and where they populate slower, as on the
    shared VM, each would pay it)."""
    first = next((i for i, (shape, dtype) in enumerate(specs)
                  if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize >= _HUGE_MIN), None)
    alone = {first: host_buffer(*specs[first])} if first is not None and _huge_pages() else {}
    made = iter(list(pool.map(lambda sd: host_buffer(*sd), [sd for i, sd in enumerate(specs) if i not in alone])))
    return [alone[i] if i in alone else next(made) for i in range(len(specs))]


def on_devices(buffers: list[np.ndarray], devices: list[list[Any]]) -> dict[Any, Any]:
    """Each restored host buffer on its devices (``devices[i]``: those that hold ``buffers[i]``'s region): the
    first adopts the buffer itself, every other replica gets its own copy, so that donating one can never scribble
    over another. The copy lands in a :func:`host_buffer`, which the device adopts too: a plain numpy copy is only
    16-byte aligned, so the device copied it once more (1 GiB: ~0.5 s more on the benchmark VM)."""
    values, targets = _replicas(buffers, devices)
    # one batched call for all of them, not one each (device_put's dispatch costs ~50 us a call)
    return dict(zip(targets, jax.device_put(values, targets), strict=True))


def _replicas(buffers: list[np.ndarray], devices: list[list[Any]]) -> tuple[list[np.ndarray], list[Any]]:
    """:func:`on_devices`'s ``(values, targets)``: each buffer for its first device, an aligned copy for each other."""
    values, targets = [], []
    for buf, devs in zip(buffers, devices, strict=True):
        for n, d in enumerate(devs):
            if n:
                own = host_buffer(buf.shape, buf.dtype)
                np.copyto(own, buf)
            values.append(buf if n == 0 else own)
            targets.append(d)
    return values, targets


class OwnedCopies:
    """What :func:`owned_copies` gives its block: ``decide`` (asked once, by the first :func:`assemble` with CPU
    devices in it: True puts XLA's own copies there, None or False the buffers themselves) and the bytes copied so."""

    def __init__(self, decide: Callable[[], bool | None]) -> None:
        self._decide = decide
        self._answer: bool | None = None
        self.asked = False
        self.copied = 0  # by the newest assemble that copied (a restore that fell back to another source: its own)

    def wanted(self) -> bool:
        if not self.asked:
            self.asked, self._answer = True, self._decide()
        return bool(self._answer)


_owned: contextvars.ContextVar[OwnedCopies | None] = contextvars.ContextVar("reprieve_owned_copies", default=None)


@contextlib.contextmanager
def owned_copies(decide: Callable[[], bool | None]) -> Iterator[OwnedCopies]:
    """Within the block, every restore's :func:`assemble` on CPU devices puts copies into memory XLA allocates when
    ``decide()`` says so (``Job.restore_or``: the step donates the state, and the restore's own buffers cannot be
    donated): the bytes land once in XLA's memory, and a replicated region's copies are XLA's, with no host copy
    for each replica first. ``decide`` is asked when the first leaves are put, after the reads, and must not wait;
    None (not known yet) leaves the buffers adopted, and the caller copies afterwards
    (:func:`owned_by_cpu_devices`)."""
    owned = OwnedCopies(decide)
    token = _owned.set(owned)
    try:
        yield owned
    finally:
        _owned.reset(token)


def assemble(leaves: list[tuple[list[np.ndarray], list[list[Any]], tuple[int, ...], Any]]) -> list[Any]:
    """The ``jax.Array`` of each restored leaf ``(buffers, devices, shape, sharding)`` (``buffers``/``devices`` as
    :func:`on_devices` takes them), every leaf's buffers put on their devices in one ``device_put``: a restore of a
    model's hundreds of leaves pays the call's dispatch once, not once a leaf (benchmarks/RESULTS.md, "Goodput and
    restart gaps"). Inside :func:`owned_copies` that says so, on CPU devices, the put copies into memory XLA
    allocates (each replica its own copy), and waits for the copies: the buffers are then free to go."""
    owned = _owned.get()
    copy = (owned is not None and bool(leaves) and
            all(str(getattr(d, "platform", "")) == "cpu" for _, devices, _, _ in leaves for ds in devices for d in ds)
            and owned.wanted())
    values: list[Any] = []
    targets: list[Any] = []
    spans = []
    if copy:  # each buffer adopted by its first device, then copied by XLA onto each of its devices
        firsts = [buf for buffers, _, _, _ in leaves for buf in buffers]
        adopted = iter(jax.device_put(firsts, [ds[0] for _, devices, _, _ in leaves for ds in devices]))
    for buffers, devices, _, _ in leaves:
        start = len(values)
        if copy:
            for devs in devices:
                values += [next(adopted)] * len(devs)
                targets += devs
        else:
            vs, ts = _replicas(buffers, devices)
            values += vs
            targets += ts
        spans.append((start, len(values)))
    if copy:
        assert owned is not None
        # a host numpy buffer put with may_alias=False is copied into another host buffer, which XLA adopts and a
        # donation cannot reuse either; an array on a device put again with it is a copy XLA allocates
        put = jax.device_put(values, targets, may_alias=False) if values else []
        jax.block_until_ready(put)  # the bytes are XLA's now: the buffers (a mapping, a landing pool's) may go
        owned.copied = sum(int(v.nbytes) for v in values)
    else:
        put = jax.device_put(values, targets) if values else []
    out = []
    for (_, _, shape, sharding), (a, b) in zip(leaves, spans, strict=True):
        placed = dict(zip(targets[a:b], put[a:b], strict=True))
        ordered = [placed[d] for d in sharding.addressable_devices_indices_map(shape)]
        out.append(jax.make_array_from_single_device_arrays(shape, sharding, ordered))
    return out


def owned_by_cpu_devices(state: Any) -> tuple[Any, int]:
    """``state`` with every ``jax.Array`` on CPU devices copied, on its own devices, into memory XLA allocates
    (``jax.device_put(..., may_alias=False)``: an array's copy, asynchronous), and the bytes copied; other leaves
    as they are.

    A restore's arrays on CPU devices are the host buffers the bytes landed in, adopted (:func:`on_devices`), and
    XLA cannot reuse memory it did not allocate for a donated input: a step that donates them writes the whole state
    into new memory at its first call, more slowly than a step that donates nothing
    (``benchmarks/donated_first_step.py``). This copy costs less than that and lets the donation work from the first
    call. On other platforms a restore copied the bytes into device memory already: nothing to do there."""
    leaves, treedef = jax.tree.flatten(state)
    picked = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and landing.on_cpu_devices(x)]
    if not picked:
        return state, 0
    # shard by shard: an array of several processes is not addressable as a whole (device_put refuses it)
    shards = [list(leaves[i].addressable_shards) for i in picked]
    flat = [s for group in shards for s in group]
    copies = iter(jax.device_put([s.data for s in flat], [s.device for s in flat], may_alias=False))
    nbytes = 0
    for i, group in zip(picked, shards, strict=True):
        x = leaves[i]
        own = [next(copies) for _ in group]
        nbytes += sum(int(c.nbytes) for c in own)
        leaves[i] = jax.make_array_from_single_device_arrays(x.shape, x.sharding, own)
    return jax.tree.unflatten(treedef, leaves), nbytes


def is_abstract_array(x: Any) -> bool:
    return isinstance(x, (jax.ShapeDtypeStruct, jax.Array))


def sharding_of(x: Any) -> Any:
    return getattr(x, "sharding", None) if is_abstract_array(x) else None


def prng_key_impl(target: Any) -> str | None:
    """The PRNG impl name of a typed-key abstract leaf (``jax.random.key``'s dtype), else None."""
    dtype = getattr(target, "dtype", None)
    if dtype is None or not is_abstract_array(target) or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    return str(dtype._impl.name)  # no public accessor for a ShapeDtypeStruct's key impl


def key_data_sharding(path: str, sharding: Any) -> Any:
    """The sharding of a key array's data (one more, unsharded, trailing dimension)."""
    if sharding is None:
        return None
    if isinstance(sharding, (jax.sharding.NamedSharding, jax.sharding.SingleDeviceSharding)):
        return sharding  # a NamedSharding's spec leaves the trailing dimension replicated
    raise ValueError(f"restore leaf {path}: typed PRNG keys restore onto a NamedSharding or a single device, "
                     f"got {type(sharding).__name__}")
