"""Periodic save policy (pure). Agreed preemption saves are decided by :mod:`reprieve.agreement`."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SavePolicy:
    """When to save without a notice.

    Attributes:
        interval_steps: save after every ``interval_steps``-th step (0 = off).
        interval_seconds: save at most every ``interval_seconds`` seconds of training (0 = off), like Orbax's
            ``ContinuousCheckpointingPolicy``. Process 0's clock decides, and the step is agreed by every
            process (:meth:`reprieve.agreement.Agreement.request_save`), so all save the same step.
        save_last: save after the job's last step, so a finished job leaves its final state.
    """

    interval_steps: int = 0
    interval_seconds: float = 0.0
    save_last: bool = True

    def __post_init__(self) -> None:
        if self.interval_steps < 0:
            raise ValueError(f"SavePolicy.interval_steps must be >= 0, got {self.interval_steps}")
        if not math.isfinite(self.interval_seconds) or self.interval_seconds < 0:
            raise ValueError(f"SavePolicy.interval_seconds must be a finite number >= 0, got {self.interval_seconds}")


def should_save(step: int, *, policy: SavePolicy, last_saved: int | None, last_step: int | None) -> bool:
    """Whether to save the state after step ``step`` (steps count from 0; after step s, s+1 are done)."""
    if last_saved is not None and step <= last_saved:
        return False
    if policy.save_last and last_step is not None and step == last_step:
        return True
    return policy.interval_steps > 0 and (step + 1) % policy.interval_steps == 0


def time_save_due(*, policy: SavePolicy, now: float, last_save_at: float) -> bool:
    """Whether process 0 should ask every process to agree on a save now: ``interval_seconds`` have passed
    since the last save started (or since the loop started)."""
    return policy.interval_seconds > 0 and now - last_save_at >= policy.interval_seconds
