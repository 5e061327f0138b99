"""The agreement protocol with N in-process participants over one in-memory KV store (fast, no JAX).

The real coordination service is exercised by test_agreement_multiprocess.py; here many skews and timings
are cheap to try, so the safety property (every participant saves the same final step, none has passed it)
is checked over many randomized runs.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time

import pytest
from localcluster.testing import wait_for
from reprieve.agreement import EARLY, FINAL, Agreement, AgreementError
from reprieve.coordination import LocalCoordinator
from reprieve.countdown import CountdownSettings
from reprieve.notice import Notice

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class _SlowView(LocalCoordinator):
    """A view that takes an RPC's time (1-3 ms) per write, as the coordination service does.

    ``claims`` records every attempted claim as ``(key, notice id)`` (shared by the views of one store):
    :meth:`Agreement.offer` claims synchronously, so a notice that should have been dropped is in it by the
    time ``offer`` returns, whatever the watcher thread has done since."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: list[tuple[str, str | None]] = []

    def set(self, key: str, value: str, *, overwrite: bool = False) -> None:
        time.sleep(random.uniform(0.001, 0.003))
        super().set(key, value, overwrite=overwrite)

    def claim(self, key: str, value: str) -> bool:
        record = json.loads(value)
        self.claims.append((key, json.loads(record["notice"])["id"] if "notice" in record else None))
        time.sleep(random.uniform(0.001, 0.003))
        return super().claim(key, value)


def shared_coordinators(n: int) -> list[_SlowView]:
    """``n`` views of one in-memory store, one per process id."""
    base = LocalCoordinator()
    claims: list[tuple[str, str | None]] = []
    views: list[_SlowView] = []
    for pid in range(n):
        view = _SlowView()
        view._kv, view._cond = base._kv, base._cond  # one store, like one coordination service
        view.claims = claims
        view.process_id, view.num_processes = pid, n
        views.append(view)
    return views


def agreements(n: int, **kwargs: object) -> list[Agreement]:
    return [Agreement(c, poll_s=0.05, timeout_s=5.0, **kwargs).start()  # type: ignore[arg-type]
            for c in shared_coordinators(n)]


def claimed(agreement: Agreement) -> list[str | None]:
    """The notice ids of every claim attempted in ``agreement``'s store, in order."""
    return [nid for _, nid in agreement.coordinator.claims]  # type: ignore[attr-defined]


def logged(caplog: pytest.LogCaptureFixture, text: str) -> int:
    """How many captured records contain ``text``."""
    return sum(text in r.getMessage() for r in caplog.records)


def notice(nid: str, seconds: float, *, reason: str = "test") -> Notice:
    now = time.time()
    return Notice(id=nid, source="test", reason=reason, deadline=now + seconds, received_at=now)


def wait_target(agreement: Agreement, round_: int = 0, timeout: float = 5.0) -> None:
    limit = time.monotonic() + timeout
    while agreement.target is None or agreement.target.round < round_:
        assert time.monotonic() < limit, "no plan"
        time.sleep(0.005)


def test_all_processes_get_the_same_plan_at_max_checked_plus_one() -> None:
    group = agreements(3)
    try:
        for a, upto in zip(group, [5, 3, 4]):
            for step in range(upto + 1):
                assert a.decide(step) is None
        group[1].offer(notice("n1", 0.0))
        for a in group:
            wait_target(a)
        assert {a.target.plan.final_step for a in group} == {6}  # type: ignore[union-attr]
        assert [a.decide(6) for a in group] == [FINAL] * 3
        assert group[0].target.leader == 1  # type: ignore[union-attr]
    finally:
        for a in group:
            a.close()


@pytest.mark.parametrize("quiet", [False, True], ids=["decide", "quiet-then-decide"])
@pytest.mark.parametrize("seed", range(12))
def test_randomized_skew_every_loop_stops_at_the_same_unpassed_step(seed: int, quiet: bool) -> None:
    """Loops running at different speeds (no lockstep at all); notices from random processes at random
    times, sometimes two at once, sometimes a second, earlier one later. Everyone must stop at one step. With
    ``quiet``: each step first asks :meth:`Agreement.quiet` (no lock, as ``Job.idle_step`` does) and calls
    ``decide`` only when it says something is in flight."""
    rng = random.Random(seed)
    n = rng.choice([2, 3, 4])
    settings = CountdownSettings(margin_seconds=0.05, safety_factor=1.0, default_save_seconds=0.01)
    group = agreements(n, countdown=settings)
    stops: dict[int, int] = {}
    decided: dict[int, list[int]] = {p: [] for p in range(n)}
    errors: list[BaseException] = []

    def loop(p: int, delay: float) -> None:
        a = group[p]
        a.report(step_seconds=delay)
        try:
            for step in range(100_000):
                kind = None if quiet and a.quiet(step) else a.decide(step)
                decided[p].append(step)
                if kind == FINAL:
                    stops[p] = step
                    return
                time.sleep(delay * rng.uniform(0.5, 1.5))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=loop, args=(p, rng.uniform(0.0005, 0.004))) for p in range(n)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.01, 0.05))
    first = rng.randrange(n)
    group[first].offer(notice(f"a{seed}", rng.choice([0.0, 0.3])))
    if rng.random() < 0.5:  # a simultaneous notice elsewhere
        group[(first + 1) % n].offer(notice(f"b{seed}", 0.0))
    if rng.random() < 0.5:  # a second, earlier notice a little later
        time.sleep(rng.uniform(0.0, 0.05))
        group[rng.randrange(n)].offer(notice(f"c{seed}", -1.0))
    for t in threads:
        t.join(20)
    for a in group:
        a.close()
    assert not errors, errors
    assert len(stops) == n and len(set(stops.values())) == 1, stops
    final = stops[0]
    for p in range(n):
        assert decided[p] == list(range(final + 1)), f"process {p} passed the agreed step {final}"


def test_quiet_records_the_step_and_says_when_decide_is_needed() -> None:
    """``quiet`` stores the step the loop decided (the next round acks it) and is True only while nothing is in
    flight: a held notice, a plan, or a save round sends the loop to ``decide``."""
    (a,) = agreements(1, hold_until_loop=True)
    try:
        assert not a.quiet(0)  # a notice may be held until the loop's first decision
        assert a.decide(0) is None and a.quiet(1) and a.quiet(2)
        assert a.request_save("interval")
        wait_for(lambda: not a.quiet(2), 5, "the save round's step to be agreed")  # step 2 again: the ack's
        assert a.decide(3) == "interval" and a.quiet(4)  # the round acked step 2 (recorded by quiet): saves step 3
        a.offer(notice("n1", 0.0))
        wait_target(a)
        assert not a.quiet(5) and a.decide(5) == FINAL
    finally:
        a.close()


def test_simultaneous_notices_one_round_and_the_second_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reprieve.agreement")
    group = agreements(2)
    try:
        a = notice("x", 10.0)
        b = Notice(id="y", source="test", reason="test", deadline=a.deadline, received_at=a.received_at)
        t = [threading.Thread(target=group[0].offer, args=(a,)), threading.Thread(target=group[1].offer, args=(b,))]
        for th in t:
            th.start()
        for th in t:
            th.join()
        for g in group:
            wait_target(g)
        # the loser is re-offered after round 0 (by its watcher) and must not start round 1: wait until that
        # re-offer was decided, then look
        lost = wait_for(lambda: re.search(r"round 0 was already claimed; notice (\w+) re-offered", caplog.text),
                        5, "the losing claim")
        loser = lost.group(1)
        wait_for(lambda: logged(caplog, f"notice {loser} (deadline") == 1, 5, f"the re-offer of {loser}",
                 interval=0.005, describe=lambda: caplog.text)
        assert logged(caplog, "does not move the agreed save") == 1
        assert sorted(claimed(group[0])) == ["x", "y"]  # one claim each for round 0; no claim for round 1
        assert [g.target.round for g in group] == [0, 0]  # type: ignore[union-attr]
        assert not group[0].coordinator.dir_get("reprieve/1/agree/notice/1")
    finally:
        for g in group:
            g.close()


def test_second_earlier_notice_moves_the_save_earlier_and_keeps_the_first_save() -> None:
    settings = CountdownSettings(margin_seconds=0.5, safety_factor=1.0, default_save_seconds=0.1)
    group = agreements(2, countdown=settings)
    try:
        for g in group:
            g.report(step_seconds=0.01)
            g.decide(0)
        group[0].offer(notice("long", 60.0))
        for g in group:
            wait_target(g)
        first = group[0].target.plan  # type: ignore[union-attr]
        assert first.early_step == 1 and first.final_step > 1000, first
        assert group[0].decide(1) == EARLY  # process 0 saves the first save; process 1 has not got there
        group[1].offer(notice("short", 0.0))
        for g in group:
            wait_target(g, 1)
        plans = {(g.target.plan.final_step, g.target.plan.early_step) for g in group}  # type: ignore[union-attr]
        assert plans == {(2, 1)}, plans
        assert group[1].decide(1) == EARLY and group[1].decide(2) == FINAL
        assert group[0].decide(2) == FINAL
    finally:
        for g in group:
            g.close()


@pytest.mark.parametrize("first,second,words", [
    (("short", 0.0), ("long", 3600.0), ("notice long (deadline", "does not move the agreed save")),
    (("same", 100.0), ("same", 0.0), ("notice same already known; ignored",)),
], ids=["a later notice never moves the save later", "a duplicate notice id is ignored"])
def test_a_second_notice_that_cannot_move_the_save_is_not_claimed(
        first: tuple[str, float], second: tuple[str, float], words: tuple[str, ...],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="reprieve.agreement")
    (agreement,) = agreements(1)
    try:
        agreement.offer(notice(*first))
        wait_target(agreement)
        agreement.offer(notice(*second))  # decided synchronously: a claim would be made in offer()
        assert claimed(agreement) == [first[0]]
        assert sum(all(w in r.getMessage() for w in words) for r in caplog.records) == 1, caplog.text
        assert agreement.target.round == 0  # type: ignore[union-attr]
    finally:
        agreement.close()


def test_a_missing_process_fails_the_round_naming_it() -> None:
    coordinators = shared_coordinators(3)
    present = [Agreement(c, poll_s=0.05, timeout_s=0.3).start() for c in coordinators[:2]]  # process 2 absent
    try:
        present[0].decide(3)
        present[0].offer(notice("n", 0.0))
        with pytest.raises(AgreementError, match=r"processes \[2\] did not ack"):
            limit = time.monotonic() + 5
            while time.monotonic() < limit:
                present[0].decide(4)
                time.sleep(0.01)
        with pytest.raises(AgreementError, match=r"leader process 0 did not publish|\[2\]"):
            while time.monotonic() < limit:
                present[1].decide(4)
                time.sleep(0.01)
    finally:
        for a in present:
            a.close()


def test_malformed_notice_after_a_long_one_brings_the_save_forward() -> None:
    group = agreements(1)
    try:
        group[0].report(step_seconds=0.01)
        group[0].decide(0)
        group[0].offer(notice("long", 600.0))
        wait_target(group[0])
        assert group[0].target.plan.final_step > 100  # type: ignore[union-attr]
        now = time.time()
        group[0].offer(Notice(id="malformed/1", source="annotation", reason="malformed", deadline=now,
                              received_at=now, deadline_known=False))
        wait_target(group[0], 1)
        target = group[0].target
        assert target is not None and target.plan.final_step == 1
        assert target.deadline_known and target.deadline > now + 500  # the exit code still uses the real one
    finally:
        group[0].close()


def test_a_failed_publish_is_retried() -> None:
    from reprieve.coordination import CoordinationError

    class Flaky(_SlowView):
        failures = 2

        def claim(self, key: str, value: str) -> bool:
            if Flaky.failures:
                Flaky.failures -= 1
                raise CoordinationError("UNAVAILABLE: coordination service restarting")
            return super().claim(key, value)

    view = Flaky()
    view.process_id, view.num_processes = 0, 1
    agreement = Agreement(view, poll_s=0.05, timeout_s=5.0).start()
    try:
        agreement.offer(notice("n", 0.0))
        wait_target(agreement)
        assert Flaky.failures == 0 and agreement.target.notice.id == "n"  # type: ignore[union-attr]
    finally:
        agreement.close()


def test_steps_that_slow_after_the_plan_move_the_save_earlier_once_per_plan(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reprieve.agreement")
    settings = CountdownSettings(margin_seconds=1.0, safety_factor=1.0, default_save_seconds=0.1, save_at_once=False)
    group = agreements(2, countdown=settings)
    try:
        for g in group:
            g.report(step_seconds=0.01, save_seconds=0.1)
            g.decide(0)
        group[0].offer(notice("spot", 10.0))
        for g in group:
            wait_target(g)
        first = group[0].target.plan  # type: ignore[union-attr]
        assert first.final_step > 500, first  # ~9 s of 10 ms steps
        # process 1's steps now take 0.1 s: the planned step is ~90 s away, far past the deadline
        group[1].report(step_seconds=0.1)
        assert group[1].decide(1) is None
        for g in group:
            wait_target(g, 1)
        second = {g.target.plan.final_step for g in group}  # type: ignore[union-attr]
        assert len(second) == 1 and 2 <= second.pop() < first.final_step / 5, (first, second)
        assert group[1].target.notice.source == "replan"  # type: ignore[union-attr]
        # on pace with the new plan: no further round. decide() asks for a re-plan synchronously (a warning,
        # then the watcher claims it), so one warning in all, from step 1, says no second one was asked for
        assert group[1].decide(2) is None and group[0].decide(2) is None
        asks = [r.getMessage() for r in caplog.records if "asking to plan again" in r.getMessage()]
        assert len(asks) == 1 and asks[0].startswith("process 1: at step 1,"), asks
        assert group[0].target.round == 1  # type: ignore[union-attr]
    finally:
        for g in group:
            g.close()


def test_a_re_plan_of_a_superseded_plan_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reprieve.agreement")
    settings = CountdownSettings(margin_seconds=1.0, safety_factor=1.0, default_save_seconds=0.1, save_at_once=False)
    group = agreements(1, countdown=settings)
    try:
        group[0].report(step_seconds=0.01, save_seconds=0.1)
        group[0].decide(0)
        group[0].offer(notice("long", 30.0))
        wait_target(group[0])
        group[0].offer(notice("short", 10.0))
        wait_target(group[0], 1)
        stale = Notice(id="replan/0/long", source="replan", reason="test", deadline=time.time() + 30.0,
                       received_at=time.time())
        group[0].offer(stale)  # decided synchronously: a claim would be made in offer()
        assert logged(caplog, "re-plan replan/0/long: the plan changed since; ignored") == 1
        assert "replan/0/long" not in claimed(group[0])
        assert group[0].target.round == 1 and group[0].target.notice.id == "short"  # type: ignore[union-attr]
    finally:
        group[0].close()


def test_a_notice_before_the_loop_begins_is_held_and_planned_from_the_first_step(
        caplog: pytest.LogCaptureFixture) -> None:
    """A restarted process learns of a notice during its restore: nothing can be saved before its loop's first
    step, so it claims no round until then; the plan then starts at the first step, with the step time the
    restore seeded (a plan made at once would have had neither)."""
    caplog.set_level(logging.INFO, logger="reprieve.agreement")
    group = agreements(2, hold_until_loop=True)
    try:
        group[0].offer(notice("n1", 60.0))  # decided synchronously: a claim would be made in offer()
        assert [n.id for n in group[0]._held] == ["n1"] and logged(caplog, "notice n1 held until") == 1
        assert claimed(group[0]) == [] and not group[0].coordinator.dir_get("reprieve/1/agree/notice/")
        assert all(a.target is None for a in group)  # held: no round was claimed
        group[1].report(step_seconds=0.1, save_seconds=0.2)  # what Job.restore_or seeds
        group[1].begin(40)
        group[0].report(step_seconds=0.1, save_seconds=0.2)
        group[0].begin(40)  # offers the held notice: one round, led by process 0
        for a in group:
            wait_target(a)
        plan = group[0].target.plan  # type: ignore[union-attr]
        assert group[1].target.plan == plan  # type: ignore[union-attr]
        assert plan.early_step == 40 and plan.final_step > 300, plan  # trains on: 60 s left at 0.1 s a step
    finally:
        for a in group:
            a.close()


def test_a_loop_without_job_steps_releases_held_notices_at_its_first_decision(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="reprieve.agreement")
    (agreement,) = agreements(1, hold_until_loop=True)
    try:
        agreement.offer(notice("n1", 0.0))  # decided synchronously: a claim would be made in offer()
        assert [n.id for n in agreement._held] == ["n1"] and claimed(agreement) == []
        assert agreement.target is None
        assert agreement.decide(7) is None  # offers the held notice: the plan is the next step
        wait_target(agreement)
        assert agreement.target.plan.final_step == 8  # type: ignore[union-attr]
        agreement.offer(notice("n1", 0.0))  # already known once offered: not held again, not a new round
        assert logged(caplog, "notice n1 already known; ignored") == 1
        assert claimed(agreement) == ["n1"] and agreement._held == []
        assert agreement.target.round == 0  # type: ignore[union-attr]
    finally:
        agreement.close()


def wait_save_round(group: list[Agreement]) -> None:
    limit = time.monotonic() + 5.0
    while group[0]._save_requested or any(a._gate is not None for a in group):
        assert time.monotonic() < limit, "the save round did not finish"
        time.sleep(0.005)


def test_a_save_round_at_the_last_step_installs_no_save_past_it() -> None:
    """The interval asks for a save while every loop is at the job's last step (saved anyway): the round's step,
    one past the end, is never reached, so no process agrees to save it and a later request is not blocked."""
    group = agreements(2)
    try:
        for a in group:
            a.begin(0, last_step=9)
            for step in range(10):
                assert a.decide(step) is None
        assert group[0].request_save("interval")
        wait_save_round(group)
        assert all(not a._saves for a in group)
        assert group[0].request_save("interval")  # the finished round freed the request
    finally:
        for a in group:
            a.close()


def test_one_interval_request_is_one_save_and_a_loop_past_its_step_still_saves() -> None:
    """A request agreed on a step not reached yet blocks the next request (the interval's clock restarts only
    when that save starts: asking again meanwhile saved two steps in a row, seen in CI); a loop that decides only
    every few steps passes the agreed step and saves at its next decision, on every process alike."""
    group = agreements(2)
    try:
        for a in group:
            a.begin(0, last_step=99)
            assert a.decide(0) is None
        assert group[0].request_save("interval")
        wait_save_round(group)
        assert [sorted(a._saves) for a in group] == [[1], [1]]
        assert not group[0].request_save("interval")  # the agreed step 1 is not reached: no second round
        assert group[0]._next_round == 1
        assert [a.decide(3) for a in group] == ["interval", "interval"]  # steps 1 and 2 were never decided
        assert [a.decide(4) for a in group] == [None, None]
        assert group[0].request_save("interval")
    finally:
        for a in group:
            a.close()


def test_a_notice_whose_round_ends_while_it_claims_is_offered_again_at_once() -> None:
    """``offer`` reads the next round, then claims it outside the lock. If that round is claimed by someone else
    and ends before the claim returns, the watcher has already re-offered what was pending: the notice must be
    offered again by ``offer`` itself, or it is never agreed on (a shorter deadline ignored; seen under load)."""
    settings = CountdownSettings(margin_seconds=1.0, safety_factor=1.0, default_save_seconds=0.1, save_at_once=False)
    a = agreements(1, countdown=settings)[0]
    try:
        a.report(step_seconds=0.01, save_seconds=0.1)
        a.decide(0)
        a.offer(notice("long", 30.0))
        wait_target(a)
        limit = time.monotonic() + 10
        while a._next_round < 1:  # the watcher has ended round 0 and re-offered what was pending
            assert time.monotonic() < limit
            time.sleep(0.005)
        real_claim = a.coordinator.claim

        def claim_after_the_round_ended(key: str, value: str) -> bool:
            with a._cond:
                a._next_round = 1  # what the watcher did while this claim was on its way
            return real_claim(key, value)

        with a._cond:
            a._next_round = 0  # offer reads round 0: it had not ended yet
        a.coordinator.claim = claim_after_the_round_ended  # type: ignore[method-assign]
        a.offer(notice("short", 10.0))
        wait_target(a, 1, timeout=10)
        assert a.target.notice.id == "short"  # type: ignore[union-attr]
    finally:
        a.close()


def test_the_nodes_of_the_notices_offered_to_a_process_are_recorded_for_its_exit() -> None:
    """``noticed_nodes``: what the memory tier's exit asks (memtier.decide.exit_wait): every notice offered to this
    process counts, the one that moved no plan too (a second node's); one that names no node is None (unknown)."""
    from dataclasses import replace

    group = agreements(2)
    try:
        for a in group:
            assert a.decide(3) is None
        group[1].offer(replace(notice("n1", 30.0), node="node-b"))
        group[1].offer(replace(notice("n2", 30.0), node="node-c"))  # a second node: may add nothing to the plan
        group[1].offer(notice("sigterm", 30.0))  # names no node
        assert group[1].noticed_nodes == {"node-b", "node-c", None}
        assert group[0].noticed_nodes == frozenset()  # offered to process 1 only
    finally:
        for a in group:
            a.close()
