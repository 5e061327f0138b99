"""policy.goodput: every second of a job's wall time in exactly one bucket, lost steps known once the next attempt
reports where it started."""

from __future__ import annotations

import pytest
from reprieve_operator.policy.goodput import (
    BUCKETS,
    Accounting,
    Attempt,
    Report,
    attempt_created,
    finished,
    progress,
    split,
    summary,
)

pytestmark = pytest.mark.unit


def rep(attempt: int, first: int, first_t: float, step: int, t: float, step_s: float = 1.0, restore: float = 0.0,
        blocking: float = 0.0, saved: tuple[tuple[int, float], ...] = ()) -> Report:
    return Report(attempt, step, t, first, first_t, step_s, restore, blocking, saved_at=saved)


# (case, attempt, end, next first step, expected buckets, lost steps)
SPLITS = [
    ("one clean attempt", Attempt(1, 0.0, report=rep(1, 1, 12.0, 100, 110.0, restore=2.0, blocking=5.0)), 112.0,
     None, {"startup": 9.0, "restore": 2.0, "checkpoint": 5.0, "productive": 94.0, "lost": 0.0, "restartGap": 2.0},
     0),
    ("noticed preemption: saved at the last step", Attempt(1, 0.0, report=rep(1, 0, 5.0, 49, 54.0)), 60.0, 50,
     {"startup": 4.0, "restore": 0.0, "checkpoint": 0.0, "productive": 50.0, "lost": 0.0, "restartGap": 6.0}, 0),
    ("hard kill: the next attempt redoes 10 steps", Attempt(1, 0.0, report=rep(1, 0, 5.0, 49, 54.0)), 60.0, 40,
     {"startup": 4.0, "restore": 0.0, "checkpoint": 0.0, "productive": 40.0, "lost": 10.0, "restartGap": 6.0}, 10),
    # steps 0-39 took 1 s each, 40-49 3 s each (beside a save's background write): an even split by step count
    # would book 19.6 s as lost; the saved step's reported finish time puts the boundary where the time was
    ("hard kill after a save: split at the saved step's reported time",
     Attempt(1, 0.0, report=rep(1, 0, 5.0, 49, 74.0, saved=((39, 44.0),))), 80.0, 40,
     {"startup": 4.0, "restore": 0.0, "checkpoint": 0.0, "productive": 40.0, "lost": 30.0, "restartGap": 6.0}, 10),
    ("resumed behind a saved step the report does not carry: interpolated between the known ones",
     Attempt(1, 0.0, report=rep(1, 0, 5.0, 49, 74.0, saved=((39, 44.0),))), 80.0, 45,
     {"startup": 4.0, "restore": 0.0, "checkpoint": 0.0, "productive": 55.0, "lost": 15.0, "restartGap": 6.0}, 5),
    ("save waits are spread over the kept and the lost part",
     Attempt(1, 0.0, report=rep(1, 0, 5.0, 49, 74.0, blocking=7.0, saved=((39, 44.0),))), 80.0, 40,
     {"startup": 4.0, "restore": 0.0, "checkpoint": 7.0, "productive": 36.0, "lost": 27.0, "restartGap": 6.0}, 10),
    ("every step lost: all of the loop's time",
     Attempt(1, 0.0, report=rep(1, 10, 5.0, 19, 14.0, saved=((15, 10.0),))), 20.0, 5,
     {"startup": 4.0, "restore": 0.0, "checkpoint": 0.0, "productive": 0.0, "lost": 10.0, "restartGap": 6.0}, 10),
    ("died before its first step: all start-up", Attempt(2, 100.0), 130.0, 40,
     {"startup": 30.0, "restore": 0.0, "checkpoint": 0.0, "productive": 0.0, "lost": 0.0, "restartGap": 0.0}, 0),
    ("restore longer than reported start (clock skew) is capped", Attempt(1, 10.0, report=rep(1, 0, 11.5, 0, 11.5,
                                                                                             restore=9.0)), 12.0, None,
     {"startup": 0.0, "restore": 0.5, "checkpoint": 0.0, "productive": 1.0, "lost": 0.0, "restartGap": 0.5}, 0),
]


@pytest.mark.parametrize("attempt,end,nxt,expected,lost", [r[1:] for r in SPLITS], ids=[r[0] for r in SPLITS])
def test_split(attempt: Attempt, end: float, nxt: int | None, expected: dict[str, float], lost: int) -> None:
    buckets, n = split(attempt, end, nxt)
    assert buckets == pytest.approx(expected) and n == lost
    assert sum(buckets.values()) == pytest.approx(end - attempt.created)


def test_a_preempted_job_end_to_end() -> None:
    """Attempt 1 trains steps 0-49, is preempted (hard kill after the last report), attempt 2 resumes at 45."""
    acc = attempt_created(Accounting(), 1, 0.0)
    acc = progress(acc, rep(1, 0, 5.0, 30, 35.0))
    acc = progress(acc, rep(1, 0, 5.0, 49, 54.0))
    acc = progress(acc, rep(1, 0, 5.0, 20, 25.0))  # a stale report changes nothing
    acc = attempt_created(acc, 2, 60.0)
    assert [a.attempt for a in acc.open] == [1, 2] and acc.lost_steps == 0  # not known before attempt 2 reports
    acc = progress(acc, rep(2, 45, 70.0, 46, 71.0, restore=3.0))
    assert [a.attempt for a in acc.open] == [2] and acc.lost_steps == 5
    assert acc.closed["lost"] == pytest.approx(5.0) and acc.closed["restartGap"] == pytest.approx(6.0)
    acc = progress(acc, rep(1, 0, 5.0, 60, 99.0))  # a late report of a closed attempt is ignored
    acc = progress(acc, rep(2, 45, 70.0, 99, 124.0, restore=3.0))
    done = finished(acc, 125.0)
    assert sum(done.closed.values()) == pytest.approx(125.0)
    assert done.closed["productive"] == pytest.approx(45.0 + 55.0)
    assert done.closed["startup"] == pytest.approx(4.0 + (69.0 - 60.0 - 3.0))
    hist = [dict(h) for h in done.history]  # what the timeline of reprieve_operator.timeline draws
    assert [(h["attempt"], h["created"], h["ended"], h["firstStep"], h["step"], h["lostSteps"]) for h in hist] == \
        [(1, 0.0, 60.0, 0, 49, 5), (2, 60.0, 125.0, 45, 99, 0)]
    s = summary(done, 0.0, 125.0)
    assert s["goodput"] == pytest.approx(100 / 125, abs=1e-4) and s["lostSteps"] == 5
    assert set(s["badputSeconds"]) == {"startup", "restore", "checkpoint", "lost", "restartGap"}


def test_summary_of_a_running_job_is_provisional() -> None:
    acc = progress(attempt_created(Accounting(), 1, 0.0), rep(1, 0, 5.0, 49, 54.0))
    s = summary(acc, 0.0, 60.0)
    assert s["wallSeconds"] == 60.0 and s["productiveSeconds"] == 50.0 and s["goodput"] == pytest.approx(50 / 60, abs=1e-4)
    assert acc.open  # nothing closed: the next attempt may still find steps lost


def test_round_trip_through_status() -> None:
    acc = progress(attempt_created(attempt_created(Accounting(), 1, 0.0), 2, 60.0), rep(2, 45, 70.0, 46, 71.0))
    acc = progress(acc, rep(2, 45, 70.0, 50, 75.0, blocking=0.5))
    again = Accounting.from_status(acc.to_status())
    assert again == acc and Accounting.from_status(None) == Accounting()
    assert set(acc.to_status()["closed"]) == set(BUCKETS)


def test_attempts_are_created_once() -> None:
    acc = attempt_created(Accounting(), 1, 0.0)
    assert attempt_created(acc, 1, 5.0) == acc
    assert progress(acc, rep(7, 0, 1.0, 1, 2.0)) == acc  # an attempt the operator never created


def test_report_of_the_progress_annotation() -> None:
    from reprieve_operator.policy.goodput import report_of

    live = {"attempt": 2, "step": 9, "committedStep": -1, "stepAt": 20.5, "firstStep": 5, "firstStepAt": 16.0,
            "stepSeconds": 1.1, "restoreSeconds": 0.5, "saveBlockingSeconds": 0.25}
    assert report_of(live) == Report(2, 9, 20.5, 5, 16.0, 1.1, 0.5, 0.25)
    assert report_of({"attempt": 1, "step": 9, "committedStep": 9, "time": "t"}) is None  # commit-only report
    assert report_of({**live, "step": "nine"}) is None and report_of(None) is None


def test_fold_says_when_nothing_changed() -> None:
    from reprieve_operator.policy.goodput import fold, status

    acc = fold(None, now=0.0, new_attempt=1)
    assert acc is not None and [a.attempt for a in acc.open] == [1]
    raw = acc.to_status()
    assert fold(raw, now=5.0) is None and fold(raw, now=5.0, new_attempt=1) is None
    acc2 = fold(raw, now=60.0, report=rep(1, 0, 5.0, 49, 54.0))
    assert acc2 is not None and fold(acc2.to_status(), now=61.0, report=rep(1, 0, 5.0, 49, 54.0)) is None
    done = fold(acc2.to_status(), now=60.0, ended=True)
    assert done is not None and not done.open and sum(done.closed.values()) == pytest.approx(60.0)
    s = status(done, 60.0)
    assert s["goodput"] == pytest.approx(50 / 60, abs=1e-4) and s["badputSeconds"]["restartGap"] == 6.0
    assert Accounting.from_status(s["accounting"]) == done


def test_saved_step_times_survive_the_status_round_trip_and_malformed_ones_are_dropped() -> None:
    """The accounting lives in status.goodput (an operator restart loses nothing): the saved steps' times too."""
    from reprieve_operator.policy.goodput import report_of

    r = report_of({"attempt": 1, "step": 49, "stepAt": 74.0, "firstStep": 0, "firstStepAt": 5.0, "stepSeconds": 1.0,
                   "savedStepsAt": [[39, 44.0], ["x", 1], [29], None, [19, "23.5"]]})
    assert r is not None and r.saved_at == ((19, 23.5), (39, 44.0))
    acc = progress(attempt_created(Accounting(), 1, 0.0), r)
    again = Accounting.from_status(acc.to_status())
    assert again == acc and again.open[0].report is not None and again.open[0].report.saved_at == r.saved_at


# A hard kill of process 0: its last report says step 30 at 35 s, a survivor's exit report says the gang
# finished step 49 at 54 s; attempt 2 (created at 60 s) resumes at 40.
# (case, last step said (attempt, step, when), lost steps, lost seconds, restart gap seconds)
LAST_STEPS = [
    ("no last step: steps 31-49 fall into the restart gap", None, 0, 0.0, 25.0),
    ("a survivor's last step: steps 40-49 lost, as the step log counts them", (1, 49, 54.0), 10, 10.0, 6.0),
    ("a last step behind the report changes nothing", (1, 20, 25.0), 0, 0.0, 25.0),
    ("another attempt's last step changes nothing", (2, 49, 54.0), 0, 0.0, 25.0),
    # an earlier clock on the survivor's node: the step is raised, its time never goes back
    ("a last step with an earlier time than the report: the step counts", (1, 49, 30.0), 10, 0.0, 25.0),
]


@pytest.mark.parametrize("said,lost_steps,lost_s,gap_s", [r[1:] for r in LAST_STEPS], ids=[r[0] for r in LAST_STEPS])
def test_a_survivors_last_step_counts_the_steps_after_the_last_report_as_lost(
        said: tuple[int, int, float] | None, lost_steps: int, lost_s: float, gap_s: float) -> None:
    from reprieve_operator.policy.goodput import fold

    acc = fold(None, now=0.0, new_attempt=1)
    assert acc is not None
    raw = fold(acc.to_status(), now=35.0, report=rep(1, 0, 5.0, 30, 35.0))
    assert raw is not None
    after = fold(raw.to_status(), now=58.0, last_steps=[said] if said else [])
    acc = after if after is not None else raw
    acc = attempt_created(acc, 2, 60.0)
    acc = progress(acc, rep(2, 40, 70.0, 41, 71.0))
    assert [a.attempt for a in acc.open] == [2] and acc.lost_steps == lost_steps
    assert acc.closed["lost"] == pytest.approx(lost_s) and acc.closed["restartGap"] == pytest.approx(gap_s)
    assert sum(acc.closed.values()) == pytest.approx(60.0)
    assert acc.closed["productive"] == pytest.approx(60.0 - 4.0 - lost_s - gap_s)


def test_a_last_step_keeps_the_reported_step_as_a_known_time_and_survives_the_status_round_trip() -> None:
    """Steps 0-30 took 1 s each, 31-49 about 1.4 s (the report at 30 is kept as a known point): the lost part,
    steps 40-49, is interpolated between 30 at 35 s and 49 at 62 s, not between the first step and the last."""
    from reprieve_operator.policy.goodput import last_step

    acc = progress(attempt_created(Accounting(), 1, 0.0), rep(1, 0, 5.0, 30, 35.0))
    acc = last_step(acc, 1, 49, 62.0)
    r = acc.open[0].report
    assert r is not None and (r.step, r.time, r.saved_at) == (49, 62.0, ((30, 35.0),))
    assert Accounting.from_status(acc.to_status()) == acc
    assert last_step(acc, 1, 49, 70.0) == acc and last_step(acc, 1, 45, 70.0) == acc  # never again, never lower
    assert progress(acc, rep(1, 0, 5.0, 30, 35.0)) == acc  # process 0's stale report does not undo it
    buckets, lost = split(acc.open[0], 66.0, 40)
    assert lost == 10 and buckets["lost"] == pytest.approx(62.0 - (35.0 + 27.0 * 9 / 19))
    assert last_step(Accounting(), 1, 49, 62.0) == Accounting()  # no attempt: nothing to raise
    bare = attempt_created(Accounting(), 1, 0.0)
    assert last_step(bare, 1, 49, 62.0) == bare  # never reported its first step: nothing to raise


def test_a_late_last_step_of_a_closed_attempt_is_ignored_not_counted_twice() -> None:
    from reprieve_operator.policy.goodput import fold

    acc = progress(attempt_created(Accounting(), 1, 0.0), rep(1, 0, 5.0, 49, 54.0))
    acc = progress(attempt_created(acc, 2, 60.0), rep(2, 40, 70.0, 41, 71.0))
    assert acc.lost_steps == 10 and [a.attempt for a in acc.open] == [2]
    assert fold(acc.to_status(), now=80.0, last_steps=[(1, 55, 58.0)]) is None
    # in one reconcile: attempt 1's last step, then attempt 2's first report (the last step folds first)
    acc = progress(attempt_created(Accounting(), 1, 0.0), rep(1, 0, 5.0, 30, 35.0))
    acc = attempt_created(acc, 2, 60.0)
    both = fold(acc.to_status(), now=80.0, report=rep(2, 40, 70.0, 41, 71.0), last_steps=[(1, 49, 54.0)])
    assert both is not None and both.lost_steps == 10


# Issue #46 (6): a double fault replaces an attempt before its first step. Attempt 1 trains steps 0-49 (its last at
# 54 s) and is lost at 60 s; attempt 2 is created at 60 s and lost before it reports; the next attempt that trains
# resumes at step 40. Each fact is (what, attempt, time, report): "created", "report" or "finished".
# (case, facts, lost steps, attempts still open, lost steps per closed attempt)
DOUBLE_FAULTS = [
    ("replaced before its first step: attempt 1 is settled against attempt 3, the first that reported",
     [("created", 2, 60.0, None), ("created", 3, 70.0, None), ("report", 3, 0.0, rep(3, 40, 80.0, 41, 81.0))],
     10, [3], [10, 0]),
    ("replaced twice before a first step: settled against attempt 4",
     [("created", 2, 60.0, None), ("created", 3, 70.0, None), ("created", 4, 75.0, None),
      ("report", 4, 0.0, rep(4, 40, 85.0, 41, 86.0))], 10, [4], [10, 0, 0]),
    ("attempt 3 has not reported yet: attempts 1 and 2 stay open (their lost steps are not known)",
     [("created", 2, 60.0, None), ("created", 3, 70.0, None)], 0, [1, 2, 3], []),
    ("the job ends after the double fault: the same lost steps, every second in one bucket",
     [("created", 2, 60.0, None), ("created", 3, 70.0, None), ("report", 3, 0.0, rep(3, 40, 80.0, 99, 139.0)),
      ("finished", 0, 140.0, None)], 10, [], [10, 0, 0]),
    ("the job ends before any later attempt reported: nothing is known lost",
     [("created", 2, 60.0, None), ("finished", 0, 65.0, None)], 0, [], [0, 0]),
]


@pytest.mark.parametrize("facts,lost_steps,still_open,per_attempt", [r[1:] for r in DOUBLE_FAULTS],
                         ids=[r[0] for r in DOUBLE_FAULTS])
def test_an_attempt_replaced_before_its_first_step_does_not_hide_the_lost_steps_before_it(
        facts: list[tuple[str, int, float, Report | None]], lost_steps: int, still_open: list[int],
        per_attempt: list[int]) -> None:
    acc = progress(attempt_created(Accounting(), 1, 0.0), rep(1, 0, 5.0, 49, 54.0))
    for what, attempt, t, report in facts:
        if what == "created":
            acc = attempt_created(acc, attempt, t)
        elif what == "report":
            assert report is not None
            acc = progress(acc, report)
        else:
            acc = finished(acc, t)
    assert acc.lost_steps == lost_steps and [a.attempt for a in acc.open] == still_open, acc
    assert [dict(h)["lostSteps"] for h in acc.history] == per_attempt
    if per_attempt:  # attempt 1 closed: its steps 40-49 (10 s) lost, 0-39 kept; attempt 2 all start-up
        assert acc.closed["lost"] == pytest.approx(10.0 if lost_steps else 0.0)
        assert acc.closed["productive"] >= 40.0 - 1e-9
    if not still_open:
        assert sum(acc.closed.values()) == pytest.approx(facts[-1][2])


# Issue #47 (5): an elastic job's degraded time. desired 4 workers; each attempt is (attempt, created, workers,
# report); the job ends at the last time. The base case: attempt 1 on 4 workers trains steps 0-49 at 1 s a step
# (its last at 54 s) and loses a node without notice; attempt 2 shrinks to 3 workers at 60 s, restores step 44 from
# the memory tier (steps 45-49 lost at the shrink) and trains steps 45-124 at 1.25 s a step (the same global
# batch on 3 of 4 workers); attempt 3 grows back to 4 at 165 s from the agreed step 124 and trains 125-199 at 1 s.
A1 = (1, 0.0, 4, rep(1, 0, 5.0, 49, 54.0))
A2 = (2, 60.0, 3, rep(2, 45, 64.25, 124, 163.0, step_s=1.25, restore=1.0))
A3 = (3, 165.0, 4, rep(3, 125, 168.0, 199, 242.0, restore=0.5))
# (case, attempts, end, lost steps, productive seconds, status.goodput.degraded)
DEGRADED = [
    ("shrank at a loss and grew back: degraded 100 s, 80 steps at 0.8 of full size's steps per second",
     [A1, A2, A3], 243.0, 5, 45.0 + 100.0 + 75.0,
     {"seconds": 100.0, "steps": 80, "stepsPerSecond": 0.8, "fullSizeStepsPerSecond": 1.0, "throughputRatio": 0.8,
      "workersRatio": 0.75, "attempts": 1}),
    ("still shrunk (running): provisional, against the full size before the shrink",
     [A1, A2], 163.0, 5, 45.0 + 100.0,
     {"seconds": 100.0, "steps": 80, "stepsPerSecond": 0.8, "fullSizeStepsPerSecond": 1.0, "throughputRatio": 0.8,
      "workersRatio": 0.75, "attempts": 1}),
    # a second loss while degraded: 3 -> 2 workers at 2 s a step (steps 85-124 redone: 0 lost, agreed at 84)
    ("shrank twice, 4 -> 3 -> 2, then grew: one figure over both sizes, workers weighted by time",
     [A1, (2, 60.0, 3, rep(2, 45, 64.25, 84, 113.0, step_s=1.25, restore=1.0)),
      (3, 115.0, 2, rep(3, 85, 119.0, 124, 197.0, step_s=2.0)), (4, 199.0, 4, rep(4, 125, 202.0, 199, 276.0))],
     277.0, 5, 45.0 + 50.0 + 80.0 + 75.0,
     {"seconds": 130.0, "steps": 80, "stepsPerSecond": round(80 / 130, 6), "fullSizeStepsPerSecond": 1.0,
      "throughputRatio": round(80 / 130, 4), "workersRatio": round((50 * 0.75 + 80 * 0.5) / 130, 4),
      "attempts": 2}),
    # a hard kill while shrunk: attempt 2's steps 115-124 are redone by attempt 3 (memory copy of 114)
    ("a loss while shrunk: the degraded steps redone are lost, not degraded",
     [A1, A2, (3, 165.0, 3, rep(3, 115, 169.25, 124, 180.5, step_s=1.25))], 182.0, 5 + 10, 45.0 + 87.5 + 12.5,
     {"seconds": 100.0, "steps": 80, "stepsPerSecond": 0.8, "fullSizeStepsPerSecond": 1.0, "throughputRatio": 0.8,
      "workersRatio": 0.75, "attempts": 2}),
    ("never shrank (sizes recorded, all full size): no degraded figures", [A1, (2, 60.0, 4, A2[3]), A3], 243.0, 5,
     45.0 + 100.0 + 75.0, None),
    ("sizes not recorded (an operator before the wiring): no degraded figures",
     [(1, 0.0, None, A1[3]), (2, 60.0, None, A2[3]), (3, 165.0, None, A3[3])], 243.0, 5, 45.0 + 100.0 + 75.0, None),
    ("the size is recorded from the shrink on: degraded, no full-size figure to compare with",
     [(1, 0.0, None, A1[3]), A2, A3[:2] + (None, A3[3])], 243.0, 5, 45.0 + 100.0 + 75.0,
     {"seconds": 100.0, "steps": 80, "stepsPerSecond": 0.8, "fullSizeStepsPerSecond": None, "throughputRatio": None,
      "workersRatio": 0.75, "attempts": 1}),
]


@pytest.mark.parametrize("attempts,end,lost_steps,productive,degraded", [r[1:] for r in DEGRADED],
                         ids=[r[0] for r in DEGRADED])
def test_degraded_time_is_productive_at_reduced_throughput(
        attempts: list[tuple[int, float, int | None, Report]], end: float, lost_steps: int, productive: float,
        degraded: dict[str, object] | None) -> None:
    from reprieve_operator.policy.goodput import fold, status

    raw = None
    for attempt, created, workers, report in attempts:
        acc = fold(raw, now=created, new_attempt=attempt, workers=workers, desired=4)
        assert acc is not None
        acc = fold(acc.to_status(), now=report.time, report=report)
        assert acc is not None
        raw = acc.to_status()
    running = status(Accounting.from_status(raw), end)  # the last attempt counted up to its report
    assert running.get("degraded") == degraded
    done = fold(raw, now=end, ended=True)
    assert done is not None and done.lost_steps == lost_steps
    assert sum(done.closed.values()) == pytest.approx(end)  # degraded time adds no second: a part of productive
    assert done.closed["productive"] == pytest.approx(productive)
    s = status(done, end)
    assert s.get("degraded") == degraded and s["productiveSeconds"] == pytest.approx(productive)
    assert s["goodput"] == pytest.approx(productive / end, abs=1e-4)
    hist = [dict(h) for h in done.history]
    assert [h.get("workers") for h in hist] == [a[2] for a in attempts]
    assert all(h.get("desired") == (4 if h.get("workers") else None) for h in hist)


def test_a_job_without_recorded_sizes_keeps_the_accounting_it_had() -> None:
    """Nothing new in status.goodput or its bookkeeping for a job whose attempts carry no size (every job before
    the elastic wiring): no ``degraded``, no ``throughput``, no ``workers`` on the attempts."""
    from reprieve_operator.policy.goodput import fold, status

    acc = fold(None, now=0.0, new_attempt=1)
    assert acc is not None
    acc = progress(attempt_created(progress(acc, rep(1, 0, 5.0, 49, 54.0)), 2, 60.0), rep(2, 45, 70.0, 99, 124.0))
    done = finished(acc, 125.0)
    for a in (acc, done):
        raw = a.to_status()
        assert "throughput" not in raw and "degraded" not in status(a, 125.0)
        assert not [x for x in [*raw["open"], *raw["history"]] if {"workers", "desired"} & set(x)]


def test_attempt_sizes_and_the_throughput_tally_survive_the_status_round_trip() -> None:
    acc = attempt_created(Accounting(), 1, 0.0, workers=4, desired=4)
    acc = progress(acc, A1[3])
    acc = progress(attempt_created(acc, 2, 60.0, workers=3, desired=4), A2[3])
    assert (acc.open[0].workers, acc.open[0].desired) == (3, 4) and acc.throughput.full.steps == 45
    again = Accounting.from_status(acc.to_status())
    assert again == acc
    raw = acc.to_status()
    # the keys statuses already hold: a job's accounting written before an operator upgrade reads the same after
    assert raw["throughput"] == {"fullSeconds": 45.0, "fullSteps": 45, "degradedSeconds": 0.0, "degradedSteps": 0,
                                 "degradedCapacity": 0.0, "degradedAttempts": 0}
    raw["open"][0]["workers"] = "three"  # malformed: the size is not known, the accounting goes on
    assert Accounting.from_status(raw).open[0].workers is None
