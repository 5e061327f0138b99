"""Restore path: read only the regions this process's devices need, under a host-memory budget.

Every target shard region is read straight from the zarr3 chunks that overlap it (TensorStore
assembles regions across chunk boundaries, so any saved sharding maps onto any target sharding and
process count). At most ``memory_limit_bytes`` of host buffers are in flight; a region is handed to
its device(s) and dropped before the next one is admitted, so host memory peaks at roughly the
restored state plus the budget, never at whole-array size.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any

import jax
import numpy as np

from . import layout
from .metadata import CheckpointCorruptError, CheckpointMeta, LeafMeta
from .save import Region, region_of, region_slices
from .storage import Storage

log = logging.getLogger(__name__)


class MissingLeafError(KeyError):
    """The abstract tree asks for a leaf the checkpoint does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclasses.dataclass
class _Read:
    slot: int  # position in the flattened abstract tree
    leaf: LeafMeta
    region: Region
    devices: list[Any]
    nbytes: int


def _target_of(path: str, leaf: LeafMeta, target: Any) -> tuple[tuple[int, ...], np.dtype, Any]:
    shape = tuple(getattr(target, "shape", ()))
    dtype = np.dtype(getattr(target, "dtype", leaf.dtype))
    sharding = getattr(target, "sharding", None)
    if leaf.shape is not None and tuple(leaf.shape) != shape:
        raise ValueError(f"restore leaf {path}: abstract shape {shape} does not match saved shape {tuple(leaf.shape)}")
    return shape, dtype, sharding


def _is_abstract_array(x: Any) -> bool:
    return isinstance(x, (jax.ShapeDtypeStruct, jax.Array))


def restore_tree(
    storage: Storage,
    ckpt_dir: str,
    meta: CheckpointMeta,
    abstract: Any,
    *,
    memory_limit_bytes: int,
) -> Any:
    """Materialise ``abstract`` (leaves: ShapeDtypeStruct with sharding, arrays, or placeholders)."""
    where = f"checkpoint {storage.loc.uri()}/{ckpt_dir}"
    saved = meta.leaf_by_path()
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    out: list[Any] = [None] * len(flat)
    reads: list[_Read] = []
    pieces: dict[int, dict[Any, jax.Array]] = {}
    targets: dict[int, tuple[tuple[int, ...], np.dtype, Any]] = {}
    for slot, (kp, target) in enumerate(flat):
        path = jax.tree_util.keystr(kp)
        leaf = saved.get(path)
        if leaf is None:
            raise MissingLeafError(f"restore: leaf {path} is not in {where} (saved leaves: {sorted(saved)[:8]}...)")
        if leaf.kind == "json":
            out[slot] = leaf.value
            continue
        shape, dtype, sharding = _target_of(path, leaf, target)
        targets[slot] = (shape, dtype, sharding)
        if (leaf.kind == "numpy" or isinstance(target, np.ndarray)) and not (
                _is_abstract_array(target) and sharding is not None):
            reads.append(_Read(slot, leaf, tuple((0, n) for n in shape), [], _nbytes(shape, leaf)))
            continue
        if sharding is None:
            raise ValueError(f"restore leaf {path}: abstract value has no sharding; give a "
                             "jax.ShapeDtypeStruct(shape, dtype, sharding=...) or a jax.Array")
        by_region: dict[Region, list[Any]] = collections.defaultdict(list)
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            by_region[region_of(index, shape)].append(device)
        pieces[slot] = {}
        for region, devices in by_region.items():
            reads.append(_Read(slot, leaf, region, devices, _nbytes([b - a for a, b in region], leaf)))

    stores = _open_all(storage, ckpt_dir, {r.leaf.index: r.leaf for r in reads}, where)
    inflight: collections.deque[tuple[_Read, Any, np.ndarray | None]] = collections.deque()
    budget = 0

    def finish(item: tuple[_Read, Any, np.ndarray | None]) -> None:
        nonlocal budget
        rd, fut, buf = item
        try:
            arr = fut.result()
        except Exception as err:
            raise CheckpointCorruptError(
                f"{where}: reading {layout.array_dir(rd.leaf.index or 0)} (leaf {rd.leaf.path}, "
                f"region {list(rd.region)}) failed: {err}") from err
        want = targets[rd.slot][1]
        if rd.devices:
            assert buf is not None
            for n, d in enumerate(rd.devices):
                # The buffer is 64-byte aligned, so on CPU the device adopts it without a copy; every
                # further replica gets its own copy, so donating one can never scribble over another.
                pieces[rd.slot][d] = jax.device_put(buf if n == 0 else buf.copy(), d)
        else:
            out[rd.slot] = arr if arr.dtype == want else arr.astype(want)
        budget -= rd.nbytes

    for rd in reads:
        while inflight and budget + rd.nbytes > memory_limit_bytes:
            finish(inflight.popleft())
        region = region_slices(rd.region)
        store = stores[rd.leaf.index]
        if rd.devices:
            # Read straight into the final, aligned buffer: one allocation, no extra copy, and
            # TensorStore converts the dtype on the way when a cast was asked for.
            buf = _empty_aligned(tuple(b - a for a, b in rd.region), targets[rd.slot][1])
            inflight.append((rd, storage.read_into(store, region, buf), buf))
        else:
            inflight.append((rd, (store[region] if region else store).read(), None))
        budget += rd.nbytes
    while inflight:
        finish(inflight.popleft())

    for slot, devmap in pieces.items():
        shape, _dtype, sharding = targets[slot]
        arrays = [devmap[d] for d in sharding.addressable_devices_indices_map(shape)]
        out[slot] = jax.make_array_from_single_device_arrays(shape, sharding, arrays)
    return jax.tree_util.tree_unflatten(treedef, out)


_ALIGN = 64  # XLA's CPU client adopts host buffers with this alignment instead of copying them


def _empty_aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    off = (-raw.ctypes.data) % _ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def _nbytes(shape: Any, leaf: LeafMeta) -> int:
    return int(np.prod(list(shape), dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def _open_all(storage: Storage, ckpt_dir: str, leaves: dict[Any, LeafMeta], where: str) -> dict[Any, Any]:
    from . import spec

    futs = {}
    for idx, leaf in leaves.items():
        assert leaf.shape is not None and leaf.dtype is not None and leaf.chunk_shape is not None
        meta = spec.zarr3_metadata(leaf.shape, leaf.dtype, leaf.chunk_shape)
        futs[idx] = storage.open_array(f"{ckpt_dir}/{layout.array_dir(idx)}", meta, create=False, read=True)
    out = {}
    for idx, f in futs.items():
        try:
            out[idx] = f.result()
        except Exception as err:
            raise CheckpointCorruptError(f"{where}: opening {layout.array_dir(idx)} failed: {err}") from err
    return out
