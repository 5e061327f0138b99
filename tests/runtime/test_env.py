"""reprieve.env: the one reader of REPRIEVE_* variables, and the warning for a misspelt one (table tests)."""

from __future__ import annotations

import logging

import pytest
from reprieve import env as env_mod
from reprieve.env import ConfigError, Env, describe_unknown, unknown_names

pytestmark = pytest.mark.unit


# (set names, expected (name, closest) pairs)
UNKNOWN = [
    (["REPRIEVE_CHECKPOINT_INTERVAL"], [("REPRIEVE_CHECKPOINT_INTERVAL",
                                         ["REPRIEVE_CHECKPOINT_INTERVAL_STEPS", "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS"])]),
    (["REPRIEVE_CHECKPOINT_URL"], [("REPRIEVE_CHECKPOINT_URL", ["REPRIEVE_CHECKPOINT_URI"])]),
    (["REPRIEVE_NUM_PROCESS"], [("REPRIEVE_NUM_PROCESS", ["REPRIEVE_NUM_PROCESSES"])]),
    (["REPREIVE_CHECKPOINT_URI"], [("REPREIVE_CHECKPOINT_URI", ["REPRIEVE_CHECKPOINT_URI"])]),  # a misspelt prefix
    (["REPRIEVE_CHECKPOINT_URI", "REPRIEVE_ATTEMPT", "PATH", "HOME", "REPLICA_COUNT"], []),  # known, or not ours
    (["REPRIEVE_LOG_LEVEL", "REPRIEVE_REQUIRE_REAL_NODES"], []),  # read by the operator or the tests
    (["REPRIEVE_ZZZZZZZZZZZZZZZ"], [("REPRIEVE_ZZZZZZZZZZZZZZZ", [])]),  # nothing close: no guess
]


@pytest.mark.parametrize("names,expected", UNKNOWN)
def test_unknown_names_come_with_the_closest_known_ones(names: list[str], expected: list) -> None:
    assert unknown_names(names) == expected


def test_the_warning_names_the_variable_and_the_guess() -> None:
    line = describe_unknown("REPRIEVE_CHECKPOINT_INTERVAL", ["REPRIEVE_CHECKPOINT_INTERVAL_STEPS"])
    assert line == ("REPRIEVE_CHECKPOINT_INTERVAL is set, but reprieve reads no variable of that name; it is "
                    "ignored: did you mean REPRIEVE_CHECKPOINT_INTERVAL_STEPS?")
    assert "docs/runtime.md" in describe_unknown("REPRIEVE_X", [])


def test_warn_unknown_logs_each_name_once(caplog: pytest.LogCaptureFixture) -> None:
    env_mod._warned.discard("REPRIEVE_CHECKPOINT_INTERVL_STEPS")
    with caplog.at_level(logging.WARNING, logger="reprieve.env"):
        first = env_mod.warn_unknown({"REPRIEVE_CHECKPOINT_INTERVL_STEPS": "5", "REPRIEVE_ATTEMPT": "1"})
        again = env_mod.warn_unknown({"REPRIEVE_CHECKPOINT_INTERVL_STEPS": "5"})
    assert first == [describe_unknown("REPRIEVE_CHECKPOINT_INTERVL_STEPS", ["REPRIEVE_CHECKPOINT_INTERVAL_STEPS"])]
    assert again == []
    assert [r.getMessage() for r in caplog.records] == first


# (variables, call, expected value or error message)
READS = [
    ({}, lambda e: e.integer("REPRIEVE_ATTEMPT", 1, minimum=1), 1),
    ({"REPRIEVE_ATTEMPT": " 3 "}, lambda e: e.integer("REPRIEVE_ATTEMPT", 1, minimum=1), 3),
    ({"REPRIEVE_ATTEMPT": "  "}, lambda e: e.integer("REPRIEVE_ATTEMPT", 1, minimum=1), 1),  # blank is unset
    ({"REPRIEVE_ATTEMPT": "0"}, lambda e: e.integer("REPRIEVE_ATTEMPT", 1, minimum=1),
     "REPRIEVE_ATTEMPT must be >= 1, got '0'"),
    ({"REPRIEVE_ATTEMPT": "x"}, lambda e: e.integer("REPRIEVE_ATTEMPT", 1, minimum=1),
     "REPRIEVE_ATTEMPT must be an integer >= 1, got 'x'"),
    ({"REPRIEVE_RESTART_EXIT_CODE": "126"}, lambda e: e.integer("REPRIEVE_RESTART_EXIT_CODE", 42, minimum=3, maximum=125),
     "REPRIEVE_RESTART_EXIT_CODE must be between 3 and 125, got '126'"),
    ({"REPRIEVE_PREWARM_DELAY_SECONDS": "2.5"}, lambda e: e.number("REPRIEVE_PREWARM_DELAY_SECONDS", 300.0), 2.5),
    ({"REPRIEVE_PREWARM_DELAY_SECONDS": "inf"}, lambda e: e.number("REPRIEVE_PREWARM_DELAY_SECONDS", 300.0),
     "REPRIEVE_PREWARM_DELAY_SECONDS must be a finite number, got 'inf'"),
    ({"REPRIEVE_PREWARM": "true"}, lambda e: e.flag("REPRIEVE_PREWARM", False), True),
    ({"REPRIEVE_PREWARM": "0"}, lambda e: e.flag("REPRIEVE_PREWARM", True), False),
    ({"REPRIEVE_PREWARM": "maybe"}, lambda e: e.flag("REPRIEVE_PREWARM", True), "REPRIEVE_PREWARM must be 1 or 0, got 'maybe'"),
    ({"REPRIEVE_RUN_ID": " seed-2 "}, lambda e: e.opt_text("REPRIEVE_RUN_ID"), "seed-2"),
]


@pytest.mark.parametrize("variables,call,expected", READS)
def test_every_variable_is_read_by_one_rule(variables: dict, call: object, expected: object) -> None:
    reader = Env(variables)
    if isinstance(expected, str) and " must " in expected:
        with pytest.raises(ConfigError) as err:
            call(reader)  # type: ignore[operator]
        assert str(err.value) == expected
    else:
        assert call(reader) == expected  # type: ignore[operator]


def test_a_name_outside_the_table_cannot_be_read() -> None:
    with pytest.raises(KeyError, match="REPRIEVE_CHECKPOINT_INTERVAL is not a variable the runtime reads"):
        Env({}).raw("REPRIEVE_CHECKPOINT_INTERVAL")


def test_the_error_class_is_the_callers() -> None:
    class Mine(ValueError):
        pass

    with pytest.raises(Mine, match="REPRIEVE_ATTEMPT must be an integer"):
        Env({"REPRIEVE_ATTEMPT": "one"}, error=Mine).integer("REPRIEVE_ATTEMPT", 1)
