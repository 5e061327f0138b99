"""The memory tier's pure decisions as tables: fencing by attempt, retention, the restore plan, pairing."""

from __future__ import annotations

import pytest
from reprieve.memtier.decide import (
    EVERYWHERE,
    HERE,
    NOTHING,
    Holding,
    Plan,
    decide,
    exit_wait,
    gang_outlives,
    outlives_notice,
    pairing_problems,
    select_deletions,
    stays,
    visible,
)
from reprieve.memtier.layout import CopyName
from reprieve.memtier.sources import choose_holder

pytestmark = pytest.mark.unit

A, B, C = "10.0.0.1:8477", "10.0.0.2:8477", "10.0.0.3:8477"  # the replica servers of pods of processes 0, 1, 2


def h(step: int, attempt: int, writer: int, loc: str = A, *, n: int = 2, tree: str = "own",
      base: tuple[int, int] | None = None) -> Holding:
    return Holding(CopyName(step, attempt, writer), n, loc, tree, base)


# -- fencing --------------------------------------------------------------------------------------------------------
# (copies, fence records, current attempt, the (step, attempt, writer) that stay visible)
FENCING = [
    ("no newer attempt: everything older is visible",
     [h(10, 1, 0), h(20, 1, 0)], {}, 2, {(10, 1, 0), (20, 1, 0)}),
    ("the current attempt's own copies are visible (a laptop reuses attempt 1)",
     [h(20, 1, 0, base=(10, 1))], {1: (10, 1)}, 1, {(20, 1, 0)}),
    ("attempt 3 started from step 150: older copies up to 150 stay, a later one of attempt 2 is fenced",
     [h(150, 2, 0), h(170, 2, 0), h(160, 3, 0, base=(150, 2))], {}, 4, {(150, 2, 0), (160, 3, 0)}),
    ("the start is known from a fence record alone (attempt 3 wrote no copy yet)",
     [h(150, 2, 0), h(170, 2, 0)], {3: (150, 2)}, 4, {(150, 2, 0)}),
    ("an attempt that started from scratch fences every older copy",
     [h(150, 2, 0), h(20, 3, 0)], {3: None}, 4, {(20, 3, 0)}),
    ("a start at the copy's own step does not fence it (same step, restored from storage)",
     [h(150, 2, 0)], {3: (150, 1)}, 4, {(150, 2, 0)}),
    ("copies of an attempt newer than the current one are ignored (this process is stale)",
     [h(10, 5, 0), h(10, 2, 0)], {}, 4, {(10, 2, 0)}),
    ("a fence of an attempt newer than the current one does not fence the current's view",
     [h(150, 2, 0)], {6: None}, 4, {(150, 2, 0)}),
    ("the first newer start is not the only one that counts: any later start before the step fences",
     [h(150, 2, 0)], {3: (200, 2), 4: (100, 1)}, 5, set()),
]


@pytest.mark.parametrize(("copies", "fences", "current", "want"), [r[1:] for r in FENCING],
                         ids=[r[0] for r in FENCING])
def test_fencing(copies: list[Holding], fences: dict[int, tuple[int, int] | None], current: int,
                 want: set[tuple[int, int, int]]) -> None:
    got = {(c.name.step, c.name.attempt, c.name.writer) for c in visible(copies, fences, current_attempt=current)}
    assert got == want


# -- the restore plan -----------------------------------------------------------------------------------------------
P2 = [(0, A), (1, B)]  # two restoring processes and their own pods' servers


def plan(holdings: list[Holding], storage: list[tuple[int, int]] = (), **kw: object) -> Plan:  # type: ignore[assignment]
    kw.setdefault("processes", P2)
    kw.setdefault("current_attempt", 3)
    return decide(holdings, kw.pop("fences", {}), storage=list(storage), **kw)  # type: ignore[arg-type]


def test_every_writer_in_its_own_pod_restores_from_memory() -> None:
    p = plan([h(40, 2, 0, A), h(40, 2, 1, B)], [(30, 2)])
    assert (p.tier, p.step, p.attempt, p.num_processes) == ("memory", 40, 2, 2)
    assert [x.location for x in p.holders[0]] == [A] and [x.location for x in p.holders[1]] == [B]


def test_a_lost_process_comes_from_its_peer_not_from_storage() -> None:
    """Process 1's pod is gone (a replacement with an empty directory); process 0's pod holds its replica."""
    p = plan([h(40, 2, 0, A), h(40, 2, 1, A, tree="peer")], [(30, 2)])
    assert (p.tier, p.step) == ("memory", 40)
    assert choose_holder(p.holders[1], 1, B) == h(40, 2, 1, A, tree="peer")


def test_a_process_and_its_peer_lost_together_fall_back_to_the_newest_storage_step() -> None:
    p = plan([h(40, 2, 0, A)], [(30, 2)])
    assert (p.tier, p.step) == ("storage", 30)
    assert "without processes [1]" in p.reason


def test_a_storage_step_with_part_of_the_writers_in_memory_is_mixed() -> None:
    p = plan([h(30, 2, 0, A), h(40, 2, 0, A)], [(30, 2)])
    assert (p.tier, p.step, p.attempt) == ("mixed", 30, 2)
    assert p.holders[1] == () and [x.name.step for x in p.holders[0]] == [30]


def test_mixed_needs_the_same_attempt_and_a_storage_tier_that_reads_per_process() -> None:
    assert plan([h(30, 1, 0, A)], [(30, 2)]).tier == "storage"
    assert plan([h(30, 2, 0, A)], [(30, 2)], mixed_ok=False).tier == "storage"


def test_memory_beats_storage_at_the_same_step_and_the_newest_step_wins() -> None:
    both = [h(30, 2, 0, A), h(30, 2, 1, B)]
    assert plan(both, [(30, 2)]).tier == "memory"
    assert plan(both, [(35, 2)]).step == 35


def test_nothing_anywhere_is_a_fresh_start() -> None:
    assert plan([], []).tier == "none"


def test_excluded_copies_are_not_used_and_the_next_source_is() -> None:
    holdings = [h(40, 2, 0, A), h(40, 2, 1, B), h(40, 2, 1, A, tree="peer")]
    p = plan(holdings, excluded=[(CopyName(40, 2, 1), B)])
    assert p.tier == "memory" and [x.location for x in p.holders[1]] == [A]
    p = plan(holdings, [(30, 2)], excluded=[(CopyName(40, 2, 1), B), (CopyName(40, 2, 1), A)])
    assert (p.tier, p.step) == ("storage", 30)


def test_a_copy_only_one_process_can_read_is_usable_only_when_that_process_is_alone() -> None:
    assert plan([h(40, 1, 0, "local:0", n=1)], processes=[(0, None)]).tier == "memory"
    assert plan([h(40, 2, 0, "local:0"), h(40, 2, 1, B)], [(30, 2)]).step == 30


def test_a_generation_whose_copies_disagree_on_the_process_count_is_not_complete() -> None:
    assert plan([h(40, 2, 0, A, n=2), h(40, 2, 1, B, n=3)], [(30, 2)]).step == 30


def test_a_changed_process_count_still_restores_from_memory() -> None:
    """4 writers, 2 restoring processes: the restore reads whatever shards the new sharding needs."""
    p = plan([h(40, 2, w, loc, n=4) for w, loc in enumerate([A, B, A, B])], [(30, 2)])
    assert (p.tier, p.num_processes) == ("memory", 4)


def test_a_stale_copy_does_not_win_over_the_newer_attempts_progress() -> None:
    p = plan([h(170, 2, 0, A), h(170, 2, 1, B), h(160, 3, 0, A, base=(150, 2)), h(160, 3, 1, B, base=(150, 2))],
             current_attempt=4)
    assert (p.step, p.attempt) == (160, 3)


# -- where one process reads --------------------------------------------------------------------------------------
def test_choose_holder_prefers_the_own_pod_then_any_server() -> None:
    own, peer = h(40, 2, 1, B), h(40, 2, 1, A, tree="peer")
    assert choose_holder([own, peer], 1, B) == own
    assert choose_holder([own, peer], 0, A) == peer
    assert choose_holder([own, peer], 2, C) == own
    assert choose_holder([h(40, 2, 1, "local:1")], 0, A) is None


# -- retention -----------------------------------------------------------------------------------------------------
RETENTION = [
    ("own: only the newest copy stays, whoever wrote it",
     None, [(10, 1, 0), (20, 1, 0), (20, 2, 1)], [], [(10, 1, 0), (20, 1, 0)]),
    ("peer: a writer's put prunes that writer's copies only (the others' are theirs to name)",
     0, [(10, 1, 0), (20, 1, 0), (10, 1, 2), (5, 1, 2)], [], [(10, 1, 0)]),
    ("a newer attempt's copy of an older step is newer than an older attempt's",
     None, [(20, 1, 0), (10, 2, 0)], [], [(20, 1, 0)]),
    ("copies in flight are never selected", 0, [(10, 1, 0)], [], []),
    ("the copies named to keep stay beside the newest (the gang step's, those that may become it)",
     None, [(10, 1, 0), (20, 1, 0), (30, 1, 0), (40, 1, 0)], [(10, 1, 0), (30, 1, 0)], [(20, 1, 0)]),
    ("peer: the put's keep holds the writer's copy of the gang step",
     1, [(10, 1, 1), (15, 1, 1), (20, 1, 1), (15, 1, 0)], [(15, 1, 1)], [(10, 1, 1)]),
    ("a name to keep that is not there keeps nothing else",
     None, [(20, 1, 0), (30, 1, 0)], [(25, 1, 0)], [(20, 1, 0)]),
    ("another attempt's step to keep keeps nothing of this one",
     None, [(20, 1, 0), (30, 2, 0)], [(20, 2, 0)], [(20, 1, 0)]),
]


@pytest.mark.parametrize(("writer", "copies", "keep", "deleted"), [r[1:] for r in RETENTION],
                         ids=[r[0] for r in RETENTION])
def test_retention(writer: int | None, copies: list[tuple[int, int, int]], keep: list[tuple[int, int, int]],
                   deleted: list[tuple[int, int, int]]) -> None:
    names = [CopyName(*c) for c in copies] + [CopyName(99, 9, 0, tmp=True)]
    got = select_deletions(names, keep=[CopyName(*k) for k in keep], writer=writer)
    assert sorted((n.step, n.attempt, n.writer) for n in got) == sorted(deleted)


# -- pairing -------------------------------------------------------------------------------------------------------
PAIRING = [
    ("apart: fine", {0: (A, "n1", B), 1: (B, "n2", A)}, {}),
    ("the own pod", {0: (A, "n1", A)}, {0: "its own pod's"}),
    ("the same node", {0: (A, "n1", B), 1: (B, "n1", A)}, {0: "same node n1", 1: "same node n1"}),
    ("a peer outside the gang (a spare) is the operator's to check", {0: (A, "n1", C)}, {}),
    ("no node known: only the own pod is refused", {0: (A, None, B), 1: (B, None, A)}, {}),
]


@pytest.mark.parametrize(("processes", "want"), [r[1:] for r in PAIRING], ids=[r[0] for r in PAIRING])
def test_pairing(processes: dict[int, tuple[str, str | None, str]], want: dict[int, str]) -> None:
    got = pairing_problems(processes)
    assert set(got) == set(want)
    for p, text in want.items():
        assert text in got[p]


# What a process leaving after the agreed save of step 8 waits for of its copy in flight (exit_wait)
EXIT_WAIT = [
    # id, agreed step, copy in flight, this pod's node, the noticed nodes, want
    ("no copy in flight", 8, None, "node-a", {"node-b"}, NOTHING),
    ("an older copy in flight is never the restart's", 8, 5, "node-a", {"node-b"}, NOTHING),
    ("an older copy, this pod going", 8, 5, "node-b", {"node-b"}, NOTHING),
    ("the agreed copy, this pod stays: committed here", 8, 8, "node-a", {"node-b"}, HERE),
    ("the agreed copy, this pod goes: at the peer", 8, 8, "node-b", {"node-b"}, EVERYWHERE),
    ("two nodes noticed, this pod's one of them", 8, 8, "node-a", {"node-b", "node-a"}, EVERYWHERE),
    ("a notice that names no node (SIGTERM): both", 8, 8, "node-a", {"node-b", None}, EVERYWHERE),
    ("no node noticed: both", 8, 8, "node-a", set(), EVERYWHERE),
    ("this pod's node unknown: both", 8, 8, None, {"node-b"}, EVERYWHERE),
    ("not an agreed exit: the whole copy, as before", None, 5, "node-a", {"node-b"}, EVERYWHERE),
]


@pytest.mark.parametrize(("agreed", "running", "node", "doomed", "want"), [r[1:] for r in EXIT_WAIT],
                         ids=[r[0] for r in EXIT_WAIT])
def test_exit_wait(agreed: int | None, running: int | None, node: str | None, doomed: set[str | None],
                   want: str) -> None:
    assert exit_wait(agreed_step=agreed, running_step=running, node=node, doomed=doomed) == want


# Whether a process's copy of a notice's agreed step outlives the noticed nodes (outlives_notice): the restart
# then reads it from memory and the gang saves no storage checkpoint for the notice
OUTLIVES = [
    # id, this pod's node, the peer's node, the noticed nodes, committed here, at the peer, why not (None: outlives)
    ("this pod stays", "node-a", "node-b", {"node-b"}, True, True, None),
    ("this pod stays, its put to the noticed peer unfinished", "node-a", "node-b", {"node-b"}, True, False, None),
    ("this pod goes, the peer stays", "node-b", "node-a", {"node-b"}, True, True, None),
    ("this pod goes, its copy not at the peer", "node-b", "node-a", {"node-b"}, True, False,
     "this pod's node node-b is noticed; not committed at the peer"),
    ("this pod and its peer both noticed", "node-a", "node-b", {"node-a", "node-b"}, True, True,
     "this pod's node node-a is noticed; the peer's node node-b is noticed"),
    ("the peer's node not known, this pod goes", "node-b", None, {"node-b"}, True, True,
     "this pod's node node-b is noticed; the peer's node is not known"),
    ("this pod's node not known, the peer stays", None, "node-a", {"node-b"}, True, True, None),
    ("neither node known", None, None, {"node-b"}, True, True,
     "this pod's node is not known; the peer's node is not known"),
    ("a notice that names no node beside", "node-a", "node-c", {"node-b", None}, True, True,
     "a notice names no node (which pods go is not known)"),
    ("no noticed node", "node-a", "node-c", set(), True, True, "no noticed node is known"),
    ("not committed anywhere", "node-a", "node-c", {"node-b"}, False, False,
     "not committed in this pod; not committed at the peer"),
]


@pytest.mark.parametrize(("node", "peer_node", "doomed", "here", "at_peer", "why"), [r[1:] for r in OUTLIVES],
                         ids=[r[0] for r in OUTLIVES])
def test_outlives_notice(node: str | None, peer_node: str | None, doomed: set[str | None], here: bool,
                         at_peer: bool, why: str | None) -> None:
    assert outlives_notice(node=node, peer_node=peer_node, doomed=doomed, here=here, at_peer=at_peer) == why


def _v(here: bool, node: str | None, peer_node: str | None, *doomed: str | None, at_peer: bool | None = None) -> dict:
    return {"here": here, "at_peer": here if at_peer is None else at_peer, "node": node, "peer_node": peer_node,
            "doomed": list(doomed)}


# The gang's decision from every process's published verdict (gang_outlives): empty, no storage save
GANG = [
    # id, verdicts, a notice (False: a resize), processes, want (process -> why, abridged to its start)
    ("every copy outlives the notice", {0: _v(True, "a", "b", "b"), 1: _v(True, "b", "a", "b")}, True, 2, {}),
    ("a process without its copy", {0: _v(True, "a", "b", "b"), 1: _v(False, "b", "a", "b")}, True, 2,
     {1: "not committed in this pod"}),
    ("a silent process", {0: _v(True, "a", "b", "b")}, True, 2, {1: "said nothing"}),
    ("a notice only process 0 heard of dooms process 1's peer too",
     {0: _v(True, "a", "b", "a", "b"), 1: _v(True, "b", "a", "b")}, True, 2,
     {0: "this pod's node a is noticed", 1: "this pod's node b is noticed"}),
    ("a notice that names no node anywhere", {0: _v(True, "a", "b", "b", None), 1: _v(True, "b", "a", "b")}, True,
     2, {0: "a notice names no node", 1: "a notice names no node"}),
    ("three processes in a ring, one node noticed",
     {0: _v(True, "a", "b", "b"), 1: _v(True, "b", "c", "b"), 2: _v(True, "c", "a", "b")}, True, 3, {}),
    ("a pod that stays, its copy here only (its peer noticed)",
     {0: _v(True, "a", "b", "b", at_peer=False), 1: _v(True, "b", "a", "b")}, True, 2, {}),
    ("a pod that goes, its copy here only",
     {0: _v(True, "a", "b", "b", at_peer=False), 1: _v(True, "b", "a", "b", at_peer=False)}, True, 2,
     {1: "this pod's node b is noticed; not committed at the peer"}),
    ("a resize: here and at the peer", {0: {"here": True, "at_peer": True}, 1: {"here": True, "at_peer": True}},
     False, 2, {}),
    ("a resize: here only is not enough", {0: {"here": True, "at_peer": False}, 1: {"here": True, "at_peer": True}},
     False, 2, {0: "its copy is not committed"}),
]


@pytest.mark.parametrize(("verdicts", "notice", "n", "want"), [r[1:] for r in GANG], ids=[r[0] for r in GANG])
def test_gang_outlives(verdicts: dict, notice: bool, n: int, want: dict[int, str]) -> None:
    got = gang_outlives(verdicts, n, notice=notice)
    assert sorted(got) == sorted(want), got
    for p, start in want.items():
        assert got[p].startswith(start), got


@pytest.mark.parametrize(("node", "doomed", "want"), [
    ("a", {"b"}, True), ("b", {"b"}, False), (None, {"b"}, False), ("a", set(), False), ("a", {"b", None}, False),
])
def test_a_pod_stays_only_where_every_notice_names_its_node_and_none_names_this_one(
        node: str | None, doomed: set[str | None], want: bool) -> None:
    assert stays(node, doomed) is want
