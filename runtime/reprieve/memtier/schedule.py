"""When the memory tier saves: the same steps on every process (a copy is only useful when every process has
one of the same step), spaced so that the tier costs at most its budget of the training time, and never sparser
than about half the storage tier's periodic interval (a memory copy older than the newest storage checkpoint
is of no use to a restore).

* ``REPRIEVE_MEMORY_INTERVAL_STEPS=N``: after every N-th step; no communication until a save is skipped.
* A save skipped on any process (its copy still in flight) makes process 0 publish a schedule twice as wide
  (:func:`widen`), adopted by every process at the same step, whatever the interval's kind: processes that skip
  where their own copies run late would otherwise save different steps, and no step would be whole in memory.
* Otherwise the first save is after the :data:`FIRST_SAVE_AFTER`-th step of the loop (past compilation) on every
  process. Process 0 keeps a robust view of the loop's step time (the lower median of the newest
  :data:`STEP_WINDOW` steps) and of what a memory save costs the loop (the mean of the newest
  :data:`COST_WINDOW` saves, each observed as the steps' excess while its copy ran: :class:`Measurements`),
  picks the interval (:func:`plan`: ``REPRIEVE_MEMORY_INTERVAL_SECONDS`` worth of steps, or, with none given,
  the fewest steps that keep the cost at :data:`AIM` of the budget, or Daly's optimum for
  ``REPRIEVE_MEMORY_LOSS_EVERY_SECONDS`` (:func:`daly_seconds`: the job's mean time between losses without notice,
  from the spec or the rate the operator saw) when that is closer; at most half the storage interval; the first
  one, measured in the warm-up, at most every :data:`PROBE_EVERY` steps, or as many as the first copy took to
  finish with slack: :func:`first_every`) and publishes
  ``{"every": N, "from": S, "version": V, "anchor": A}`` in the coordination KV under a key per version (``A``:
  the save a re-plan counts from). ``S`` lies a few steps (and at least :data:`LEAD_SECONDS`) ahead of process
  0, so every process, which watches for the next version in a thread, switches at the same step. Process 0
  publishes again (:func:`reconsider`) when the interval it would choose now differs from the one in force by
  more than :data:`CHANGE_FACTOR` (the provisional first one: when it differs at all; one that costs more than
  :data:`REPLAN_ABOVE` of the budget: when the new one saves less often), after :data:`REPUBLISH_AFTER_SAVES`
  saves under it: a warm-up, compile-inflated or loaded first measurement is corrected within a few saves.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .config import INTERVAL_SECONDS_ENV, INTERVAL_STEPS_ENV, LOSS_EVERY_ENV, MemoryConfig

FIRST_SAVE_AFTER = 4  # steps after the loop's first: the first steps compile and are not representative
LEAD_SECONDS = 1.0  # how far ahead of process 0 a published schedule starts (at least LEAD_STEPS steps)
LEAD_STEPS = 3
MAX_EVERY = 1_000_000
STEP_WINDOW = 16  # step durations process 0 keeps (the newest)
COST_WINDOW = 5  # save costs process 0 keeps (the newest)
CHANGE_FACTOR = 2.0  # a new interval is published when it differs from the one in force by more than this
# The budget schedule aims below the budget (AIM x budget): the tier's per-step check (~0.1 % of a 20 ms CPU step)
# and what a save costs the steps after its window (~0.2 % of the training time at 256 MiB on the benchmark: the
# whole-block A/B read ~0.2 % above the saves' windows there) still fit. One that a newer measurement finds above
# REPLAN_ABOVE x budget republishes at once (:func:`over_budget`, :func:`reconsider`); between the two it is kept,
# so that each save's cost measured a little higher or lower than the last does not re-plan every few saves.
# (benchmarks/memtier.py --parts cost; the figures in benchmarks/RESULTS.md.)
AIM = 0.7
REPLAN_ABOVE = 0.8
REPUBLISH_AFTER_SAVES = 2  # saves measured since the last publication before the interval is reconsidered
# The first schedule saves at least every PROBE_EVERY steps: it rests on one save measured in the warm-up (often
# compile-inflated, or on a machine still busy with the restart), so it is provisional and re-measured soon (a
# restart a few dozen steps before an unwarned loss must not wait a whole sparse interval for its second copy).
PROBE_EVERY = 4
# ... but never more often than a copy can finish: the first copy's span (from its save to its last byte at the
# peer) with this much slack. A save due while a copy runs is skipped, and a skip widens every process's schedule
# (:func:`widen`): at 1 GiB a process on the 2-core VM a copy spanned 4-15 s, 7-27 steps, and every restart's
# provisional 4 steps cascaded through 8, 16 and 32 with a skipped save each (benchmarks/RESULTS.md, "Goodput").
COPY_SLACK = 1.5
WIDEN_FACTOR = 2  # a skipped save widens the interval this much (:func:`widen`), until no process skips


@dataclass(frozen=True)
class Schedule:
    """In force from step ``start``: save after every ``every``-th step counted from ``anchor`` (``start`` when
    None: a save after ``start`` itself); ``version`` orders publications. A re-planned schedule is anchored at
    the last save, so its first save comes ``every`` steps after that one, not at its start."""

    every: int
    start: int
    version: int = 1
    anchor: int | None = None

    def due(self, step: int) -> bool:
        return step >= self.start and (step - (self.start if self.anchor is None else self.anchor)) % self.every == 0

    def to_json(self) -> str:
        raw = {"every": self.every, "from": self.start, "version": self.version}
        return json.dumps(raw if self.anchor is None else {**raw, "anchor": self.anchor})

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        raw = json.loads(text)
        every, start, version = int(raw["every"]), int(raw["from"]), int(raw.get("version", 1))
        anchor = None if raw.get("anchor") is None else int(raw["anchor"])
        if every < 1 or start < 0 or version < 1 or (anchor is not None and anchor < 0):
            raise ValueError(f"memory schedule needs every >= 1, from >= 0, version >= 1 and anchor >= 0, got {raw}")
        return cls(every, start, version, anchor)


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


def daly_seconds(cost_s: float, loss_every_s: float) -> float:
    """The training seconds between copies that lose the least to copies and to unwarned losses together (pure):
    Daly's higher-order estimate (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
    restart dumps", 2006) of the optimum for a copy that costs ``cost_s`` and a loss every ``loss_every_s`` on
    average. To first order it is Young's ``sqrt(2 x cost x M)``: a copy's cost against half an interval of work
    lost at each loss. A copy that costs half the mean time between losses or more: the interval is that time."""
    m = max(loss_every_s, 1e-6)
    if cost_s >= 2 * m:
        return m
    r = cost_s / (2 * m)
    return max(1e-6, math.sqrt(2 * cost_s * m) * (1 + math.sqrt(r) / 3 + r / 9) - cost_s)


def expected_share(cost_s: float, interval_s: float, loss_every_s: float) -> float:
    """What copies every ``interval_s`` seconds of training add to the time the training takes, with the work a
    loss every ``loss_every_s`` seconds on average undoes, as a share of the training time (pure): the expected
    time of an interval and its copy under losses that come at random (exponentially distributed), each resuming
    from the last copy, ``M (e^((T + C) / M) - 1)``, per ``T`` of training, less one (Daly's model; the restart's
    own time left out). To first order ``C / T + T / 2M``. :func:`daly_seconds` is its minimum."""
    interval_s = max(interval_s, 1e-6)
    if loss_every_s <= 0:
        return cost_s / interval_s
    return loss_every_s * math.expm1(min((interval_s + cost_s) / loss_every_s, 700.0)) / interval_s - 1


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
    """An interval (``every``), what the interval, the budget or the loss rate alone asked for (``wanted``), the
    storage cap, and whether the loss rate's interval was the closer one (``by_loss``)."""

    every: int
    wanted: int
    cap: int | None
    by_loss: bool = False

    @property
    def capped(self) -> bool:
        return self.every < self.wanted


def plan(*, cost_s: float, step_s: float, interval_s: float = 0.0, budget: float = 0.01, storage_steps: int = 0,
         storage_seconds: float = 0.0, loss_every_s: float = 0.0) -> Choice:
    """The interval to publish (pure): ``interval_s`` worth of steps when given; else :func:`choose_every` at
    :data:`AIM` of the budget or, with a loss rate (``loss_every_s``: the mean seconds between losses without
    notice), :func:`daly_seconds` worth when that is closer: losses that come often enough pay for copies beyond
    the budget, rare ones never space the copies wider than it. Capped by :func:`storage_cap`."""
    wanted = choose_every(cost_s=cost_s, step_s=step_s, interval_s=interval_s, budget=budget * AIM)
    by_loss = False
    if interval_s <= 0 and loss_every_s > 0:
        daly = choose_every(cost_s=cost_s, step_s=step_s, interval_s=daly_seconds(cost_s, loss_every_s))
        wanted, by_loss = min(wanted, daly), daly < wanted
    cap = storage_cap(storage_steps=storage_steps, storage_seconds=storage_seconds, step_s=step_s)
    return Choice(wanted if cap is None else min(wanted, cap), wanted, cap, by_loss)


def share(cost_s: float, step_s: float, every: int) -> float:
    """The tier's cost as a share of the training time when saving every ``every`` steps."""
    return cost_s / (max(step_s, 1e-6) * every)


def over_budget(cost_s: float, step_s: float, every: int, budget: float) -> bool:
    """Whether the schedule in force (``every``) costs more than :data:`REPLAN_ABOVE` of the budget now (pure)."""
    return share(cost_s, step_s, every) > REPLAN_ABOVE * budget


def material(old_every: int, new_every: int, factor: float = CHANGE_FACTOR) -> bool:
    """Whether an interval change is worth a new publication (both ways: more than ``factor``)."""
    return new_every > old_every * factor or new_every * factor < old_every


def copy_steps(copy_s: float, step_s: float) -> int:
    """The steps a copy that spanned ``copy_s`` seconds needs between saves so that the next one finds it done,
    with :data:`COPY_SLACK` (pure; 0 when no copy was timed)."""
    return math.ceil(COPY_SLACK * copy_s / max(step_s, 1e-6) - 1e-9) if copy_s > 0 else 0  # 15.000000000000002: 15


def first_every(every: int, copy_s: float = 0.0, step_s: float = 1.0) -> int:
    """The first (provisional) schedule's interval (pure): at most :data:`PROBE_EVERY` steps, or, when the first
    copy spanned ``copy_s`` seconds (its save to its last byte at the peer) at ``step_s`` a step, as many as
    :func:`copy_steps` gives it, so that the next save does not come while it would still run (a skip, and a
    wider schedule for every process); never more than ``every``, the interval the measurements ask for."""
    return min(every, max(PROBE_EVERY, copy_steps(copy_s, step_s)))


def reconsider(current: Schedule | None, *, newest: Schedule | None, step: int, every: int,
               saves_since: int, over_budget: bool = False) -> bool:
    """Whether process 0 publishes ``every`` as a new schedule now (pure): the newest publication is in force
    (no two changes in flight), it has been measured for :data:`REPUBLISH_AFTER_SAVES` saves, and the change
    is material (any change of the provisional first schedule), or the one in force costs more than it may
    (``over_budget``: :func:`over_budget`) and ``every`` saves less often."""
    if current is None or newest is None or current != newest or step < newest.start:
        return False
    if saves_since < REPUBLISH_AFTER_SAVES:
        return False
    if current.version == 1:
        return every != current.every
    return material(current.every, every) or (over_budget and every > current.every)


def start_after(current_step: int, step_s: float) -> int:
    """The first step of a schedule published while process 0 is at ``current_step`` (pure)."""
    return current_step + max(LEAD_STEPS, math.ceil(LEAD_SECONDS / max(step_s, 1e-6)))


def widen(newest: Schedule | None, skips: Mapping[int, tuple[int, int]], *, step: int,
          step_s: float) -> Schedule | None:
    """Process 0's answer to skipped saves (pure): ``skips`` maps a process to the ``(schedule version, step)`` of
    the newest save it skipped (its previous copy still written or sent). One under the newest schedule means the
    processes may no longer save the same steps (each skips where its own copy runs late), so no step is held by
    all: the next schedule saves :data:`WIDEN_FACTOR` times less often, from a step every process reaches after
    it adopted it (:func:`start_after`, process 0 at ``step``). None when no skip is under the newest schedule (an
    older one's are answered by it)."""
    if newest is None or not any(version == newest.version for version, _ in skips.values()):
        return None
    return Schedule(min(MAX_EVERY, newest.every * WIDEN_FACTOR), start_after(step, step_s), newest.version + 1)


class Measurements:
    """Process 0's running view of the step time and of what a save costs the loop (no clock, no I/O: the tier
    passes the times in). The step time counts consecutive steps only (a restart or a skipped call is no step).

    A save's cost is **observed** from the step the loop saved after until the first step after which the copy
    was no longer being written or sent (:meth:`saving`, then :meth:`step` with ``busy``): the steps' time beyond
    that of the newest steps before the save that no copy ran beside (its stall and whatever the background copy
    took from the steps: CPU, memory bandwidth, the interpreter's lock), at least the stall; and **estimated** by
    the tier (:meth:`cost`).
    The cost is the larger of the two (:meth:`cost_s`).

    The loop thread records steps and windows (every step, so no lock: one cost ~10 us a step right after a CPU
    step on the 2-core VM, a third of the tier's per-step check); the background thread appends estimates and
    reads. Both share deques only, whose appends and copies (``tuple``) are atomic under the interpreter lock."""

    def __init__(self) -> None:
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._quiet: deque[float] = deque(maxlen=STEP_WINDOW)  # steps outside any save's window: a window's base
        self._costs: deque[float] = deque(maxlen=COST_WINDOW)  # the tier's estimates
        self._observed: deque[float] = deque(maxlen=COST_WINDOW)  # the loop's observed excess
        self._window: list[float] | None = None  # [step time before the save, excess so far, the save's stall]
        self._last: tuple[int, float] | None = None

    @property
    def last_step(self) -> int | None:
        last = self._last
        return None if last is None else last[0]

    @property
    def measuring(self) -> bool:
        """A save's window is open: :meth:`step` wants to know whether its copy is still running."""
        return self._window is not None

    def step(self, step: int, now: float, busy: bool = False) -> None:
        """Step ``step`` ended at ``now``; ``busy``: a save's copy was still being written or sent then."""
        last, window = self._last, self._window
        self._last = (step, now)
        if last is None or step != last[0] + 1:
            self._window = None  # a gap (a restart, a skipped call): this window is not measurable
            return
        # every step is a step-time sample, a window's too: saves every step or two (a seconds interval in a slow
        # warm-up) would leave none outside them; the lower median keeps the slower window steps out of it
        self._steps.append(now - last[1])
        if window is None:
            self._quiet.append(now - last[1])
        else:
            window[1] += now - last[1] - window[0]
            if not busy:
                self._observed.append(max(window[1], window[2]))
                self._window = None

    def saving(self, stall_s: float) -> None:
        """The loop saved after the step it reported last (its host copy stalled it ``stall_s``)."""
        # the base: steps no copy ran beside (saves every few steps leave none: then every step), else the excess of
        # back-to-back windows is measured against steps that the copies already slowed
        base = low_median(tuple(self._quiet)) or low_median(tuple(self._steps))
        self._window = None if base is None else [base, 0.0, stall_s]

    def cost(self, seconds: float) -> None:
        self._costs.append(seconds)

    def step_s(self, fallback: float | None = None) -> float:
        got = low_median(tuple(self._steps))
        return got if got is not None else (fallback or 1.0)

    def cost_s(self) -> float:
        """The larger of the mean of the newest observed costs and the lower median of the tier's estimates: the
        observed excess holds what the estimate misses (the peer's receiving, the interpreter's lock, memory
        bandwidth), the estimate bounds an observation that the steps' own noise hides (a window of a few fast
        steps). The mean, not a median: the budget is a share of the training time, and save costs are skewed
        high (64 MiB saves observed 74, 81, 96, 111, 178 ms: their lower median 96 ms read a fifth below it)."""
        observed = tuple(self._observed)
        return max(sum(observed) / len(observed) if observed else 0.0, low_median(tuple(self._costs)) or 0.0)


# -- what the tier says about its interval (pure: the tier and the job log the lines) -------------------------------
def _every(steps: int) -> str:
    return "every step" if steps == 1 else f"every {steps} steps"


def _seconds(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def startup_line(cfg: MemoryConfig, loop_start: int) -> str:
    """The tier's interval at start-up: the one asked for, or, for the budget (the default), how the first copies
    are spaced until they are timed (:func:`interval_line` follows when the interval is set)."""
    if cfg.interval_steps:
        return (f"memory copies {_every(cfg.interval_steps)} ({INTERVAL_STEPS_ENV}); a save that comes due while "
                "the previous copy is still written or sent is skipped")
    first = first_save(loop_start)
    then = (f"the first after step {first}, then at most every {PROBE_EVERY} steps (no more often than the first copy "
            "finishes) until the steps and a copy are timed")
    if cfg.interval_seconds:
        return (f"memory copies about every {cfg.interval_seconds:g} s ({INTERVAL_SECONDS_ENV}): {then}; the "
                "interval in steps is logged when it is set")
    if cfg.loss_every_seconds:
        return (f"memory copies spaced for a loss without notice every {_seconds(cfg.loss_every_seconds)} of "
                f"training ({LOSS_EVERY_ENV}; Young/Daly: about sqrt(2 x a copy's cost x that), where that is "
                f"closer than the {cfg.budget:.0%} cost budget's spacing): {then}; the interval is logged when it is "
                "set")
    return (f"memory copies spaced to cost at most {cfg.budget:.0%} of the step time (no {INTERVAL_STEPS_ENV} or "
            f"{INTERVAL_SECONDS_ENV}): {then}; the interval is logged when it is set. {LOSS_EVERY_ENV} (how often "
            "the job loses a machine without notice) spaces them for the fewest steps lost to copies and losses "
            "together")


def interval_line(plan: Schedule, choice: Choice, *, cost_s: float, step_s: float, cfg: MemoryConfig,
                  storage: tuple[int, float] = (0, 0.0), copy_s: float = 0.0) -> str:
    """One line for a schedule process 0 publishes: the interval in steps and seconds, what it rests on, and what a
    ``kill -9`` can cost under it (``copy_s``: the span of the copy the first schedule rests on)."""
    if cfg.interval_seconds:
        why = f"{INTERVAL_SECONDS_ENV}={cfg.interval_seconds:g}"
    elif choice.by_loss:
        m = cfg.loss_every_seconds
        why = (f"Young/Daly for a loss without notice every {_seconds(m)} ({LOSS_EVERY_ENV}): copies and losses "
               f"together cost ~{expected_share(cost_s, choice.every * step_s, m):.1%} of the training time, copies "
               f"alone {share(cost_s, step_s, choice.every):.1%}")
    else:
        why = f"the budget is {cfg.budget:.0%} of the step time (aiming at {AIM * cfg.budget:.2%})"
        if cfg.loss_every_seconds:
            why += (f", closer than Young/Daly for a loss without notice every {_seconds(cfg.loss_every_seconds)} "
                    f"({LOSS_EVERY_ENV}) would space them")
    if choice.capped:
        why += (f"; capped at half the storage tier's periodic interval ({storage_text(*storage)}), which alone "
                f"would space them every {choice.wanted} steps")
    if plan.version == 1 and plan.every < choice.every:
        if plan.every > PROBE_EVERY:
            why += (f"; provisional: at most every {PROBE_EVERY} steps, but the first copy took {copy_s:.2f} s from "
                    f"its save to the peer ({COPY_SLACK:g}x that: {plan.every} steps), until a few more copies are "
                    "timed")
        else:
            why += f"; provisional: at most every {PROBE_EVERY} steps until a few more copies are timed"
    counted = "" if plan.anchor is None else f", counted from step {plan.anchor}"
    return (f"memory copies {_every(plan.every)} (~{_seconds(plan.every * step_s)}) from step {plan.start}{counted} "
            f"(schedule {plan.version}): each copy costs the loop {cost_s:.3f} s and a step takes {step_s:.4f} s; "
            f"{why}. A kill -9 loses up to ~{plan.every} step{'' if plan.every == 1 else 's'}")


def widened_line(plan: Schedule, skips: Mapping[int, tuple[int, int]], previous: int) -> str:
    """Process 0's line for a schedule :func:`widen` published."""
    skipped = ", ".join(f"process {p} step {s}" for p, (_, s) in sorted(skips.items()))
    return (f"memory copies {_every(plan.every)} from step {plan.start} (schedule {plan.version}), {_every(previous)} "
            f"before: saves were skipped while a copy was still written or sent ({skipped}), so the processes no "
            f"longer saved the same steps; every process switches at step {plan.start}, and widens again while any "
            "skips")


def storage_text(steps: int, seconds: float) -> str:
    """The storage tier's periodic interval in words (``10 steps and 600 s``)."""
    return " and ".join(t for t in (f"{steps} steps" if steps else "", f"{seconds:g} s" if seconds else "") if t)


class SkipNotice:
    """Says once that copies are slower than the interval: a save that comes due while the previous copy is still
    written or sent is skipped, so copies land less often than asked (and a ``kill -9`` loses more steps)."""

    def __init__(self) -> None:
        self.told = False

    def line(self, *, step: int, running_step: int | None, every: int | None, step_s: float | None,
             cfg: MemoryConfig) -> str | None:
        """The warning for the skipped save after ``step`` while the copy of ``running_step`` runs (None: said
        already). ``every``: the interval in force; ``step_s``: the step time, when known."""
        if self.told:
            return None
        self.told = True
        behind = "" if running_step is None else f", {step - running_step} steps"
        if running_step is not None and step_s:
            behind += f" (~{_seconds((step - running_step) * step_s)})"
        running = "the previous copy" if running_step is None else f"the copy of step {running_step}"
        asked = _every(every) if every else "the interval"
        late = None if running_step is None else step - running_step
        if cfg.interval_steps:
            fix = f"raise {INTERVAL_STEPS_ENV}" + ("" if late is None else f" above {late}")
        elif cfg.interval_seconds:
            fix = f"raise {INTERVAL_SECONDS_ENV}" + ("" if late is None or not step_s else
                                                     f" above ~{_seconds(late * step_s)}")
        else:
            fix = "make the copies smaller or faster"
        return (f"memory copies are slower than {asked}: {running} was still being written or sent at step {step}"
                f"{behind} later, so that save was skipped, as is every save due while a copy runs; copies land "
                f"less often than asked and a kill -9 loses more steps. To save as asked, {fix} (said once)")


def periodic_saves_off_line(start: int, memory: MemoryConfig | None) -> str:
    """The job's start-up line when no storage interval is set (``REPRIEVE_CHECKPOINT_INTERVAL_*``): what an exception,
    Ctrl-C or ``kill -9`` loses, with the memory tier (``memory``) on or off."""
    since = "the start" if start == 0 else f"step {start - 1}"
    knobs = "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS (e.g. 600) or REPRIEVE_CHECKPOINT_INTERVAL_STEPS"
    if memory is None:
        return ("periodic saves are off: only the last step and the agreed save of a notice are saved, so an "
                f"exception, Ctrl-C or kill -9 loses every step since {since}; set {knobs} to save periodically")
    return ("periodic saves to storage are off: only the last step and the agreed save of a notice are saved there; "
            f"the memory tier's copies ({memory.directory}) cover an exception, Ctrl-C or kill -9 (they lose the "
            f"steps since the newest copy), not a lost machine, whose memory goes with it (that loses every step "
            f"since {since}); set {knobs} to save to storage periodically")
