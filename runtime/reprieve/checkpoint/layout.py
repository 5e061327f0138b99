"""Pure naming of everything a checkpoint root holds (no I/O).

Layout under a root URI (a directory, or a bucket prefix)::

    step_0000000042_a3/            a committed checkpoint: step 42 written by attempt 3
        reprieve.json              metadata: tree, leaves, shardings, step, attempt, versions, extra
        arrays/00007/zarr.json     one zarr3 array per array leaf, one chunk per saved shard
        arrays/00007/c/0/1         chunk files (crc32c-checksummed)
    step_0000000043_a3.tmp/        being written (filesystems); renamed to the committed name at commit
    step_0000000040_a2.deleting/   being deleted by retention (invisible)
    step_0000000041_a2.corrupt/    quarantined: found corrupt by a restore (kept for inspection, never listed)
    commits/step_0000000042_a3     object stores only: the commit marker (written last, atomically)
    corrupt/step_0000000041_a2-<ms>.json   object stores only: why a checkpoint was quarantined (data deleted)
    attempts/attempt_0000000003.json   fence of attempt 3: the checkpoints visible when it started
    topology.json                  the devices of the newest attempt that took a step (process 0 writes it after
                                   its first step under reprieve-supervisor): a hint for a spare parked before the
                                   first checkpoint (reprieve.trace_ahead), never read for a restore

Object stores have no rename: data is written straight under the committed name and only the
marker in ``commits/`` makes it visible.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

METADATA_FILE = "reprieve.json"
ARRAYS_DIR = "arrays"
COMMITS_DIR = "commits"
FENCES_DIR = "attempts"
TOPOLOGY_FILE = "topology.json"  # reprieve.trace_ahead.record_topology: a hint, not part of any checkpoint
CORRUPT_DIR = "corrupt"
ORBAX_FENCES_DIR = "reprieve_attempts"  # reprieve.orbax.OrbaxCheckpointer's fences, beside Orbax's step directories
TMP_SUFFIX = ".tmp"
DELETING_SUFFIX = ".deleting"
CORRUPT_SUFFIX = ".corrupt"

# A URI scheme (RFC 3986: a letter, then letters, digits, '+', '-', '.') and its colon at the start of a root.
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
URI_FORMS = "a path (./ckpt, /ckpt), file:///abs/path, file://rel/path, gs://bucket/prefix or s3://bucket/prefix"
_NAME_RE = re.compile(r"^step_(\d{10})_a(\d+)(\.tmp|\.deleting|\.corrupt(?:-(\d+))?)?$")
_FENCE_RE = re.compile(r"^attempt_(\d{10})\.json$")

State = Literal["committed", "tmp", "deleting", "corrupt"]


@dataclasses.dataclass(frozen=True, order=True)
class CheckpointName:
    """A parsed directory (or prefix) name under the checkpoint root."""

    step: int
    attempt: int
    state: State = "committed"
    copy: int = dataclasses.field(default=1, compare=False)  # quarantined copies of one name: .corrupt-<copy>

    @property
    def committed(self) -> str:
        return committed_name(self.step, self.attempt)

    def __str__(self) -> str:
        if self.state == "corrupt":
            return self.committed + CORRUPT_SUFFIX + ("" if self.copy == 1 else f"-{self.copy}")
        suffix = {"committed": "", "tmp": TMP_SUFFIX, "deleting": DELETING_SUFFIX}[self.state]
        return self.committed + suffix


def committed_name(step: int, attempt: int) -> str:
    if step < 0 or attempt < 0:
        raise ValueError(f"checkpoint step and attempt must be >= 0, got step={step} attempt={attempt}")
    return f"step_{step:010d}_a{attempt}"


def tmp_name(step: int, attempt: int) -> str:
    return committed_name(step, attempt) + TMP_SUFFIX


def deleting_name(name: str) -> str:
    return name + DELETING_SUFFIX


def parse_name(name: str) -> CheckpointName | None:
    """Parse ``step_<10 digits>_a<attempt>[.tmp|.deleting]``; None for anything else."""
    m = _NAME_RE.match(name.rstrip("/"))
    if not m:
        return None
    if m.group(3) and m.group(3).startswith(CORRUPT_SUFFIX):
        return CheckpointName(int(m.group(1)), int(m.group(2)), "corrupt", int(m.group(4) or 1))
    states: dict[str | None, State] = {None: "committed", TMP_SUFFIX: "tmp", DELETING_SUFFIX: "deleting"}
    return CheckpointName(int(m.group(1)), int(m.group(2)), states[m.group(3)])


def quarantine_name(name: str, existing: set[str]) -> str:
    """Where a corrupt checkpoint ``name`` is moved: ``<name>.corrupt``, or ``.corrupt-2``, ``-3``... when a
    copy quarantined before already holds that name (a name can go corrupt more than once)."""
    copy = 1
    while (target := str(CheckpointName(*_split(name), "corrupt", copy))) in existing:
        copy += 1
    return target


def _split(name: str) -> tuple[int, int]:
    parsed = parse_name(name)
    if parsed is None or parsed.state != "committed":
        raise ValueError(f"not a committed checkpoint name: {name!r}")
    return parsed.step, parsed.attempt


_RECORD_RE = re.compile(r"^step_(\d{10})_a(\d+)-(\d+)\.json$")


def parse_quarantine_record(name: str) -> tuple[int, int, int] | None:
    """``(step, attempt, unix ms)`` of an object store's ``corrupt/<name>-<ms>.json`` record; None otherwise."""
    m = _RECORD_RE.match(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def fence_name(attempt: int) -> str:
    return f"attempt_{attempt:010d}.json"


def parse_fence_name(name: str) -> int | None:
    m = _FENCE_RE.match(name)
    return int(m.group(1)) if m else None


def array_dir(leaf_index: int) -> str:
    return f"{ARRAYS_DIR}/{leaf_index:05d}"


def chunk_key(leaf_index: int, grid_index: tuple[int, ...]) -> str:
    """The key of one chunk file under a checkpoint (zarr3's default chunk key encoding: ``c/<i>/<j>...``)."""
    return "/".join([array_dir(leaf_index), "c", *(str(k) for k in grid_index)])


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a checkpoint root lives: ``scheme`` is ``file``, ``gs`` or ``s3``."""

    scheme: str
    bucket: str  # empty for file
    path: str  # absolute directory for file; key prefix (no leading '/', '' or ending in '/') otherwise

    @property
    def is_object_store(self) -> bool:
        return self.scheme != "file"

    def uri(self) -> str:
        if self.scheme == "file":
            return self.path
        return f"{self.scheme}://{self.bucket}/{self.path}".rstrip("/")


def parse_uri(uri: str, cwd: str = "/") -> Location:
    """Parse a checkpoint root: a path, ``file://path``, ``gs://bucket/prefix`` or ``s3://bucket/prefix``."""
    import posixpath

    if not uri:
        raise ValueError("checkpoint uri must not be empty")
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        if scheme == "file":
            return Location("file", "", posixpath.normpath(posixpath.join(cwd, rest)))
        if scheme not in ("gs", "s3"):
            raise ValueError(
                f"checkpoint uri {uri!r}: scheme must be one of file://, gs://, s3:// or a plain path, got {scheme}://"
            )
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ValueError(f"checkpoint uri {uri!r}: missing bucket name after {scheme}://")
        prefix = prefix.strip("/")
        return Location(scheme, bucket, prefix + "/" if prefix else "")
    scheme_like = _SCHEME_RE.match(uri)
    if scheme_like:  # s3:/bucket (one slash), file:rel: a typo that would become a local folder named "s3:"
        raise ValueError(
            f"checkpoint uri {uri!r}: starts like a URI ({scheme_like.group(1)}:) but is not one of the accepted forms: "
            f"{URI_FORMS}; for a local directory whose name has a colon, write ./{uri}")
    return Location("file", "", posixpath.normpath(posixpath.join(cwd, uri)))
