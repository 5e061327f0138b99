"""workqueue.ReconcileQueue, the owner of when reconciles run, with a fake clock and a recording reconcile."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import kopf
import pytest
from fake_clock import FakeClock, until
from reprieve_operator import metrics
from reprieve_operator.workqueue import ReconcileQueue, fresh_this_round

pytestmark = pytest.mark.unit


class Recorder:
    """The injected reconcile: records (namespace, name, fresh) and how many run at once per job; a run of a job
    named in ``hold`` waits until the test opens ``gate``."""

    def __init__(self, fail: BaseException | None = None, hold: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, str, bool]] = []
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.fail, self.hold = fail, hold
        self.gate = asyncio.Event()

    async def __call__(self, namespace: str, name: str, fresh: bool) -> str:
        self.calls.append((namespace, name, fresh))
        self.running[name] = self.running.get(name, 0) + 1
        self.most[name] = max(self.most.get(name, 0), self.running[name])
        try:
            if name in self.hold:
                await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return f"plan of {name}"
        finally:
            self.running[name] -= 1


def run(test: Coroutine[Any, Any, None]) -> None:
    asyncio.run(test)


def test_a_burst_of_kicks_is_one_run_and_one_follow_up() -> None:
    async def main() -> None:
        rec = Recorder(hold=("llama",))
        queue = ReconcileQueue(rec, FakeClock())
        queue.kick("ml", "llama")
        await until(lambda: len(rec.calls) == 1)
        for _ in range(5):  # pod events while the first run waits
            queue.kick("ml", "llama")
        rec.gate.set()
        await until(lambda: queue.busy == 0)
        assert rec.calls == [("ml", "llama", False)] * 2
    run(main())


def test_fresh_goes_to_the_next_run_only() -> None:
    async def main() -> None:
        rec = Recorder()
        queue = ReconcileQueue(rec, FakeClock())
        queue.kick("ml", "llama", fresh=True)
        await until(lambda: queue.busy == 0)
        queue.kick("ml", "llama")
        await until(lambda: queue.busy == 0)
        assert [c[2] for c in rec.calls] == [True, False]
    run(main())


def test_runs_of_one_job_never_overlap_and_jobs_run_side_by_side() -> None:
    async def main() -> None:
        rec = Recorder(hold=("llama", "gpt"))
        queue = ReconcileQueue(rec, FakeClock())
        runs = [asyncio.ensure_future(queue.run("ml", n)) for n in ("llama", "llama", "gpt")]
        await until(lambda: rec.running.get("llama") == 1 and rec.running.get("gpt") == 1)
        rec.gate.set()
        assert await asyncio.gather(*runs) == ["plan of llama", "plan of llama", "plan of gpt"]
        assert rec.most == {"llama": 1, "gpt": 1} and len(rec.calls) == 3
    run(main())


def test_at_most_slots_reconciles_run_at_once_awaited_by_handlers_or_kicked() -> None:
    """At start every job's kopf handler awaits its reconcile at once: they wait for a slot as kicks do."""
    async def main() -> None:
        names = [f"job{i}" for i in range(6)]
        rec = Recorder(hold=tuple(names))
        queue = ReconcileQueue(rec, FakeClock(), slots=2)
        handlers = [asyncio.ensure_future(queue.run("ml", n)) for n in names[:4]]
        for n in names[4:]:
            queue.kick("ml", n)
        await until(lambda: sum(rec.running.values()) == 2)
        for _ in range(20):
            await asyncio.sleep(0)
        assert sum(rec.running.values()) == 2 and len(rec.calls) == 2
        rec.gate.set()
        assert await asyncio.gather(*handlers) == [f"plan of {n}" for n in names[:4]]
        await until(lambda: queue.busy == 0)
        assert sorted(c[1] for c in rec.calls) == names
    run(main())


def test_the_handler_path_and_a_kick_share_the_job_lock() -> None:
    """Notice delivery takes the same lock: it never annotates pods while a reconcile of the job runs."""
    async def main() -> None:
        rec = Recorder(hold=("llama",))
        queue = ReconcileQueue(rec, FakeClock())
        handler = asyncio.ensure_future(queue.run("ml", "llama"))
        await until(lambda: len(rec.calls) == 1)
        assert queue.lock("ml", "llama").locked() and not queue.lock("ml", "gpt").locked()
        queue.kick("ml", "llama")
        rec.gate.set()
        await handler
        await until(lambda: queue.busy == 0)
        assert len(rec.calls) == 2 and rec.most == {"llama": 1}
    run(main())


def test_a_requeue_replaces_the_one_before() -> None:
    async def main() -> None:
        rec, clock = Recorder(), FakeClock()
        queue = ReconcileQueue(rec, clock)
        queue.requeue("ml", "llama", 30.0)
        queue.requeue("ml", "llama", 10.0)
        first, second = clock.timers
        assert first.cancelled and not second.cancelled and second.delay == 10.0
        clock.advance(10.0)
        await until(lambda: queue.busy == 0 and len(rec.calls) == 1)
        assert clock.pending() == [] and rec.calls == [("ml", "llama", False)]
    run(main())


def test_a_negative_requeue_delay_fires_at_once() -> None:
    async def main() -> None:
        rec, clock = Recorder(), FakeClock()
        queue = ReconcileQueue(rec, clock)
        queue.requeue("ml", "llama", -3.0)
        assert clock.timers[0].delay == 0.0
        clock.advance(0.0)
        await until(lambda: len(rec.calls) == 1)
    run(main())


def test_the_create_backoff_doubles_runs_out_and_clears() -> None:
    clock = FakeClock()
    queue = ReconcileQueue(Recorder(), clock)
    key = ("ml", "llama")
    assert queue.backoff_left(key) is None
    assert queue.backoff_failed(key) == (1, 2.0)
    assert queue.backoff_left(key) == pytest.approx(2.0)
    clock.advance(1.5)
    assert queue.backoff_left(key) == pytest.approx(0.5)
    clock.advance(0.5)
    assert queue.backoff_left(key) is None  # due: the next create may be tried
    assert queue.backoff_failed(key) == (2, 4.0)
    assert queue.backoff_failed(key) == (3, 8.0)
    queue.backoff_clear(key)
    assert queue.backoff_left(key) is None and queue.backoff_failed(key) == (1, 2.0)
    assert queue.backoff_left(("ml", "gpt")) is None  # per job


def test_a_failed_kicked_run_is_counted_and_the_queue_goes_on() -> None:
    async def main() -> None:
        errors = metrics.RECONCILE_ERRORS.labels("pod-event")
        before = errors._value.get()
        rec = Recorder(fail=RuntimeError("API down"))
        queue = ReconcileQueue(rec, FakeClock())
        queue.kick("ml", "llama")
        await until(lambda: queue.busy == 0)
        assert errors._value.get() == before + 1
        rec.fail = kopf.PermanentError("invalid spec")  # on the job's status already: not an error here
        queue.kick("ml", "llama")
        await until(lambda: queue.busy == 0 and len(rec.calls) == 2)
        assert errors._value.get() == before + 1
        rec.fail = None
        queue.kick("ml", "llama")
        await until(lambda: queue.busy == 0 and len(rec.calls) == 3)
    run(main())


def test_a_handler_run_raises_to_its_caller() -> None:
    async def main() -> None:
        queue = ReconcileQueue(Recorder(fail=RuntimeError("API down")), FakeClock())
        with pytest.raises(RuntimeError, match="API down"):
            await queue.run("ml", "llama")
        assert not queue.lock("ml", "llama").locked()
    run(main())


def test_the_resync_kicks_every_job_fresh_spread_over_half_the_interval() -> None:
    async def main() -> None:
        rec, clock = Recorder(), FakeClock()
        queue = ReconcileQueue(rec, clock)
        jobs = [("ml", "a"), ("ml", "b"), ("team", "c"), ("team", "d")]
        rounds: list[float] = []
        task = asyncio.ensure_future(queue.resync(60.0, lambda: jobs, lambda: rounds.append(clock.elapsed)))
        await until(lambda: len(clock.sleeping) == 1)
        assert clock.sleeping[0][0] == 30.0 and rec.calls == []  # the first round starts after half the interval
        clock.advance(30.0)
        await until(lambda: len(rec.calls) == 1)
        assert rounds == [30.0] and rec.calls == [("ml", "a", True)]
        for n in range(1, 4):  # one job every 30 s / 4
            await until(lambda: len(clock.sleeping) == 1)
            assert clock.sleeping[0][0] == pytest.approx(30.0 + 7.5 * n)
            clock.advance(7.5)
            await until(lambda n=n: len(rec.calls) == n + 1)  # type: ignore[misc]
        assert rec.calls == [(ns, name, True) for ns, name in jobs]
        task.cancel()
    run(main())


@pytest.mark.parametrize(("jobs", "budget"), [(4, 150), (150, 150), (151, 150), (1000, 150), (2500, 150), (7, 1)])
def test_the_resyncs_fresh_lists_are_bounded_a_round_and_reach_every_job_in_turn(jobs: int, budget: int) -> None:
    stride = -(-jobs // budget)
    rounds = [[i for i in range(jobs) if fresh_this_round(i, jobs, r, budget)] for r in range(stride)]
    assert all(len(fresh) <= budget for fresh in rounds)  # at most the budget's LISTs a round
    assert sorted(i for fresh in rounds for i in fresh) == list(range(jobs))  # each job once in ``stride`` rounds
    if jobs <= budget:
        assert rounds == [list(range(jobs))]  # every job, every round, as before


def test_the_resync_lists_afresh_at_most_its_budget_a_round_with_many_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    from reprieve_operator import workqueue

    monkeypatch.setattr(workqueue, "FRESH_LISTS_PER_SECOND", 0.1)  # 1 fresh LIST a 10 s round
    async def main() -> None:
        rec, clock = Recorder(), FakeClock()
        queue = ReconcileQueue(rec, clock)
        jobs = [("ml", "a"), ("ml", "b"), ("ml", "c")]
        task = asyncio.ensure_future(queue.resync(20.0, lambda: jobs))
        while len(rec.calls) < 9:  # three rounds of three kicks
            await until(lambda: len(clock.sleeping) == 1)
            clock.advance(clock.sleeping[0][0] - clock.elapsed)
            await asyncio.sleep(0)
        await until(lambda: queue.busy == 0)
        assert [name for _, name, fresh in rec.calls if fresh] == ["a", "b", "c"]  # one a round, each in turn
        task.cancel()
    run(main())


def test_the_resync_survives_a_failing_round() -> None:
    async def main() -> None:
        errors = metrics.RECONCILE_ERRORS.labels("resync")
        before = errors._value.get()
        rec, clock = Recorder(), FakeClock()
        queue = ReconcileQueue(rec, clock)
        answers: list[Any] = [RuntimeError("cache broken"), [("ml", "a")]]

        def keys() -> list[tuple[str, str]]:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer  # type: ignore[no-any-return]

        task = asyncio.ensure_future(queue.resync(10.0, keys))
        for _ in range(2):
            await until(lambda: len(clock.sleeping) == 1)
            clock.advance(5.0)
        await until(lambda: len(rec.calls) == 1)
        assert errors._value.get() == before + 1 and not task.done()
        task.cancel()
    run(main())
