"""When the memory tier saves: the same steps on every process (a copy is only useful when every process has
one of the same step), spaced so that the tier costs at most its budget of the training time, and never sparser
than about half the storage tier's periodic interval (a memory copy older than the newest storage checkpoint
is of no use to a restore).

* ``REPRIEVE_MEMORY_INTERVAL_STEPS=N``: after every N-th step; no communication.
* Otherwise the first save is after the :data:`FIRST_SAVE_AFTER`-th step of the loop (past compilation) on every
  process. Process 0 keeps a robust view of the loop's step time (the lower median of the newest
  :data:`STEP_WINDOW` steps) and of what a memory save costs the loop (the lower median of the newest
  :data:`COST_WINDOW` saves), picks the interval (:func:`plan`: ``REPRIEVE_MEMORY_INTERVAL_SECONDS`` worth of
  steps, or, with none given, the fewest steps that keep the cost within the budget; at most half the storage
  interval; the first one, measured in the warm-up, at most every :data:`PROBE_EVERY` steps) and publishes
  ``{"every": N, "from": S, "version": V}`` in the coordination KV under a key per version. ``S`` lies a few steps (and at least :data:`LEAD_SECONDS`) ahead of process 0, so every process,
  which watches for the next version in a thread, switches at the same step. Process 0 publishes again
  (:func:`reconsider`) when the interval it would choose now differs from the one in force by more than
  :data:`CHANGE_FACTOR` (the provisional first one: when it differs at all), after
  :data:`REPUBLISH_AFTER_SAVES` saves under it: a warm-up, compile-inflated or loaded first measurement is
  corrected within a few saves.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

FIRST_SAVE_AFTER = 4  # steps after the loop's first: the first steps compile and are not representative
LEAD_SECONDS = 1.0  # how far ahead of process 0 a published schedule starts (at least LEAD_STEPS steps)
LEAD_STEPS = 3
MAX_EVERY = 1_000_000
STEP_WINDOW = 16  # step durations process 0 keeps (the newest)
COST_WINDOW = 5  # save costs process 0 keeps (the newest)
CHANGE_FACTOR = 2.0  # a new interval is published when it differs from the one in force by more than this
REPUBLISH_AFTER_SAVES = 2  # saves measured since the last publication before the interval is reconsidered
# The first schedule saves at least every PROBE_EVERY steps: it rests on one save measured in the warm-up (often
# compile-inflated, or on a machine still busy with the restart), so it is provisional and re-measured soon (a
# restart a few dozen steps before an unwarned loss must not wait a whole sparse interval for its second copy).
PROBE_EVERY = 4


@dataclass(frozen=True)
class Schedule:
    """Save after step ``start`` and every ``every``-th step after it; ``version`` orders publications."""

    every: int
    start: int
    version: int = 1

    def due(self, step: int) -> bool:
        return step >= self.start and (step - self.start) % self.every == 0

    def to_json(self) -> str:
        return json.dumps({"every": self.every, "from": self.start, "version": self.version})

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        raw = json.loads(text)
        every, start, version = int(raw["every"]), int(raw["from"]), int(raw.get("version", 1))
        if every < 1 or start < 0 or version < 1:
            raise ValueError(f"memory schedule needs every >= 1, from >= 0 and version >= 1, got {raw}")
        return cls(every, start, version)


def in_force(plans: Sequence[Schedule], step: int) -> tuple[Schedule | None, tuple[Schedule, ...]]:
    """The schedule that decides ``step`` (the newest version that started at or before it; None before the
    first one starts) and the plans still needed from here on (that one and the ones not yet started)."""
    current = None
    for p in plans:
        if p.start <= step and (current is None or p.version > current.version):
            current = p
    keep = tuple(p for p in plans if p is current or p.start > step)
    return current, keep


def first_save(loop_start: int) -> int:
    return loop_start + FIRST_SAVE_AFTER


def low_median(samples: Sequence[float]) -> float | None:
    """The lower median: robust to the high outliers a loaded machine or a compiling step gives."""
    if not samples:
        return None
    return sorted(samples)[(len(samples) - 1) // 2]


def choose_every(*, cost_s: float, step_s: float, interval_s: float = 0.0, budget: float = 0.01) -> int:
    """Steps between saves (pure): ``interval_s`` worth of steps when given; else the fewest steps whose time
    pays for one save within ``budget`` (``cost_s`` <= budget x every x step_s)."""
    step_s = max(step_s, 1e-6)
    if interval_s > 0:
        return max(1, min(MAX_EVERY, round(interval_s / step_s)))
    return max(1, min(MAX_EVERY, math.ceil(cost_s / (budget * step_s))))


def storage_cap(*, storage_steps: int, storage_seconds: float, step_s: float) -> int | None:
    """The sparsest memory interval (steps) the storage tier's periodic interval allows: about half of it, so
    the newest memory copy is at most half an interval old when a storage checkpoint is; None without one."""
    caps = []
    if storage_steps > 0:
        caps.append(max(1, storage_steps // 2))
    if storage_seconds > 0:
        caps.append(max(1, math.floor(storage_seconds / 2 / max(step_s, 1e-6))))
    return min(caps) if caps else None


@dataclass(frozen=True)
class Choice:
    """An interval (``every``), what the interval or budget alone asked for (``wanted``) and the storage cap."""

    every: int
    wanted: int
    cap: int | None

    @property
    def capped(self) -> bool:
        return self.every < self.wanted


def plan(*, cost_s: float, step_s: float, interval_s: float = 0.0, budget: float = 0.01, storage_steps: int = 0,
         storage_seconds: float = 0.0) -> Choice:
    """The interval to publish (pure): :func:`choose_every`, capped by :func:`storage_cap`."""
    wanted = choose_every(cost_s=cost_s, step_s=step_s, interval_s=interval_s, budget=budget)
    cap = storage_cap(storage_steps=storage_steps, storage_seconds=storage_seconds, step_s=step_s)
    return Choice(wanted if cap is None else min(wanted, cap), wanted, cap)


def share(cost_s: float, step_s: float, every: int) -> float:
    """The tier's cost as a share of the training time when saving every ``every`` steps."""
    return cost_s / (max(step_s, 1e-6) * every)


def material(old_every: int, new_every: int, factor: float = CHANGE_FACTOR) -> bool:
    """Whether an interval change is worth a new publication (both ways: more than ``factor``)."""
    return new_every > old_every * factor or new_every * factor < old_every


def first_every(every: int) -> int:
    """The first (provisional) schedule's interval: at most :data:`PROBE_EVERY`."""
    return min(every, PROBE_EVERY)


def reconsider(current: Schedule | None, *, newest: Schedule | None, step: int, every: int,
               saves_since: int) -> bool:
    """Whether process 0 publishes ``every`` as a new schedule now (pure): the newest publication is in force
    (no two changes in flight), it has been measured for :data:`REPUBLISH_AFTER_SAVES` saves, and the change
    is material (any change of the provisional first schedule)."""
    if current is None or newest is None or current != newest or step < newest.start:
        return False
    if saves_since < REPUBLISH_AFTER_SAVES:
        return False
    return every != current.every if current.version == 1 else material(current.every, every)


def start_after(current_step: int, step_s: float) -> int:
    """The first step of a schedule published while process 0 is at ``current_step`` (pure)."""
    return current_step + max(LEAD_STEPS, math.ceil(LEAD_SECONDS / max(step_s, 1e-6)))


class Measurements:
    """Process 0's running view of the step time and of a save's cost to the loop (no clock, no I/O: the tier
    passes the times in). The step time counts consecutive steps only (a restart or a skipped call is no step).
    The loop records steps, the background thread costs and reads both: one lock."""

    def __init__(self) -> None:
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._costs: deque[float] = deque(maxlen=COST_WINDOW)
        self._last: tuple[int, float] | None = None
        self._lock = threading.Lock()

    @property
    def last_step(self) -> int | None:
        last = self._last
        return None if last is None else last[0]

    def step(self, step: int, now: float) -> None:
        with self._lock:
            if self._last is not None and step == self._last[0] + 1:
                self._steps.append(now - self._last[1])
            self._last = (step, now)

    def cost(self, seconds: float) -> None:
        with self._lock:
            self._costs.append(seconds)

    def step_s(self, fallback: float | None = None) -> float:
        with self._lock:
            got = low_median(self._steps)
        return got if got is not None else (fallback or 1.0)

    def cost_s(self) -> float:
        with self._lock:
            return low_median(self._costs) or 0.0
