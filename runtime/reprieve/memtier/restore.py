"""One process's part of a restore from memory: read the manifests of the chosen generation, find the saved
shards that cover the regions this process's devices need, read them (its own pod's directory through a
private mapping, another pod's over TCP), check their crc32c, and build the arrays.

Saved shards are the writers' replica-0 shards, so they tile every array: a target region is covered exactly
when the shards it intersects are all readable, whatever the sharding and the process count now. A region
that needs a writer memory lacks raises :class:`NeedsStorage` (this process then reads storage). A target
region that equals one saved shard of the same dtype in this pod's directory is handed to the device as a
view of the mapping (no copy: committed copies are never written again, and writes through the mapping copy
pages); everything else lands in fresh 64-byte aligned host buffers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ..arrays import (
    Region,
    addressable_regions,
    assemble,
    host_buffer,
    host_buffers,
    key_data_sharding,
    prng_key_impl,
    sharding_of,
)
from ..checkpoint.restore import MissingLeafError
from ..checksum import crc32c, crc32c_combine
from . import wire
from .decide import Holding
from .manifest import CopyCorruptError, Manifest
from .store import MemoryDir, check_shard, verify


class NeedsStorage(Exception):
    """This process needs shards (or a data position) of writers whose copies memory lacks."""


class SourceError(Exception):
    """Reading one copy failed (unreachable, vanished, corrupt): the round excludes ``(copy, location)``."""

    def __init__(self, holder: Holding, message: str, *, corrupt: bool = False) -> None:
        super().__init__(message)
        self.holder = holder
        self.corrupt = corrupt  # the copy disagrees with itself or a checksum (not merely unreachable)


@dataclasses.dataclass
class Source:
    holder: Holding
    manifest: Manifest
    local: bool
    mem: Any = None  # the local copy's mapping


def open_sources(holders: Mapping[int, Holding], mdir: MemoryDir, *, process: int, location: str | None,
                 token: str | None) -> dict[int, Source]:
    """Each writer's manifest from the holder chosen for it (checked against the copy's name)."""
    out = {}
    for writer, h in holders.items():
        local = h.local_to(process, location)
        try:
            if local:
                m = mdir.manifest(h.tree, h.name)
                mem = mdir.open_data(h.tree, h.name)
            else:
                where = f"{h.location}/{h.tree}/{h.name}/manifest.json"
                m = Manifest.from_bytes(wire.Client(h.location, token=token).manifest(h.tree, str(h.name)), where)
                problems = m.problems(h.name)
                if problems:
                    raise CopyCorruptError(f"{where}: {'; '.join(problems)}")
                mem = None
        except (CopyCorruptError, wire.WireError, OSError) as err:
            raise SourceError(h, f"copy {h.tree}/{h.name} at {h.location}: {err}",
                              corrupt=isinstance(err, CopyCorruptError)) from err
        out[writer] = Source(h, m, local, mem)
    return out


def _intersect(a: Region, b: Region) -> Region | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return out if all(lo < hi for lo, hi in out) or not out else None


def _count(r: Region) -> int:
    return math.prod(hi - lo for lo, hi in r)


def _local(part: Region, origin: Region) -> tuple[slice, ...]:
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(part, origin, strict=True))


def cover(region: Region, shards: list[tuple[int, int, Region]]) -> list[tuple[int, int, Region]] | None:
    """The ``(writer, shard, intersection)`` pieces that fill ``region``; None when they leave a gap (pure:
    saved shards never overlap, so the sizes add up exactly when they cover it)."""
    pieces = [(w, k, inter) for w, k, r in shards if (inter := _intersect(region, r)) is not None]
    return pieces if sum(_count(p) for _, _, p in pieces) == _count(region) else None


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(jax.numpy.dtype(name))


STREAMS = min(8, max(2, os.cpu_count() or 2))  # connections a restore reads one peer's copy over at once
CHUNK_BYTES = 32 << 20  # the most one request reads: a large shard is spread over the streams too


class _Reader:
    """Shard bytes as numpy arrays, checked once each; a remote copy's shards read over several connections."""

    def __init__(self, sources: dict[int, Source], token: str | None) -> None:
        self.sources = sources
        self.token = token
        self.cache: dict[tuple[int, int], np.ndarray] = {}

    def fetch(self, wanted: set[tuple[int, int]]) -> None:
        by_writer: dict[int, list[int]] = collections.defaultdict(list)
        for w, k in sorted(wanted):
            by_writer[w].append(k)
        for w, ks in by_writer.items():
            src = self.sources[w]
            m, h = src.manifest, src.holder
            where = f"copy {h.tree}/{h.name} at {h.location}"
            try:
                if src.local:
                    verify(src.mem, m, ks, where=where)
                    for k in ks:
                        s = m.shards[k]
                        self.cache[(w, k)] = np.frombuffer(src.mem, np.uint8, s.nbytes, s.offset)
                else:
                    for k, b in zip(ks, self._fetch_remote(src, ks, where), strict=True):
                        self.cache[(w, k)] = b
            except (CopyCorruptError, wire.WireError, OSError) as err:
                raise SourceError(h, f"{where}: {err}", corrupt=isinstance(err, CopyCorruptError)) from err

    def _fetch_remote(self, src: Source, ks: list[int], where: str) -> list[np.ndarray]:
        """Shards ``ks`` of a peer's copy, each checked: received over up to :data:`STREAMS` connections at once
        (a chunk of at most :data:`CHUNK_BYTES` each). Each chunk is checked by the thread that received it while
        the other streams still receive (on a pod network, one chunk's check overlaps the next one's wire time), and
        a shard's chunks' checksums are combined into the shard's (``crc32c_combine``): no pass over the whole state
        after its last byte arrives. One TCP stream is bounded by one core's copy out of the socket; several fill a
        pod network (or loopback) further."""
        m, h = src.manifest, src.holder
        shards = [m.shards[k] for k in ks]
        chunks = [(i, a, min(CHUNK_BYTES, s.nbytes - a)) for i, s in enumerate(shards)
                  for a in range(0, s.nbytes, CHUNK_BYTES)]
        crcs: dict[tuple[int, int], int] = {}
        streams = max(1, min(STREAMS, len(chunks)))
        with concurrent.futures.ThreadPoolExecutor(streams, thread_name_prefix="reprieve-memory-read") as pool:
            bufs = host_buffers([((s.nbytes,), np.dtype(np.uint8)) for s in shards], pool)  # the first large alone

            def receive(chunk: tuple[int, int, int]) -> None:
                i, start, n = chunk
                with memoryview(bufs[i].data) as whole, whole.cast("B") as flat, flat[start:start + n] as view:
                    wire.Client(h.location, token=self.token).read(h.tree, str(h.name),
                                                                   [(shards[i].offset + start, n)], [view])
                    crcs[(i, start)] = crc32c(view)

            for _ in pool.map(receive, chunks):
                pass
        whole = [0] * len(shards)  # each shard's checksum, its chunks' combined in order
        for i, start, n in chunks:
            whole[i] = crcs[(i, start)] if start == 0 else crc32c_combine(whole[i], crcs[(i, start)], n)
        for i, k in enumerate(ks):
            check_shard(m, k, whole[i], where=where)
        return bufs

    def array(self, w: int, k: int, dtype: np.dtype) -> np.ndarray:
        s = self.sources[w].manifest.shards[k]
        return self.cache[(w, k)].view(dtype).reshape([b - a for a, b in s.region])


def restore_state(sources: dict[int, Source], abstract: Any, *, num_writers: int, process: int, num_processes: int,
                  token: str | None, planned: Callable[[], None] | None = None,
                  ) -> tuple[Any, dict[str, Any], list[Any] | None, bool]:
    """``abstract`` materialised from ``sources`` (writer -> its copy); returns ``(state, extra, process_extra,
    remote)``, ``remote`` True when some shard came over the network. Raises :class:`NeedsStorage` when a
    region or this process's data position needs a writer that has no source: that is known before any shard is
    read, and ``planned()`` is called once it is known that none is needed (before the reads)."""
    if not sources:
        raise NeedsStorage("no writer's copy is in memory")
    first = next(iter(sources.values())).manifest
    for w, src in sources.items():
        if src.manifest.leaves != first.leaves:
            raise SourceError(src.holder, f"copy {src.holder.name}: its leaves disagree with writer "
                                          f"{first.writer}'s copy of the same step")
    saved = {leaf["path"]: (i, leaf) for i, leaf in enumerate(first.leaves)}
    by_leaf: dict[int, list[tuple[int, int, Region]]] = collections.defaultdict(list)
    for w, src in sources.items():
        for k, s in enumerate(src.manifest.shards):
            by_leaf[s.leaf].append((w, k, s.region))

    extras = [sources[w].manifest.process_extra if w in sources else None for w in range(num_writers)]
    has_positions = any(src.manifest.process_extra is not None for src in sources.values())
    lacking = [w for w in range(num_writers) if w not in sources]
    if has_positions and lacking and (num_writers != num_processes or process not in sources):
        raise NeedsStorage(f"the data positions of processes {lacking} are not in memory")

    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    out: list[Any] = [None] * len(flat)
    plans = []
    reader = _Reader(sources, token)
    wanted: set[tuple[int, int]] = set()
    for slot, (kp, target) in enumerate(flat):
        path = jax.tree_util.keystr(kp)
        if path not in saved:
            raise MissingLeafError(f"restore: leaf {path} is not in the memory copy of step {first.step} (saved "
                                   f"leaves: {sorted(saved)[:8]}...)")
        i, leaf = saved[path]
        if leaf["kind"] == "json":
            out[slot] = leaf["value"]
            continue
        key_impl = prng_key_impl(target)
        if key_impl is not None:
            if leaf.get("key_impl") not in (None, key_impl):
                raise ValueError(f"restore leaf {path}: saved typed PRNG keys of impl {leaf['key_impl']}, the "
                                 f"abstract state asks for {key_impl}")
            data = jax.eval_shape(jax.random.key_data, target)
            target = jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=key_data_sharding(path, sharding_of(target)))
        shape = tuple(getattr(target, "shape", ()))
        if tuple(leaf["shape"]) != shape:
            raise ValueError(f"restore leaf {path}: abstract shape {shape} does not match saved shape "
                             f"{tuple(leaf['shape'])}")
        sharding = sharding_of(target)
        if sharding is None and leaf["kind"] == "array" and not isinstance(target, np.ndarray):
            raise ValueError(f"restore leaf {path}: abstract value has no sharding; give a "
                             "jax.ShapeDtypeStruct(shape, dtype, sharding=...) or a jax.Array")
        saved_dtype = _np_dtype(leaf.get("stored_as") or leaf["dtype"])
        want = np.dtype(getattr(target, "dtype", saved_dtype)) if leaf.get("stored_as") is None else saved_dtype
        regions, devices = addressable_regions(sharding, shape)
        pieces = []
        for r in regions:
            found = cover(r, by_leaf.get(i, []))
            if found is None:
                raise NeedsStorage(f"leaf {path} region {list(r)} needs shards of a writer memory lacks")
            pieces.append(found)
            wanted.update((w, k) for w, k, _ in found)
        plans.append((slot, path, leaf, shape, sharding, regions, devices, pieces, saved_dtype, want, key_impl))
    if planned is not None:
        planned()
    reader.fetch(wanted)

    placed = []  # (slot, key_impl) of each leaf on devices, and its (buffers, devices, shape, sharding)
    for slot, _path, leaf, shape, sharding, regions, devices, pieces, saved_dtype, want, key_impl in plans:
        bufs = []
        for r, found in zip(regions, pieces, strict=True):
            w, k, inter = found[0]
            s_region = sources[w].manifest.shards[k].region
            if len(found) == 1 and inter == r == s_region and want == saved_dtype:
                bufs.append(reader.array(w, k, saved_dtype))  # the saved shard itself (a view when local)
                continue
            buf = host_buffer(tuple(hi - lo for lo, hi in r), want)
            for w, k, inter in found:
                part = reader.array(w, k, saved_dtype)[_local(inter, sources[w].manifest.shards[k].region)]
                buf[_local(inter, r)] = part if want == saved_dtype else part.astype(want)
            bufs.append(buf)
        if leaf.get("stored_as") is not None:
            bufs = [b.view(_np_dtype(leaf["dtype"])) for b in bufs]
        if sharding is None:
            out[slot] = np.array(bufs[0]) if leaf["kind"] == "numpy" else bufs[0]
            continue
        placed.append(((slot, key_impl), (bufs, devices, shape, sharding)))
    for ((slot, key_impl), _), arr in zip(placed, assemble([p for _, p in placed]), strict=True):
        out[slot] = arr if key_impl is None else jax.random.wrap_key_data(arr, impl=key_impl)
    remote = any(not sources[w].local for w, _ in wanted)
    return jax.tree_util.tree_unflatten(treedef, out), dict(first.extra), extras, remote

