"""What the memory tier decides (pure): which copies are fenced, which to delete, where a restore reads from,
and whether a pairing keeps the two copies apart. Every function here is a function of its inputs and
table-tested (``tests/runtime/test_memtier_decide.py``); :mod:`reprieve.memtier.restore_round` does the I/O.

**Fencing.** Every copy records the attempt that wrote it and that attempt's *base*, the ``(step, attempt)`` it
restored from (None: it started from scratch); every attempt also leaves a fence record with its base in the
memory directories of its pods. The rule, the memory tier's form of the storage tier's (``checkpoint/fencing``):

    a copy of step ``s`` written by attempt ``a`` is visible iff no attempt ``a'`` with ``a < a' <= current``
    started from a step before ``s`` (a missing base counts as step -1).

An attempt restores the newest complete step it can see, so if ``a'`` started before ``s``, the copy was not
part of a complete step when ``a'`` started (or it was written afterwards by a stale process of ``a``): it must
not come back later and replace ``a'``'s own progress. Copies of attempts newer than the current one are
ignored (this process is the stale one; the storage tier's fence stops it).

**Restore.** The newest step for which every writer's shards exist *somewhere*: a memory generation
``(step, attempt)`` with a readable copy of every writer, or a storage checkpoint. A generation that is in
storage too may miss writers in memory ("mixed"): a process that needs a missing writer reads storage, all
others read memory. One process missing its copy therefore never sends the gang to storage while its replica
exists, and a lost replica costs only the processes that needed it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from .layout import CopyName

LOCAL = "local:"  # a location only one process can read: "local:<process>" (no replica server)


@dataclasses.dataclass(frozen=True)
class Holding:
    """A committed copy some process can reach, and where: ``location`` is a replica server's ``host:port``
    (anyone can read it) or ``local:<p>`` (only process ``p``, through its memory directory). ``tree`` is
    ``own`` (written in that pod) or ``peer`` (a replica received there). ``root``: the storage root the copy
    belongs to (:attr:`.manifest.Manifest.root`)."""

    name: CopyName
    num_processes: int
    location: str
    tree: str = "own"
    base: tuple[int, int] | None = None
    nbytes: int = 0
    root: str | None = None

    def readable_by(self, process: int, process_location: str | None) -> bool:
        if self.location.startswith(LOCAL):
            return self.location == f"{LOCAL}{process}"
        return True

    def local_to(self, process: int, process_location: str | None) -> bool:
        return self.location == f"{LOCAL}{process}" or (process_location is not None
                                                         and self.location == process_location)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The restore every process carries out. ``tier``: ``memory`` (every writer in memory), ``mixed``
    (storage has the step too and fills in the writers memory lacks), ``storage`` or ``none`` (start
    fresh). ``holders[w]``: where writer ``w``'s copy can be read (empty: storage only)."""

    tier: str
    step: int | None = None
    attempt: int | None = None
    num_processes: int = 0
    holders: Mapping[int, tuple[Holding, ...]] = dataclasses.field(default_factory=dict)
    reason: str = ""


def lineage(holdings: Iterable[Holding], fences: Mapping[int, tuple[int, int] | None]) -> dict[int, int]:
    """attempt -> the step it started from (-1: from scratch), from fence records and from the copies."""
    out: dict[int, int] = {}
    for a, base in fences.items():
        out[a] = -1 if base is None else base[0]
    for h in holdings:
        out.setdefault(h.name.attempt, -1 if h.base is None else h.base[0])
    return out


def visible(holdings: Iterable[Holding], fences: Mapping[int, tuple[int, int] | None], *,
            current_attempt: int) -> list[Holding]:
    """The copies a restore of ``current_attempt`` may use (module docstring, "Fencing")."""
    holdings = list(holdings)
    started = lineage(holdings, fences)
    out = []
    for h in holdings:
        a, s = h.name.attempt, h.name.step
        if a > current_attempt:
            continue
        if any(a < later <= current_attempt and base < s for later, base in started.items()):
            continue
        out.append(h)
    return out


def decide(holdings: Iterable[Holding], fences: Mapping[int, tuple[int, int] | None], *,
           storage: Sequence[tuple[int, int]], current_attempt: int, processes: Sequence[tuple[int, str | None]],
           excluded: Iterable[tuple[CopyName, str]] = (), mixed_ok: bool = True) -> Plan:
    """Where the restore of ``current_attempt`` reads from.

    Args:
        holdings: every copy any process reported (its pod's directory and what its peer server holds).
        fences: attempt -> base, from the fence records the processes found.
        storage: ``(step, attempt)`` of every visible storage checkpoint.
        processes: ``(process, its own location)`` of every restoring process (a copy is usable only if each
            of them can read it: the shards a process needs are known only once the manifests are read).
        excluded: ``(copy, location)`` that failed a read or a checksum in an earlier round.
        mixed_ok: processes may read storage while others read memory (the storage checkpointer reads one
            process's part on its own); otherwise a step memory lacks is restored from storage by all.
    """
    bad = set(excluded)
    usable = [h for h in visible(holdings, fences, current_attempt=current_attempt)
              if (h.name.committed, h.location) not in bad
              and all(h.readable_by(p, loc) for p, loc in processes)]
    gens: dict[tuple[int, int], dict[int, list[Holding]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[tuple[int, int], set[int]] = defaultdict(set)
    for h in usable:
        gens[(h.name.step, h.name.attempt)][h.name.writer].append(h)
        counts[(h.name.step, h.name.attempt)].add(h.num_processes)
    complete = {g: next(iter(counts[g])) for g, writers in gens.items()
                if len(counts[g]) == 1 and set(writers) == set(range(next(iter(counts[g]))))}
    in_storage = set(storage)
    candidates: list[tuple[int, int, int, str]] = []  # (step, preference, attempt, tier)
    for (s, a) in complete:
        candidates.append((s, 2, a, "memory"))
    for (s, a) in in_storage:
        partial = (s, a) in gens and len(counts[(s, a)]) == 1
        candidates.append((s, 1 if partial and mixed_ok else 0, a, "mixed" if partial and mixed_ok else "storage"))
    if not candidates:
        return Plan("none", reason="no complete copy in memory and no checkpoint in storage")
    step, _, attempt, tier = max(candidates, key=lambda c: (c[0], c[1], c[2]))
    holders: dict[int, tuple[Holding, ...]] = {}
    n = 0
    if tier in ("memory", "mixed"):
        n = next(iter(counts[(step, attempt)]))
        for w in range(n):
            holders[w] = tuple(sorted(gens[(step, attempt)].get(w, []), key=_preference))
    missing = [w for w in range(n) if not holders.get(w)]
    reason = {"memory": f"step {step} (attempt {attempt}): every process's shards are in memory",
              "mixed": f"step {step} (attempt {attempt}): in storage, and in memory except processes {missing}",
              "storage": f"step {step} (attempt {attempt}): newest complete step, in storage only"}[tier]
    newer = max((g for g in gens if g[0] > step), default=None)
    if newer is not None:
        want = max(counts[newer])
        reason += (f"; memory holds step {newer[0]} (attempt {newer[1]}) without processes "
                   f"{sorted(set(range(want)) - set(gens[newer]))}")
    return Plan(tier, step, attempt, n, holders, reason)


def _preference(h: Holding) -> tuple[int, str]:
    """Among copies of one writer, the one written in its own pod first, then by location (deterministic)."""
    return (0 if h.tree == "own" else 1, h.location)


def select_deletions(names: Iterable[CopyName], *, keep: Collection[CopyName] = (),
                     writer: int | None = None) -> list[CopyName]:
    """Committed copies to delete now that a newer one committed (pure): of ``writer``'s copies (every copy:
    None), everything but the newest and those in ``keep``.

    A pod's own copies are pruned whole (``writer`` None: the newest copy, whoever wrote it, stays), a pod's
    replicas per writer, at that writer's put (each writer's newest stays, and the copies its put named: the
    others' are theirs to name). ``keep``: the copies of the gang step and of the steps that may still become it
    (:func:`.gang.keep_steps`). Newest means written last: the highest ``(attempt, step)`` (a newer attempt may
    write a lower step than a fenced copy of an older one).
    """
    committed = sorted({n.committed for n in names if not n.tmp and (writer is None or n.writer == writer)},
                       key=lambda n: (n.attempt, n.step, n.writer))
    kept = {n.committed for n in keep}
    return [n for n in committed[:-1] if n not in kept]


def pairing_problems(processes: Mapping[int, tuple[str | None, str | None, str | None]]) -> dict[int, str]:
    """process -> why its replica is useless: ``processes[p] = (own location, node, peer address)``. A peer that
    is the process's own pod, or a pod of the gang on the same node, would die with the copy it protects."""
    by_location = {loc: (p, node) for p, (loc, node, _) in processes.items() if loc}
    out = {}
    for p, (loc, node, peer) in processes.items():
        if peer is None:
            continue
        if peer == loc:
            out[p] = f"process {p}'s replica server {peer} is its own pod's"
        elif peer in by_location and node and by_location[peer][1] == node:
            out[p] = (f"process {p}'s replica server {peer} (the pod of process {by_location[peer][0]}) runs on "
                      f"the same node {node}")
    return out


# What a process leaving after an agreed save waits for of the copy in its background (:func:`exit_wait`)
NOTHING = "nothing"  # no copy the restart reads: leave at once (an uncommitted copy is never read: see below)
HERE = "here"  # the agreed step's copy committed in this pod (its put to the peer is left unfinished)
EVERYWHERE = "everywhere"  # the copy committed here and at the peer


def exit_wait(*, agreed_step: int | None, running_step: int | None, node: str | None,
              doomed: Collection[str | None]) -> str:
    """What of the copy in flight (``running_step``, None: none) a process waits for before it ends, when the
    agreed save of ``agreed_step`` is committed to storage and a restart follows (None: any other exit, which
    waits for the whole copy as before). ``node``: this pod's node; ``doomed``: the nodes the agreed notice and the
    notices this process received name (None: a notice that names no node, as SIGTERM's).

    The restart reads the agreed step: from this pod's memory when the pod stays, from the peer's when this pod
    goes with a noticed node. An older copy is never the restart's (the agreed step is newer and in storage), and
    the agreed copy's put to the peer is not needed when this pod stays: both are left unfinished, which is safe,
    since a copy commits by a rename and the holder commits a put only whole and checked, and an unfinished one is
    a ``.tmp`` leftover that the next writer removes. Whether this pod stays unknown (its node, or a notice's): the
    whole copy, as before."""
    if agreed_step is None:
        return EVERYWHERE
    if running_step is None or running_step != agreed_step:
        return NOTHING
    return HERE if stays(node, doomed) else EVERYWHERE


def stays(node: str | None, doomed: Collection[str | None]) -> bool:
    """Whether a pod on ``node`` outlives the notices naming ``doomed`` (pure): its node is known, every notice
    names its node (None: one that names none, as SIGTERM's) and none names this one. A gang restart keeps such a
    pod (restartMode InPlace, which the memory tier requires)."""
    return bool(node) and bool(doomed) and None not in doomed and node not in doomed


def outlives_notice(*, node: str | None, peer_node: str | None, doomed: Collection[str | None], here: bool,
                    at_peer: bool) -> str | None:
    """Why this process's copy of a notice's agreed step may not outlive the noticed nodes (pure); None: it
    does, so the restart can read it from memory with no storage save (docs/memory.md, "After a notice").

    ``here``: the copy is committed in this pod, on ``node``; ``at_peer``: committed at the peer, on
    ``peer_node``; ``doomed``: the nodes the agreed notice and the notices this process received name (None: a
    notice that names no node). The copy outlives them when a pod holding it is on a node none of them names: this
    pod (a gang restart keeps every pod on a healthy node, restartMode InPlace, which the memory tier requires) or
    the peer's. A node not known, or a notice that names none, proves nothing."""
    if not doomed:
        return "no noticed node is known"
    if None in doomed:
        return "a notice names no node (which pods go is not known)"
    if (here and stays(node, doomed)) or (at_peer and stays(peer_node, doomed)):
        return None
    return f"{_why_lost(here, node, 'in this pod', 'this pod')}; {_why_lost(at_peer, peer_node, 'at the peer', 'the peer')}"


def _why_lost(committed: bool, node: str | None, at: str, whose: str) -> str:
    """Why one place's copy does not outlive a notice: not committed ``at`` it, or ``whose`` node not known or
    noticed."""
    if not committed:
        return f"not committed {at}"
    return f"{whose}'s node is not known" if not node else f"{whose}'s node {node} is noticed"


def gang_outlives(verdicts: Mapping[int, Mapping[str, Any]], num_processes: int, *,
                  notice: bool) -> dict[int, str]:
    """process -> why the gang may not skip the storage save of the agreed step (pure; empty: every process holds
    it in memory where the restart reads it). ``verdicts[p]`` is what process ``p`` published: where its copy is
    committed (``here``, in its pod; ``at_peer``: a resize needs both, a notice one that outlives it, and a pod
    that stays does not wait for its put), and for a ``notice`` its ``node``, its peer's ``peer_node`` and the
    nodes the notices it received name (``doomed``). A process that said nothing holds nothing. For a notice every
    copy is checked against the nodes *any* process heard of (:func:`outlives_notice`): a notice that reached one
    process only still counts, and every process computes the same answer from the same verdicts."""
    doomed: set[str | None] = set()
    for said in verdicts.values():
        doomed.update(said.get("doomed") or ())

    def why_not(said: Mapping[str, Any] | None) -> str | None:
        if said is None:
            return "said nothing in time"
        if notice:
            return outlives_notice(node=said.get("node"), peer_node=said.get("peer_node"), doomed=doomed,
                                   here=bool(said.get("here")), at_peer=bool(said.get("at_peer")))
        if not (said.get("here") and said.get("at_peer")):
            return "its copy is not committed in its pod and at its peer"
        return None

    return {p: why for p in range(num_processes) if (why := why_not(verdicts.get(p))) is not None}
