"""Virtual shards as data: which member owns which shard, every shard's position saved on one process count and
restored on another (through the same ``reprieve.data`` path ``job.save``/``job.restore_or`` take), and the guard
for a job whose step never went through the shards. Pure: no JAX, no processes."""

from __future__ import annotations

from typing import Any

import pytest
from reprieve.data import VIRTUAL, DataPositionError, encode, value_for_process
from reprieve.virtual import VirtualData, VirtualShardsError, owned, sizes, usage_problem
from reprieve.virtual import require_virtual_step as require

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("count,members,blocks", [
    (4, 1, [[0, 1, 2, 3]]),
    (4, 2, [[0, 1], [2, 3]]),
    (4, 4, [[0], [1], [2], [3]]),
    (12, 3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]),
])
def test_contiguous_blocks(count: int, members: int, blocks: list[list[int]]) -> None:
    assert [list(owned(count, members, i)) for i in range(members)] == blocks


@pytest.mark.parametrize("count", [1, 4, 12, 64])
def test_every_shard_has_one_owner_and_stays_in_its_block_on_every_size(count: int) -> None:
    for members in sizes(count):
        got = [v for i in range(members) for v in owned(count, members, i)]
        assert got == list(range(count))
        for v in range(count):  # the owner of shard v is the member whose block holds it, the same rule on any size
            assert v in owned(count, members, v * members // count)


def test_sizes_are_the_divisors() -> None:
    assert sizes(12) == (1, 2, 3, 4, 6, 12)
    assert sizes(1) == (1,)


@pytest.mark.parametrize("count,members,index,words", [
    (4, 3, 0, (r"4 shards cannot be split evenly over 3 processes/devices; .*\(sizes \[1, 2, 4\] divide 4; e\.g\. "
              r"6 shards allow every size from 1 to 3\)")),
    (0, 1, 0, "need count >= 1 and members >= 1, got count=0, members=1"),
    (4, 2, 2, "member index 2 is not in 0..1"),
])
def test_a_layout_that_does_not_fit_names_the_numbers(count: int, members: int, index: int, words: str) -> None:
    with pytest.raises(VirtualShardsError, match=words):
        owned(count, members, index)


class Counter:
    """A shard's iterator: yields (shard, position); its state is the position."""

    def __init__(self, shard: int) -> None:
        self.shard, self.position = shard, 0

    def __next__(self) -> tuple[int, int]:
        self.position += 1
        return self.shard, self.position - 1

    def get_state(self) -> dict[str, int]:
        return {"position": self.position}

    def set_state(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def _processes(count: int, processes: int) -> list[VirtualData]:
    return [VirtualData(count, owned(count, processes, p), Counter) for p in range(processes)]


def _saved(datas: list[VirtualData]) -> list[Any]:
    """What the checkpoint holds: every process's ``encode(data)`` (``job.save(..., data=...)``)."""
    return [encode(d, f"process {p}") for p, d in enumerate(datas)]


def _advance(datas: list[VirtualData], steps: int) -> None:
    for _ in range(steps):
        for d in datas:
            next(d)


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (4, 2), (2, 4), (2, 2)])
def test_positions_follow_the_shards_onto_another_process_count(before: int, after: int) -> None:
    saving = _processes(4, before)
    _advance(saving, 3)
    next(saving[0])  # shard positions may differ: process 0's shards are one batch further
    saved = _saved(saving)
    restored = _processes(4, after)
    for p, d in enumerate(restored):
        d.set_state(value_for_process(saved, p, after))  # what job.restore_or(..., data=d) does
    positions = {v: it.position for d in restored for v, it in d.iterators.items()}
    ahead = set(owned(4, before, 0))
    assert positions == {v: 4 if v in ahead else 3 for v in range(4)}
    assert next(restored[0])[0] == (0, 4)  # and they go on from there


def test_a_process_saves_only_its_own_shards() -> None:
    saved = _saved(_processes(4, 2))
    assert saved[1] == {VIRTUAL: {"count": 4, "positions": {"2": {"position": 0}, "3": {"position": 0}}}}


@pytest.mark.parametrize("saved,words", [
    ([{VIRTUAL: {"count": 4, "positions": {"0": 1, "1": 1}}}, {"i": 3}], "mix virtual shards with other values"),
    ([{VIRTUAL: {"count": 4, "positions": {"0": 1, "1": 1}}}, {VIRTUAL: {"count": 2, "positions": {"1": 1}}}],
     r"counts \['2', '4'\]"),
    ([{VIRTUAL: {"count": 2, "positions": {"0": 1, "1": 1}}}, {VIRTUAL: {"count": 2, "positions": {"1": 1}}}],
     r"virtual shard 1's data position was saved by two processes \(0 and 1\)"),
    ([{VIRTUAL: {"count": 4, "positions": {"0": 1, "1": 1}}}, {VIRTUAL: {"count": 4, "positions": {"3": 1}}}],
     r"no data position for virtual shards \[2\] of 4"),
])
def test_saved_positions_that_do_not_cover_the_shards_once_are_refused(saved: list[Any], words: str) -> None:
    with pytest.raises(DataPositionError, match=words):
        value_for_process(saved, 0, 1)


def test_restoring_into_another_shard_count_or_a_plain_position_is_refused() -> None:
    data = VirtualData(4, range(4), Counter)
    with pytest.raises(VirtualShardsError, match="the checkpoint has 2 virtual shards and this job 4"):
        data.set_state(value_for_process(_saved(_processes(2, 1)), 0, 1))
    with pytest.raises(VirtualShardsError, match="not a virtual-shard position"):
        data.set_state({"i": 3})


def test_virtual_data_yields_one_batch_per_owned_shard_in_order() -> None:
    data = VirtualData(8, owned(8, 4, 2), Counter)
    assert next(data) == [(4, 0), (5, 0)]
    assert next(data) == [(4, 1), (5, 1)]
    with pytest.raises(VirtualShardsError, match=r"shards range\(6, 10\) is not a non-empty block of range\(8\)"):
        VirtualData(8, range(6, 10), Counter)


@pytest.mark.parametrize("declared,used,words", [
    (None, {}, None),  # no virtual shards declared: nothing to check
    (4, {4: 10}, None),
    (4, {}, "declares 4 virtual shards but its training step never went through reprieve.VirtualStep with 4"),
    (4, {2: 3}, r"\(its steps used \[2\] virtual shards\)"),
])
def test_a_declared_shard_count_needs_steps_through_it(declared: int | None, used: dict[int, int],
                                                      words: str | None) -> None:
    problem = usage_problem(declared, used)
    if words is None:
        assert problem is None
        require(declared, used)
    else:
        assert problem is not None
        with pytest.raises(VirtualShardsError, match=words):
            require(declared, used)
