"""Asynchronous sharded checkpoints on TensorStore: atomic commit, fencing, resharding restore.

Public API: :class:`CheckpointManager` (see its docstring and docs/checkpoint.md).
"""

from .fencing import FencedError
from .manager import CheckpointManager, CheckpointSaveError, RestoreResult
from .metadata import CheckpointCorruptError

__all__ = ["CheckpointCorruptError", "CheckpointManager", "CheckpointSaveError", "FencedError", "RestoreResult"]
