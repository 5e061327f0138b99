"""``state.BatchLane``: a notice burst's per-pod writes queued as a tuple each, run on threads of the lane's own."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import tracemalloc

import pytest
from reprieve_operator.state import BatchLane

pytestmark = pytest.mark.unit


def test_a_batch_runs_on_at_most_the_lanes_threads_and_returns_in_order() -> None:
    lane = BatchLane(3, "test-lane", idle_s=0.05)
    lock, now, most = threading.Lock(), [0], [0]

    def call(i: int) -> int:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.01)
        with lock:
            now[0] -= 1
        return i * i

    async def two_batches() -> tuple[list[int], list[int]]:
        a = lane.gather([functools.partial(call, i) for i in range(10)])
        b = lane.gather([functools.partial(call, i) for i in range(10, 14)])
        return tuple(await asyncio.gather(a, b))  # type: ignore[return-value]

    first, second = asyncio.run(two_batches())
    assert first == [i * i for i in range(10)] and second == [i * i for i in range(10, 14)]
    assert most[0] == 3  # both batches' 14 calls shared the lane's 3 threads
    deadline = time.monotonic() + 5
    while lane.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lane.running == 0  # idle threads end
    assert asyncio.run(lane.gather([lambda: "again"])) == ["again"]  # and start again for the next batch
    assert asyncio.run(lane.gather([])) == []


def test_the_first_error_is_raised_after_every_call_of_the_batch_ran() -> None:
    lane = BatchLane(2, "test-lane")
    ran: list[int] = []

    def call(i: int) -> int:
        time.sleep(0.01)
        ran.append(i)
        if i == 1:
            raise ValueError("refused: pod 1")
        return i

    with pytest.raises(ValueError, match="refused: pod 1"):
        asyncio.run(lane.gather([functools.partial(call, i) for i in range(6)]))
    assert sorted(ran) == list(range(6))


def test_queued_calls_hold_a_tuple_each_not_a_future_each() -> None:
    """A burst of 23,000 per-pod writes held ~3.2 KB each as executor and asyncio futures; queued here, < 0.5 KB."""
    lane = BatchLane(2, "test-lane")
    release = threading.Event()
    n = 5000

    async def burst() -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            jobs = [asyncio.ensure_future(lane.gather([functools.partial(release.wait, 10) for _ in range(20)]))
                    for _ in range(n // 20)]
            await asyncio.sleep(0.2)  # every batch queued
            held = (tracemalloc.get_traced_memory()[0] - before) / n
        finally:
            tracemalloc.stop()
            release.set()
        await asyncio.gather(*jobs)
        return held

    held = asyncio.run(burst())
    assert held < 500, f"{held:.0f} B a queued call"


def test_the_per_pod_lane_yields_to_the_objects_lane_for_at_most_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst's one write per job goes before the fallback's 20 a job (the API server serves the writes that
    tell a whole job first), but a slow object write holds a pod write back for at most ``YIELD_SECONDS``."""
    from reprieve_operator import state

    objects = BatchLane(1, "test-objects")
    pods = BatchLane(4, "test-pods", yield_to=objects)
    log: list[tuple[str, float]] = []

    def write(kind: str, seconds: float) -> None:
        time.sleep(seconds)
        log.append((kind, time.monotonic()))

    async def burst(object_s: float) -> None:
        first = objects.gather([functools.partial(write, "object", object_s) for _ in range(3)])
        await asyncio.sleep(0.02)  # the objects' writes are queued first
        await asyncio.gather(first, pods.gather([functools.partial(write, "pod", 0.0) for _ in range(8)]))

    asyncio.run(burst(0.1))
    last_object = max(t for kind, t in log if kind == "object")
    assert all(t >= last_object for kind, t in log if kind == "pod"), log  # every pod write after the objects'
    assert objects.idle.is_set() and pods.idle.is_set()

    log.clear()
    monkeypatch.setattr(state, "YIELD_SECONDS", 0.2)
    t0 = time.monotonic()
    asyncio.run(burst(0.5))  # 1.5 s of object writes
    first_pod = min(t for kind, t in log if kind == "pod") - t0
    assert first_pod < 1.0, log  # not held back until the objects' 1.5 s were done


def test_calls_queued_first_run_before_every_call_queued_after_them() -> None:
    """The objects pods hear now go before the objects kept for a process that starts later, whenever queued."""
    lane = BatchLane(1, "test-lane")
    gate, took, order = threading.Event(), threading.Event(), []

    def write(name: str) -> None:
        took.set()
        gate.wait(5)
        order.append(name)

    async def burst() -> None:
        later = asyncio.ensure_future(lane.gather([functools.partial(write, f"later-{i}") for i in range(3)],
                                                  first=False))
        while not took.is_set():  # the lane's one thread holds later-0, the rest are queued
            await asyncio.sleep(0.001)
        now = asyncio.ensure_future(lane.gather([functools.partial(write, f"now-{i}") for i in range(2)]))
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(later, now)

    asyncio.run(burst())
    assert order == ["later-0", "now-0", "now-1", "later-1", "later-2"]
