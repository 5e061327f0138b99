"""Each replicated byte read from storage once: which process reads which shared piece of a restore. Pure.

A *piece* is the part of one saved chunk that lands in one target region (a shard) which two or more processes
hold (data-parallel replicas, a fully replicated leaf). :func:`assign` gives each piece one owner among the
processes that need it, balancing the bytes each reads, the same on every process (it sees only the sharding and
the checkpoint's chunk grid); the owner reads it from storage and the others get it from the owner
(:mod:`.exchange`). A piece under ``min_bytes`` is read by every process that needs it: a round trip to a peer
costs more than reading it. docs/checkpoint.md, "Each replicated byte read once".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from ..arrays import Region

MIN_PIECE_BYTES = 1 << 20  # under a MiB a piece is read by every process that needs it (no round trip)
AUTO, ON, OFF = "auto", "on", "off"  # CheckpointManager(read_once=): auto: on when the job spans several hosts
MODES = (AUTO, ON, OFF)


@dataclasses.dataclass(frozen=True)
class Piece:
    """The part ``part`` (array coordinates, inside one saved chunk) of leaf ``leaf``'s target region ``region``;
    ``needers``: the processes that hold ``region``; ``owner``: the one that reads it from storage."""

    leaf: int
    region: Region
    part: Region
    nbytes: int
    needers: tuple[int, ...]
    owner: int = -1


def shared_regions(regions: Mapping[int, Iterable[Region]]) -> dict[Region, tuple[int, ...]]:
    """The regions that two or more processes hold (``regions``: process -> its regions), each with those
    processes in order. Pure."""
    holders: dict[Region, list[int]] = {}
    for process in sorted(regions):
        for region in regions[process]:
            holders.setdefault(region, []).append(process)
    return {r: tuple(ps) for r, ps in sorted(holders.items()) if len(ps) > 1}


def assign(pieces: Iterable[Piece], *, min_bytes: int = MIN_PIECE_BYTES) -> list[Piece]:
    """The pieces worth one read, each with its owner: the needer that has been given the fewest bytes so far (the
    lowest process on a tie), in the order given (the same on every process). Pieces under ``min_bytes`` or with a
    single needer are left out: every needer reads those itself. Pure."""
    load: dict[int, int] = {}
    out = []
    for piece in pieces:
        if len(piece.needers) < 2 or piece.nbytes < min_bytes:
            continue
        owner = min(piece.needers, key=lambda p: (load.get(p, 0), p))
        load[owner] = load.get(owner, 0) + piece.nbytes
        out.append(dataclasses.replace(piece, owner=owner))
    return out


def engaged(modes: Iterable[str], hosts: Iterable[str]) -> bool:
    """Whether a restore shares its replicated pieces, from every process's ``read_once`` mode and host name (the
    same answer on every process: each reads all the others'). Off when any process has it off (that process
    neither sends nor receives); on when any has it on, or when all are ``auto`` and the processes span several
    hosts (processes on one host share its page cache, so reading a file twice there costs a memory copy, less
    than a round trip through a socket). Pure.

    Raises:
        ValueError: a mode that is not one of :data:`MODES` (named, with the choices).
    """
    modes = list(modes)
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"read_once must be one of {MODES}, got {mode!r}")
    return OFF not in modes and (ON in modes or len(set(hosts)) > 1)
