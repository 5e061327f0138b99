"""The memory tier: a copy of every process's shards in memory that outlives the trainer, replicated to a peer
pod over the pod network, restored from the nearest complete copy (``docs/memory.md``).

Modules: :mod:`.config` (the environment), :mod:`.layout` and :mod:`.manifest` (what a copy is), :mod:`.decide`
(fencing, retention, the restore plan, pairing: pure), :mod:`.store` (the memory directory), :mod:`.wire` and
:mod:`.server` (the replica protocol and server; reprieve-supervisor runs the server), :mod:`.schedule` (when to save),
:mod:`.tier` (saving; a Job saves to it through ``reprieve.targets.MemoryTarget``), :mod:`.sources`, :mod:`.restore`
and :mod:`.restore_round` (restoring).
Importing this package does not import JAX (reprieve-supervisor imports the server).
"""

from .config import MemoryConfig

__all__ = ["MemoryConfig"]
