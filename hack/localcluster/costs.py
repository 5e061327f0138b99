"""Costs a real node has that a process kubelet's pod does not (emulated on request; pure, no API client)."""

from __future__ import annotations

import os
from dataclasses import dataclass

PULL_ENV, START_ENV = "REPRIEVE_EMULATE_PULL_SECONDS", "REPRIEVE_EMULATE_START_SECONDS"


@dataclass(frozen=True)
class EmulatedCosts:
    """What a real node costs that a process does not: an image pull (the first time a node runs an image) and
    a container start (every pod start). 0 in unit and integration tests; the benchmarks and the demo set
    them and print them (docs/local-cluster.md, "Emulated costs")."""

    pull_seconds: float = 0.0
    start_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.pull_seconds < 0 or self.start_seconds < 0:
            raise ValueError(f"emulated costs must be >= 0 seconds, got pull {self.pull_seconds}, "
                             f"start {self.start_seconds}")

    @classmethod
    def from_env(cls, pull: float | None = None, start: float | None = None,
                 env: dict[str, str] | None = None) -> EmulatedCosts:
        env = dict(os.environ if env is None else env)
        try:
            return cls(pull if pull is not None else float(env.get(PULL_ENV) or 0),
                       start if start is not None else float(env.get(START_ENV) or 0))
        except ValueError as e:
            raise ValueError(f"{PULL_ENV}/{START_ENV}: {e}") from e

    def describe(self) -> str:
        if not (self.pull_seconds or self.start_seconds):
            return "no emulated costs (pods start as fast as processes)"
        return (f"emulated: image pull {self.pull_seconds:g} s (once per node and image), container start "
                f"{self.start_seconds:g} s (every pod)")
