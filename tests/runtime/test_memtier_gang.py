"""The gang step and what each process and its holder keep for it (``reprieve.memtier.gang``, pure), as tables, and
replayed over the two losses issue #48 names: processes that skipped different saves, and a lost middle process of
three at different replication progress. Each replay ends with the restore plan (``decide.decide``) that the
survivors' pods allow: a step in memory that every process wrote."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from reprieve.memtier import gang
from reprieve.memtier.decide import Holding, decide, select_deletions
from reprieve.memtier.layout import CopyName

pytestmark = pytest.mark.unit

GANG = [
    ("the newest step in every list", {0: [4, 5, 6], 1: [4, 5]}, 2, 5),
    ("skipped different saves: the newest they share, not the minimum of the newest (p1 never wrote 9)",
     {0: [6, 7, 9, 11], 1: [6, 8, 10]}, 2, 6),
    ("no step in common", {0: [7, 9], 1: [8, 10]}, 2, None),
    ("a process with no list yet", {0: [4, 5]}, 2, None),
    ("a process whose list is empty (no peer)", {0: [4, 5], 1: []}, 2, None),
    ("three processes", {0: [10, 15, 20], 1: [10, 15, 20], 2: [10, 15]}, 3, 15),
    ("one process", {0: [3]}, 1, 3),
]


@pytest.mark.parametrize(("lists", "n", "want"), [r[1:] for r in GANG], ids=[r[0] for r in GANG])
def test_gang_step(lists: dict[int, list[int]], n: int, want: int | None) -> None:
    assert gang.gang_step(lists, n) == want


KEEP = [
    ("in step: the gang step's copy beside the newest", [5, 6], {0: [5], 1: [5]}, 2, 5, {5}),
    ("one copy ahead: the step the others still replicate stays too",
     [5, 6, 7], {0: [5, 6], 1: [5]}, 2, 5, {5, 6}),
    ("a step another process skipped (it replicated a newer one without it) can never be the gang's",
     [6, 9, 11], {0: [6, 9], 1: [6, 8, 10]}, 2, 6, {6}),
    ("... but one newer than all it replicated may still be", [6, 9, 11, 13], {0: [6, 9, 11], 1: [6, 8, 10]}, 2, 6,
     {6, 11}),
    ("the gang step's own copy gone: the newest one before it", [4, 9], {0: [4, 9], 1: [5, 9]}, 2, 5, {4}),
    ("at most PENDING copies that may become the gang step, the newest of them",
     [1, 2, 3, 4, 5], {0: [1, 2, 3, 4]}, 2, None, {3, 4}),
    ("only the newest: nothing else to keep", [5], {0: [5], 1: [5]}, 2, 5, {5}),
    ("no gang step yet and nothing replicated: the pending steps", [0, 1], {}, 2, None, {0}),
]


@pytest.mark.parametrize(("steps", "lists", "n", "gang_at", "want"), [r[1:] for r in KEEP], ids=[r[0] for r in KEEP])
def test_keep_steps(steps: list[int], lists: dict[int, list[int]], n: int, gang_at: int | None,
                    want: set[int]) -> None:
    assert gang.keep_steps(steps, lists, n, gang_at) == want


def test_the_gang_step_seen_never_goes_back() -> None:
    assert [gang.newer_gang(a, b) for a, b in [(None, None), (None, 4), (4, None), (4, 3), (4, 6)]] == \
        [None, 4, 4, 4, 6]


def test_a_list_keeps_the_newest_recent_steps() -> None:
    steps: tuple[int, ...] = ()
    for s in range(gang.RECENT + 3):
        steps = gang.replicated(steps, s)
    assert steps == tuple(range(3, gang.RECENT + 3))


RECORDS = [
    ("steps and a skip", '{"steps":[4,5],"skip":[2,7]}', gang.Record((4, 5), (2, 7))),
    ("steps only", '{"steps":[4]}', gang.Record((4,))),
    ("an older runtime's bare step", "9", gang.Record((9,))),
]


@pytest.mark.parametrize(("text", "want"), [r[1:] for r in RECORDS], ids=[r[0] for r in RECORDS])
def test_a_record_is_read_as_published(text: str, want: gang.Record) -> None:
    assert gang.Record.from_json(text) == want
    assert gang.Record.from_json(want.to_json()) == want


BAD_RECORDS = [
    ("a list", "[1, 2]", "must be an object or a step"),
    ("a negative step", '{"steps":[-1]}', "steps must be a list of steps >= 0, got [-1]"),
    ("a step that is no number", '{"steps":["4"]}', "steps must be a list of steps >= 0"),
    ("a skip without its version", '{"steps":[],"skip":[7]}', "skip must be [version, step], got [7]"),
]


@pytest.mark.parametrize(("text", "error"), [r[1:] for r in BAD_RECORDS], ids=[r[0] for r in BAD_RECORDS])
def test_a_malformed_record_is_refused_naming_the_field(text: str, error: str) -> None:
    with pytest.raises(ValueError, match="memory progress record") as err:
        gang.Record.from_json(text)
    assert error in str(err.value)


# -- the two losses, replayed over the pure rules --------------------------------------------------------------------
@dataclass
class Gang:
    """``n`` processes in a ring (process ``p``'s replicas in pod ``p+1``), each pod's copies as the tier keeps them:
    a commit keeps what :func:`gang.keep_steps` says in the own pod, the put names the same to the holder."""

    n: int
    own: dict[int, set[CopyName]] = field(default_factory=dict)
    peer: dict[int, set[CopyName]] = field(default_factory=dict)  # pod -> replicas it holds
    lists: dict[int, tuple[int, ...]] = field(default_factory=dict)
    seen: dict[int, int | None] = field(default_factory=dict)
    pending: dict[int, tuple[CopyName, list[CopyName]]] = field(default_factory=dict)

    def commit(self, p: int, step: int) -> None:
        """Process ``p`` writes its copy of ``step`` in its pod (the tier's ``_write_own`` with ``_keep``)."""
        assert p not in self.pending, f"process {p} has a copy in flight: the tier would skip step {step}"
        name = CopyName(step, 1, p)
        lists = {q: self.lists.get(q, ()) for q in range(self.n)}
        self.seen[p] = gang.newer_gang(self.seen.get(p), gang.gang_step(lists, self.n))
        own = [c.step for c in self.own.get(p, set())] + [step]
        keep = [CopyName(s, 1, p) for s in gang.keep_steps(own, lists, self.n, self.seen[p])]
        pod = self.own.setdefault(p, set())
        pod.add(name)
        pod -= set(select_deletions(pod, keep=keep))
        self.pending[p] = (name, keep)

    def replicate(self, p: int) -> None:
        """The holder commits ``p``'s copy in flight and deletes that writer's copies its put does not name."""
        name, keep = self.pending.pop(p)
        held = self.peer.setdefault((p + 1) % self.n, set())
        held.add(name)
        held -= set(select_deletions(held, keep=keep, writer=p))
        self.lists[p] = gang.replicated(self.lists.get(p, ()), name.step)

    def step(self, s: int, *processes: int) -> None:
        for p in processes or range(self.n):
            self.commit(p, s)
        for p in processes or range(self.n):
            self.replicate(p)

    def restore_after_losing(self, lost: int) -> tuple[str, int | None]:
        """The plan of the survivors' restore: every copy in the pods that remain, no storage checkpoint."""
        holdings = [Holding(c, self.n, f"pod-{pod}", tree, base=None)
                    for tree, pods in (("own", self.own), ("peer", self.peer)) for pod, copies in pods.items()
                    if pod != lost for c in copies]
        plan = decide(holdings, {}, storage=[], current_attempt=1, processes=[(p, None) for p in range(self.n)])
        return plan.tier, plan.step

    def copies(self) -> int:
        return max(len(c) for pods in (self.own, self.peer) for c in pods.values())


def test_processes_that_skipped_different_saves_keep_a_step_every_one_wrote() -> None:
    """Issue #48 (found by the e2e chain): every step a save, copies slower than a step, each process skipping
    where its own copy runs late (process 0 skipped 8 and 10, process 1 skipped 9 and 11). The minimum of the
    newest replicated steps named 9, which process 1 never wrote, and the holders kept only each writer's newest:
    after losing process 1 no step was complete in memory. Now both keep 7, the newest step both replicated."""
    g = Gang(2)
    for s in range(7):
        g.step(s)
    g.commit(0, 7), g.commit(1, 7)
    g.replicate(1)
    g.commit(1, 8)  # process 0 skips 8: its copy of 7 runs late
    g.replicate(0)
    g.commit(0, 9)  # process 1 skips 9: its copy of 8 runs late
    g.replicate(1)
    g.commit(1, 10)  # process 0 skips 10
    g.replicate(0)
    g.commit(0, 11)  # process 1 skips 11
    g.replicate(1)
    g.commit(1, 12)
    g.replicate(0)
    assert gang.gang_step(g.lists, 2) == 7
    for lost in (0, 1):
        assert g.restore_after_losing(lost) == ("memory", 7), lost


def test_a_lost_middle_process_of_three_at_different_progress_leaves_the_gang_step_in_memory() -> None:
    """Coherent saves, three processes at different replication progress: processes 0 and 1 one copy ahead of
    process 2, which is still sending 15 when 0 and 1 have written 20. Losing process 1 (its pod holds process 0's
    replicas): its holder keeps its 15 beside its 20, process 0 its own 15, so step 15 is whole in memory."""
    g = Gang(3)
    g.step(10)
    g.commit(0, 15), g.commit(1, 15), g.commit(2, 15)
    g.replicate(0), g.replicate(1)
    g.step(20, 0, 1)  # process 2 is still sending 15 (it will skip 20)
    g.replicate(2)
    assert gang.gang_step(g.lists, 3) == 15
    assert g.restore_after_losing(1) == ("memory", 15)


def test_a_gang_in_step_keeps_a_few_copies_per_pod() -> None:
    """Nothing is kept forever: in step, a pod holds its newest copy and the gang step's (and one in flight)."""
    g = Gang(3)
    for s in range(40):
        g.step(s)
        assert g.copies() <= 2, (s, g.own, g.peer)
    assert {c.step for c in g.own[0]} == {39, 38}
    for lost in range(3):
        assert g.restore_after_losing(lost) == ("memory", 39)
