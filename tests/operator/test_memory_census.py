"""memory.census: the live objects by type and the dicts by their keys (the diagnosis aid behind
``REPRIEVE_MEMORY_CENSUS=1``)."""

from __future__ import annotations

import logging

import pytest
from reprieve_operator import memory

pytestmark = pytest.mark.unit


def test_census_names_the_dicts_that_hold_the_memory_by_their_keys() -> None:
    held = [{"podname": i, "podnode": "n", "podphase": "Running"} for i in range(50000)]
    types, dicts = memory.census()
    assert types[0][0] == "dict" and types[0][1] >= len(held)
    keys, count, size = dicts[0]
    assert (keys, count) == ("podname,podnode,podphase", len(held)) and size > 0


def test_census_is_logged_only_when_asked(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "reprieve_operator")
    monkeypatch.delenv(memory.ENV_CENSUS, raising=False)
    memory.log_census()
    assert not caplog.records
    monkeypatch.setenv(memory.ENV_CENSUS, "1")
    memory.log_census()
    assert any("census:" in r.getMessage() and "dicts {" in r.getMessage() for r in caplog.records)
