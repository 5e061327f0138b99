"""Periodic save policy (pure). Agreed preemption saves are decided by :mod:`reprieve.agreement`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SavePolicy:
    """When to save without a notice.

    Attributes:
        interval_steps: save after every ``interval_steps``-th step (0 = only on notice and at the end).
        save_last: save after the job's last step, so a finished job leaves its final state.
    """

    interval_steps: int = 0
    save_last: bool = True

    def __post_init__(self) -> None:
        if self.interval_steps < 0:
            raise ValueError(f"SavePolicy.interval_steps must be >= 0, got {self.interval_steps}")


def should_save(step: int, *, policy: SavePolicy, last_saved: int | None, last_step: int | None) -> bool:
    """Whether to save the state after step ``step`` (steps count from 0; after step s, s+1 are done)."""
    if last_saved is not None and step <= last_saved:
        return False
    if policy.save_last and last_step is not None and step == last_step:
        return True
    return policy.interval_steps > 0 and (step + 1) % policy.interval_steps == 0
