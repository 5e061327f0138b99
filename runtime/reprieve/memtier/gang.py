"""Which step the whole gang holds in memory, and which copies each process and its holder keep for it (pure).

Every process of an attempt publishes one :class:`Record` in the coordination service after each copy: the steps
it has replicated lately (:data:`RECENT` of them, oldest first) and the newest save it skipped. From those:

* the **gang step** (:func:`gang_step`) is the newest step that *every* process replicated: the newest step in
  every process's list. Processes that skip different saves (a copy slower than the interval) replicate different
  steps; the minimum of their newest steps would name a step one of them never wrote.
* a process keeps beside its newest copy (:func:`keep_steps`), in its own pod and at its holder (the put names
  them), the copy of the gang step and the copies that may still become the gang step: newer than the gang step
  and not yet skipped by any process (a process replicates its copies in step order, so one that replicated a
  newer step without this one skipped it). At most :data:`PENDING` of those: a process lags the others by a copy
  in flight, not more. Without them a process one copy ahead drops the step the others are still replicating,
  and once they have, no step is complete in memory until the next one is.

The gang step a process has seen only grows (:func:`newer_gang`): a list that forgot an old step never takes back
a gang step whose copies the others already dropped the older ones for.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

RECENT = 16  # replicated steps a process publishes (the newest): processes that drift apart meet within them
PENDING = 2  # copies newer than the gang step a process keeps for the steps the others may still replicate


@dataclass(frozen=True)
class Record:
    """One process's progress: ``steps`` it replicated (the newest :data:`RECENT`, oldest first) and ``skip``, the
    ``(schedule version, step)`` of the newest save it skipped (None: none yet)."""

    steps: tuple[int, ...] = ()
    skip: tuple[int, int] | None = None

    def to_json(self) -> str:
        raw: dict[str, object] = {"steps": list(self.steps)}
        if self.skip is not None:
            raw["skip"] = list(self.skip)
        return json.dumps(raw, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Record:
        """A record as published; a bare step (an older runtime's ``replicated`` value) is a list of one.
        ValueError for anything else."""
        raw = json.loads(text)
        if isinstance(raw, int) and not isinstance(raw, bool):
            return cls((raw,))
        if not isinstance(raw, dict):
            raise ValueError(f"memory progress record must be an object or a step, got {text!r}")  # noqa: TRY004
        steps = raw.get("steps", [])
        skip = raw.get("skip")
        if not isinstance(steps, list) or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"memory progress record: steps must be a list of steps >= 0, got {steps!r}")
        if skip is not None and not (isinstance(skip, list) and len(skip) == 2
                                     and all(isinstance(v, int) and v >= 0 for v in skip)):
            raise ValueError(f"memory progress record: skip must be [version, step], got {skip!r}")
        return cls(tuple(steps), None if skip is None else (skip[0], skip[1]))


def replicated(steps: Sequence[int], step: int) -> tuple[int, ...]:
    """The list after ``step`` was replicated: appended, the newest :data:`RECENT` kept."""
    return (*steps, step)[-RECENT:]


def gang_step(lists: Mapping[int, Collection[int]], num_processes: int) -> int | None:
    """The newest step in every process's list of replicated steps (None: a process has none, or no step is in
    all of them)."""
    if num_processes < 1 or any(not lists.get(p) for p in range(num_processes)):
        return None
    common = set(lists[0]).intersection(*(lists[p] for p in range(1, num_processes)))
    return max(common, default=None)


def newer_gang(seen: int | None, now: int | None) -> int | None:
    """The gang step to go on with: the newer of the one seen before and the one computed now."""
    return now if seen is None else seen if now is None else max(seen, now)


def may_become_gang(step: int, lists: Mapping[int, Collection[int]], num_processes: int) -> bool:
    """Whether every process may still replicate ``step``: it has, or it has replicated nothing newer yet."""
    return all(step in lists.get(p, ()) or not lists.get(p) or step > max(lists[p]) for p in range(num_processes))


def keep_steps(steps: Iterable[int], lists: Mapping[int, Collection[int]], num_processes: int,
               gang: int | None) -> frozenset[int]:
    """Which of a process's copies (``steps``, its copies of this attempt, the newest among them) to keep beside
    the newest: the newest at or before the gang step, and the newest :data:`PENDING` newer ones that may still
    become the gang step (:func:`may_become_gang`). The newest itself is always kept; it may be in the set."""
    held = sorted(set(steps))
    keep: set[int] = set()
    if gang is not None:
        keep.update([s for s in held if s <= gang][-1:])
    pending = [s for s in held[:-1] if (gang is None or s > gang) and may_become_gang(s, lists, num_processes)]
    keep.update(pending[-PENDING:])
    return frozenset(keep)
