"""The memory tier's save schedule (pure): re-measured, re-published when it changes materially, switched at the
same step everywhere, and never sparser than about half the storage tier's periodic interval."""

from __future__ import annotations

import pytest
from reprieve.memtier import schedule
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
    ("the budget alone (no storage interval)", {"cost_s": 0.5, "step_s": 0.5}, (100, 100, None)),
    # the goodput benchmark's defect: a compile-inflated first measurement asked for 65 steps, storage every 100
    ("capped at half the storage interval", {"cost_s": 0.542, "step_s": 0.834, "storage_steps": 100}, (50, 65, 50)),
    ("under the cap: the budget's", {"cost_s": 0.02, "step_s": 0.52, "storage_steps": 100}, (4, 4, 50)),
    ("a seconds interval, capped", {"cost_s": 0.0, "step_s": 0.5, "interval_s": 60.0, "storage_seconds": 30.0},
     (30, 120, 30)),
]


@pytest.mark.parametrize(("kw", "want"), [r[1:] for r in PLAN], ids=[r[0] for r in PLAN])
def test_plan(kw: dict[str, float], want: tuple[int, int, int | None]) -> None:
    choice = schedule.plan(**kw)  # type: ignore[arg-type]
    assert (choice.every, choice.wanted, choice.cap) == want
    assert choice.capped == (want[0] < want[1])


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


@pytest.mark.parametrize(("current", "newest", "step", "every", "saves", "want"), [r[1:] for r in RECONSIDER],
                         ids=[r[0] for r in RECONSIDER])
def test_reconsider(current: Schedule | None, newest: Schedule, step: int, every: int, saves: int,
                    want: bool) -> None:
    assert schedule.reconsider(current, newest=newest, step=step, every=every, saves_since=saves) is want


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


def test_schedule_json_round_trip_with_version() -> None:
    s = Schedule(every=5, start=12, version=3)
    assert Schedule.from_json(s.to_json()) == s
    assert Schedule.from_json('{"every": 5, "from": 12}') == Schedule(5, 12, 1)
    with pytest.raises(ValueError, match="version >= 1"):
        Schedule.from_json('{"every": 5, "from": 12, "version": 0}')
