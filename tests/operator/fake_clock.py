"""A clock the operator's owners take (``reprieve_operator.clock.Clock``) that only moves when a test moves it.

``advance(seconds)`` moves both clocks and fires, in order, every timer that falls due (``call_later``) and wakes
every ``sleep`` that ends; a timer cancelled before never fires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

START = datetime(2026, 11, 25, 8, 0, 0, tzinfo=UTC)


@dataclass
class FakeTimer:
    due: float
    fn: Callable[[], None]
    delay: float
    cancelled: bool = False
    fired: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeClock:
    start: datetime = START
    elapsed: float = 0.0
    timers: list[FakeTimer] = field(default_factory=list)
    sleeping: list[tuple[float, asyncio.Future[None]]] = field(default_factory=list)  # (wakes at, waiter)

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed

    def call_later(self, delay: float, fn: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.elapsed + delay, fn, delay)
        self.timers.append(timer)
        return timer

    async def sleep(self, seconds: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleeping.append((self.elapsed + seconds, waiter))
        await waiter

    def pending(self) -> list[FakeTimer]:
        return [t for t in self.timers if not t.cancelled and not t.fired]

    def advance(self, seconds: float) -> None:
        end = self.elapsed + seconds
        while True:
            due = sorted((t for t in self.pending() if t.due <= end), key=lambda t: t.due)
            if not due:
                break
            timer = due[0]
            self.elapsed = max(self.elapsed, timer.due)
            timer.fired = True
            timer.fn()
        self.elapsed = end
        for wakes, waiter in list(self.sleeping):
            if wakes <= end and not waiter.done():
                waiter.set_result(None)
        self.sleeping = [(w, f) for w, f in self.sleeping if not f.done()]


async def until(condition: Callable[[], bool], turns: int = 1000) -> None:
    """Let the event loop run until ``condition()`` holds (it fails the test if it never does)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")
