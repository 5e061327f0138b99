"""The memory tier's save schedule (pure): re-measured, re-published when it changes materially, switched at the
same step everywhere, and never sparser than about half the storage tier's periodic interval."""

from __future__ import annotations

import math

import pytest
from reprieve.memtier import schedule
from reprieve.memtier.config import MemoryConfig
from reprieve.memtier.schedule import Schedule

pytestmark = pytest.mark.unit

V1, V2, V3 = Schedule(60, 10, 1), Schedule(8, 40, 2), Schedule(20, 90, 3)

IN_FORCE = [
    ("before the first schedule starts: none", (V1,), 9, None, (V1,)),
    ("the first schedule from its start", (V1,), 10, V1, (V1,)),
    ("a published schedule waits for its start", (V1, V2), 39, V1, (V1, V2)),
    ("from its start the newer one decides and the older is dropped", (V1, V2), 40, V2, (V2,)),
    ("two ahead: only the started ones count", (V1, V2, V3), 50, V2, (V2, V3)),
    ("order of arrival does not matter", (V3, V1, V2), 95, V3, (V3,)),
    ("nothing known", (), 5, None, ()),
]


@pytest.mark.parametrize(("plans", "step", "current", "keep"), [r[1:] for r in IN_FORCE],
                         ids=[r[0] for r in IN_FORCE])
def test_in_force(plans: tuple[Schedule, ...], step: int, current: Schedule | None,
                  keep: tuple[Schedule, ...]) -> None:
    assert schedule.in_force(plans, step) == (current, keep)


def test_every_process_saves_the_same_steps_across_a_switch() -> None:
    """Saves under v1 until v2's start, then v2's: the steps a process saves depend only on the schedules."""
    plans: tuple[Schedule, ...] = (Schedule(10, 4, 1), Schedule(3, 27, 2))
    saved = []
    for step in range(40):
        current, plans = schedule.in_force(plans, step)
        if current is not None and current.due(step):
            saved.append(step)
    assert saved == [4, 14, 24, 27, 30, 33, 36, 39]


def test_low_median_ignores_high_outliers() -> None:
    assert schedule.low_median([]) is None
    assert schedule.low_median([0.54]) == 0.54
    assert schedule.low_median([0.54, 0.02]) == 0.02  # a warm-up sample and a real one: the real one
    assert schedule.low_median([0.02, 2.4, 0.03, 0.9, 0.025]) == 0.03


CAP = [
    ("no storage interval: no cap", {"storage_steps": 0, "storage_seconds": 0.0, "step_s": 0.5}, None),
    ("half the storage steps", {"storage_steps": 100, "storage_seconds": 0.0, "step_s": 0.5}, 50),
    ("an interval of one step: every step", {"storage_steps": 1, "storage_seconds": 0.0, "step_s": 0.5}, 1),
    ("half the storage seconds, in steps", {"storage_steps": 0, "storage_seconds": 60.0, "step_s": 0.5}, 60),
    ("both: the tighter", {"storage_steps": 100, "storage_seconds": 20.0, "step_s": 0.5}, 20),
    ("seconds shorter than a step: every step", {"storage_steps": 0, "storage_seconds": 0.5, "step_s": 2.0}, 1),
]


@pytest.mark.parametrize(("kw", "cap"), [r[1:] for r in CAP], ids=[r[0] for r in CAP])
def test_storage_cap(kw: dict[str, float], cap: int | None) -> None:
    assert schedule.storage_cap(**kw) == cap  # type: ignore[arg-type]


PLAN = [
    # aimed at 0.7 of the budget: 0.5 / (0.007 x 0.5) = 142.9, so 143 steps (100 would cost exactly the budget)
    ("the budget alone (no storage interval)", {"cost_s": 0.5, "step_s": 0.5}, (143, 143, None)),
    # the goodput benchmark's defect: a compile-inflated first measurement asked for 93 steps, storage every 100
    ("capped at half the storage interval", {"cost_s": 0.542, "step_s": 0.834, "storage_steps": 100}, (50, 93, 50)),
    ("under the cap: the budget's", {"cost_s": 0.02, "step_s": 0.52, "storage_steps": 100}, (6, 6, 50)),
    ("a seconds interval, capped", {"cost_s": 0.0, "step_s": 0.5, "interval_s": 60.0, "storage_seconds": 30.0},
     (30, 120, 30)),
    # Daly for a 0.2 s copy and a loss every 300 s: 10.82 s, 19.7 steps of 0.55 s (the budget would ask for 52)
    ("a loss rate: Young/Daly, not the budget", {"cost_s": 0.2, "step_s": 0.55, "loss_every_s": 300.0},
     (20, 20, None)),
    ("a loss rate, capped", {"cost_s": 0.2, "step_s": 0.55, "loss_every_s": 300.0, "storage_steps": 30},
     (15, 20, 15)),
    # a rare loss never spaces them wider than the budget: Daly's 632 s (1150 steps) against the budget's 52 steps
    ("a rare loss: the budget's", {"cost_s": 0.2, "step_s": 0.55, "loss_every_s": 1e6}, (52, 52, None)),
    ("an interval given: the loss rate is not asked", {"cost_s": 0.2, "step_s": 0.5, "interval_s": 5.0,
                                                       "loss_every_s": 300.0}, (10, 10, None)),
]


@pytest.mark.parametrize(("cost", "loss_every"), [(0.2, 300.0), (0.01, 60.0), (2.0, 3600.0), (5.0, 40.0)])
def test_the_loss_rates_interval_loses_the_least_to_copies_and_losses_together(cost: float,
                                                                               loss_every: float) -> None:
    best = schedule.daly_seconds(cost, loss_every)
    assert best <= loss_every
    at = schedule.expected_share(cost, best, loss_every)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert at <= schedule.expected_share(cost, best * factor, loss_every), factor
    young = math.sqrt(2 * cost * loss_every)  # Daly corrects Young's first-order estimate, more as the cost grows
    assert at <= schedule.expected_share(cost, young, loss_every) and abs(best - young) < 0.35 * young


def test_a_copy_that_costs_half_the_time_between_losses_or_more_is_spaced_by_that_time() -> None:
    assert schedule.daly_seconds(10.0, 5.0) == 5.0 and schedule.daly_seconds(10.0, 4.0) == 4.0


@pytest.mark.parametrize(("kw", "want"), [r[1:] for r in PLAN], ids=[r[0] for r in PLAN])
def test_plan(kw: dict[str, float], want: tuple[int, int, int | None]) -> None:
    choice = schedule.plan(**kw)  # type: ignore[arg-type]
    assert (choice.every, choice.wanted, choice.cap) == want
    assert choice.capped == (want[0] < want[1])
    budget = schedule.plan(**{k: v for k, v in kw.items() if k != "loss_every_s"})  # type: ignore[arg-type]
    assert choice.by_loss == (choice.wanted < budget.wanted), "by_loss: the loss rate's interval was the closer one"


def test_share_is_the_cost_per_interval() -> None:
    assert schedule.share(0.5, 0.5, 50) == pytest.approx(0.02)  # capped at 50 where the budget wanted 100


NOW = Schedule(60, 10, 2)
FIRST = Schedule(4, 10, 1)
RECONSIDER = [
    ("no schedule yet: the first publication is not a reconsideration", None, NOW, 20, 8, 5, False),
    ("the newest publication is not in force yet", NOW, Schedule(8, 40, 3), 30, 2, 5, False),
    ("too few saves measured under it", NOW, NOW, 70, 8, 1, False),
    ("more than 2x denser: published", NOW, NOW, 70, 8, 2, True),
    ("more than 2x sparser: published", Schedule(8, 10, 2), Schedule(8, 10, 2), 70, 17, 2, True),
    ("exactly 2x: not material", NOW, NOW, 70, 30, 2, False),
    ("a small drift: not material", NOW, NOW, 70, 45, 9, False),
    ("the provisional first schedule: any change", FIRST, FIRST, 20, 6, 2, True),
    ("the provisional first schedule, confirmed: kept", FIRST, FIRST, 20, 4, 2, False),
    ("the provisional first schedule, measured once: kept", FIRST, FIRST, 20, 6, 1, False),
]


def test_the_first_schedule_is_a_dense_probe() -> None:
    assert schedule.first_every(65) == schedule.PROBE_EVERY == 4 and schedule.first_every(2) == 2
    assert schedule.first_every(65, copy_s=0.5, step_s=0.5) == 4  # a copy done within the probe: the probe


def test_the_first_schedule_leaves_a_copy_the_steps_the_first_one_took() -> None:
    """At 1 GiB a process on the 2-core VM the first copy spanned 4-15 s against 0.55 s steps: a save every 4 steps
    met every copy still running, and each skip widened every process's schedule (4, 8, 16, 32 steps)."""
    assert schedule.COPY_SLACK == 1.5
    assert schedule.copy_steps(4.0, 0.5) == 12 and schedule.copy_steps(0.0, 0.5) == 0
    assert schedule.first_every(65, copy_s=4.0, step_s=0.5) == 12  # 8 steps' copy, 1.5x
    assert schedule.first_every(10, copy_s=4.0, step_s=0.5) == 10  # never sparser than the measurements ask
    assert schedule.first_every(65, copy_s=1.0, step_s=0.5) == 4  # 3 steps: within the probe's 4


@pytest.mark.parametrize(("current", "newest", "step", "every", "saves", "want"), [r[1:] for r in RECONSIDER],
                         ids=[r[0] for r in RECONSIDER])
def test_reconsider(current: Schedule | None, newest: Schedule, step: int, every: int, saves: int,
                    want: bool) -> None:
    assert schedule.reconsider(current, newest=newest, step=step, every=every, saves_since=saves) is want


# The memtier benchmark's finding: a schedule of every 324 steps planned from a cheaper first measurement cost
# 1.12 % of the training time once the save cost settled higher, within 2x: the hysteresis alone kept it.
OVER = [
    ("over the budget, the new interval sparser: published", NOW, 66, 2, True),
    ("over the budget, measured once: not yet", NOW, 66, 1, False),
    ("over the budget but the new one no sparser (capped by the storage interval): kept", NOW, 60, 2, False),
    ("over the budget, a denser interval wanted (a cheaper measurement, within 2x): kept", NOW, 50, 2, False),
]


@pytest.mark.parametrize(("current", "every", "saves", "want"), [r[1:] for r in OVER], ids=[r[0] for r in OVER])
def test_reconsider_over_budget(current: Schedule, every: int, saves: int, want: bool) -> None:
    assert schedule.reconsider(current, newest=current, step=70, every=every, saves_since=saves,
                               over_budget=True) is want
    assert not schedule.reconsider(current, newest=current, step=70, every=every, saves_since=saves)


def test_a_cost_that_settled_above_the_budget_is_replanned_below_it() -> None:
    """The benchmark's numbers: planned from a cost of 0.06 s, the saves then cost 0.086 s at 23.6 ms a step."""
    first = schedule.plan(cost_s=0.06, step_s=0.0236).every
    assert schedule.share(0.06, 0.0236, first) <= 0.01 * schedule.AIM
    over = schedule.share(0.086, 0.0236, first)
    assert over > 0.01  # within 2x of the first cost: the material rule alone would keep it
    again = schedule.plan(cost_s=0.086, step_s=0.0236).every
    assert not schedule.material(first, again)
    assert schedule.reconsider(Schedule(first, 10, 2), newest=Schedule(first, 10, 2), step=first + 10, every=again,
                               saves_since=2, over_budget=True)
    assert schedule.share(0.086, 0.0236, again) <= 0.01


OVER_BUDGET = [  # (why, cost_s, every, over): a 20 ms step, the 1 % budget
    ("at the aim (0.7 %)", 0.07, 500, False),
    ("between the aim and 0.8 %: kept (a cost measured a little higher)", 0.078, 500, False),
    ("above 0.8 %: re-planned (the benchmark's schedule ran at 0.98 % when its steps got faster)", 0.085, 500, True),
    ("above the budget", 0.12, 500, True),
]


@pytest.mark.parametrize(("cost", "every", "want"), [r[1:] for r in OVER_BUDGET], ids=[r[0] for r in OVER_BUDGET])
def test_a_schedule_in_force_is_over_budget_above_eight_tenths_of_it(cost: float, every: int, want: bool) -> None:
    assert schedule.over_budget(cost, 0.02, every, 0.01) is want
    assert schedule.AIM < schedule.REPLAN_ABOVE < 1  # a band: the aim, then room before the budget


def test_measurements_count_consecutive_steps_and_recent_costs() -> None:
    m = schedule.Measurements()
    assert m.step_s(fallback=0.7) == 0.7 and m.cost_s() == 0.0 and m.last_step is None
    t = 0.0
    for step, seconds in [(0, 0.0), (1, 2.5), (2, 0.9), (3, 0.5), (4, 0.5), (5, 0.5)]:  # a compiling warm-up
        t += seconds
        m.step(step, t)
    m.step(20, t + 30.0)  # not consecutive (a gap): no step duration
    m.step(21, t + 30.5)
    assert m.step_s() == 0.5 and m.last_step == 21
    for cost in [0.54, 0.03, 0.02, 0.025, 0.03, 0.02]:  # the window keeps the newest COST_WINDOW
        m.cost(cost)
    assert m.cost_s() == 0.025


def test_a_saves_cost_is_the_steps_excess_while_its_copy_runs() -> None:
    """The memtier benchmark's finding: the tier's estimate (stall + the copy thread's CPU, 0.075 s) missed a
    fifth of what the steps lost (0.09 s: the peer's receiver, the interpreter's lock); the loop's own steps say."""
    m = schedule.Measurements()
    t = 0.0
    for k in range(6):  # steps of 0.5 s
        t += 0.5
        m.step(k, t)
    m.cost(0.075)
    assert m.cost_s() == 0.075  # nothing observed yet: the estimate stands in
    m.saving(0.05)  # the loop saved after step 5 (a 0.05 s stall)
    for k, seconds, busy in [(6, 0.6, True), (7, 0.58, True), (8, 0.52, False), (9, 0.9, False)]:
        t += seconds
        m.step(k, t, busy)
    assert m.cost_s() == pytest.approx(0.1 + 0.08 + 0.02)  # steps 6-8; step 9 is after the copy
    m.cost(0.4)
    m.cost(0.4)
    assert m.cost_s() == 0.4  # an estimate above the observed excess: a window that the steps' noise hid
    assert m.step_s() == 0.5  # the window's steps are samples too, below the lower median's reach


def test_an_observed_cost_is_at_least_the_stall_and_a_gap_drops_the_window() -> None:
    m = schedule.Measurements()
    t = 0.0
    for k in range(4):
        t += 0.5
        m.step(k, t)
    m.saving(0.03)
    t += 0.45  # the copy ended within a faster step: the excess is negative, the stall was still paid
    m.step(4, t, False)
    assert m.cost_s() == 0.03  # no estimate yet
    m.saving(0.03)
    m.step(40, t + 9.0, False)  # not consecutive (a restart): this window says nothing
    m.step(41, t + 9.5, False)
    assert list(m._observed) == [0.03]


def test_the_observed_cost_is_the_mean_of_skewed_saves() -> None:
    """memtier.py's cost run: the tier's newest five saves cost 74, 81, 96, 111 and 178 ms; the budget is a share of
    the time, so their mean (108 ms) counts, not their lower median (96 ms)."""
    m, t, k = schedule.Measurements(), 0.0, 0
    for _ in range(4):
        k, t = k + 1, t + 0.5
        m.step(k, t)
    for cost in [0.074, 0.081, 0.096, 0.111, 0.178]:  # each save slows the one step after it by its cost
        m.saving(0.0)
        k, t = k + 1, t + 0.5 + cost
        m.step(k, t, False)
        k, t = k + 1, t + 0.5
        m.step(k, t)
    m.cost(0.09)
    assert m.cost_s() == pytest.approx(0.108)


def test_a_window_is_measured_against_steps_no_copy_ran_beside() -> None:
    """memtier.py's cost run found it: probe saves every few steps left windows back to back, and their
    base (the steps before) was already slowed by the copies: the costs observed were a third too low."""
    m = schedule.Measurements()
    t = 0.0
    for k in range(5):  # quiet steps of 0.5 s
        t += 0.5
        m.step(k, t)
    k = 4
    for _ in range(4):  # four saves back to back, each slowing two steps to 0.7 s
        m.saving(0.0)
        for busy in (True, False):
            k, t = k + 1, t + 0.7
            m.step(k, t, busy)
    assert list(m._observed) == pytest.approx([0.4] * 4)  # against the quiet 0.5 s, not the slowed steps


def test_no_window_before_any_step_time() -> None:
    m = schedule.Measurements()
    m.saving(0.2)  # the bootstrap save before two consecutive steps: no step time to compare with
    m.step(0, 1.0, True)
    m.step(1, 2.0, False)
    assert m.cost_s() == 0.0 and m.step_s() == 1.0


def test_a_replanned_schedule_counts_from_the_last_save() -> None:
    """Every 336 steps, re-planned to 400 after the save of step 3444 (start 3450): the next save is 3844, not
    3450 (52 steps after the last one, as the benchmark saw), nor the old schedule's 3780."""
    old, new = Schedule(336, 420, 2), Schedule(400, 3450, 3, anchor=3444)
    saves = [k for k in range(3400, 4300) if (schedule.in_force((old, new), k)[0] or old).due(k)]
    assert saves == [3444, 3844, 4244]
    assert Schedule.from_json(new.to_json()) == new
    assert '"anchor"' not in Schedule(4, 10).to_json()
    with pytest.raises(ValueError, match="anchor >= 0"):
        Schedule.from_json('{"every": 5, "from": 12, "version": 2, "anchor": -1}')


def test_schedule_json_round_trip_with_version() -> None:
    s = Schedule(every=5, start=12, version=3)
    assert Schedule.from_json(s.to_json()) == s
    assert Schedule.from_json('{"every": 5, "from": 12}') == Schedule(5, 12, 1)
    with pytest.raises(ValueError, match="version >= 1"):
        Schedule.from_json('{"every": 5, "from": 12, "version": 0}')


# -- what the tier says about its interval (issue 46: 300 MiB copies 1,640-2,140 steps apart, and copies slower than
# an explicit interval skipped without a word) ------------------------------------------------------------------

AUTO = MemoryConfig("/dev/shm/j")
TEN = MemoryConfig("/dev/shm/j", interval_steps=10)


def test_the_startup_line_says_the_interval_or_how_the_first_copies_are_spaced() -> None:
    assert schedule.startup_line(TEN, 0).startswith("memory copies every 10 steps (REPRIEVE_MEMORY_INTERVAL_STEPS)")
    assert schedule.startup_line(AUTO, 100).startswith(
        "memory copies spaced to cost at most 1% of the step time (no REPRIEVE_MEMORY_INTERVAL_STEPS or "
        "REPRIEVE_MEMORY_INTERVAL_SECONDS): the first after step 104, then at most every 4 steps")
    assert "about every 30 s (REPRIEVE_MEMORY_INTERVAL_SECONDS)" in schedule.startup_line(
        MemoryConfig("/m", interval_seconds=30), 0)
    assert "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS (how often the job loses a machine" in schedule.startup_line(AUTO, 0)
    assert schedule.startup_line(MemoryConfig("/m", loss_every_seconds=1800), 0).startswith(
        "memory copies spaced for a loss without notice every 1800 s of training (REPRIEVE_MEMORY_LOSS_EVERY_SECONDS; "
        "Young/Daly: about sqrt(2 x a copy's cost x that), where that is closer than the 1% cost budget's spacing): "
        "the first after step 4")


def test_the_interval_line_of_a_loss_rate_says_what_copies_and_losses_cost_together() -> None:
    cfg = MemoryConfig("/m", loss_every_seconds=300)
    choice = schedule.plan(cost_s=0.2, step_s=0.55, loss_every_s=300.0)
    assert choice.by_loss
    line = schedule.interval_line(schedule.Schedule(choice.every, 40, 2), choice, cost_s=0.2, step_s=0.55, cfg=cfg)
    # copies: 0.2 / (20 x 0.55) = 1.8 %; losses about 11 s / 2 / 300 s = 1.8 % (Daly's model: 3.7 % together)
    assert ("Young/Daly for a loss without notice every 300 s (REPRIEVE_MEMORY_LOSS_EVERY_SECONDS): copies and losses "
            "together cost ~3.7% of the training time, copies alone 1.8%. A kill -9 loses up to ~20 steps") in line
    rare = MemoryConfig("/m", loss_every_seconds=10**6)
    choice = schedule.plan(cost_s=0.2, step_s=0.55, loss_every_s=1e6)
    line = schedule.interval_line(schedule.Schedule(choice.every, 40, 2), choice, cost_s=0.2, step_s=0.55, cfg=rare)
    assert ("the budget is 1% of the step time (aiming at 0.70%), closer than Young/Daly for a loss without notice "
            "every 1000000 s (REPRIEVE_MEMORY_LOSS_EVERY_SECONDS) would space them") in line, line


def test_the_interval_line_gives_steps_seconds_the_reason_and_the_loss() -> None:
    choice = schedule.plan(cost_s=1.2, step_s=0.02, budget=AUTO.budget)
    line = schedule.interval_line(schedule.Schedule(choice.every, 40, 2, 30), choice, cost_s=1.2, step_s=0.02,
                                  cfg=AUTO)
    assert line == (f"memory copies every {choice.every} steps (~171 s) from step 40, counted from step 30 (schedule "
                    "2): each copy costs the loop 1.200 s and a step takes 0.0200 s; the budget is 1% of the step time "
                    f"(aiming at 0.70%). A kill -9 loses up to ~{choice.every} steps")
    first = schedule.interval_line(schedule.Schedule(4, 9), choice, cost_s=1.2, step_s=0.02, cfg=AUTO)
    assert first.startswith("memory copies every 4 steps (~0.08 s) from step 9 (schedule 1)") and first.endswith(
        "; provisional: at most every 4 steps until a few more copies are timed. A kill -9 loses up to ~4 steps")
    slow = schedule.interval_line(schedule.Schedule(schedule.first_every(choice.every, 0.2, 0.02), 9), choice,
                                  cost_s=1.2, step_s=0.02, cfg=AUTO, copy_s=0.2)
    assert ("; provisional: at most every 4 steps, but the first copy took 0.20 s from its save to the peer (1.5x "
            "that: 15 steps), until a few more copies are timed") in slow, slow
    capped = schedule.plan(cost_s=1.2, step_s=0.02, budget=AUTO.budget, storage_steps=100)
    line = schedule.interval_line(schedule.Schedule(50, 60, 2), capped, cost_s=1.2, step_s=0.02, cfg=AUTO,
                                  storage=(100, 0.0))
    assert f"capped at half the storage tier's periodic interval (100 steps), which alone would space them every " \
           f"{capped.wanted} steps" in line


def test_skipped_copies_are_said_once_with_the_fix() -> None:
    notice = schedule.SkipNotice()
    line = notice.line(step=50, running_step=40, every=10, step_s=0.02, cfg=TEN)
    assert line is not None and line.startswith(
        "memory copies are slower than every 10 steps: the copy of step 40 was still being written or sent at step "
        "50, 10 steps (~0.2 s) later, so that save was skipped")
    assert line.endswith("raise REPRIEVE_MEMORY_INTERVAL_STEPS above 10 (said once)"), line
    assert notice.line(step=60, running_step=50, every=10, step_s=0.02, cfg=TEN) is None


def test_periodic_saves_off_says_what_the_memory_tier_covers() -> None:
    off = schedule.periodic_saves_off_line(0, None)
    assert "kill -9 loses every step since the start" in off  # the tier off: as before
    on = schedule.periodic_saves_off_line(7, AUTO)
    assert "kill -9 loses every step" not in on and "the steps since the newest copy" in on, on
    assert "not a lost machine" in on and "every step since step 6" in on


STEPS_V1 = Schedule(1, 0, 1)  # REPRIEVE_MEMORY_INTERVAL_STEPS=1: every process's own, version 1
WIDEN = [
    ("a skip under the newest schedule: twice as wide, from a step every process reaches after adopting it",
     STEPS_V1, {1: (1, 9)}, 12, 0.05, Schedule(2, 12 + 20, 2)),
    ("skips of several processes: one wider schedule", Schedule(2, 32, 2), {0: (2, 40), 1: (2, 41)}, 41, 0.5,
     Schedule(4, 41 + 3, 3)),
    ("a skip under an older schedule is answered by the newer one already published", Schedule(2, 32, 2),
     {1: (1, 11)}, 20, 0.05, None),
    ("the bootstrap save's skip (no schedule yet)", Schedule(4, 8, 1), {1: (0, 4)}, 6, 0.05, None),
    ("no skip", STEPS_V1, {}, 12, 0.05, None),
    ("no schedule", None, {1: (1, 9)}, 12, 0.05, None),
]


@pytest.mark.parametrize(("newest", "skips", "step", "step_s", "want"), [r[1:] for r in WIDEN],
                         ids=[r[0] for r in WIDEN])
def test_a_skipped_save_widens_the_schedule_for_every_process(newest: Schedule | None,
                                                             skips: dict[int, tuple[int, int]], step: int,
                                                             step_s: float, want: Schedule | None) -> None:
    assert schedule.widen(newest, skips, step=step, step_s=step_s) == want


def test_processes_that_skipped_different_steps_save_the_same_ones_from_the_widened_schedule() -> None:
    """Process 0 skipped 8 and process 1 skipped 9 under every step (issue #48): from the widened schedule's start
    both save the same steps, whichever they skipped before."""
    wide = schedule.widen(STEPS_V1, {0: (1, 8), 1: (1, 9)}, step=10, step_s=0.25)
    assert wide is not None
    saved = []
    for skipped in ({8}, {9}):
        plans: tuple[Schedule, ...] = (STEPS_V1, wide)
        mine = []
        for step in range(30):
            current, plans = schedule.in_force(plans, step)
            if current is not None and current.due(step) and step not in skipped:
                mine.append(step)
        saved.append([s for s in mine if s >= wide.start])
    assert saved[0] == saved[1] == list(range(wide.start, 30, 2))


def test_the_widened_line_names_who_skipped_what_and_the_new_interval() -> None:
    line = schedule.widened_line(Schedule(2, 32, 2), {0: (1, 8), 1: (1, 9)}, 1)
    assert line.startswith("memory copies every 2 steps from step 32 (schedule 2), every step before: ")
    assert "(process 0 step 8, process 1 step 9)" in line and "every process switches at step 32" in line
