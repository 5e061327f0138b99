"""Goodput of a training run, from the per-step log the example trainer writes (``TRAIN_STEP_LOG``).

Definition (after ml-goodput-measurement: productive, preserved step time over wall time):

* A step record is ``(attempt, step, t)``: process 0 finished ``step`` at wall time ``t`` in gang attempt ``attempt``.
* A record is *preserved* when it is the last record of its step: a later attempt that computed the same step
  again means the earlier result was lost (not checkpointed) and redone.
* A record's duration is ``t`` minus the previous record's ``t`` in the same attempt. The first step of an
  attempt also holds process start, ``jax.distributed`` start-up, restore and compilation: that part is
  badput, so it is counted at the attempt's median step time.
* **goodput** = (sum of preserved records' durations) / (wall time from job start to job end). Everything
  else — pod scheduling and process start (the cluster's own pod-start time: about 0.1 s per pod on the local
  process kubelet, image pulls and node start on a real cluster), initialisation, compilation, restores,
  steps redone after a lost checkpoint, waits for the gang — is badput.
* **goodput after the first start** = the same over the wall time from the first step's beginning (the first
  record's ``t`` minus the first attempt's typical step) to the job's end: the first start (scheduling, image
  pull, imports, the first compilation) is the same in every restart mode, and a vanishing share of a long job.
* For every interruption (attempt ``a`` → ``a+1``): **lost steps** = steps computed in ``a`` after the step
  ``a+1`` resumed from; **gap** = first step record of ``a+1`` minus the last of ``a``, less ``a+1``'s typical
  step (the part of its first step that goodput counts as productive): save, exit, gang restart, restore and
  compile, nothing of the training itself.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class StepRecord:
    attempt: int
    step: int
    t: float


@dataclass(frozen=True)
class Interruption:
    from_attempt: int
    last_step: int        # last step finished in the interrupted attempt
    resumed_at: int       # first step of the next attempt
    lost_steps: int
    gap_seconds: float
    last_t: float = 0.0   # wall time of the interrupted attempt's last step record
    next_t: float = 0.0   # wall time of the next attempt's first step record


@dataclass
class GoodputReport:
    steps: int
    wall_seconds: float
    productive_seconds: float
    interruptions: list[Interruption] = field(default_factory=list)
    first_start_seconds: float = 0.0  # job start -> the first step began (first attempt's typical step before it)

    @property
    def goodput(self) -> float:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def goodput_after_start(self) -> float:
        """Productive time over the wall time after the first start (pod scheduling, image pull, imports, the
        first compilation: the same in every restart mode, and a vanishing share of a long job): what the
        restarts themselves cost."""
        wall = self.wall_seconds - self.first_start_seconds
        return self.productive_seconds / wall if wall > 0 else 0.0

    @property
    def lost_steps(self) -> int:
        return sum(i.lost_steps for i in self.interruptions)

    @property
    def mean_gap(self) -> float:
        """Mean seconds from an attempt's last step to the next attempt's first (0 without interruptions)."""
        return sum(i.gap_seconds for i in self.interruptions) / max(1, len(self.interruptions))

    def summary(self) -> str:
        lines = [(f"steps {self.steps}, wall {self.wall_seconds:.1f}s, productive {self.productive_seconds:.1f}s, "
                 f"goodput {self.goodput:.1%}")]
        for i in self.interruptions:
            lines.append(f"  attempt {i.from_attempt} -> {i.from_attempt + 1}: last step {i.last_step}, resumed at "
                         f"{i.resumed_at}, lost {i.lost_steps} step(s), gap {i.gap_seconds:.1f}s")
        return "\n".join(lines)


def read_step_log(path: Path) -> list[StepRecord]:
    """Records from a ``TRAIN_STEP_LOG`` file; a torn last line (the writer was killed) is skipped."""
    records = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
            records.append(StepRecord(int(d["attempt"]), int(d["step"]), float(d["t"])))
        except (ValueError, KeyError, TypeError):
            continue
    return records


def analyse(records: Iterable[StepRecord], *, start: float, end: float, until: float | None = None) -> GoodputReport:
    """Goodput of one run whose job started at ``start`` and ended at ``end`` (wall-clock seconds).

    ``until``: goodput over ``[start, until]`` only (e.g. the window in which faults were injected, so a
    fault-free tail does not dilute their cost): the wall time ends there, and only preserved records finished
    by then count as productive (a step lost after ``until`` and redone still counts as lost). Steps and
    interruptions are the whole run's."""
    recs = sorted(records, key=lambda r: (r.attempt, r.t))
    by_attempt: dict[int, list[StepRecord]] = {}
    for r in recs:
        by_attempt.setdefault(r.attempt, []).append(r)

    durations: dict[tuple[int, int], float] = {}
    typical_step: dict[int, float] = {}
    for attempt_recs in by_attempt.values():
        deltas = [b.t - a.t for a, b in itertools.pairwise(attempt_recs)]
        typical = statistics.median(deltas) if deltas else 0.0
        typical_step[attempt_recs[0].attempt] = typical
        durations[(attempt_recs[0].attempt, attempt_recs[0].step)] = typical
        for prev, cur in itertools.pairwise(attempt_recs):
            durations[(cur.attempt, cur.step)] = cur.t - prev.t

    last_of_step: dict[int, StepRecord] = {}
    for r in recs:  # sorted by attempt: a later attempt's record replaces an earlier one
        last_of_step[r.step] = r
    stop = end if until is None else min(end, until)
    productive = sum(durations[(r.attempt, r.step)] for r in last_of_step.values() if until is None or r.t <= stop)

    interruptions = []
    attempts = sorted(by_attempt)
    for a, b in itertools.pairwise(attempts):
        prev, nxt = by_attempt[a], by_attempt[b]
        last_step = max(r.step for r in prev)
        resumed_at = min(r.step for r in nxt)
        interruptions.append(Interruption(a, last_step, resumed_at, max(0, last_step - resumed_at + 1),
                                          max(0.0, nxt[0].t - prev[-1].t - typical_step[b]),
                                          prev[-1].t, nxt[0].t))
    first_start = 0.0
    if recs:  # the first step began one typical step before the first record
        first_start = max(0.0, recs[0].t - typical_step[recs[0].attempt] - start)
    return GoodputReport(len(last_of_step), stop - start, productive, interruptions, first_start)
