"""The restore sources: where one process of a memory-tier restore reads one writer's part of the step.

:data:`SOURCES` is the one table of them, keyed by the words of ``docs/contract.toml``'s ``[memory]
restore_sources`` (what ``restoredFrom.sources`` reports per process) and ordered by preference: a process asks
each source in turn for a copy of the writer's shards and reads the first that has one. Its own pod's memory comes
first (a mapping, no copy, no network), a peer's memory over the pod network next, and storage last (the storage
tier's checkpoint of the same step, read only in a mixed restore when memory lacks a writer: ``.restore_round``).
A new source is one class here with its contract word (``docs/contract.toml``) and its line in
``docs/contract.md`` ("Memory tier"); ``tests/test_contract.py`` binds this table to the contract's list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .decide import Holding


class RestoreSource(Protocol):
    """One place a restore can read a writer's part from."""

    @property
    def name(self) -> str:
        """Its word in ``docs/contract.toml`` ``[memory] restore_sources``."""
        ...

    @property
    def where(self) -> str:
        """How the restore's log line names it."""
        ...

    def holder(self, holders: Sequence[Holding], process: int, location: str | None) -> Holding | None:
        """The copy among ``holders`` (one writer's) that ``process`` (in the pod at ``location``) reads through
        this source; None when it has none."""
        ...


@dataclass(frozen=True)
class OwnMemory:
    """A copy in the process's own pod's memory directory (read through a private mapping)."""

    name: str = "memory"
    where: str = "its own pod's memory"

    def holder(self, holders: Sequence[Holding], process: int, location: str | None) -> Holding | None:
        return next((h for h in holders if h.local_to(process, location)), None)


@dataclass(frozen=True)
class PeerMemory:
    """A copy another pod's replica server holds (read over TCP)."""

    name: str = "peer"
    where: str = "a peer's memory over the network"

    def holder(self, holders: Sequence[Holding], process: int, location: str | None) -> Holding | None:
        return next((h for h in holders if h.readable_by(process, location)), None)


@dataclass(frozen=True)
class StorageCheckpoint:
    """The storage tier's checkpoint of the step: it holds no memory copy, and serves whatever memory lacks."""

    name: str = "storage"
    where: str = "storage"

    def holder(self, holders: Sequence[Holding], process: int, location: str | None) -> Holding | None:
        return None


MEMORY, PEER, STORAGE = OwnMemory(), PeerMemory(), StorageCheckpoint()
SOURCES: dict[str, RestoreSource] = {s.name: s for s in (MEMORY, PEER, STORAGE)}  # in order of preference


def choose_holder(holders: Sequence[Holding], process: int, location: str | None) -> Holding | None:
    """Where ``process`` reads one writer's copy: the first source in :data:`SOURCES` that holds one."""
    for source in SOURCES.values():
        h = source.holder(holders, process, location)
        if h is not None:
            return h
    return None
