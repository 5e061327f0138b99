"""What a pre-warmed process imports before it parks (reprieve.prewarm): the table, and that every name is real."""

from __future__ import annotations

import gc
import importlib.util
import weakref

import pytest
from reprieve import exiting, prewarm

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.mark.parametrize(("environ", "memory"), [
    ({}, False),
    ({"REPRIEVE_MEMORY_DIR": "/dev/shm/reprieve"}, True),
    ({"REPRIEVE_MEMORY_DIR": ""}, False),  # set but empty: the tier is off (MemoryConfig reads it the same way)
])
def test_the_memory_tiers_modules_only_for_a_job_with_the_tier(environ: dict[str, str], memory: bool) -> None:
    want = prewarm.LAZY_MODULES + (prewarm.MEMORY_TIER_MODULES if memory else ())
    assert prewarm.modules_for(environ) == want


def test_every_module_named_exists() -> None:
    # a renamed module would make the head start a silent no-op (prepare logs import failures at debug only)
    missing = [m for m in prewarm.LAZY_MODULES + prewarm.MEMORY_TIER_MODULES if importlib.util.find_spec(m) is None]
    assert missing == []


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settling_the_heap_collects_the_cycles_then_freezes_what_is_left() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    kept = _Node()
    try:
        prewarm.settle_heap(first=False)
        assert gone() is None  # collected before the freeze, not frozen forever
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # frozen: no pass walks it
        made_after = _Node()
        assert any(o is made_after for o in gc.get_objects())
    finally:
        gc.unfreeze()  # this test process's heap back as it was
        exiting._frozen_files.clear()
        exiting._frozen.clear()
    assert any(o is kept for o in gc.get_objects())


class _Ahead:
    """A head start made at its ``ready``-th attempt."""

    def __init__(self, ready: int) -> None:
        self.done, self.tries, self._ready = False, 0, ready

    def attempt(self) -> None:
        self.tries += 1
        self.done = self.tries >= self._ready


@pytest.mark.unit
def test_a_waiting_warm_process_checks_its_memory_every_call_and_retries_its_head_starts_every_poll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now, checks, settled = [0.0], [], []
    monkeypatch.setattr(prewarm, "settle_heap", lambda first, collect=True: settled.append(first))
    trace, made = _Ahead(ready=2), _Ahead(ready=1)
    made.done = True  # made before the wait: not retried
    waiting = prewarm.WhileWaiting([trace, None, made], 5.0, clock=lambda: now[0], check=lambda: checks.append(1) or 0)
    for t in (1.0, 2.0, 4.9):
        now[0] = t
        waiting()
    assert len(checks) == 3 and trace.tries == 0 and made.tries == 0  # the memory each call; no retry before 5 s
    now[0] = 5.0
    waiting()
    assert trace.tries == 1 and not trace.done and settled == []
    now[0] = 7.0
    waiting()
    assert trace.tries == 1  # the next poll is 5 s after the last
    now[0] = 10.0
    waiting()
    assert trace.done and settled == [False] and len(checks) == 6  # made: the heap settled again, once
    now[0] = 20.0
    waiting()
    assert trace.tries == 2 and settled == [False] and len(checks) == 7  # nothing left to retry; the memory still
