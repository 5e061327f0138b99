"""The degraded part of a job's goodput (pure): the kept step time and kept steps of attempts at full size and of
attempts on fewer workers than desired (an elastic job that shrank), and the throughput while degraded against full
size that ``status.goodput.degraded`` reports. ``policy.goodput`` adds each closed attempt of a known size;
``docs/goodput.md`` ("Degraded") states the definitions."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Throughput:
    """Kept step time (``productive`` seconds) and kept steps of the closed attempts whose size is known: at full
    size and degraded (fewer workers than desired); ``degraded_capacity`` is the degraded seconds weighted by
    workers / desired (the share of the job's workers that trained)."""

    full_seconds: float = 0.0
    full_steps: int = 0
    degraded_seconds: float = 0.0
    degraded_steps: int = 0
    degraded_capacity: float = 0.0
    degraded_attempts: int = 0

    def add(self, workers: int | None, desired: int | None, productive: float, kept_steps: int) -> Throughput:
        """With a closed attempt's kept time and steps counted, the attempt on ``workers`` of ``desired`` workers
        (unchanged when its size is not known)."""
        if workers is None or not desired:
            return self
        if workers >= desired:
            return replace(self, full_seconds=self.full_seconds + productive, full_steps=self.full_steps + kept_steps)
        return replace(self, degraded_seconds=self.degraded_seconds + productive,
                       degraded_steps=self.degraded_steps + kept_steps,
                       degraded_capacity=self.degraded_capacity + productive * workers / desired,
                       degraded_attempts=self.degraded_attempts + 1)

    def to_status(self) -> dict[str, Any]:
        return {"fullSeconds": round(self.full_seconds, 3), "fullSteps": self.full_steps,
                "degradedSeconds": round(self.degraded_seconds, 3), "degradedSteps": self.degraded_steps,
                "degradedCapacity": round(self.degraded_capacity, 3), "degradedAttempts": self.degraded_attempts}

    @classmethod
    def from_status(cls, raw: Any) -> Throughput:
        if not isinstance(raw, dict):
            return cls()
        return cls(float(raw.get("fullSeconds") or 0.0), int(raw.get("fullSteps") or 0),
                   float(raw.get("degradedSeconds") or 0.0), int(raw.get("degradedSteps") or 0),
                   float(raw.get("degradedCapacity") or 0.0), int(raw.get("degradedAttempts") or 0))

    def summary(self) -> dict[str, Any] | None:
        """``status.goodput.degraded``; None for a job that never trained degraded."""
        if not self.degraded_attempts:
            return None
        rate = self.degraded_steps / self.degraded_seconds if self.degraded_seconds > 0 else None
        full = self.full_steps / self.full_seconds if self.full_seconds > 0 else None
        return {"seconds": round(self.degraded_seconds, 1), "steps": self.degraded_steps,
                "stepsPerSecond": None if rate is None else round(rate, 6),
                "fullSizeStepsPerSecond": None if full is None else round(full, 6),
                "throughputRatio": round(rate / full, 4) if rate is not None and full else None,
                "workersRatio": (round(self.degraded_capacity / self.degraded_seconds, 4)
                                 if self.degraded_seconds > 0 else None),
                "attempts": self.degraded_attempts}
