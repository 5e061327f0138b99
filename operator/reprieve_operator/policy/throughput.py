"""The degraded part of a job's goodput (pure): the kept step time and kept steps of attempts at full size and of
attempts on fewer workers than desired (an elastic job that shrank), and the throughput while degraded against full
size that ``status.goodput.degraded`` reports. ``policy.goodput`` adds each closed attempt of a known size;
``docs/goodput.md`` ("Degraded") states the definitions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Kept:
    """Kept step time (``productive`` seconds) and kept steps of some closed attempts."""

    seconds: float = 0.0
    steps: int = 0

    def plus(self, seconds: float, steps: int) -> Kept:
        return Kept(self.seconds + seconds, self.steps + steps)

    @property
    def rate(self) -> float | None:
        """Kept steps per second; None before any kept time."""
        return self.steps / self.seconds if self.seconds > 0 else None

    def to_status(self, prefix: str) -> dict[str, Any]:
        return {f"{prefix}Seconds": round(self.seconds, 3), f"{prefix}Steps": self.steps}

    @classmethod
    def from_status(cls, raw: Mapping[str, Any], prefix: str) -> Kept:
        return cls(float(raw.get(f"{prefix}Seconds") or 0.0), int(raw.get(f"{prefix}Steps") or 0))


@dataclass(frozen=True)
class Throughput:
    """What the closed attempts whose size is known kept: at full size and degraded (fewer workers than desired);
    ``degraded_capacity`` is the degraded seconds weighted by workers / desired (the share of the job's workers
    that trained)."""

    full: Kept = field(default_factory=Kept)
    degraded: Kept = field(default_factory=Kept)
    degraded_capacity: float = 0.0
    degraded_attempts: int = 0

    def add(self, workers: int | None, desired: int | None, productive: float, kept_steps: int) -> Throughput:
        """With a closed attempt's kept time and steps counted, the attempt on ``workers`` of ``desired`` workers
        (unchanged when its size is not known)."""
        if workers is None or not desired:
            return self
        if workers >= desired:
            return replace(self, full=self.full.plus(productive, kept_steps))
        return replace(self, degraded=self.degraded.plus(productive, kept_steps),
                       degraded_capacity=self.degraded_capacity + productive * workers / desired,
                       degraded_attempts=self.degraded_attempts + 1)

    def to_status(self) -> dict[str, Any]:
        return {**self.full.to_status("full"), **self.degraded.to_status("degraded"),
                "degradedCapacity": round(self.degraded_capacity, 3), "degradedAttempts": self.degraded_attempts}

    @classmethod
    def from_status(cls, raw: Any) -> Throughput:
        if not isinstance(raw, dict):
            return cls()
        return cls(Kept.from_status(raw, "full"), Kept.from_status(raw, "degraded"),
                   float(raw.get("degradedCapacity") or 0.0), int(raw.get("degradedAttempts") or 0))

    def summary(self) -> dict[str, Any] | None:
        """``status.goodput.degraded``; None for a job that never trained degraded."""
        if not self.degraded_attempts:
            return None
        rate, full = self.degraded.rate, self.full.rate
        seconds = self.degraded.seconds
        return {"seconds": round(seconds, 1), "steps": self.degraded.steps,
                "stepsPerSecond": None if rate is None else round(rate, 6),
                "fullSizeStepsPerSecond": None if full is None else round(full, 6),
                "throughputRatio": round(rate / full, 4) if rate is not None and full else None,
                "workersRatio": round(self.degraded_capacity / seconds, 4) if seconds > 0 else None,
                "attempts": self.degraded_attempts}
