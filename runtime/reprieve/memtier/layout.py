"""Pure naming of everything a memory directory holds (no I/O).

Layout under ``REPRIEVE_MEMORY_DIR`` (one per pod; a ``medium: Memory`` emptyDir outlives the trainer process
and a restart of the container)::

    own/s0000000120_a3_p1/          a committed copy written in this pod: step 120, attempt 3, by process 1
        manifest.json               what the copy holds (leaves, shards, offsets, crc32c), self-checksummed
        data.bin                    the shards' bytes, 64-byte aligned, as the manifest says
    own/s0000000130_a3_p1.tmp/      being written: never listed, removed by the next writer
    peer/s0000000120_a3_p0/         a committed copy received from process 0 (this pod holds its replica)
    peer/s0000000130_a3_p0.tmp/     being received
    fences/attempt_0000000004.json  attempt 4 started here, restoring from (step, attempt): see decide.visible
    .lock                           one copy in flight per pod (own save or receive): flock(2)
    .free/data.<writer>             a deleted copy's data.bin kept for the next copy in flight to write over
                                    (at most one; its pages are already the volume's: no allocation, no zeroing)

The commit of a copy is the rename of its ``.tmp`` directory (atomic); a copy is never modified after it: a
deleted copy's data file is written over only when no reader holds it (``flock(LOCK_SH)`` on its ``data.bin``, which
a restore that maps the copy holds as long as the mapping lives).
Process, step and attempt in the name must agree with the manifest, or the copy is corrupt.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

OWN = "own"
PEER = "peer"
TREES = (OWN, PEER)
FENCES_DIR = "fences"
MANIFEST_FILE = "manifest.json"
DATA_FILE = "data.bin"
LOCK_FILE = ".lock"
FREE_DIR = ".free"
TMP_SUFFIX = ".tmp"
ALIGN = 64  # shard offsets in data.bin: CPU devices adopt 64-byte aligned host buffers without a copy

_NAME_RE = re.compile(r"^s(\d{10})_a(\d+)_p(\d+)(\.tmp)?$")

Tree = Literal["own", "peer"]


@dataclasses.dataclass(frozen=True, order=True)
class CopyName:
    """One copy in a memory directory: process ``writer``'s shards of ``step``, written by ``attempt``."""

    step: int
    attempt: int
    writer: int
    tmp: bool = False

    def __post_init__(self) -> None:
        if self.step < 0 or self.attempt < 1 or self.writer < 0:
            raise ValueError(f"memory copy name needs step >= 0, attempt >= 1, writer >= 0; got step={self.step} "
                             f"attempt={self.attempt} writer={self.writer}")

    @property
    def committed(self) -> CopyName:
        return dataclasses.replace(self, tmp=False)

    @property
    def in_flight(self) -> CopyName:
        return dataclasses.replace(self, tmp=True)

    def __str__(self) -> str:
        return f"s{self.step:010d}_a{self.attempt}_p{self.writer}" + (TMP_SUFFIX if self.tmp else "")


def parse_name(name: str) -> CopyName | None:
    """``s<10 digits>_a<attempt>_p<writer>[.tmp]`` -> CopyName; None for anything else."""
    m = _NAME_RE.match(name.rstrip("/"))
    if not m:
        return None
    try:
        return CopyName(int(m.group(1)), int(m.group(2)), int(m.group(3)), tmp=m.group(4) is not None)
    except ValueError:
        return None


def aligned(offset: int) -> int:
    """``offset`` rounded up to :data:`ALIGN`."""
    return -(-offset // ALIGN) * ALIGN
