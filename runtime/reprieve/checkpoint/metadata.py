"""The checkpoint metadata file (``reprieve.json``): its schema and (de)serialisation. Pure."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from ..jsonobject import json_object

FORMAT_VERSION = 1

LeafKind = Literal["array", "numpy", "json"]
_OPTIONAL_LEAF_FIELDS = ("stored_as", "key_impl")


class CheckpointCorruptError(RuntimeError):
    """A checkpoint file is missing, truncated or fails its checksum. Names the file and checkpoint."""


class CheckpointUnavailableError(RuntimeError):
    """The storage did not serve a checkpoint's bytes (unreachable, timed out, refused, not permitted): nothing is
    known to be wrong with the checkpoint, so a restore neither quarantines it nor falls back past it. Names the
    checkpoint and the file."""


# TensorStore's status codes (the word its error messages begin with) that say the storage did not serve the bytes,
# not that they are wrong: such a failure is not the checkpoint's, so it is neither quarantined nor fallen back past
# (a restore), nor called corrupt (``reprieve verify``). Every other code (DATA_LOSS: a checksum; FAILED_PRECONDITION:
# a chunk shorter than its metadata says; NOT_FOUND...) is damage.
UNAVAILABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "CANCELLED", "RESOURCE_EXHAUSTED",
                               "PERMISSION_DENIED", "UNAUTHENTICATED"})


def unavailable(err: BaseException) -> bool:
    """Whether ``err`` says the storage did not answer (nothing is known of the data) rather than that the data is
    wrong: a CheckpointUnavailableError, or TensorStore's status code in its message."""
    return isinstance(err, CheckpointUnavailableError) or str(err).split(":", 1)[0].strip() in UNAVAILABLE_CODES


@dataclasses.dataclass
class LeafMeta:
    """One leaf of the saved tree.

    ``array`` leaves are jax.Arrays written as zarr3 arrays with one chunk per saved shard;
    ``numpy`` leaves are host arrays written whole by process 0; ``json`` leaves (Python scalars,
    strings) live in ``value``. ``stored_as``: the integer dtype holding the bytes of a dtype zarr3 has no
    name for (``uint4``...). ``key_impl``: the leaf is a typed PRNG key array saved as its key data
    (``shape`` and ``dtype`` are the key data's), to be rebuilt with that implementation.
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
    stored_as: str | None = None
    key_impl: str | None = None


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
    process_extra: list[Any] | None = None  # one JSON value per process (data positions), or None
    topology: dict[str, Any] | None = None  # the writing attempt's devices (reprieve.topology), or None
    landing_bytes: int | None = None  # what a restore lands on the writer's process 0 (reprieve.landing), or None
    # what a restore there copies into memory XLA allocates, when the writer's step donates the state, or None
    owned_bytes: int | None = None

    @property
    def array_bytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def structure(self) -> list[tuple[str, tuple[int, ...] | None]]:
        """The saved state's leaf paths and shapes as the program saw them (``reprieve.identity.structure``): a
        typed key's shape without its key-data dimension, None for a Python scalar or a 0-d leaf."""
        out: list[tuple[str, tuple[int, ...] | None]] = []
        for leaf in self.leaves:
            shape = None if leaf.kind == "json" or leaf.shape is None else tuple(
                leaf.shape[:-1] if leaf.key_impl else leaf.shape)
            out.append((leaf.path, shape or None))
        return out

    def leaf_by_path(self) -> dict[str, LeafMeta]:
        return {leaf.path: leaf for leaf in self.leaves}

    def to_json(self) -> bytes:
        raw = dataclasses.asdict(self)
        # Fields added after format 1 shipped are written only when used, so files without them stay
        # byte-for-byte what older versions wrote and read.
        for leaf in raw["leaves"]:
            for key in _OPTIONAL_LEAF_FIELDS:
                if leaf[key] is None:
                    del leaf[key]
        for key in ("process_extra", "topology", "landing_bytes", "owned_bytes"):
            if raw[key] is None:
                del raw[key]
        return json.dumps(raw, indent=1, sort_keys=True).encode()

    def problems(self, step: int, attempt: int) -> list[str]:
        """Where this metadata disagrees with the checkpoint's name (``step``, ``attempt``) or with itself."""
        out = []
        if self.step != step:
            out.append(f"metadata step {self.step} disagrees with the name's step {step}")
        if self.attempt != attempt:
            out.append(f"metadata attempt {self.attempt} disagrees with the name's attempt {attempt}")
        if self.process_extra is not None and len(self.process_extra) != self.num_processes:
            out.append(f"metadata has {len(self.process_extra)} per-process values for {self.num_processes} "
                       "processes")
        seen: set[int] = set()
        for leaf in self.leaves:
            if leaf.kind == "json":
                continue
            if leaf.index is None or leaf.shape is None or leaf.dtype is None or leaf.chunk_shape is None:
                out.append(f"leaf {leaf.path} ({leaf.kind}) lacks its index, shape, dtype or chunk shape")
            elif leaf.index in seen:
                out.append(f"leaf {leaf.path} reuses array index {leaf.index}")
            else:
                seen.add(leaf.index)
        return out

    @classmethod
    def from_json(cls, data: bytes, where: str) -> CheckpointMeta:
        """Parse; ``where`` (file and checkpoint) is named in every error."""
        raw = json_object(data, f"{where}: metadata", CheckpointCorruptError)
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise CheckpointCorruptError(
                f"{where}: format_version must be {FORMAT_VERSION}, got {version!r} (written by a newer reprieve?)"
            )
        # Within a format version, a field added at the top level is informational (process_extra, topology,
        # landing_bytes, owned_bytes): a reader that predates it ignores it, so a downgrade does not quarantine good
        # checkpoints.
        # A leaf field says how the bytes are stored (stored_as, key_impl): one this reader does not know is an
        # error. A field a reader must understand takes a new format_version.
        known = {f.name for f in dataclasses.fields(cls)}
        raw = {k: v for k, v in raw.items() if k in known}
        try:
            leaves = [LeafMeta(**leaf) for leaf in raw.pop("leaves")]
            return cls(leaves=leaves, **raw)
        except (KeyError, TypeError) as err:
            raise CheckpointCorruptError(f"{where}: metadata has a missing or unknown field ({err})") from err
