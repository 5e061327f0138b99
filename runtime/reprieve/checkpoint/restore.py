"""Restore path: read only what this process's devices need, chunk by chunk, under a memory budget.

For every leaf, each distinct target shard region this process needs gets one 64-byte aligned host
buffer (on CPU the device then adopts it without a copy). :func:`plan_reads` (pure) decides how the
saved chunks fill those buffers:

* on a local filesystem, a buffer that whole chunk files in the stored dtype tile page by page (the same sharding)
  is those files themselves where the page cache holds them: mapped private one after another
  (:func:`.chunk_files.map_chunks`; no copy, no fresh memory), each file's crc32c checked over its mapping in this
  restore's threads;
* otherwise there, a whole chunk that is one contiguous span of a buffer in the stored dtype is read by
  :mod:`.chunk_files` straight into it, several files at once in this restore's threads (one copy a byte, crc32c
  checked in place, no transient memory);
* a target region that lies inside one saved chunk is read by TensorStore straight into its buffer
  (the same-sharding case on an object store or with a cast: no intermediate array; casts happen on the way);
* otherwise, on a local filesystem in the stored dtype, a chunk file no larger than the budget is read whole into
  a scratch buffer (reused from chunk to chunk, at most the budget's bytes of them), checked as it is read, and
  each part a target region needs is copied from it into that region's buffer: resharding reads each file once
  and allocates nothing per chunk (through TensorStore's chunk cache, below, a resharded restore took longer and
  peaked higher: benchmarks/RESULTS.md, "Checkpoints vs Orbax", run H);
* elsewhere (an object store, a cast) each part of a chunk that a target region needs is read straight into that
  region's buffer, all parts of one chunk at once through a small TensorStore chunk cache (half the budget), so
  resharding decodes each chunk once (a new array per chunk, then scattered, cost an allocation and a copy more);
* a chunk whose needed part is bigger than the budget is read piece by piece.

At most ``memory_limit_bytes`` of transient reads are in flight (and half as much cached), so host memory
peaks at about the restored state plus 1.5x the budget; nothing ever materialises a whole array that this
host does not need.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from ..arrays import (
    Region,
    addressable_regions,
    assemble,
    host_buffer,
    host_buffers,
    intersect,
    is_abstract_array,
    key_data_sharding,
    local_slices,
    prng_key_impl,
    process_regions,
    region_size,
    region_slices,
    sharding_of,
)
from . import chunk_files, layout, read_once, spec
from .exchange import Exchange, Peers
from .metadata import (
    CheckpointCorruptError,
    CheckpointMeta,
    CheckpointUnavailableError,
    LeafMeta,
    unavailable,
)
from .read_once import Piece
from .storage import Storage

log = logging.getLogger(__name__)


class MissingLeafError(KeyError):
    """The abstract tree asks for a leaf the checkpoint does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


# -- pure planning ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ReadOp:
    """Read ``box``; ``direct``: straight into target ``parts[0][0]``; else copy each part out of it."""

    box: Region
    parts: tuple[tuple[int, Region], ...]  # (target index, region in array coordinates)
    direct: bool


def _bbox(regions: Sequence[Region]) -> Region:
    return tuple((min(r[d][0] for r in regions), max(r[d][1] for r in regions)) for d in range(len(regions[0])))


def plan_reads(shape: Sequence[int], chunk_shape: Sequence[int], targets: Sequence[Region], *,
               itemsize: int, limit_bytes: int) -> list[ReadOp]:
    """How the saved chunks (grid ``chunk_shape``) fill the ``targets`` regions. Pure."""
    live = [i for i, t in enumerate(targets) if region_size(t) > 0]
    chunks: set[tuple[int, ...]] = set()
    for i in live:
        ranges = [range(lo // c, (hi - 1) // c + 1) for (lo, hi), c in zip(targets[i], chunk_shape, strict=True)]
        chunks.update(itertools.product(*ranges))
    ops: list[ReadOp] = []
    for idx in sorted(chunks):
        cbox = tuple((k * c, min((k + 1) * c, n)) for k, c, n in zip(idx, chunk_shape, shape, strict=True))
        parts = [(i, p) for i in live if (p := intersect(cbox, targets[i])) is not None]
        if len(parts) == 1 and parts[0][1] == targets[parts[0][0]]:
            ops.append(ReadOp(parts[0][1], tuple(parts), direct=True))
        elif len(parts) == 1 or region_size(_bbox([p for _, p in parts])) * itemsize <= limit_bytes:
            ops.append(ReadOp(_bbox([p for _, p in parts]), tuple(parts), direct=False))
        else:
            ops.extend(ReadOp(p, ((i, p),), direct=False) for i, p in parts)
    return ops


def read_failure(message: str, err: BaseException) -> CheckpointCorruptError | CheckpointUnavailableError:
    """The error a restore raises for ``err`` met reading a checkpoint (``message`` says where; pure): unavailable
    when TensorStore's status code says the storage did not answer, else corrupt."""
    return (CheckpointUnavailableError if unavailable(err) else CheckpointCorruptError)(message)


def narrowing(saved: np.dtype, target: np.dtype) -> str | None:
    """What a restore's cast from ``saved`` to ``target`` loses, in words; None when it loses nothing. Pure."""
    import ml_dtypes

    if saved == target or np.can_cast(saved, target, casting="safe"):
        return None
    inexact, floating = jax.numpy.inexact, jax.numpy.floating  # jax's issubdtype knows ml_dtypes' floats
    if jax.dtypes.issubdtype(saved, inexact) and not jax.dtypes.issubdtype(target, inexact):
        return "a float cast to an integer: fractions are dropped (30.125 becomes 30)"
    if jax.dtypes.issubdtype(saved, floating) and jax.dtypes.issubdtype(target, floating):
        a, b = ml_dtypes.finfo(saved), ml_dtypes.finfo(target)  # numpy's safe-cast table misses ml_dtypes' floats
        if b.nmant >= a.nmant and b.maxexp >= a.maxexp and b.minexp <= a.minexp:
            return None
    return "a narrowing cast: values outside the new type's range or precision change"


DEFAULT_MIN_BUDGET = 32 << 20
DEFAULT_MAX_BUDGET = 1 << 30
BUDGET_FRACTION = 32  # transient reads may add 1/32 (3 %) of the state this host restores


def read_budget(host_bytes: int, limit_bytes: int | None) -> int:
    """Bytes of transient reads allowed in flight. Pure.

    ``limit_bytes`` (user-set) wins. Otherwise the budget scales with the state this host restores: 1/32 of
    it, at least 32 MiB (a few chunks in flight even for small states) and at most 1 GiB, so transient
    memory (the budget plus a cache of half of it) stays within ~5 % of the restored state while large states
    still read many chunks at once (a fixed 32 MiB read 4 GiB of 64 MiB chunks one at a time: 0.42 GiB/s,
    against 0.53 GiB/s with 256 MiB).
    """
    if limit_bytes is not None:
        if limit_bytes <= 0:
            raise ValueError(f"restore memory limit must be > 0 bytes, got {limit_bytes}")
        return limit_bytes
    return max(DEFAULT_MIN_BUDGET, min(DEFAULT_MAX_BUDGET, host_bytes // BUDGET_FRACTION))


# -- execution --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Leaf:
    slot: int
    meta: LeafMeta
    shape: tuple[int, ...]
    dtype: np.dtype
    sharding: Any  # None: a host numpy leaf
    regions: list[Region]
    devices: list[list[Any]]
    buffers: list[np.ndarray]
    key_impl: str | None = None  # wrap the restored key data into typed keys of this impl

    def out(self, i: int) -> np.ndarray:
        """Buffer ``i`` as TensorStore reads it: a view in the stored dtype for raw-stored dtypes."""
        buf = self.buffers[i]
        return buf if self.meta.stored_as is None else buf.view(self.meta.stored_as)


@dataclasses.dataclass
class ReadStats:
    """Where one process's restore got the bytes of its arrays (counted as the reads and receives complete)."""

    storage_bytes: int = 0  # read from storage by this process
    mapped_bytes: int = 0  # of them, the page cache's own pages mapped as the buffers (no copy)
    peer_bytes: int = 0  # received from the process that read them (:mod:`.exchange`)
    fallback_pieces: int = 0  # pieces expected from a peer that did not arrive whole, read from storage after all


def restore_tree(storage: Storage, ckpt_dir: str, meta: CheckpointMeta, abstract: Any, *,
                 memory_limit_bytes: int | None = None, peers: Peers | None = None,
                 stats: ReadStats | None = None, map_files: bool = True) -> Any:
    """Materialise ``abstract`` (leaves: ShapeDtypeStruct with sharding, arrays, or placeholders).

    ``memory_limit_bytes``: transient reads in flight; None scales it with the state (:func:`read_budget`).
    ``peers``: a collective restore (every process of ``peers.processes()`` calls this with the same
    ``peers.key``): each replicated piece is read from storage by one process and sent to the others
    (:mod:`.read_once`); None: every process reads everything it needs. ``stats``: filled with where the bytes
    came from. ``map_files``: page-cached local chunk files may be mapped as the buffers (:func:`_map`); off,
    they are read.
    """
    where = f"checkpoint {storage.loc.uri()}/{ckpt_dir}"
    saved = meta.leaf_by_path()
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    out: list[Any] = [None] * len(flat)
    leaves: list[_Leaf] = []
    for slot, (kp, target) in enumerate(flat):
        path = jax.tree_util.keystr(kp)
        leaf = saved.get(path)
        if leaf is None:
            raise MissingLeafError(f"restore: leaf {path} is not in {where} (saved leaves: {sorted(saved)[:8]}...)")
        if leaf.kind == "json":
            out[slot] = leaf.value
            continue
        key_impl = prng_key_impl(target)
        if key_impl is not None:
            if leaf.key_impl is not None and leaf.key_impl != key_impl:
                raise ValueError(f"restore leaf {path} from {where}: saved typed PRNG keys of impl {leaf.key_impl}, the "
                                 f"abstract state asks for {key_impl}")
            data = jax.eval_shape(jax.random.key_data, target)  # the key data: shape + (the impl's words,)
            target = jax.ShapeDtypeStruct(data.shape, data.dtype,
                                          sharding=key_data_sharding(path, sharding_of(target)))
        shape = tuple(getattr(target, "shape", ()))
        dtype = np.dtype(getattr(target, "dtype", leaf.dtype))
        sharding = getattr(target, "sharding", None) if is_abstract_array(target) else None
        if leaf.shape is not None and tuple(leaf.shape) != shape:
            raise ValueError(f"restore leaf {path}: abstract shape {shape} does not match saved shape "
                             f"{tuple(leaf.shape)} in {where}")
        if sharding is None and leaf.kind == "array" and not isinstance(target, np.ndarray):
            raise ValueError(f"restore leaf {path} from {where}: abstract value has no sharding; give a "
                             "jax.ShapeDtypeStruct(shape, dtype, sharding=...) or a jax.Array "
                             "(flax NNX: docs/runtime.md, \"flax NNX\")")
        if leaf.stored_as is not None and str(dtype) != leaf.dtype:
            raise ValueError(f"restore leaf {path} from {where}: saved as {leaf.dtype} (stored as its raw bytes), which cannot "
                             f"be cast to {dtype} on the way; restore it as {leaf.dtype} and cast after")
        if leaf.dtype is not None and (lost := narrowing(np.dtype(leaf.dtype), dtype)) is not None:
            log.warning("restore leaf %s from %s: saved as %s, restored as %s (the abstract state's dtype): %s; give "
                        "the abstract state the saved dtype to restore the values as saved", path, where, leaf.dtype,
                        dtype, lost)
        regions, devices = addressable_regions(sharding, shape)
        leaves.append(_Leaf(slot, leaf, shape, dtype, sharding, regions, devices, [], key_impl))

    with concurrent.futures.ThreadPoolExecutor(chunk_files.THREADS, thread_name_prefix="reprieve-restore") as pool:
        try:
            _read_leaves(storage, ckpt_dir, leaves, where, pool, memory_limit_bytes, peers,
                         ReadStats() if stats is None else stats, map_files)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # after a failure, nothing writes into a buffer any more

    for lf in leaves:
        if lf.sharding is None:
            out[lf.slot] = lf.buffers[0]
    placed = [lf for lf in leaves if lf.sharding is not None]
    for lf, arr in zip(placed, assemble([(lf.buffers, lf.devices, lf.shape, lf.sharding) for lf in placed]),
                       strict=True):
        out[lf.slot] = arr if lf.key_impl is None else jax.random.wrap_key_data(arr, impl=lf.key_impl)
    return jax.tree_util.tree_unflatten(treedef, out)


def _read_leaves(storage: Storage, ckpt_dir: str, leaves: list[_Leaf], where: str,
                 pool: concurrent.futures.ThreadPoolExecutor, memory_limit_bytes: int | None, peers: Peers | None,
                 stats: ReadStats, map_files: bool = True) -> None:
    """Make every leaf's buffers and fill them. A buffer that whole chunk files tile, page by page, on a local
    filesystem whose page cache holds them is those files, mapped (:func:`chunk_files.map_chunks`: no copy) and
    checked in ``pool``. The others are made in ``pool`` (populating fresh memory is a restore's largest cost on
    some machines; it spreads over the cores); whole chunk files that land as one span of a buffer are read by
    :mod:`.chunk_files` in ``pool``, the rest by TensorStore under the memory budget. With ``peers``, a replicated
    piece another process owns (:mod:`.read_once`) is received from it instead, and read here after all when it
    does not arrive whole."""
    memory_limit_bytes = read_budget(sum(region_size(r) * lf.dtype.itemsize for lf in leaves for r in lf.regions),
                                     memory_limit_bytes)
    plans = []
    for lf in leaves:
        assert lf.meta.shape is not None and lf.meta.chunk_shape is not None
        plans.append(plan_reads(lf.meta.shape, lf.meta.chunk_shape, lf.regions, itemsize=lf.dtype.itemsize,
                                limit_bytes=memory_limit_bytes))
    # The chunk cache only helps leaves with a chunk that feeds several targets; the others skip it (keeping
    # their decoded chunks cached as well halved same-sharding throughput).
    cached = {lf.meta.index for lf, ops in zip(leaves, plans, strict=True) if any(len(op.parts) > 1 for op in ops)}
    stores = _open_all(storage, ckpt_dir, [lf.meta for lf in leaves], where, cached=cached,
                       cached_context=storage.read_context(memory_limit_bytes // 2) if cached else None)
    pieces = [] if peers is None else _pieces(leaves, peers.min_bytes, peers.processes())  # the same list on each
    exchange = None if peers is None or not pieces else Exchange(peers, pieces, _place(leaves))
    try:
        skip = set() if exchange is None else exchange.expected()
        mapped = _map(storage, ckpt_dir, leaves, plans, {(n, leaves[n].regions.index(region)) for n, region, _ in skip},
                      pool, where, stats) if map_files else {}
        for n, (lf, bufs) in enumerate(zip(leaves, _buffers(pool, [
                [(tuple(hi - lo for lo, hi in r), lf.dtype) for i, r in enumerate(lf.regions) if (n, i) not in mapped]
                for n, lf in enumerate(leaves)]), strict=True)):
            made = iter(bufs)
            lf.buffers = [mapped[n, i].buffer().view(lf.dtype).reshape(tuple(hi - lo for lo, hi in r))
                          if (n, i) in mapped else next(made) for i, r in enumerate(lf.regions)]

        def unfilled(key: tuple[int, Region, Region]) -> bool:  # neither received nor mapped (filled by _map)
            return key not in skip and (key[0], leaves[key[0]].regions.index(key[1])) not in mapped

        _run(storage, ckpt_dir, leaves, _only(leaves, plans, unfilled), stores, where, pool, memory_limit_bytes,
             stats)
        if exchange is None:
            return
        exchange.ready()
        failed = exchange.receive(pool)
        again = {(pc.leaf, pc.region, pc.part) for pc, _ in failed}
        stats.peer_bytes += sum(region_size(part) * leaves[n].dtype.itemsize for n, _, part in skip - again)
        if failed:
            log.warning("restore from %s: %d of %d pieces expected from other processes did not arrive whole (%s); "
                        "reading them from storage", where, len(failed), len(skip), failed[0][1])
            stats.fallback_pieces += len(failed)
            _run(storage, ckpt_dir, leaves, _only(leaves, plans, lambda key: key in again), stores, where, pool,
                 memory_limit_bytes, stats)
    except BaseException:
        if exchange is not None:
            exchange.abort()
        raise
    finally:
        if exchange is not None:
            exchange.close()


def _map(storage: Storage, ckpt_dir: str, leaves: list[_Leaf], plans: list[list[ReadOp]],
         received: set[tuple[int, int]], pool: concurrent.futures.ThreadPoolExecutor, where: str, stats: ReadStats
         ) -> dict[tuple[int, int], chunk_files.Mapped]:
    """``(leaf, target)`` -> the target's buffer as its chunk files mapped, for every target whose reads are all
    whole chunk files that tile it page by page (:func:`chunk_files.mappable`), none of it ``received`` from
    another process, where :func:`chunk_files.map_chunks` maps them (local, in the page cache): the largest first,
    each of at least ``chunk_files.MAP_MIN_BYTES``, within the process's room for more mappings
    (:func:`chunk_files.pick_mapped`). Mapped and checked (the files not wholly cached read into their places) in
    ``pool``, counted in ``stats``: the buffers are full when it returns."""
    want: dict[tuple[int, int], tuple[list[str], list[int]]] = {}
    for n, (lf, ops) in enumerate(zip(leaves, plans, strict=True)):
        if not _files_readable(storage, lf):
            continue
        by_target: dict[int, list[chunk_files.ChunkRead] | None] = {}
        for op in ops:
            reads = chunk_files.direct_reads(lf.meta.shape or (), lf.meta.chunk_shape or (), lf.regions, op.parts)
            for i, _ in op.parts:
                if reads is None:
                    by_target[i] = None
                elif by_target.setdefault(i, []) is not None:
                    by_target[i] += [r for r in reads if r.target == i]  # type: ignore[operator]
        for i, reads in by_target.items():
            count = region_size(lf.regions[i])
            if (reads is None or (n, i) in received
                    or not chunk_files.mappable(reads, count, lf.dtype.itemsize)):
                continue
            ordered = sorted(reads, key=lambda r: r.start)
            paths = [storage.local_path(f"{ckpt_dir}/{layout.chunk_key(lf.meta.index or 0, r.key)}") for r in ordered]
            want[n, i] = ([p for p in paths if p is not None], [r.count * lf.dtype.itemsize for r in ordered])

    def map_and_check(paths: list[str], nbytes: list[int]) -> chunk_files.Mapped | None:
        got = chunk_files.map_chunks(paths, nbytes)
        if got is not None:
            got.complete()  # in the same task: one target's checks start as soon as its files are mapped
        return got

    picked = chunk_files.pick_mapped({k: (len(paths), sum(nbytes)) for k, (paths, nbytes) in want.items()},
                                     chunk_files.map_budget() if want else 0)
    futs = {k: pool.submit(map_and_check, *pn) for k, pn in want.items() if k in picked}
    out = {}
    for (n, i), fut in futs.items():
        try:
            got = fut.result()
        except chunk_files.ChunkFileError as err:
            lf = leaves[n]
            raise read_failure(f"{where}: reading {layout.array_dir(lf.meta.index or 0)} (leaf {lf.meta.path}, "
                               f"region {list(lf.regions[i])}) failed: {err}", err) from err
        if got is not None:
            out[n, i] = got
            stats.storage_bytes += got.nbytes
            stats.mapped_bytes += got.mapped_bytes
    log.debug("restore from %s: %d chunk files mapped as their buffers and checked, %d read into their places", where,
              sum(len(m.mapped) for m in out.values()), sum(len(m.unread) for m in out.values()))
    return out


def _pieces(leaves: list[_Leaf], min_bytes: int, members: tuple[int, ...]) -> list[Piece]:
    """Every replicated piece of the restore with its owner, the same list on every process of ``members`` (from
    the shardings and the chunk grids alone: every region two of them hold, not only this process's)."""
    out = []
    for n, lf in enumerate(leaves):
        if lf.sharding is None or lf.meta.chunk_shape is None:
            continue
        held = {p: regions for p, regions in process_regions(lf.sharding, lf.shape).items() if p in members}
        for region, needers in read_once.shared_regions(held).items():
            for op in plan_reads(lf.shape, lf.meta.chunk_shape, [region], itemsize=lf.dtype.itemsize,
                                 limit_bytes=1 << 62):
                part = op.parts[0][1]
                out.append(Piece(n, region, part, region_size(part) * lf.dtype.itemsize, needers))
    return read_once.assign(out, min_bytes=min_bytes)


def _place(leaves: list[_Leaf]) -> Callable[[Piece], np.ndarray]:
    """A piece's place in this process's landing buffer."""
    def view(pc: Piece) -> np.ndarray:
        lf = leaves[pc.leaf]
        return lf.buffers[lf.regions.index(pc.region)][local_slices(pc.part, pc.region)]
    return view


def _only(leaves: list[_Leaf], plans: list[list[ReadOp]],
          keep: Callable[[tuple[int, Region, Region]], bool]) -> list[list[ReadOp]]:
    """``plans`` with only the parts ``keep((leaf, target region, part))`` keeps (an op left without parts goes)."""
    out = []
    for n, (lf, ops) in enumerate(zip(leaves, plans, strict=True)):
        kept = []
        for op in ops:
            parts = tuple((i, p) for i, p in op.parts if keep((n, lf.regions[i], p)))
            if parts == op.parts:
                kept.append(op)
            elif parts:
                kept.append(ReadOp(_bbox([p for _, p in parts]), parts, direct=False))
        out.append(kept)
    return out


def _run(storage: Storage, ckpt_dir: str, leaves: list[_Leaf], plans: list[list[ReadOp]], stores: dict[Any, Any],
         where: str, pool: concurrent.futures.ThreadPoolExecutor, memory_limit_bytes: int, stats: ReadStats) -> None:
    """Carry out ``plans`` (every leaf's reads) from storage."""
    inflight: collections.deque[tuple[_Leaf, ReadOp, list[Any]]] = collections.deque()
    budget = 0

    def finish() -> None:
        nonlocal budget
        lf, op, futs = inflight.popleft()
        try:
            for fut in futs:
                fut.result()
        except Exception as err:
            raise read_failure(f"{where}: reading {layout.array_dir(lf.meta.index or 0)} (leaf {lf.meta.path}, "
                               f"region {list(op.box)}) failed: {err}", err) from err
        budget -= region_size(op.box) * lf.dtype.itemsize
        stats.storage_bytes += sum(region_size(part) for _, part in op.parts) * lf.dtype.itemsize

    files: list[tuple[_Leaf, ReadOp, int, concurrent.futures.Future[None]]] = []
    scratch = _Scratch(memory_limit_bytes)
    for lf, ops in zip(leaves, plans, strict=True):
        store = stores[lf.meta.index]
        readable = _files_readable(storage, lf)
        for op in ops:
            reads = chunk_files.direct_reads(lf.meta.shape or (), lf.meta.chunk_shape or (), lf.regions,
                                             op.parts) if readable else None
            if reads is not None:  # no transient memory: outside the budget
                for r in reads:
                    first, nbytes = r.start * lf.dtype.itemsize, r.count * lf.dtype.itemsize
                    path = storage.local_path(f"{ckpt_dir}/{layout.chunk_key(lf.meta.index or 0, r.key)}")
                    assert path is not None
                    span = lf.buffers[r.target].reshape(-1).view(np.uint8)[first:first + nbytes]
                    files.append((lf, op, nbytes, pool.submit(_read_file, path, span)))
                continue
            chunk = _chunk_of(lf, op, memory_limit_bytes) if readable else None
            if chunk is not None:  # read whole into a reused scratch buffer (scratch: the budget's bytes at most)
                key, cbox = chunk
                path = storage.local_path(f"{ckpt_dir}/{layout.chunk_key(lf.meta.index or 0, key)}")
                assert path is not None
                nbytes = sum(region_size(part) for _, part in op.parts) * lf.dtype.itemsize
                files.append((lf, op, nbytes, pool.submit(_scatter_file, path, lf, op, cbox, scratch)))
                continue
            nbytes = region_size(op.box) * lf.dtype.itemsize
            while inflight and budget + nbytes > memory_limit_bytes:
                finish()
            if op.direct:
                futs = [storage.read_into(store, region_slices(op.box), lf.out(op.parts[0][0]))]
            else:  # every part straight into its target's buffer (a strided view; casts on the way)
                futs = [storage.read_into(store, region_slices(part), lf.out(i)[local_slices(part, lf.regions[i])])
                        for i, part in op.parts]
            inflight.append((lf, op, futs))
            budget += nbytes
    while inflight:
        finish()
    for lf, op, nbytes, fut in files:
        try:
            fut.result()
        except chunk_files.ChunkFileError as err:
            raise read_failure(f"{where}: reading {layout.array_dir(lf.meta.index or 0)} (leaf {lf.meta.path}, "
                               f"region {list(op.box)}) failed: {err}", err) from err
        stats.storage_bytes += nbytes
    log.debug("restore from %s: %d chunk files read by the runtime, the rest through TensorStore", where, len(files))


def _files_readable(storage: Storage, lf: _Leaf) -> bool:
    """Whether ``lf``'s chunk files can be read straight into its buffers: a local filesystem, and every buffer
    (as TensorStore would read into it) in the stored dtype with the ``bytes`` codec's byte order (no cast)."""
    assert lf.meta.dtype is not None
    stored = np.dtype(spec.zarr_dtype(lf.meta.dtype))
    out = lf.dtype if lf.meta.stored_as is None else np.dtype(lf.meta.stored_as)  # as :meth:`_Leaf.out` views it
    return storage.local_path("") is not None and chunk_files.little_endian(stored) and out == stored


def _read_file(path: str, span: np.ndarray) -> None:
    with span.data as out:
        chunk_files.read_chunk(path, out)


def _chunk_of(lf: _Leaf, op: ReadOp, limit_bytes: int) -> tuple[tuple[int, ...], Region] | None:
    """The grid index of the one saved chunk ``op``'s parts lie in and that chunk's whole box (past the array's
    edge for an edge chunk: its file holds the padding too); None for a leaf without a chunk grid (a scalar) or a
    chunk file larger than ``limit_bytes`` (TensorStore reads such a chunk's parts piece by piece)."""
    chunk_shape = lf.meta.chunk_shape or ()
    if not chunk_shape or not op.parts:
        return None
    key = tuple(lo // c for (lo, _), c in zip(op.parts[0][1], chunk_shape, strict=True))
    cbox = tuple((k * c, k * c + c) for k, c in zip(key, chunk_shape, strict=True))
    inside = all(c0 <= lo and hi <= c1 for _, part in op.parts for (lo, hi), (c0, c1) in zip(part, cbox, strict=True))
    fits = region_size(cbox) * lf.out(op.parts[0][0]).dtype.itemsize <= limit_bytes
    return (key, cbox) if inside and fits else None


class _Scratch:
    """Buffers for whole chunk files, reused from chunk to chunk (no fresh memory per chunk), at most ``limit``
    bytes of them at once: a read that would pass it waits for a buffer to come back."""

    def __init__(self, limit: int) -> None:
        self._limit, self._made = limit, 0
        self._free: list[np.ndarray] = []
        self._cv = threading.Condition()

    @contextlib.contextmanager
    def take(self, n: int) -> Iterator[np.ndarray]:
        buf: np.ndarray | None = None
        with self._cv:
            while True:
                k = next((k for k, b in enumerate(self._free) if b.nbytes >= n), None)
                if k is not None:
                    buf = self._free.pop(k)  # by position: list.remove would compare arrays element by element
                    break
                if self._made + n <= self._limit or self._made == 0:
                    self._made += n
                    break
                if self._free:  # a smaller one goes, to make room for this size
                    self._made -= self._free.pop().nbytes
                    continue
                self._cv.wait()
        if buf is None:
            try:
                buf = host_buffer((n,), np.dtype(np.uint8))
            except BaseException:
                with self._cv:
                    self._made -= n
                    self._cv.notify_all()
                raise
        try:
            yield buf[:n]
        finally:
            with self._cv:
                self._free.append(buf)
                self._cv.notify_all()


def _scatter_file(path: str, lf: _Leaf, op: ReadOp, cbox: Region, scratch: _Scratch) -> None:
    """Chunk file ``path`` read whole into a scratch buffer and checked, then each of ``op``'s parts copied into its
    target's buffer: a chunk that feeds several targets (another sharding), or a part that is no contiguous span of
    its target."""
    stored = lf.out(op.parts[0][0]).dtype
    with scratch.take(region_size(cbox) * stored.itemsize) as buf:
        with buf.data as out:
            chunk_files.read_chunk(path, out)
        chunk = buf.view(stored).reshape([hi - lo for lo, hi in cbox])
        for i, part in op.parts:
            lf.out(i)[local_slices(part, lf.regions[i])] = chunk[local_slices(part, cbox)]


def _buffers(pool: concurrent.futures.ThreadPoolExecutor,
             shapes: list[list[tuple[tuple[int, ...], np.dtype]]]) -> list[list[np.ndarray]]:
    """``host_buffer`` of every ``(shape, dtype)`` of every group, made in ``pool`` (:func:`host_buffers`)."""
    made = iter(host_buffers([sd for group in shapes for sd in group], pool))
    return [[next(made) for _ in group] for group in shapes]


def _open_all(storage: Storage, ckpt_dir: str, leaves: list[LeafMeta], where: str, *, cached: set[Any],
              cached_context: Any) -> dict[Any, Any]:
    futs = {}
    for leaf in leaves:
        assert leaf.index is not None and leaf.shape is not None and leaf.dtype is not None
        assert leaf.chunk_shape is not None
        md = spec.zarr3_metadata(leaf.shape, leaf.dtype, leaf.chunk_shape)
        futs[leaf.index] = storage.open_array(f"{ckpt_dir}/{layout.array_dir(leaf.index)}", md, create=False,
                                              read=True, context=cached_context if leaf.index in cached else None)
    out = {}
    for idx, f in futs.items():
        try:
            out[idx] = f.result()
        except Exception as err:
            raise read_failure(f"{where}: opening {layout.array_dir(idx)} failed (its zarr.json is missing, "
                               f"unreadable or disagrees with {layout.METADATA_FILE}): {err}", err) from err
    return out
