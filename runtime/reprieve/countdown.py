"""Grace-period countdown: at which step to save, given the deadline (pure).

The leader of an agreement round calls :func:`choose_save_step` once with the earliest step every process can
still save at, the time left, the step time and the save time, and publishes the resulting :class:`SavePlan`.
With little time it saves at the earliest safe step. With a long notice it keeps training and places the
final save so that its commit lands ``margin`` seconds before the deadline, with an optional first save at
once (as TensorFlow's PreemptionCheckpointHandler does) so an early kill still finds a recent checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CountdownSettings:
    """Knobs of :func:`choose_save_step`.

    Attributes:
        safety_factor: the save-time estimate is multiplied by this (saves get slower under load).
        margin_seconds: the final commit should land at least this long before the deadline.
        save_at_once: with a long notice, also save at the earliest step (not final; training continues).
        min_extra_steps: keep training only if it buys at least this many steps; else save at once.
        default_save_seconds: save-time estimate before any save has been measured.
    """

    safety_factor: float = 2.0
    margin_seconds: float = 5.0
    save_at_once: bool = True
    min_extra_steps: int = 2
    default_save_seconds: float = 30.0


@dataclass(frozen=True)
class SavePlan:
    """What an agreement round decided: save at ``final_step`` and exit; optionally also at ``early_step``."""

    final_step: int
    early_step: int | None
    reason: str

    def save_steps(self) -> tuple[int, ...]:
        return (self.final_step,) if self.early_step is None else (self.early_step, self.final_step)


def choose_save_step(
    *,
    earliest_step: int,
    seconds_left: float,
    step_seconds: float | None,
    save_seconds: float | None,
    settings: CountdownSettings = CountdownSettings(),
    last_step: int | None = None,
    previous_final: int | None = None,
    previous_early: int | None = None,
) -> SavePlan:
    """Choose the agreed save step.

    Args:
        earliest_step: the smallest step no process has decided about yet (max over processes + 1).
        seconds_left: deadline minus now (may be negative).
        step_seconds: running step time (slowest process), None before any step was timed.
        save_seconds: measured save-call-to-commit time (slowest process), None if never measured.
        settings: margins and policy.
        last_step: the job's last step (total - 1), if known: never plan past it.
        previous_final: the final step of an earlier round, if any. A later notice can only bring the
            save earlier, never later; if every process is already past it, it stays.
        previous_early: the first-save step of an earlier round, if any. It stays in the plan while it is
            before the final step: some processes may already have saved it, the others must too.

    Returns:
        The plan; ``final_step >= earliest_step`` unless ``previous_final`` was already reached.
    """
    if previous_final is not None and earliest_step > previous_final:
        return SavePlan(previous_final, previous_early if _before(previous_early, previous_final) else None,
                        f"previous final step {previous_final} already reached; kept")
    save_est = settings.default_save_seconds if save_seconds is None else max(0.0, save_seconds)
    budget = seconds_left - settings.margin_seconds - settings.safety_factor * save_est
    if step_seconds is None or step_seconds <= 0:
        final, early, reason = earliest_step, None, "step time unknown: save at the earliest step"
    elif budget <= 0:
        final, early = earliest_step, None
        reason = (f"{seconds_left:.1f}s left <= margin {settings.margin_seconds:.1f}s + "
                  f"{settings.safety_factor:g} x save {save_est:.1f}s: save at the earliest step")
    else:
        # Steps that fit in the budget. Reaching ``final`` takes final - earliest + 1 steps for the process
        # furthest ahead and one more for a process a step behind it.
        affordable = math.floor(budget / step_seconds) - 2
        if affordable < settings.min_extra_steps:
            final, early = earliest_step, None
            reason = f"only {max(affordable, 0)} more step(s) fit before the deadline: save at the earliest step"
        else:
            final = earliest_step + affordable
            early = None
            reason = (f"{seconds_left:.1f}s left, step {step_seconds:.3f}s, save {save_est:.1f}s: "
                      f"train {affordable} more step(s), commit ~{settings.margin_seconds:.1f}s+ before deadline")
            if settings.save_at_once and previous_final is None and affordable * step_seconds > save_est:
                early = earliest_step
                reason += "; first save at once"
    if last_step is not None and final > last_step:
        final = max(last_step, earliest_step)
        reason += f"; capped at the last step {last_step}"
    if previous_final is not None and final > previous_final:
        final = previous_final
        reason += f"; not later than the previous final step {previous_final}"
    if previous_early is not None:
        early = previous_early  # agreed before: may be saved already by some processes
    if early is not None and early >= final:
        early = None
    return SavePlan(final, early, reason)


def behind_plan(
    *,
    now: float,
    deadline: float,
    step: int,
    final_step: int,
    step_seconds: float | None,
    save_seconds: float | None,
    settings: CountdownSettings = CountdownSettings(),
) -> bool:
    """True when, at today's step time, the agreed final save would commit later than half the margin before
    the deadline: steps got slower since the plan (a loaded node, a slower phase of the model), so the plan
    must be agreed again (it can only move earlier).

    The plan itself leaves ``margin + one step`` of slack at the step time it was made with, so a process
    that merely keeps pace never asks; one whose steps slowed by that much does.
    """
    if step >= final_step or step_seconds is None or step_seconds <= 0:
        return False
    save_est = settings.default_save_seconds if save_seconds is None else max(0.0, save_seconds)
    projected = now + (final_step - step) * step_seconds + settings.safety_factor * save_est
    return projected > deadline - settings.margin_seconds / 2


def _before(step: int | None, final: int) -> bool:
    return step is not None and step < final
