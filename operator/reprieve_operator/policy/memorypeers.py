"""Pure: the memory tier's pairing of an in-place job's attempts (``docs/contract.md``, "Memory tier").

``policy.pairing`` does the matching; this module says who may hold a replica in which attempt and checks the
pairing in force:

* **the first attempt** is paired before any pod runs (nodes and pod IPs are not known yet): a ring over the
  workers' stable names, process ``i`` -> ``<job>-<i+1>.<job>.<ns>.svc:<port>`` (the headless Service's record of
  the pod ``<job>-<i+1>``), given to each pod as ``REPRIEVE_MEMORY_PEER`` and written in the first assignment;
  a one-process job has no peer in its first attempt (a spare's name is not known before it exists);
* **every later attempt** is paired by ``policy.pairing.pair`` over the pods that run it and the ready spares,
  with their nodes and zones (``topology.kubernetes.io/zone`` of the node), keeping the previous attempt's
  pairings that are still valid (a stable name counts as the address of the pod that answers to it);
* **the pairing in force is checked** once every pod of the attempt runs on a known node
  (:func:`pairing_condition`): a process without a peer, or whose peer runs on its own node (the ring's
  neighbour scheduled beside it), is named with both nodes in the ``MemoryPaired`` condition; the shell posts an
  Event when that condition changes (``policy.events``). The copies themselves stay correct either way: a
  process whose replica shares its node keeps its own copy, and a loss of that node falls back to storage;
* **the job's loss rate** (:func:`loss_every`): when the spec gives no interval and no
  ``lossEverySeconds``, a later assignment carries ``lossEverySeconds``, the job's wall seconds over the losses
  without notice its status counts (``restarts.disruption``), so the runtime spaces the copies for the rate the
  job has met (Young/Daly, docs/memory.md) where that is closer than the cost budget's;
* **a tier that switched itself off** (process 0's progress report says ``memoryOff``: the state does not fit the
  memory limit) protects nothing: ``MemoryPaired`` is False with reason ``MemoryTierOff``, the runtime's why and
  what to change, whatever the pairing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..models import TrainingJob
from .pairing import MEMORY_PORT, Holder, address, check_pairing, pair
from .restart import Condition
from .views import PodView

PAIRED = "MemoryPaired"  # the condition type
TIER_OFF = "MemoryTierOff"  # its reason (and the Warning Event's) when the runtime switched the tier off


def enabled(job: TrainingJob) -> bool:
    m = job.spec.checkpoint.memory
    return m is not None and m.enabled


def loss_every(job: TrainingJob) -> int | None:
    """The assignment's ``lossEverySeconds``: the mean wall seconds between the job's losses without notice so far
    (``status.goodput.wallSeconds`` over ``status.restarts.disruption``, at least 1 s); None without an enabled
    tier, before the first such loss, or when the spec spaces the copies itself (an interval, or its own
    ``lossEverySeconds``, which the pods' environment carries)."""
    m = job.spec.checkpoint.memory
    if m is None or not m.enabled or m.interval_steps or m.interval_seconds or m.loss_every_seconds:
        return None
    st = job.status
    losses = st.restarts.disruption
    wall = st.goodput.wall_seconds if st.goodput is not None else 0.0
    if losses < 1 or wall <= 0:
        return None
    return max(1, round(wall / losses))


def stable_address(job: TrainingJob, pod: str) -> str:
    """The replica server of pod ``pod`` under its headless-Service name (resolvable before the pod runs)."""
    return f"{pod}.{job.name}.{job.namespace}.svc:{MEMORY_PORT}"


def first_peers(job: TrainingJob) -> dict[int, str | None]:
    """The first attempt's pairing: a ring over ``<job>-<i>``'s stable names; {} without an enabled tier."""
    if not enabled(job):
        return {}
    n = job.spec.replicas
    return {i: (stable_address(job, f"{job.name}-{(i + 1) % n}") if n > 1 else None) for i in range(n)}


def _pod_at(job: TrainingJob, peer: str, pods: Sequence[PodView]) -> PodView | None:
    """The pod serving replicas at ``peer`` (its IP address or its stable name)."""
    for p in pods:
        if (p.ip and peer == address(p.ip)) or peer == stable_address(job, p.name):
            return p
    return None


def _holder(p: PodView, process: int | None) -> Holder:
    assert p.ip, "only a pod with an IP serves replicas"
    return Holder(p.name, address(p.ip), p.node, p.zone, process)


def memory_peers(job: TrainingJob, processes: Mapping[str, int], pods: Sequence[PodView],
                 previous: Mapping[int, str | None] | None) -> dict[int, str | None]:
    """A later attempt's pairing for ``processes`` (pod name -> index) over ``pods`` (the attempt's pods and the
    ready spares), the ``previous`` attempt's pairings kept where still valid. {} without an enabled tier."""
    if not enabled(job):
        return {}
    holders = [_holder(p, processes.get(p.name)) for p in pods if p.ip]
    before: dict[int, str | None] = {}
    for index, peer in (previous or {}).items():
        at = _pod_at(job, peer, pods) if peer else None
        before[index] = address(at.ip) if at is not None and at.ip else peer
    return pair(holders, before).peers


def peer_nodes(job: TrainingJob, peers: Mapping[int, str | None], pods: Sequence[PodView]) -> dict[int, str]:
    """The node of each process's peer (the assignment's ``memoryPeerNodes``), where it is known."""
    out: dict[int, str] = {}
    for index, peer in peers.items():
        at = _pod_at(job, peer, pods) if peer else None
        if at is not None and at.node:
            out[index] = at.node
    return out


def pairing_condition(job: TrainingJob, processes: Mapping[str, int], peers: Mapping[int, str | None],
                      pods: Sequence[PodView]) -> Condition | None:
    """``MemoryPaired`` for the assignment in force (``processes``, ``peers``); None when there is nothing to
    say yet (no enabled tier, or a listed pod not running on a known node)."""
    if not enabled(job):
        return None
    by_name = {p.name: p for p in pods}
    listed = [by_name.get(n) for n in processes]
    if not processes or any(p is None or not p.node or p.phase != "Running" for p in listed):
        return None
    off = next((p.memory_off[1] for p in listed if p is not None and p.memory_off is not None
                and p.memory_off[0] == job.status.attempt), None)
    if off is not None:
        return Condition(PAIRED, "False", TIER_OFF, (
            f"the memory tier is off in attempt {job.status.attempt}: {off}. Until then no process has a memory copy: "
            "a restart restores from storage only")[:2000])
    holders = [_holder(p, processes.get(p.name)) for p in pods
               if p.ip and (p.name in processes or p.role == "spare")]
    resolved: dict[int, str | None] = {}
    problems: list[str] = []
    for name, index in sorted(processes.items(), key=lambda kv: kv[1]):
        me = by_name[name]
        peer = peers.get(index)
        if not peer:
            problems.append(f"process {index} (pod {name} on node {me.node}) has no memory-tier peer in this "
                            "attempt: no other pod of the job on another node had room for its replica when the "
                            f"attempt was paired{_why_alone(job, len(processes))}; it keeps its own copies only (a "
                            "loss of its node falls back to storage for it). Spread the job's pods over more nodes "
                            "or add a spare (spec.spares)")
            continue
        at = _pod_at(job, peer, pods)
        resolved[index] = address(at.ip) if at is not None and at.ip else peer
    problems += check_pairing(resolved, holders)
    if problems:
        return Condition(PAIRED, "False", "PairingProblem", "; ".join(problems)[:2000])
    return Condition(PAIRED, "True", "Paired", f"each of the {len(processes)} process(es) has its memory-tier "
                                               "replica in a pod on another node")


def _why_alone(job: TrainingJob, processes: int) -> str:
    """Why an attempt can lack a peer, when its size says: a one-process job's first attempt is paired before any
    spare exists; a shrunk attempt's pods left for the lost workers do not run."""
    if job.spec.replicas == 1:
        return " (a one-process job's first attempt is paired before any spare exists)"
    if processes < job.spec.replicas:
        return (f" (the job shrank to {processes} of its {job.spec.replicas} workers: the pods made for the others "
                "do not run)")
    return ""
