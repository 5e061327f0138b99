"""The checkpoint metadata file (``reprieve.json``): its schema and (de)serialisation. Pure."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

FORMAT_VERSION = 1

LeafKind = Literal["array", "numpy", "json"]


class CheckpointCorruptError(RuntimeError):
    """A checkpoint file is missing, truncated or fails its checksum. Names the file and checkpoint."""


@dataclasses.dataclass
class LeafMeta:
    """One leaf of the saved tree.

    ``array`` leaves are jax.Arrays written as zarr3 arrays with one chunk per saved shard;
    ``numpy`` leaves are host arrays written whole by process 0; ``json`` leaves (Python scalars,
    strings) live in ``value``.
    """

    path: str
    kind: LeafKind
    index: int | None = None
    shape: list[int] | None = None
    dtype: str | None = None
    chunk_shape: list[int] | None = None
    nbytes: int = 0
    sharding: dict[str, Any] | None = None
    value: Any = None


@dataclasses.dataclass
class CheckpointMeta:
    step: int
    attempt: int
    num_processes: int
    leaves: list[LeafMeta]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    created_unix: float = 0.0
    format_version: int = FORMAT_VERSION

    @property
    def array_bytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def leaf_by_path(self) -> dict[str, LeafMeta]:
        return {leaf.path: leaf for leaf in self.leaves}

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> CheckpointMeta:
        """Parse; ``where`` (file and checkpoint) is named in every error."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointCorruptError(f"{where}: metadata is not valid JSON ({err})") from err
        if not isinstance(raw, dict):
            raise CheckpointCorruptError(f"{where}: metadata must be a JSON object, got {type(raw).__name__}")
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise CheckpointCorruptError(
                f"{where}: format_version must be {FORMAT_VERSION}, got {version!r} (written by a newer reprieve?)"
            )
        try:
            leaves = [LeafMeta(**leaf) for leaf in raw.pop("leaves")]
            return cls(leaves=leaves, **raw)
        except (KeyError, TypeError) as err:
            raise CheckpointCorruptError(f"{where}: metadata has a missing or unknown field ({err})") from err
