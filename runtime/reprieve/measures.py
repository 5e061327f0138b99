"""What a :class:`reprieve.Job` measures and reports: the step time the countdown plans with and the progress
report shows (:class:`StepTimes`), and each save's blocking time, commit and failure (:class:`SaveReports`:
metrics, the progress annotation, the countdown's save estimate)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .agreement import Agreement
from .metrics import Metrics
from .progress import LoopProgress, ProgressReporter

log = logging.getLogger("reprieve.job")  # the job's lines, under the name they always had

STEP_EMA_WEIGHT = 0.1  # weight of the newest step in the step-time moving average


def positive(value: Any) -> float | None:
    """``value`` as a float when it is a positive finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < float("inf") else None


def timing_of(record: Any) -> tuple[float | None, float | None]:
    """``(step_seconds, save_seconds)`` that the attempt which wrote a checkpoint measured (its ``reprieve``
    record's ``stepSeconds`` and ``saveSeconds``), each None when absent or not a positive finite number: a
    checkpoint written by an older runtime, or before any step or save was timed."""
    if not isinstance(record, dict):
        return None, None
    return positive(record.get("stepSeconds")), positive(record.get("saveSeconds"))


class StepTimes:
    """``average``: the moving average (seconds), None before a step was timed or seeded. The training thread
    is its only writer."""

    def __init__(self, loop: LoopProgress, agreement: Agreement, metrics: Metrics) -> None:
        self._loop, self._agreement, self._metrics = loop, agreement, metrics
        self.average: float | None = None
        self._skip_first = True  # an attempt's first step holds its compilation: never in the average

    def seed(self, record: Any) -> None:
        """Start the countdown's step and save times from what the attempt that wrote the restored checkpoint
        measured. Without them a notice that arrives before this attempt timed a step (a restart onto a node
        that is already doomed, a second notice right after a restart) must plan "save at the earliest step"
        and exit at once, though its deadline may leave tens of seconds of training. The first step of this
        attempt (compilation) does not enter the moving average; the next ones replace the seed, and a plan
        made with it is agreed again if the steps turn out slower (``countdown.behind_plan``)."""
        step_s, save_s = timing_of(record)
        if step_s is not None:
            self.average = step_s
            self._loop.step_seconds = step_s
        self._agreement.report(step_seconds=step_s, save_seconds=save_s)
        if step_s is not None or save_s is not None:
            log.info("estimates from the checkpoint's attempt: step %s s, save %s s",
                     "?" if step_s is None else f"{step_s:.3f}", "?" if save_s is None else f"{save_s:.3f}")

    def observe(self, seconds: float, step: int) -> None:
        self._metrics.pending_steps.append(seconds)  # a deque: observed into the histogram at scrape time
        if self._skip_first:  # compilation: the seeded estimate (or none) stands until a real step is timed
            self._skip_first = False
            return
        ema = self.average
        self.average = seconds if ema is None else ema + STEP_EMA_WEIGHT * (seconds - ema)
        self._loop.step_seconds = self.average
        self._agreement.report(step_seconds=self.average)
        if step % 16 == 0:  # the exporter needs no more; a metrics update costs a lock
            self._metrics.set("reprieve_step_average_seconds", self.average)


class SaveReports:
    """What the job reports about its saves. ``position()``: the loop's furthest step; ``in_training()``: whether
    a wait now counts as checkpoint badput."""

    def __init__(self, loop: LoopProgress, agreement: Agreement, metrics: Metrics, progress: ProgressReporter | None,
                 *, position: Callable[[], int], in_training: Callable[[], bool]) -> None:
        self._loop, self._agreement, self._metrics, self._progress = loop, agreement, metrics, progress
        self._position, self._in_training = position, in_training

    def blocked(self, seconds: float) -> None:
        """The training loop waited ``seconds`` for a save (the copy off the devices, a commit). Only waits
        between steps count as checkpoint badput: the agreed save and the last commit come after the last
        reported step, where the operator counts them as restart gap (``docs/goodput.md``)."""
        self._metrics.observe("reprieve_save_blocking_seconds", seconds)
        if self._in_training():
            self._loop.save_blocking_seconds += seconds

    def committed(self, step: int, save_seconds: float | None) -> None:
        # The measured save time feeds the countdown as soon as a save commits, not at the next save: a
        # notice between two periodic saves must not plan with the pessimistic default estimate.
        if save_seconds is not None:
            self._agreement.report(save_seconds=save_seconds)
            self._metrics.observe("reprieve_save_to_commit_seconds", save_seconds)
        self._metrics.set("reprieve_last_committed_step", step)
        if self._progress is not None:
            self._progress.report(self._position(), step)

    def failed(self, committed: int | None) -> None:
        """A save failed and the job trains on: the progress report says so at once."""
        if self._progress is not None:
            self._progress.report(self._position(), -1 if committed is None else committed)
