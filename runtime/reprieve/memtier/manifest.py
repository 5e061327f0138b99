"""A memory copy's ``manifest.json``: what the copy holds, where each shard lies in ``data.bin``, its checksums.
Pure (no JAX: the replica server in reprieve-supervisor reads it too).

The file is the JSON body, a newline and ``crc32c=<8 hex digits>`` of the body, so a torn or flipped manifest
is found before anything it says is believed. Every shard carries the crc32c of its bytes: a reader checks
each shard it uses (:func:`reprieve.memtier.store.verify`), and a copy with one bad shard is not used at all.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from ..checksum import crc32c
from .layout import ALIGN, CopyName

FORMAT_VERSION = 1
_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2, "int32": 4,
             "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "complex64": 8, "complex128": 16}

Region = tuple[tuple[int, int], ...]


class CopyCorruptError(RuntimeError):
    """A memory copy disagrees with itself or fails a checksum; the message names the copy and the file."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """One saved shard: its leaf (index into ``leaves``), its region in the array, where its bytes lie."""

    leaf: int
    region: Region
    offset: int
    nbytes: int
    crc32c: int

    def to_json(self) -> dict[str, Any]:
        return {"leaf": self.leaf, "region": [list(r) for r in self.region], "offset": self.offset,
                "nbytes": self.nbytes, "crc32c": self.crc32c}


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What one copy holds. ``leaves`` are the storage tier's leaf records (``reprieve.checkpoint.metadata.LeafMeta``
    as dicts: path, kind, shape, dtype, ...), so the copy restores onto any sharding like a checkpoint does.
    ``base``: the ``(step, attempt)`` the writing attempt restored from (None: it started from scratch); the
    fencing rule (:func:`reprieve.memtier.decide.visible`) reads it. ``root``: the storage root (the run's
    ``REPRIEVE_CHECKPOINT_URI``) the copy belongs to: a restore reads only the copies of its own root (None: written
    before copies recorded it, never restored)."""

    writer: int
    num_processes: int
    step: int
    attempt: int
    leaves: list[dict[str, Any]]
    shards: list[Shard]
    data_bytes: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    process_extra: Any = None  # the writer's own data position (a JSON value), or None
    base: tuple[int, int] | None = None
    created_unix: float = 0.0
    topology: dict[str, Any] | None = None
    root: str | None = None
    format_version: int = FORMAT_VERSION

    @property
    def name(self) -> CopyName:
        return CopyName(self.step, self.attempt, self.writer)

    def to_bytes(self) -> bytes:
        body = json.dumps({
            "format_version": self.format_version, "writer": self.writer, "num_processes": self.num_processes,
            "step": self.step, "attempt": self.attempt, "base": None if self.base is None else list(self.base),
            "created_unix": self.created_unix, "data_bytes": self.data_bytes, "extra": self.extra,
            "process_extra": self.process_extra, "topology": self.topology, "root": self.root,
            "leaves": self.leaves,
            "shards": [s.to_json() for s in self.shards]}, sort_keys=True, separators=(",", ":")).encode()
        return body + b"\ncrc32c=" + f"{crc32c(body):08x}".encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        """Parse and check the self-checksum; :class:`CopyCorruptError` naming ``where`` otherwise."""
        body, sep, tail = data.rstrip(b"\n").rpartition(b"\ncrc32c=")
        if not sep:
            raise CopyCorruptError(f"{where}: manifest has no checksum line (torn or not a memory copy)")
        try:
            want = int(tail.decode(), 16)
        except ValueError:
            raise CopyCorruptError(f"{where}: manifest checksum line is malformed: {tail[:40]!r}") from None
        if crc32c(body) != want:
            raise CopyCorruptError(f"{where}: manifest fails its checksum (crc32c {crc32c(body):08x}, "
                                   f"recorded {want:08x})")
        try:
            raw = json.loads(body)
            if raw.get("format_version") != FORMAT_VERSION:
                raise CopyCorruptError(f"{where}: format_version must be {FORMAT_VERSION}, got "
                                       f"{raw.get('format_version')!r} (written by another reprieve?)")
            base = raw.get("base")
            shards = [Shard(int(s["leaf"]), tuple((int(a), int(b)) for a, b in s["region"]), int(s["offset"]),
                            int(s["nbytes"]), int(s["crc32c"])) for s in raw["shards"]]
            return cls(writer=int(raw["writer"]), num_processes=int(raw["num_processes"]), step=int(raw["step"]),
                       attempt=int(raw["attempt"]), leaves=list(raw["leaves"]), shards=shards,
                       data_bytes=int(raw["data_bytes"]), extra=dict(raw.get("extra") or {}),
                       process_extra=raw.get("process_extra"),
                       base=None if base is None else (int(base[0]), int(base[1])),
                       created_unix=float(raw.get("created_unix", 0.0)), topology=raw.get("topology"),
                       root=None if raw.get("root") is None else str(raw["root"]))
        except CopyCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CopyCorruptError(f"{where}: manifest has a missing or malformed field ({err!r})") from None

    def structure(self) -> list[tuple[str, tuple[int, ...] | None]]:
        """The saved state's leaf paths and shapes as ``reprieve.identity.structure`` has them (the storage tier's
        ``Metadata.structure`` over the manifest's leaf records)."""
        from ..checkpoint.metadata import CheckpointMeta, LeafMeta

        known = {f.name for f in dataclasses.fields(LeafMeta)}  # a field a newer reprieve added is not the shape
        leaves = [LeafMeta(**{k: v for k, v in leaf.items() if k in known}) for leaf in self.leaves]
        return CheckpointMeta(self.step, self.attempt, self.num_processes, leaves).structure()

    def problems(self, name: CopyName) -> list[str]:
        """Where the manifest disagrees with the copy's name or with itself (pure)."""
        out = []
        for field, got, want in (("step", self.step, name.step), ("attempt", self.attempt, name.attempt),
                                 ("writer", self.writer, name.writer)):
            if got != want:
                out.append(f"manifest {field} {got} disagrees with the name's {want}")
        if not 0 <= self.writer < self.num_processes:
            out.append(f"writer {self.writer} is not below num_processes {self.num_processes}")
        end = 0
        for k, s in enumerate(sorted(self.shards, key=lambda s: s.offset)):
            where = f"shard {k} (leaf {s.leaf})"
            if not 0 <= s.leaf < len(self.leaves):
                out.append(f"{where}: no such leaf (the copy has {len(self.leaves)})")
                continue
            leaf = self.leaves[s.leaf]
            shape, dtype = leaf.get("shape"), leaf.get("dtype")
            if leaf.get("kind") not in ("array", "numpy") or shape is None or dtype not in _ITEMSIZE_ALL:
                out.append(f"{where}: leaf {leaf.get('path')} is not an array of a known dtype")
                continue
            if len(s.region) != len(shape) or any(not 0 <= a <= b <= n for (a, b), n in zip(s.region, shape)):
                out.append(f"{where}: region {list(s.region)} is outside leaf {leaf.get('path')} of shape {shape}")
                continue
            want_bytes = math.prod(b - a for a, b in s.region) * itemsize(dtype, leaf.get("stored_as"))
            if s.nbytes != want_bytes:
                out.append(f"{where}: {s.nbytes} bytes, its region of {dtype} needs {want_bytes}")
            if s.offset % ALIGN or s.offset < end or s.offset + s.nbytes > self.data_bytes:
                out.append(f"{where}: bytes {s.offset}..{s.offset + s.nbytes} overlap another shard, are not "
                           f"{ALIGN}-byte aligned or lie beyond data.bin's {self.data_bytes}")
            end = max(end, s.offset + s.nbytes)
        return out


# ml_dtypes and sub-byte types: their item size in a host buffer (one byte for the sub-byte ones, as numpy stores)
_ITEMSIZE_ALL = {**_ITEMSIZE, **{n: 1 for n in (
    "int2", "int4", "uint1", "uint2", "uint4", "int1", "float4_e2m1fn", "float8_e3m4", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float8_e4m3",
    "float6_e2m3fn", "float6_e3m2fn")}}


def itemsize(dtype: str, stored_as: str | None = None) -> int:
    """Bytes per element of a leaf's host buffer."""
    return _ITEMSIZE_ALL[stored_as or dtype]
