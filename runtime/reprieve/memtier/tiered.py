"""The checkpointer a :class:`reprieve.Job` sees when the memory tier is on: the storage tier's, plus memory.

Saves go to storage as before (periodic saves, the agreed save on a notice, the job's end: the memory tier never
replaces one); memory saves come through :meth:`memory_save` when :meth:`memory_due` says so; a restore
without a named step is the tiered one (:func:`.restore_round.restore`). Everything else is the storage
checkpointer's (attribute access falls through to it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import restore_round
from .tier import MemoryTier


class TieredCheckpointer:
    """``storage`` (a ``reprieve.Checkpointer``) with ``tier`` beside it."""

    def __init__(self, storage: Any, tier: MemoryTier) -> None:
        self.storage = storage
        self.tier = tier
        self._restore_check: Callable[[Any, Any, str], None] | None = None

    def __getattr__(self, name: str) -> Any:  # last_save_seconds, supports_process_extra, defer_retention, ...
        return getattr(self.storage, name)

    def save(self, step: int, state: Any, **kwargs: Any) -> None:
        self.storage.save(step, state, **kwargs)

    def wait(self) -> None:
        self.storage.wait()

    def latest_step(self) -> int | None:
        return self.storage.latest_step()

    def set_restore_check(self, check: Callable[[Any, Any, str], None] | None) -> None:
        """``Job.restore_or``'s run-identity check: the storage tier runs it on what it restores, the memory tier
        on a memory copy's record (``reprieve.identity``), before the state is handed back."""
        self._restore_check = check
        hook = getattr(self.storage, "set_restore_check", None)
        if callable(hook):
            hook(check)

    def restore(self, abstract_state: Any, *, step: int | None = None) -> Any:
        if step is not None:
            return self.storage.restore(abstract_state, step=step)
        return restore_round.restore(self.tier, self.storage, abstract_state, check=self._restore_check)

    def close(self) -> None:
        try:
            self.tier.close()
        finally:
            self.storage.close()

    # -- the memory tier (reprieve.Job calls these when present) -------------------------------------------------
    def memory_begin(self, start: int, *, storage_steps: int = 0, storage_seconds: float = 0.0) -> None:
        """The loop starts at ``start``; the storage tier's periodic interval (the job's ``SavePolicy``) caps
        the memory schedule (docs/memory.md, "Interval")."""
        self.tier.begin(start, storage_steps=storage_steps, storage_seconds=storage_seconds)

    def memory_due(self, step: int, step_seconds: float | None) -> bool:
        return self.tier.due(step, step_seconds)

    def memory_save(self, step: int, state: Any, *, extra: dict[str, Any], process_extra: Any = None) -> bool:
        return self.tier.save(step, state, extra=extra, process_extra=process_extra)

    def join_threads(self, timeout_s: float) -> None:
        """After the distributed shutdown: wait for the tier's threads that use the coordination client."""
        self.tier.join_watcher(timeout_s)

    def memory_wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the copy in the background (written here, then sent to the peer); True
        when none is left running."""
        self.tier.wait(timeout_s)
        return not self.tier.busy()

    def progress_fields(self) -> dict[str, Any]:
        """What process 0 adds to its progress report (docs/contract.md, "Progress"): where the restore read from
        and the newest step every process holds in memory (replicated, when peers are configured)."""
        out: dict[str, Any] = {}
        if self.tier.restored_from is not None:
            out["restoredFrom"] = self.tier.restored_from
        step = self.tier.gang_step()
        if step is not None:
            out["memoryStep"] = step
        return out
