"""The restore sources: where one process of a memory-tier restore reads one writer's part of the step.

:data:`SOURCES` is the one table of them, keyed by the words of ``docs/contract.toml``'s ``[memory]
restore_sources`` (what ``restoredFrom.sources`` reports per process) and ordered by preference: a process asks
each source in turn for a copy of the writer's shards and reads the first that has one. Its own pod's memory comes
first (a mapping, no copy, no network), a peer's memory over the pod network next, and storage last (the storage
tier's checkpoint of the same step, read only in a mixed restore when memory lacks a writer: ``.restore_round``).
A new source is one row here, :class:`RestoreSource` with its contract word (``docs/contract.toml``) and which
copies it reads, and its line in ``docs/contract.md`` ("Memory tier"); ``tests/test_contract.py`` binds this table
to the contract's list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .decide import Holding


@dataclass(frozen=True)
class RestoreSource:
    """One place a restore can read a writer's part from: ``name``, its word in ``docs/contract.toml`` ``[memory]
    restore_sources``; ``where``, how the restore's log line names it; ``reads(holding, process, location)``,
    whether ``process`` (in the pod at ``location``) reads that copy through this source."""

    name: str
    where: str
    reads: Callable[[Holding, int, str | None], bool]

    def holder(self, holders: Sequence[Holding], process: int, location: str | None) -> Holding | None:
        """The copy among ``holders`` (one writer's) that ``process`` reads through this source; None when it has
        none."""
        return next((h for h in holders if self.reads(h, process, location)), None)


def _no_copy(holding: Holding, process: int, location: str | None) -> bool:
    return False


# A copy in the process's own pod's memory directory (read through a private mapping); a copy another pod's replica
# server holds (read over TCP); the storage tier's checkpoint of the step, which holds no memory copy and serves
# whatever memory lacks.
MEMORY = RestoreSource("memory", "its own pod's memory", Holding.local_to)
PEER = RestoreSource("peer", "a peer's memory over the network", Holding.readable_by)
STORAGE = RestoreSource("storage", "storage", _no_copy)
SOURCES: dict[str, RestoreSource] = {s.name: s for s in (MEMORY, PEER, STORAGE)}  # in order of preference


def choose_holder(holders: Sequence[Holding], process: int, location: str | None) -> Holding | None:
    """Where ``process`` reads one writer's copy: the first source in :data:`SOURCES` that holds one."""
    for source in SOURCES.values():
        h = source.holder(holders, process, location)
        if h is not None:
            return h
    return None
