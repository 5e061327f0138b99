"""The job's lifecycle as data: the exit-code decision (a table), the teardown table, the phases; and the
data-position rule for a changed process count. Pure: no processes, no files."""

from __future__ import annotations

from typing import Any

import pytest
from reprieve.data import DataPositionError, decode, encode, to_json_value, value_for_process
from reprieve.lifecycle import ABANDON, ABORT, FINISH, RESTART, TEARDOWNS, Phase, exit_decision
from reprieve.policy import SavePolicy, time_save_due

pytestmark = pytest.mark.unit

# (committed, now, deadline, last_step, expected code, words in the reason)
EXITS = [
    (True, 100.0, 130.0, False, 42, "restart"),
    (True, 100.0, None, False, 42, "restart"),  # deadline unknown (malformed notice): never late
    # committed late: still saved (the checkpoint is whole), said in the reason
    (True, 131.0, 130.0, False, 42, "restart wanted; committed 1.0s AFTER the deadline"),
    (True, 131.0, 130.0, True, None, "training finished; committed 1.0s AFTER the deadline"),
    (True, 100.0, 130.0, True, None, "training finished"),  # in time on the last step: finish, exit 0
    (True, 100.0, None, True, None, "training finished"),
    (False, 100.0, 130.0, False, 1, "not committed"),
    (False, 100.0, None, True, 1, "not committed"),
]


@pytest.mark.parametrize("committed,now,deadline,last_step,code,reason", EXITS)
def test_exit_decision(committed: bool, now: float, deadline: float | None, last_step: bool, code: int | None,
                       reason: str) -> None:
    decision = exit_decision(committed=committed, now=now, deadline=deadline, restart_code=42, last_step=last_step)
    assert decision.code == code and reason in decision.reason


def test_exit_decision_uses_the_configured_restart_code() -> None:
    assert exit_decision(committed=True, now=0, deadline=1, restart_code=77, last_step=False).code == 77


def test_teardown_table() -> None:
    assert TEARDOWNS == {"finish": FINISH, "restart": RESTART, "abandon": ABANDON, "abort": ABORT}
    # only a normal end waits for the last commit; only the ends that reached a consistent state leave the
    # distributed job (its shutdown barrier waits for every peer) and close the checkpointer
    assert [t.name for t in TEARDOWNS.values() if t.wait_for_commit] == ["finish"]
    assert [t.name for t in TEARDOWNS.values() if t.leave_distributed] == ["finish", "restart"]
    assert [t.name for t in TEARDOWNS.values() if t.close_checkpointer] == ["finish", "restart"]
    assert [t.name for t in TEARDOWNS.values() if t.ignore_signals] == ["restart"]
    assert all(t.phase.terminal for t in TEARDOWNS.values())
    assert not Phase.READY.terminal and not Phase.TRAINING.terminal


@pytest.mark.parametrize("saved,index,count,expected", [
    (None, 0, 2, None),
    ([{"i": 1}, {"i": 2}], 1, 2, {"i": 2}),  # same count: its own
    ([{"i": 5}, {"i": 5}], 2, 3, {"i": 5}),  # a global position moves to any count
    ([{"i": 5}, {"i": 5}, {"i": 5}], 0, 1, {"i": 5}),
    ([{"__reprieve_bytes__": "YWI="}], 0, 1, b"ab"),  # bytes (grain DataLoader states) come back as bytes
])
def test_value_for_process(saved: Any, index: int, count: int, expected: Any) -> None:
    assert value_for_process(saved, index, count) == expected


def test_per_process_positions_do_not_move_to_another_count_without_a_reshard_function() -> None:
    with pytest.raises(DataPositionError, match=r"data positions of 2 processes and this job has 3; .* processes "
                                                r"\[1\] differ.*reshard_data"):
        value_for_process([{"i": 1}, {"i": 2}], 0, 3)
    assert value_for_process([{"i": 1}, {"i": 2}], 2, 3, lambda v, i, n: (v, i, n)) == ([{"i": 1}, {"i": 2}], 2, 3)


def test_encode_takes_iterator_state_and_names_what_cannot_be_saved() -> None:
    class It:
        def get_state(self) -> bytes:
            return b"\x00state"

    assert decode(encode(It(), "x")) == b"\x00state"
    assert encode({"epoch": 1}, "x") == {"epoch": 1}
    with pytest.raises(TypeError, match=r"process 3's data position must be JSON-serialisable: \['pos'\]\[1\] is a "
                                        r"object"):
        encode({"pos": [1, object()]}, "process 3's data position")
    with pytest.raises(TypeError, match=r"key \[\(1, 2\)\] is a tuple"):
        to_json_value({(1, 2): 3}, "extra")


@pytest.mark.parametrize("interval,now,last,due", [
    (0.0, 1000.0, 0.0, False),  # off
    (60.0, 59.9, 0.0, False),
    (60.0, 60.0, 0.0, True),
    (60.0, 200.0, 150.0, False),  # counted from the last save, whatever kind
])
def test_time_save_due(interval: float, now: float, last: float, due: bool) -> None:
    assert time_save_due(policy=SavePolicy(interval_seconds=interval), now=now, last_save_at=last) is due


def test_save_policy_rejects_bad_intervals() -> None:
    with pytest.raises(ValueError, match="interval_seconds must be a finite number >= 0, got -1"):
        SavePolicy(interval_seconds=-1)
    with pytest.raises(ValueError, match="interval_steps must be >= 0"):
        SavePolicy(interval_steps=-1)
