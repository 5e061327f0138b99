"""Save decisions (pure): the periodic :class:`SavePolicy`, and small decision policies that compose into each
save target's policy the way Orbax's ``SaveDecisionPolicy`` / ``AnySavePolicy`` do. Agreed preemption saves are
agreed by :mod:`reprieve.agreement`; a policy only reads the agreement's verdict from :class:`SaveContext`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .checkpoint.fencing import FencedError
from .notice import RESIZE_REASON


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


NEVER = 1 << 62  # a step no loop reaches: "no step is due from here on"


def next_due_step(step: int, *, policy: SavePolicy, last_step: int | None) -> int:
    """The first step from ``step`` on at which :func:`should_save` can say yes: the interval's next step, or the
    job's last one with ``save_last`` (:data:`NEVER` when neither comes). Before it the interval asks nothing, so a
    loop may skip asking (``Job.idle_step``)."""
    due = NEVER
    if policy.interval_steps > 0:
        n = policy.interval_steps
        due = -(-(step + 1) // n) * n - 1  # the first s >= step with (s + 1) % n == 0
    if policy.save_last and last_step is not None and step <= last_step:
        due = min(due, last_step)
    return due


def time_save_due(*, policy: SavePolicy, now: float, last_save_at: float) -> bool:
    """Whether process 0 should ask every process to agree on a save now: ``interval_seconds`` have passed
    since the last save started (or since the loop started)."""
    return policy.interval_seconds > 0 and now - last_save_at >= policy.interval_seconds


class SaveContext(NamedTuple):
    """What a save decision reads about one step (``Job.save``'s call for it). A named tuple, not a frozen
    dataclass: one is built at every step, and a frozen dataclass's ``__init__`` costs ~1.2 µs of the loop's ~3
    (``object.__setattr__`` per field), a named tuple's ~0.4.

    Attributes:
        step: the step just finished.
        agreed: the kind every process agreed to save this step as (``reprieve.agreement``: ``"final"``, or a
            requested save's reason such as ``"interval"``), None when none was agreed.
        forced: ``job.save(..., force=True)``.
        last_saved: the last step the target started a save of, None before one.
        last_step: the job's last step, None when not known (a loop over a loader).
        step_seconds: the moving average of the step time, None before one was timed.
    """

    step: int
    agreed: str | None = None
    forced: bool = False
    last_saved: int | None = None
    last_step: int | None = None
    step_seconds: float | None = None


class SaveDecisionPolicy(Protocol):
    """Whether a target saves the step ``context`` describes (Orbax's ``SaveDecisionPolicy.should_save``)."""

    def should_save(self, context: SaveContext) -> bool: ...


@dataclass(frozen=True)
class AgreedSavePolicy:
    """Every process agreed to save this step (a notice's final step, a time-based request): Orbax's
    ``PreemptionCheckpointingPolicy``."""

    def should_save(self, context: SaveContext) -> bool:
        return context.agreed is not None


@dataclass(frozen=True)
class ForcedSavePolicy:
    """The program asked for this save (``job.save(..., force=True)``)."""

    def should_save(self, context: SaveContext) -> bool:
        return context.forced


@dataclass(frozen=True)
class FixedIntervalPolicy:
    """Every ``policy.interval_steps``-th step and the job's last step (:func:`should_save`)."""

    policy: SavePolicy

    def should_save(self, context: SaveContext) -> bool:
        return should_save(context.step, policy=self.policy, last_saved=context.last_saved,
                           last_step=context.last_step)


@dataclass(frozen=True)
class ScheduledPolicy:
    """A schedule of the target's own (``due(step, step_seconds)``: the memory tier's budget schedule), asked only
    on steps nobody agreed to save: an agreed step goes to storage, and its memory copy is the agreed save's."""

    due: Callable[[int, float | None], bool]

    def should_save(self, context: SaveContext) -> bool:
        return context.agreed is None and self.due(context.step, context.step_seconds)


@dataclass(frozen=True)
class AnySavePolicy:
    """Save when any of ``policies`` says so (Orbax's ``AnySavePolicy``), asking them in order until one does."""

    policies: tuple[SaveDecisionPolicy, ...]

    def should_save(self, context: SaveContext) -> bool:
        return any(p.should_save(context) for p in self.policies)


def storage_policy(policy: SavePolicy) -> AnySavePolicy:
    """The storage target's saves: agreed, forced, or the fixed interval (and the last step)."""
    return AnySavePolicy((AgreedSavePolicy(), ForcedSavePolicy(), FixedIntervalPolicy(policy)))


# The notices whose agreed save may stay in the pods' memory whatever nodes they name: no node goes away (a grow
# keeps every worker).
MEMORY_ONLY_REASONS = frozenset({RESIZE_REASON})


def agreed_to_memory(reason: str, *, memory_on: bool, restart: bool, noticed_node: str | None = None,
                     notices_to_memory: bool = False) -> bool:
    """Whether the agreed save of a notice with ``reason`` goes to the memory tier first, with no storage save
    when every process holds it where it outlives the notice (pure; docs/memory.md, "After a notice"). Only with
    the memory tier on and a restart to follow (the loop's last step is the run's end: storage). A resize always
    (every pod stays); any other notice when it names its node (``noticed_node``: which pods go is known; each
    process then checks that its copy is on a pod that stays, or at a peer that does), where
    ``REPRIEVE_NOTICE_TO_MEMORY`` (``notices_to_memory``) asks for it: off by default, since a second notice that
    reaches the gang after its decision can doom the pod holding the only copy (docs/memory.md, "After a notice").
    Storage follows anyway unless every process holds the step (:func:`reprieve.memtier.decide.gang_outlives`). The
    choice depends only on what every process shares (the agreed notice, the configuration), so the whole gang
    takes the same path."""
    if not (memory_on and restart):
        return False
    if reason in MEMORY_ONLY_REASONS:
        return True
    return noticed_node is not None and notices_to_memory


# What a failed storage save was (classify_save_error) and what the job does about it (save_failure_verdict).
STORAGE, FENCED, OTHER = "storage", "fenced", "other"
# A storage failing for less than this (since the first failed save of the streak began) never fails the job, however
# often it saves: a job that saves every few seconds would otherwise reach the bound within one short outage (the
# soak's 10-20 s storage faults against its ~3 s save interval did).
MIN_FAILING_SECONDS = 60.0


def classify_save_error(err: BaseException) -> str:
    """``FENCED`` (a newer attempt owns the storage), ``STORAGE`` (the storage refused a write or the commit on
    some process: the same verdict on every process, ``CheckpointSaveError.storage``; or an ``OSError`` from a
    checkpointer without that attribute) or ``OTHER`` (the coordination service, a bug: never retried)."""
    if isinstance(err, FencedError):
        return FENCED
    storage = getattr(err, "storage", None)
    if isinstance(storage, bool):
        return STORAGE if storage else OTHER
    return STORAGE if isinstance(err, OSError) else OTHER


def save_failure_verdict(kind: str, consecutive: int, max_failed: int, *, failing_seconds: float = float("inf"),
                         min_failing_seconds: float = MIN_FAILING_SECONDS, agreed_next: bool = False) -> str | None:
    """None: the job trains on and the next due save retries; else why the failure is fatal (pure).

    ``consecutive``: failed saves in a row, this one included; ``max_failed``: ``REPRIEVE_MAX_FAILED_SAVES``;
    ``failing_seconds``: since the first of them began (the bound applies from ``min_failing_seconds`` on).
    ``agreed_next``: the failure surfaced as the agreed save of a notice begins; that save is the last chance to
    keep the steps since the last commit, so the bound does not stop it (its own failure is fatal).
    """
    if kind == FENCED:
        return "a newer attempt owns the checkpoint storage (fenced): this attempt must stop"
    if kind != STORAGE:
        return "the save failed outside the storage (not retried)"
    if consecutive >= max_failed and failing_seconds >= min_failing_seconds and not agreed_next:
        return (f"{consecutive} consecutive checkpoint saves failed over {failing_seconds:.0f} s "
                f"(REPRIEVE_MAX_FAILED_SAVES={max_failed}): the storage stays unusable")
    return None
