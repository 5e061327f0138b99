"""What a pre-warmed process imports before it parks (reprieve.prewarm): the table, and that every name is real."""

from __future__ import annotations

import importlib.util

import pytest
from reprieve import prewarm

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
