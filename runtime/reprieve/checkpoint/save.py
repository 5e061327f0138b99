"""Save path: the blocking snapshot (device copies) and the background write of this process's shards."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from .. import topology
from ..arrays import Region, describe_sharding, host_buffer, region_of, region_slices
from ..landing import leaf_bytes, on_cpu_devices
from . import layout, spec
from .metadata import CheckpointMeta, LeafMeta
from .storage import Storage

log = logging.getLogger(__name__)

@dataclasses.dataclass
class ShardCopy:
    leaf: int  # index into Snapshot.leaves
    region: Region
    data: Any  # a private jax.Array copy (device copy path) or np.ndarray (host copy path)


@dataclasses.dataclass
class Snapshot:
    leaves: list[LeafMeta]
    shards: list[ShardCopy]
    host_leaves: dict[int, np.ndarray]  # numpy leaves (written by process 0)
    local_bytes: int
    landing_bytes: int = 0  # what a restore of the state lands here: every addressable shard, replicas included
    cpu_bytes: int = 0  # of them, the arrays' on CPU devices: what a donating step's restore copies (reprieve.landing)


def _is_key_array(x: Any) -> bool:
    return bool(jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))


def _dtype_of(path: str, dtype: Any) -> tuple[str, str | None]:
    """``(dtype name, stored_as)`` of a leaf; a dtype that cannot be stored is a TypeError naming the leaf."""
    name = str(np.dtype(dtype)) if not hasattr(dtype, "name") else str(dtype.name)
    try:
        return name, spec.stored_as(name)
    except TypeError as err:
        raise TypeError(f"checkpoint leaf {path}: {err}; cast it (x.astype(...)) or keep it out of the saved "
                        "state") from None


def _what_to_do(leaf: Any) -> str:
    if callable(leaf):
        return ("functions and other Python objects are not state: save the arrays only (for an equinox "
                "module, eqx.filter(model, eqx.is_array), and rebuild it with eqx.combine; docs/checkpoint.md)")
    return ("convert it to an array or a Python scalar, or keep it out of the state (job.save(..., extra=) "
            "for JSON metadata, data= for per-process data positions)")


def _unsupported(path: str, leaf: Any) -> TypeError:
    return TypeError(f"checkpoint leaf {path}: expected jax.Array, numpy array, or a Python scalar/str, "
                     f"got {type(leaf).__name__}; {_what_to_do(leaf)}")


def check_leaves(state: Any) -> None:
    """Raise the TypeError :func:`snapshot` would raise for ``state`` (naming the first leaf it cannot save),
    without copying anything: the job calls it at its first ``save()``, so a function in the state is reported
    at step 0, not at the first real save (the last step, when no periodic save is set)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    for path, leaf in flat:
        p = jax.tree_util.keystr(path)
        if isinstance(leaf, jax.Array):
            if not _is_key_array(leaf):  # typed keys are saved as their key data (uint32): always storable
                _dtype_of(p, leaf.dtype)
        elif isinstance(leaf, (np.ndarray, np.generic)):
            _dtype_of(p, leaf.dtype)
        elif not (leaf is None or isinstance(leaf, (bool, int, float, str))):
            raise _unsupported(p, leaf)


# A copy task's least size: below it a thread pool hand-off costs more than the copy (a 120-leaf state of 851 KB
# took 120 hand-offs per save, 20-40 ms on an idle 2-core machine and up to 0.5 s on a loaded one).
COPY_GROUP_BYTES = 8 << 20


def copy_groups(sizes: list[int], min_bytes: int) -> list[list[int]]:
    """Consecutive indices of ``sizes`` in groups of at least ``min_bytes`` (the last one may be smaller; it
    joins the one before when there is one), so each thread's task is worth its hand-off (pure)."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        current.append(i)
        total += n
        if total >= min_bytes:
            groups.append(current)
            current, total = [], 0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


class Staging:
    """Host buffers for shard copies, reused from one save to the next.

    Fresh host memory is expensive to fault in (on the benchmark VM, 4-30x slower than copying into
    memory that is already mapped), so the copies of save N+1 go into the buffers of save N, which are
    free again because at most one save is in flight. Costs one copy of the owned state in host RAM
    for the life of the manager (Orbax allocates the same amount anew on every save).
    """

    def __init__(self, threads: int = 0) -> None:
        self._free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1),
                                        thread_name_prefix="reprieve-ckpt-copy")

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            free = self._free.get((shape, dtype.str))
            if free:
                return free.pop()
        return host_buffer(shape, dtype)

    def give_back(self, buffers: list[np.ndarray]) -> None:
        """Make the buffers of the last save the pool; buffers it did not reuse are dropped, so a
        state whose shapes change does not accumulate stale buffers."""
        with self._lock:
            self._free = {}
            for b in buffers:
                self._free.setdefault((b.shape, b.dtype.str), []).append(b)

    def copy(self, shards: list[jax.Shard]) -> list[np.ndarray]:
        """Copy every shard into a staging buffer (in parallel groups of at least :data:`COPY_GROUP_BYTES`;
        a small state in the calling thread); returns when all copies are done."""
        bufs = [self.take(tuple(s.data.shape), np.dtype(s.data.dtype)) for s in shards]
        for s in shards:
            s.data.copy_to_host_async()  # overlaps device->host transfers on accelerators; no-op on CPU

        def group(indices: list[int]) -> None:
            for i in indices:
                np.copyto(bufs[i], np.asarray(shards[i].data))

        groups = copy_groups([int(b.nbytes) for b in bufs], COPY_GROUP_BYTES)
        if len(groups) <= 1:
            for g in groups:
                group(g)
        else:
            list(self._pool.map(group, groups))
        return bufs

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._free.clear()


def snapshot(state: Any, *, host_copy: str = "staged", staging: Staging | None = None,
             max_chunk_bytes: int | None = None) -> Snapshot:
    """Copy what this process must write, so the caller may donate or mutate ``state`` right after.

    ``host_copy``: ``"staged"`` (default) copies every owned shard into reusable host buffers of
    ``staging`` and returns once the copies are done; ``"device"`` dispatches an on-device copy
    (returns at once, but the copy and its fresh allocation then compete with the next step and
    hold accelerator memory).
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    leaves: list[LeafMeta] = []
    owned: list[tuple[int, Region, jax.Shard]] = []
    host_leaves: dict[int, np.ndarray] = {}
    array_index = 0
    landing = cpu = 0
    for path, leaf in flat:
        p = jax.tree_util.keystr(path)
        i = len(leaves)
        if isinstance(leaf, jax.Array):
            key_impl = None
            if _is_key_array(leaf):  # typed PRNG keys: their key data, rebuilt with the same impl on restore
                key_impl = str(jax.random.key_impl(leaf))
                leaf = jax.random.key_data(leaf)
            dtype, stored = _dtype_of(p, leaf.dtype)
            shape = tuple(leaf.shape)
            shard_shape = leaf.sharding.shard_shape(shape)
            leaves.append(LeafMeta(
                path=p, kind="array", index=array_index, shape=list(shape), dtype=dtype,
                chunk_shape=spec.chunk_shape_for(shape, shard_shape, itemsize=leaf.dtype.itemsize,
                                                 max_chunk_bytes=max_chunk_bytes), nbytes=int(leaf.nbytes),
                sharding=describe_sharding(leaf.sharding), stored_as=stored, key_impl=key_impl,
            ))
            array_index += 1
            landing += (nbytes := leaf_bytes(leaf))
            if on_cpu_devices(leaf):
                cpu += nbytes
            for s in leaf.addressable_shards:
                if s.replica_id == 0 and s.data.size > 0:
                    owned.append((i, region_of(s.index, shape), s))
        elif isinstance(leaf, (np.ndarray, np.generic)):
            arr = np.array(leaf, copy=True)
            dtype, stored = _dtype_of(p, arr.dtype)  # fail now, not in the background
            leaves.append(LeafMeta(
                path=p, kind="numpy", index=array_index, shape=list(arr.shape), dtype=dtype,
                chunk_shape=spec.chunk_shape_for(arr.shape, arr.shape, itemsize=arr.dtype.itemsize,
                                                 max_chunk_bytes=max_chunk_bytes), nbytes=int(arr.nbytes),
                stored_as=stored,
            ))
            array_index += 1
            landing += leaf_bytes(arr)
            host_leaves[i] = arr
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            leaves.append(LeafMeta(path=p, kind="json", value=leaf))
        else:
            raise _unsupported(p, leaf)
    if host_copy == "device":
        copies: list[Any] = jax.device_put([s.data for _, _, s in owned], [s.device for _, _, s in owned],
                                           may_alias=False)
    elif host_copy == "staged":
        copies = (staging or Staging(threads=1)).copy([s for _, _, s in owned])
    else:
        raise ValueError(f"host_copy must be 'staged' or 'device', got {host_copy!r}")
    shards = [ShardCopy(i, r, c) for (i, r, _), c in zip(owned, copies, strict=True)]
    local = sum(int(np.prod([b - a for a, b in sc.region], dtype=np.int64)) * np.dtype(leaves[sc.leaf].dtype).itemsize
                for sc in shards)
    return Snapshot(leaves, shards, host_leaves, local, landing, cpu)


def _as_stored(arr: np.ndarray, leaf: LeafMeta) -> np.ndarray:
    """The bytes of ``arr`` as the dtype zarr3 stores them in (a view; the same array for most dtypes)."""
    return arr if leaf.stored_as is None else arr.view(leaf.stored_as)


def _zarr_meta(leaf: LeafMeta) -> dict[str, Any]:
    assert leaf.shape is not None and leaf.dtype is not None and leaf.chunk_shape is not None
    return spec.zarr3_metadata(leaf.shape, leaf.dtype, leaf.chunk_shape)


def write_snapshot(storage: Storage, ckpt_dir: str, snap: Snapshot, *, process_index: int) -> None:
    """Write this process's shards (and, on process 0, every array's zarr.json and the numpy leaves)."""
    needed = {sc.leaf for sc in snap.shards} | (set(snap.host_leaves) if process_index == 0 else set())
    if process_index == 0:
        needed |= {i for i, leaf in enumerate(snap.leaves) if leaf.kind == "array"}
    opens = {}
    for i in sorted(needed):
        leaf = snap.leaves[i]
        assert leaf.index is not None
        opens[i] = storage.open_array(f"{ckpt_dir}/{layout.array_dir(leaf.index)}", _zarr_meta(leaf),
                                      create=process_index == 0)
    stores = {i: f.result() for i, f in opens.items()}
    writes = []
    for sc in snap.shards:
        data = _as_stored(np.asarray(sc.data), snap.leaves[sc.leaf])  # device copies: waits (zero-copy on CPU)
        writes.append(stores[sc.leaf][region_slices(sc.region)].write(
            data, can_reference_source_data_indefinitely=True))
    if process_index == 0:
        for i, arr in snap.host_leaves.items():
            if arr.size:
                writes.append(stores[i].write(_as_stored(arr, snap.leaves[i]),
                                              can_reference_source_data_indefinitely=True))
    for w in writes:
        w.result()


def _versions() -> dict[str, str]:
    """The versions every checkpoint records (a copy: the packages do not change under a running process)."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> dict[str, str]:
    """Read once per process: each lookup scans the installed distributions, and the agreed save is on the restart
    path."""
    from importlib import metadata as md

    out = {}
    for dist in ("reprieve", "jax", "jaxlib", "tensorstore", "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def build_metadata(step: int, attempt: int, num_processes: int, snap: Snapshot, extra: dict[str, Any],
                   process_extra: list[Any] | None = None, *, donated: bool = False) -> CheckpointMeta:
    """``donated``: the job's step donates the state, so ``owned_bytes`` is recorded (what a spare populates)."""
    return CheckpointMeta(
        step=step, attempt=attempt, num_processes=num_processes, leaves=snap.leaves, extra=extra,
        versions=_versions(), created_unix=time.time(), process_extra=process_extra,
        topology=topology.recorded(num_processes), landing_bytes=snap.landing_bytes or None,
        owned_bytes=(snap.cpu_bytes or None) if donated else None,
    )
