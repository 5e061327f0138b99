"""Time as the operator's owners read it: the wall clock, the monotonic clock, timers and sleeps on the event
loop. The owners take a ``Clock``; their unit tests pass a fake one they move by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clocks; timers run on the running event loop."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, fn)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM = SystemClock()
