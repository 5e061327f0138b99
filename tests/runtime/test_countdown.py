"""Table tests for the grace-period countdown (reprieve.countdown.choose_save_step)."""

# ruff: noqa: C408  (keyword dicts read best in the tables)

from __future__ import annotations

import pytest
from reprieve.countdown import CountdownSettings, SavePlan, behind_plan, choose_save_step

pytestmark = pytest.mark.unit

S = CountdownSettings(safety_factor=2.0, margin_seconds=5.0, save_at_once=True, min_extra_steps=2,
                      default_save_seconds=30.0)

# (name, kwargs, expected final, expected early)
CASES = [
    ("no step time yet: earliest", dict(earliest_step=10, seconds_left=3600, step_seconds=None,
                                        save_seconds=1.0), 10, None),
    ("past deadline: earliest", dict(earliest_step=10, seconds_left=-5, step_seconds=0.1, save_seconds=1.0),
     10, None),
    ("short grace (SIGTERM 20s, 10s save): earliest", dict(earliest_step=7, seconds_left=20, step_seconds=0.5,
                                                            save_seconds=10.0), 7, None),
    # budget = 30 - 5 - 2*10 = 5s -> 10 steps of 0.5s, two of them for reaching earliest and skew
    ("SIGTERM 30s, 10s save: 8 more steps, no time for a first save", dict(
        earliest_step=7, seconds_left=30, step_seconds=0.5, save_seconds=10.0), 15, None),
    ("unknown save time uses the 30s default", dict(earliest_step=0, seconds_left=60, step_seconds=1.0,
                                                    save_seconds=None), 0, None),
    # budget = 100 - 5 - 2*10 = 75s -> 75 steps, two held back -> 73 more
    ("long notice: train, first save at once", dict(earliest_step=100, seconds_left=100, step_seconds=1.0,
                                                    save_seconds=10.0), 173, 100),
    ("only one step fits: earliest", dict(earliest_step=5, seconds_left=5 + 2 * 1 + 2.5, step_seconds=1.0,
                                          save_seconds=1.0), 5, None),
    ("capped at the last step", dict(earliest_step=100, seconds_left=1000, step_seconds=1.0, save_seconds=1.0,
                                     last_step=150), 150, 100),
    ("earliest beyond the last step stays earliest", dict(earliest_step=151, seconds_left=1000,
                                                          step_seconds=1.0, save_seconds=1.0, last_step=150),
     151, None),
    ("second notice moves the save earlier", dict(earliest_step=120, seconds_left=3, step_seconds=1.0,
                                                  save_seconds=1.0, previous_final=174), 120, None),
    ("second notice never moves it later", dict(earliest_step=120, seconds_left=10_000, step_seconds=1.0,
                                                save_seconds=1.0, previous_final=174), 174, None),
    ("previous final already reached: kept", dict(earliest_step=175, seconds_left=3, step_seconds=1.0,
                                                  save_seconds=1.0, previous_final=174), 174, None),
    ("an earlier round's first save is kept", dict(earliest_step=16, seconds_left=3, step_seconds=1.0,
                                                   save_seconds=1.0, previous_final=1295, previous_early=15),
     16, 15),
    ("an earlier round's first save past the new final is dropped", dict(
        earliest_step=16, seconds_left=3, step_seconds=1.0, save_seconds=1.0, previous_final=1295,
        previous_early=40), 16, None),
    ("kept final keeps its first save", dict(earliest_step=175, seconds_left=3, step_seconds=1.0,
                                             save_seconds=1.0, previous_final=174, previous_early=100), 174, 100),
    ("no first save when it would not finish before the final", dict(
        earliest_step=0, seconds_left=5 + 2 * 20 + 4, step_seconds=1.0, save_seconds=20.0), 2, None),
]


@pytest.mark.parametrize("name,kwargs,final,early", CASES, ids=[c[0] for c in CASES])
def test_choose_save_step(name: str, kwargs: dict, final: int, early: int | None) -> None:
    plan = choose_save_step(settings=S, **kwargs)
    assert (plan.final_step, plan.early_step) == (final, early), plan.reason
    assert plan.reason


def test_save_at_once_can_be_disabled() -> None:
    plan = choose_save_step(earliest_step=0, seconds_left=100, step_seconds=1.0, save_seconds=1.0,
                            settings=CountdownSettings(save_at_once=False, margin_seconds=5.0))
    assert plan.early_step is None and plan.final_step > 0


def test_commit_lands_before_the_deadline_with_margin() -> None:
    """Property over a grid: the final commit (steps to train + one skew step + save) fits the budget."""
    for left in (10, 30, 60, 300, 3600):
        for step_s in (0.01, 0.1, 1.0, 7.0):
            for save_s in (0.5, 5.0, 60.0):
                plan = choose_save_step(earliest_step=0, seconds_left=left, step_seconds=step_s,
                                        save_seconds=save_s, settings=S)
                if plan.final_step > 0:
                    finish = (plan.final_step + 2) * step_s + S.safety_factor * save_s
                    assert finish <= left - S.margin_seconds + 1e-9, (left, step_s, save_s, plan)


def test_save_steps() -> None:
    assert SavePlan(5, None, "").save_steps() == (5,)
    assert SavePlan(9, 5, "").save_steps() == (5, 9)


# -- a plan made before the loop knew its first step (notice during start-up) ------------------------------

def _target(final: int, early: int | None):
    from reprieve.agreement import Target
    from reprieve.notice import Notice

    notice = Notice(id="n", source="annotation", reason="gke-spot", deadline=100.0, received_at=70.0)
    return Target(0, 0, notice, SavePlan(final, early, "r"), 100.0, True, 70.0)


@pytest.mark.parametrize(
    ("final", "early", "start", "expected"),
    [
        (0, None, 378, (378, None)),      # planned from step 0 during start-up; the loop resumes at 378
        (400, 379, 378, (400, 379)),      # plan entirely ahead: unchanged
        (400, 10, 378, (400, None)),      # stale early save dropped, final kept
        (378, None, 378, (378, None)),    # exactly the first step
        (5, 2, 0, (5, 2)),                # fresh start
    ],
)
def test_not_before_moves_a_stale_plan_to_the_first_step(final: int, early: int | None, start: int,
                                                         expected: tuple[int, int | None]) -> None:
    from reprieve.agreement import not_before

    plan = not_before(_target(final, early), start).plan
    assert (plan.final_step, plan.early_step) == expected


# (name, kwargs, behind?) - the plan leaves margin + one step of slack: keeping pace never asks for a re-plan
BEHIND = [
    ("on pace", dict(now=0.0, deadline=100.0, step=10, final_step=90, step_seconds=1.0, save_seconds=1.0), False),
    ("slowed by half", dict(now=0.0, deadline=100.0, step=10, final_step=90, step_seconds=1.5, save_seconds=1.0),
     True),
    ("just inside half the margin", dict(now=0.0, deadline=100.0, step=10, final_step=107, step_seconds=1.0,
                                        save_seconds=0.0), False),
    ("just past half the margin", dict(now=0.0, deadline=100.0, step=10, final_step=108, step_seconds=1.0,
                                      save_seconds=0.0), True),
    ("save slower than planned", dict(now=0.0, deadline=100.0, step=10, final_step=80, step_seconds=1.0,
                                      save_seconds=15.0), True),
    ("unknown save uses the default", dict(now=0.0, deadline=100.0, step=10, final_step=80, step_seconds=0.1,
                                           save_seconds=None), False),
    ("at the final step", dict(now=99.0, deadline=100.0, step=90, final_step=90, step_seconds=1.0,
                               save_seconds=1.0), False),
    ("no step time", dict(now=99.0, deadline=100.0, step=10, final_step=90, step_seconds=None,
                          save_seconds=1.0), False),
]


@pytest.mark.parametrize(("name", "kwargs", "behind"), BEHIND, ids=[c[0] for c in BEHIND])
def test_behind_plan(name: str, kwargs: dict, behind: bool) -> None:
    assert behind_plan(settings=S, **kwargs) is behind, name


def test_a_plan_made_at_a_step_time_is_not_behind_at_that_step_time() -> None:
    for step_s in (0.01, 0.1, 1.0, 3.0):
        for save_s in (0.0, 1.0, 10.0):
            plan = choose_save_step(earliest_step=0, seconds_left=300.0, step_seconds=step_s, save_seconds=save_s,
                                    settings=S)
            assert not behind_plan(now=0.0, deadline=300.0, step=0, final_step=plan.final_step,
                                   step_seconds=step_s, save_seconds=save_s, settings=S), (step_s, save_s, plan)
