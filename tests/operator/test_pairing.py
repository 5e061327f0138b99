"""policy.pairing: which pod holds each process's memory-tier replica (table tests of the pure decision)."""

from __future__ import annotations

import pytest
from reprieve_operator.policy.pairing import Holder, check_pairing, pair

pytestmark = pytest.mark.unit


def proc(i: int, node: str | None, zone: str | None = None) -> Holder:
    return Holder(f"w-{i}", f"10.0.0.{i}:8477", node, zone, i)


S1 = Holder("s-1", "10.0.9.1:8477", "n9", None, None)
S2 = Holder("s-2", "10.0.9.2:8477", "n8", None, None)

PAIR_ROWS: list[tuple[str, list[Holder], dict[int, str | None], dict[int, str | None], int]] = [
    # (what, holders, previous pairing, expected peers, expected problem count)
    ("a ring over distinct nodes", [proc(0, "a"), proc(1, "b"), proc(2, "c")], {},
     {0: "10.0.0.1:8477", 1: "10.0.0.2:8477", 2: "10.0.0.0:8477"}, 0),
    ("two processes hold each other's replica", [proc(0, "a"), proc(1, "b")], {},
     {0: "10.0.0.1:8477", 1: "10.0.0.0:8477"}, 0),
    ("the next pod shares the node: skipped for the one after it",
     [proc(0, "a"), proc(1, "a"), proc(2, "b"), proc(3, "b")], {},
     {0: "10.0.0.2:8477", 1: "10.0.0.3:8477", 2: "10.0.0.0:8477", 3: "10.0.0.1:8477"}, 0),
    ("another zone preferred over the ring's next pod",
     [proc(0, "a", "z1"), proc(1, "b", "z1"), proc(2, "c", "z2"), proc(3, "d", "z2")], {},
     {0: "10.0.0.2:8477", 1: "10.0.0.3:8477", 2: "10.0.0.0:8477", 3: "10.0.0.1:8477"}, 0),
    ("one zone only: still across nodes", [proc(0, "a", "z1"), proc(1, "b", "z1")], {},
     {0: "10.0.0.1:8477", 1: "10.0.0.0:8477"}, 0),
    ("all on one node: nobody is paired, each named", [proc(0, "a"), proc(1, "a")], {}, {0: None, 1: None}, 2),
    ("a lone process pairs with a spare", [proc(0, "a"), S1], {}, {0: S1.address}, 0),
    ("two processes on one node, a spare elsewhere holds both (two slots)", [proc(0, "a"), proc(1, "a"), S1], {},
     {0: S1.address, 1: S1.address}, 0),
    ("three on one node, one spare: the third goes without", [proc(0, "a"), proc(1, "a"), proc(2, "a"), S1], {},
     {0: S1.address, 1: S1.address, 2: None}, 1),
    ("a valid previous pairing is kept (no needless re-replication)",
     [proc(0, "a"), proc(1, "b"), proc(2, "c")], {0: "10.0.0.2:8477", 1: "10.0.0.0:8477", 2: "10.0.0.1:8477"},
     {0: "10.0.0.2:8477", 1: "10.0.0.0:8477", 2: "10.0.0.1:8477"}, 0),
    ("re-pair after a replacement on a new node: only the replica that lived on the replaced pod moves",
     [proc(0, "a"), Holder("w-1b", "10.0.0.11:8477", "d", None, 1), proc(2, "c")],
     {0: "10.0.0.1:8477", 1: "10.0.0.2:8477", 2: "10.0.0.0:8477"},
     {0: "10.0.0.11:8477", 1: "10.0.0.2:8477", 2: "10.0.0.0:8477"}, 0),
    ("a replacement on process 2's node: process 2 keeps its peer, the replacement goes without",
     [proc(0, "a"), Holder("w-1b", "10.0.0.11:8477", "c", None, 1), proc(2, "c")],
     {0: "10.0.0.1:8477", 1: "10.0.0.2:8477", 2: "10.0.0.0:8477"},
     {0: "10.0.0.11:8477", 1: None, 2: "10.0.0.0:8477"}, 1),
    ("a previous peer on the process's own node now is dropped", [proc(0, "a"), proc(1, "a"), proc(2, "b")],
     {0: "10.0.0.1:8477"}, {0: "10.0.0.2:8477", 1: None, 2: "10.0.0.0:8477"}, 1),
    ("nodes unknown: pods still never hold their own replica", [proc(0, None), proc(1, None)], {},
     {0: "10.0.0.1:8477", 1: "10.0.0.0:8477"}, 0),
]


@pytest.mark.parametrize(("what", "holders", "previous", "want", "problems"), PAIR_ROWS, ids=[r[0] for r in PAIR_ROWS])
def test_pair(what: str, holders: list[Holder], previous: dict[int, str | None], want: dict[int, str | None],
              problems: int) -> None:
    got = pair(holders, previous)
    assert got.peers == want
    assert len(got.problems) == problems, got.problems
    assert check_pairing(got.peers, holders) == []  # never a pairing check_pairing refuses
    load: dict[str, int] = {}
    for address in got.peers.values():
        if address is not None:
            load[address] = load.get(address, 0) + 1
    slots = {h.address: h.slots for h in holders}
    assert all(n <= slots[a] for a, n in load.items()), load


def test_a_process_left_without_a_peer_is_named_with_what_to_do() -> None:
    (problem,) = pair([proc(0, "a")]).problems
    assert "process 0 (pod w-0) has no memory-tier peer" in problem and "Add a node or a spare" in problem


CHECK_ROWS: list[tuple[str, dict[int, str | None], str]] = [
    ("both copies on one node", {0: "10.0.0.1:8477"}, "runs on node a, as process 0 does"),
    ("the process's own pod", {0: "10.0.0.0:8477"}, "is process 0's own pod w-0"),
    ("an address no pod serves", {0: "10.9.9.9:8477"}, "no pod of this job serves replicas there"),
    ("a process no pod runs", {7: "10.0.0.2:8477"}, "no pod runs process 7"),
]


@pytest.mark.parametrize(("what", "peers", "message"), CHECK_ROWS, ids=[r[0] for r in CHECK_ROWS])
def test_check_pairing_refuses(what: str, peers: dict[int, str | None], message: str) -> None:
    holders = [proc(0, "a"), proc(1, "a"), proc(2, "b")]
    (problem,) = check_pairing(peers, holders)
    assert message in problem


def test_check_pairing_accepts_other_nodes_and_no_peer() -> None:
    assert check_pairing({0: "10.0.0.2:8477", 1: None, 2: "10.0.0.0:8477"},
                         [proc(0, "a"), proc(1, "a"), proc(2, "b")]) == []
