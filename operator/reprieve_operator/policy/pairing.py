"""Pure decision: which pod holds each process's memory-tier replica (``memoryPeers`` in the assignment).

Every process's memory copy is sent to one peer pod (``docs/memory.md``, "Pairing"), so that a node lost without
notice still leaves that process's newest copy in another pod's memory. The rules:

* **another node, always**: a replica on the process's own node dies with it; a process whose only candidates
  share its node gets no peer (own copies only) and a problem naming it, never a same-node pairing;
* **another zone when nodes carry zone labels** (``topology.kubernetes.io/zone``): preferred, not required (a
  one-zone pool still pairs across nodes);
* **spares may hold replicas**: a spare holds no copy of its own, so it has room for two; a process pod for one
  (its memory volume holds its own copy, one peer's copy and one in flight: ``copies_per_limit`` 3);
* **stable**: a pairing that is still valid is kept (a re-pair after a replacement moves only the replicas that
  lived on the replaced pod, or belonged to it), then the nearest pod after the process in index order
  (a ring, as a rolling node loss then never takes a process and its peer together by construction);
* **as many pairs as possible**: a maximum matching of processes to holder slots (augmenting paths), trying
  each process's candidates in that order of preference.

:func:`check_pairing` refuses a given pairing (from a user or an older operator) that puts a process's replica
on its own node, on itself, or on a pod that is not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ZONE_LABEL = "topology.kubernetes.io/zone"
MEMORY_PORT = 8477  # every pod's replica server (reprieve-supervisor); docs/contract.toml [memory.defaults] port
PROCESS_SLOTS = 1  # a process pod: its own copy, one peer's and one in flight
SPARE_SLOTS = 2  # a spare holds no own copy: two peers' copies and one in flight fit the same volume


@dataclass(frozen=True)
class Holder:
    """A running pod that can hold replicas: its replica server's address and where it runs."""

    pod: str
    address: str  # host:port of its replica server (pod IP and the memory port)
    node: str | None
    zone: str | None = None
    process: int | None = None  # the process it runs; None: a spare

    @property
    def slots(self) -> int:
        return SPARE_SLOTS if self.process is None else PROCESS_SLOTS


@dataclass(frozen=True)
class Pairing:
    """``peers``: process index -> the address holding its replica (None: own copies only); ``problems``: why."""

    peers: dict[int, str | None]
    problems: list[str]


def _same_node(a: Holder, b: Holder) -> bool:
    return a.node is not None and a.node == b.node


def _preference(proc: Holder, holders: list[Holder], count: int, previous: str | None) -> list[int]:
    """Indices into ``holders`` of the pods that may hold ``proc``'s replica, best first."""
    me = proc.process
    assert me is not None

    def key(i: int) -> tuple[int, int, int, int, str]:
        h = holders[i]
        kept = 0 if h.address == previous else 1
        other_zone = 0 if (proc.zone and h.zone and proc.zone != h.zone) else 1
        ring = ((h.process - me) % count) if h.process is not None else count  # spares after the ring
        return kept, other_zone, ring, 0 if h.process is None else 1, h.pod

    ok = [i for i, h in enumerate(holders) if h.pod != proc.pod and not _same_node(h, proc)]
    return sorted(ok, key=key)


def pair(holders: list[Holder], previous: Mapping[int, str | None] | None = None) -> Pairing:
    """Pair every process pod in ``holders`` with a replica holder (other process pods and spares)."""
    procs = sorted((h for h in holders if h.process is not None), key=lambda h: h.process or 0)
    count = max((h.process or 0) for h in procs) + 1 if procs else 0
    prefs = {p.process: _preference(p, holders, count, (previous or {}).get(p.process or 0)) for p in procs}
    slots_of: dict[int, list[int]] = {i: [] for i in range(len(holders))}  # holder -> processes it holds

    def place(proc: int, seen: set[int]) -> bool:
        """Kuhn's augmenting path over holder slots; a free slot in preference order first."""
        for i in prefs[proc]:
            if i not in seen and len(slots_of[i]) < holders[i].slots:
                seen.add(i)
                slots_of[i].append(proc)
                return True
        for i in prefs[proc]:
            if i in seen:
                continue
            seen.add(i)
            for other in list(slots_of[i]):
                if place(other, seen):
                    slots_of[i].remove(other)
                    slots_of[i].append(proc)
                    return True
        return False

    def keeps(p: Holder) -> bool:  # its previous peer is still a candidate
        before = (previous or {}).get(p.process or 0)
        return any(holders[i].address == before for i in prefs[p.process])

    for p in sorted(procs, key=lambda p: (not keeps(p), p.process)):  # kept pairings are placed first
        assert p.process is not None
        place(p.process, set())
    held = {proc: holders[i].address for i, procs_held in slots_of.items() for proc in procs_held}
    peers: dict[int, str | None] = {}
    problems = []
    for p in procs:
        assert p.process is not None
        peers[p.process] = held.get(p.process)
        if peers[p.process] is None:
            why = ("every other pod runs on its node " + repr(p.node)) if not prefs[p.process] else (
                "every pod on another node already holds as many replicas as its memory volume has room for")
            problems.append(f"process {p.process} (pod {p.pod}) has no memory-tier peer: {why}; it keeps its own "
                            "copies only (a loss of its node falls back to storage for it). Add a node or a spare")
    return Pairing(peers, problems)


def address(ip: str, port: int = MEMORY_PORT) -> str:
    """``host:port`` of a pod's replica server (``[v6]:port`` for an IPv6 pod IP)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def check_pairing(peers: Mapping[int, str | None], holders: list[Holder]) -> list[str]:
    """Why a given pairing is refused (pure): a replica on its own pod or node, or on a pod that is not there."""
    by_address = {h.address: h for h in holders}
    by_process = {h.process: h for h in holders if h.process is not None}
    problems = []
    for proc, address in sorted(peers.items()):
        if address is None:
            continue
        own, peer = by_process.get(proc), by_address.get(address)
        if own is None:
            problems.append(f"memoryPeers[{proc}]: no pod runs process {proc}")
        elif peer is None:
            problems.append(f"memoryPeers[{proc}]={address}: no pod of this job serves replicas there")
        elif peer.pod == own.pod:
            problems.append(f"memoryPeers[{proc}]={address} is process {proc}'s own pod {own.pod}: the replica "
                            "would die with the copy it protects")
        elif _same_node(peer, own):
            problems.append(f"memoryPeers[{proc}]={address} (pod {peer.pod}) runs on node {own.node}, as process "
                            f"{proc} does: one node failure would take both copies; pair it with a pod on another node")
    return problems
