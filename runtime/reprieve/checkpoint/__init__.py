"""Asynchronous sharded checkpoints on TensorStore: atomic commit, fencing, resharding restore.

Public API: :class:`CheckpointManager` (see its docstring and docs/checkpoint.md). The names are imported when
first used, so the pure modules (``layout``, ``catalog``, ``metadata``...) and the ``reprieve`` command's reader load
without JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fencing import FencedError
    from .manager import CheckpointManager, CheckpointSaveError, OnlyQuarantinedError, RestoreResult
    from .metadata import CheckpointCorruptError, CheckpointUnavailableError

_WHERE = {"CheckpointManager": "manager", "CheckpointSaveError": "manager", "RestoreResult": "manager",
          "OnlyQuarantinedError": "manager",
          "FencedError": "fencing", "CheckpointCorruptError": "metadata",
          "CheckpointUnavailableError": "metadata"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckpointCorruptError", "CheckpointManager", "CheckpointSaveError", "CheckpointUnavailableError",
           "FencedError", "OnlyQuarantinedError", "RestoreResult"]
