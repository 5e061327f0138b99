"""When the memory tier saves: the same steps on every process (a copy is only useful when every process has
one of the same step), spaced so that the tier costs at most its budget of the training time.

* ``REPRIEVE_MEMORY_INTERVAL_STEPS=N``: after every N-th step; no communication.
* Otherwise the first save is after the :data:`FIRST_SAVE_AFTER`-th step of the loop (past compilation) on every
  process. Process 0 measures what that save cost the loop and its own step time, picks the interval
  (:func:`choose_every`: ``REPRIEVE_MEMORY_INTERVAL_SECONDS`` worth of steps, or, with none given, the fewest
  steps that keep the cost within the budget) and publishes ``{"every": N, "from": S}`` once in the coordination
  KV; every process reads it in its background thread and saves after step ``S`` and every N-th step after it.
  ``S`` lies a few steps ahead of process 0, so every process learns it in time; one that learns it late only
  skips the saves already behind it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

FIRST_SAVE_AFTER = 4  # steps after the loop's first: the first steps compile and are not representative
LEAD_SECONDS = 1.0  # how far ahead of process 0 the published schedule starts (at least LEAD_STEPS steps)
LEAD_STEPS = 3
MAX_EVERY = 1_000_000


@dataclass(frozen=True)
class Schedule:
    """Save after step ``start`` and every ``every``-th step after it."""

    every: int
    start: int

    def due(self, step: int) -> bool:
        return step >= self.start and (step - self.start) % self.every == 0

    def to_json(self) -> str:
        return json.dumps({"every": self.every, "from": self.start})

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        raw = json.loads(text)
        every, start = int(raw["every"]), int(raw["from"])
        if every < 1 or start < 0:
            raise ValueError(f"memory schedule needs every >= 1 and from >= 0, got {raw}")
        return cls(every, start)


def first_save(loop_start: int) -> int:
    return loop_start + FIRST_SAVE_AFTER


def choose_every(*, cost_s: float, step_s: float, interval_s: float = 0.0, budget: float = 0.01) -> int:
    """Steps between saves (pure): ``interval_s`` worth of steps when given; else the fewest steps whose time
    pays for one save within ``budget`` (``cost_s`` <= budget x every x step_s)."""
    step_s = max(step_s, 1e-6)
    if interval_s > 0:
        return max(1, min(MAX_EVERY, round(interval_s / step_s)))
    return max(1, min(MAX_EVERY, math.ceil(cost_s / (budget * step_s))))


def start_after(current_step: int, step_s: float) -> int:
    """The first step of a schedule published while process 0 is at ``current_step`` (pure)."""
    return current_step + max(LEAD_STEPS, math.ceil(LEAD_SECONDS / max(step_s, 1e-6)))
