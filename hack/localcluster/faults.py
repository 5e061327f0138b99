"""The chaos soak's fault kinds: one class per kind, each with how it is injected, undone, detected and recovered,
all in one registry (:data:`REGISTRY`).

A kind is a :class:`FaultKind`: what it does (``what``, for ``--faults`` and errors), what it needs of the cluster
(``needs``: :func:`localcluster.chaos.validate` checks it before anything starts), whether it ends the running
attempt (``interrupts``), and four methods:

* :meth:`~FaultKind.inject` carries it out now through an :class:`Env` (:class:`localcluster.injectors.Injectors`,
  which holds the I/O: kills, node signals, deletions, partitions, the checkpoint storage) and returns its target;
* :meth:`~FaultKind.undo` takes back what it left pending (Ctrl-C): signals, due deletions, a partition, a
  storage fault; a kill or a deletion that happened stays;
* :meth:`~FaultKind.detected` says when the harness first saw the operator act on it (pure, over the polls);
* :meth:`~FaultKind.recovered` says whether it recovered when no restart of the job is booked to it (pure; a
  fault that caused a restart recovered when the job trained again: :func:`localcluster.soakrecord.records`).

Every noticed preemption kind is generated from the operator's ``BUILTIN_SIGNALS`` (``notice-<signal name>``), so a
signal added there is a fault kind here, with the same key, value and notice window. Adding any other kind: its
class here, registered; its row in docs/soak.md's faults table; its test in tests/localcluster/test_chaos_unit.py
(``--faults`` accepts it, the default schedule and the CI smoke's rotation include it: both are computed from the
registry).
"""

from __future__ import annotations

import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from reprieve_operator.policy.signals import BUILTIN_SIGNALS, Signal

log = logging.getLogger("soak")

# What a fault needs of the cluster (Capabilities.has): checked by chaos.validate() before anything starts.
REAL_NODES = "real nodes"            # containers in cgroups and network namespaces (not process nodes)
OPERATOR_DEPLOYMENT = "the operator as the chart's Deployment with two replicas"
SPARE = "a warm spare (spec.spares >= 1)"
ROOT = "root (the soak mounts the job's checkpoint storage as a tmpfs)"
IPTABLES = "iptables-restore on PATH (Debian's iptables package: the partition's DROP rules)"
NOTICE_PREFIX = "notice-"
GKE_SPOT = next(s for s in BUILTIN_SIGNALS if s.name == "gke-spot")  # the notice of the composite kinds


# -- what the harness records -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Injected:
    """A fault as the injector carried it out (wall times)."""

    kind: str
    target: str
    at: float
    attempt: int                 # the job's status.attempt when it was injected
    error: str = ""              # the injection itself failed (e.g. no process to kill): counted, unrecovered


@dataclass(frozen=True)
class Observation:
    """One poll of the TrainingJob (and the operator's Lease) by the harness."""

    t: float
    attempt: int = 0
    phase: str = ""
    notice_id: str = ""
    notice_node: str = ""
    checkpoint_step: int | None = None
    leader: str = ""             # the Lease's holderIdentity (<pod>_<pid>; in a container the pid is the same after
    #                              a restart, so a restarted leader shows in the next two fields)
    leader_restarts: int = 0     # restartCount of the holder pod's operator container
    leader_renewed: float = 0.0  # the Lease's renewTime (Unix seconds): only a live holder renews it
    spares: tuple[str, ...] = ()
    last_restart: Mapping[str, Any] | None = None
    operator_lost_steps: int | None = None   # status.goodput.lostSteps
    last_restore: Mapping[str, Any] | None = None  # status.lastRestore (the memory tier's restore)


@dataclass(frozen=True)
class Seen:
    """What :meth:`FaultKind.recovered` judges by: the polls, the step log's last step time, and when each
    storage fault or partition (by its injection time) was undone."""

    obs: Sequence[Observation]
    last_step_t: float
    ended: Mapping[float, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Recovery:
    """A fault no restart is booked to: whether it recovered, how (the table's ``recovery``), and why not."""

    recovered: bool
    recovery: str = ""
    note: str = ""


class Env(Protocol):
    """What a kind's :meth:`~FaultKind.inject` and :meth:`~FaultKind.undo` act through
    (:class:`localcluster.injectors.Injectors`)."""

    rng: random.Random
    doomed: set[str]
    attempt: Callable[[], int]

    def workers(self) -> list[Any]: ...
    def spares(self) -> list[Any]: ...
    def choose(self, items: list[Any], what: str) -> Any: ...
    def worker_node(self) -> str: ...
    def kill(self, pod: Any, role: str) -> None: ...
    def kill_leader(self) -> str: ...
    def notice(self, node: str, sig: Signal) -> None: ...
    def delete_node(self, node: str) -> None: ...
    def restart_apiserver(self, down_seconds: float) -> float: ...
    def partition(self, at: float, seconds: Callable[[random.Random], float]) -> str: ...
    def storage_unwritable(self, at: float, seconds: Callable[[random.Random], float]) -> str: ...
    def storage_full(self, at: float, seconds: Callable[[random.Random], float]) -> str: ...
    def remove_signals(self) -> list[str]: ...
    def heal_partitions(self) -> list[str]: ...
    def end_storage_fault(self) -> list[str]: ...


# -- the kinds --------------------------------------------------------------------------------------------------

class FaultKind(ABC):
    """One kind of fault. Subclasses set the class attributes and implement the four methods."""

    name: str
    what: str
    interrupts: bool                 # expected to end the running attempt (a gang restart follows)
    needs: tuple[str, ...] = ()
    implemented: bool = True
    nodes: int = 1                   # worker nodes it dooms
    signal: Signal | None = None     # notice kinds: the node signal put on the node
    restarts: int = 1                # restarts it may cause (notice-during-restart: its kill's and its notice's)
    costly: bool = False             # a long or double restart (the CI smoke's rotation spreads these one a seed)
    tmpfs: bool = False              # needs the soak's checkpoint-storage tmpfs (mounted before the nodes start)
    holds_node_seconds: float = 0.0  # how long a doomed node stays after the fault (the smoke's rotation)

    @abstractmethod
    def inject(self, env: Env, at: float) -> str:
        """Carry the fault out now (``at``: its wall time); its target in words. Raises when it cannot."""

    @abstractmethod
    def undo(self, env: Env) -> list[str]:
        """Take back what faults of this kind left pending (Ctrl-C); what was undone, in words."""

    @abstractmethod
    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        """Wall time the operator was first seen to act on ``fault``; None: never."""

    @abstractmethod
    def recovered(self, fault: Injected, seen: Seen) -> Recovery:
        """Whether ``fault`` recovered, where no restart of the job is booked to it."""

    def awaited(self, fault: Injected, obs: Sequence[Observation]) -> bool:
        """Whether its recovery may still come after the job ended (the harness keeps polling, up to a minute)."""
        return False


def _after(fault: Injected, obs: Sequence[Observation]) -> Iterator[Observation]:
    return (o for o in obs if o.t >= fault.at)


def next_attempt(fault: Injected, obs: Sequence[Observation]) -> float | None:
    """Wall time the job was first seen in an attempt after the one ``fault`` hit."""
    return next((o.t for o in _after(fault, obs) if o.attempt > fault.attempt), None)


def notice_seen(fault: Injected, obs: Sequence[Observation]) -> float | None:
    """Wall time a notice for one of the fault's nodes (``+``-joined target) was first seen on the job (a new
    ``status.lastNotice``), or the next attempt, whichever came first."""
    before = [o for o in obs if o.t <= fault.at]
    prior_id = before[-1].notice_id if before else ""
    return next((o.t for o in _after(fault, obs) if (o.notice_id and o.notice_id != prior_id and
                                                      o.notice_node in fault.target.split("+"))
                 or o.attempt > fault.attempt), None)


def stepped_after(fault: Injected, seen: Seen, after: float | None = None) -> Recovery:
    """An interrupting fault that ended no attempt: recovered once the job stepped after it (``after``: after it
    was healed)."""
    after = fault.at if after is None else after
    ok = seen.last_step_t > after
    return Recovery(ok, "no restart" if ok else "", "the step log shows no restart after it" + (
        "" if ok else f"; no step after it{' was healed' if after > fault.at else ''} either"))


class EndsAttempt(FaultKind):
    """A kind that ends the running attempt: seen at the next attempt, recovered once the job stepped after it."""

    interrupts = True

    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        return next_attempt(fault, obs)

    def recovered(self, fault: Injected, seen: Seen) -> Recovery:
        return stepped_after(fault, seen)


class Irreversible(FaultKind):
    """Nothing to undo: a kill or a deletion has happened, and the apiserver restart is not left half-way."""

    def undo(self, env: Env) -> list[str]:
        return []


class NoticeKind(EndsAttempt):
    """A kind that puts node signals: the operator is seen to act once the job records the notice; Ctrl-C takes
    the signals off and cancels the deletions not yet due."""

    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        return notice_seen(fault, obs)

    def undo(self, env: Env) -> list[str]:
        return env.remove_signals()


def notice_patch(sig: Signal, now: float) -> tuple[str, str, str | None, float]:
    """How to put ``sig`` on a node at wall time ``now``: (field kind, key, value, seconds until the node is
    deleted). An epoch label carries its own deadline (30 s ahead); a zero window deletes the node at once."""
    if sig.kind == "LabelEpoch":
        deadline = int(now) + 30
        return sig.kind, sig.key, str(deadline), float(deadline - now)
    value = sig.value if sig.value is not None else ("True" if sig.kind == "Condition" else "true")
    return sig.kind, sig.key, value, float(sig.notice_seconds)


class SignalNotice(NoticeKind):
    """``notice-<signal>``: one per built-in node signal."""

    def __init__(self, sig: Signal) -> None:
        window = f"{sig.notice_seconds} s" if sig.notice_seconds else "its deadline"
        self.name = f"{NOTICE_PREFIX}{sig.name}"
        self.what = (f"{sig.kind} {sig.key or 'spec.unschedulable'} on a worker's node, the node deleted after "
                     f"{window}")
        self.signal = sig
        self.holds_node_seconds = notice_patch(sig, 0.0)[3]

    def inject(self, env: Env, at: float) -> str:
        assert self.signal is not None
        node = env.worker_node()
        env.notice(node, self.signal)
        return node


class NodeLost(Irreversible, EndsAttempt):
    name = "node-lost"
    what = "a worker's node vanishes without notice (containers, kubelet and Node gone)"
    costly = True  # the attempt is lost from its last checkpoint

    def inject(self, env: Env, at: float) -> str:
        node = env.worker_node()
        env.delete_node(node)
        return node


def kill_one(env: Env, pods: list[Any], what: str, role: str) -> str:
    """SIGKILL the process of ``role`` in one of ``pods`` (drawn); the pod's name."""
    pod = env.choose(pods, what)
    env.kill(pod, role)
    return str(pod.metadata.name)


class KillWorkerProcess(Irreversible, EndsAttempt):
    """``kill-trainer`` and ``kill-supervisor``: SIGKILL of a worker's process of that role."""

    needs = (REAL_NODES,)

    def __init__(self, role: str, what: str) -> None:
        self.role, self.name, self.what = role, f"kill-{role}", what

    def inject(self, env: Env, at: float) -> str:
        return kill_one(env, env.workers(), "a running worker pod", self.role)


def _holder_at(fault: Injected, obs: Sequence[Observation]) -> str:
    """The Lease holder the harness last saw before ``fault`` (its full identity)."""
    before = [o.leader for o in obs if o.t <= fault.at and o.leader]
    return before[-1] if before else ""


class Replaced(Irreversible):
    """A kill that ends no attempt: recovered once its replacement was seen (:meth:`replaced`)."""

    interrupts = False
    replacement = ""

    def replaced(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        """Wall time the replacement was first seen; None: never."""
        raise NotImplementedError

    def recovered(self, fault: Injected, seen: Seen) -> Recovery:
        back = self.replaced(fault, seen.obs) is not None
        return Recovery(back, self.replacement if back else "", "" if back else "no replacement seen")


class KillSpare(Replaced):
    """No attempt ends: the operator replaces the spare."""

    name = "kill-spare"
    what = "SIGKILL of the warm spare's supervisor (no attempt ends; the spare is replaced)"
    needs = (REAL_NODES, SPARE)
    replacement = "spare replaced"

    def inject(self, env: Env, at: float) -> str:
        return kill_one(env, env.spares(), "a running spare pod", "supervisor")

    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        """The spare gone from the job's running spares."""
        return next((o.t for o in _after(fault, obs) if fault.target not in o.spares), None)

    def replaced(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        """A running spare other than the killed one."""
        return next((o.t for o in _after(fault, obs) if any(s != fault.target for s in o.spares)), None)


class KillOperatorLeader(Replaced):
    """No attempt ends: the kubelet restarts the container, which takes the Lease back, or the standby takes it
    after the lease duration."""

    name = "kill-operator-leader"
    what = "SIGKILL of the operator pod holding the leader Lease (the standby takes over)"
    needs = (REAL_NODES, OPERATOR_DEPLOYMENT)
    replacement = "new leader"

    def inject(self, env: Env, at: float) -> str:
        return env.kill_leader()

    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        """The Lease gone or another holder; or the holder's container restarted (real nodes)."""
        before = [o for o in obs if o.t <= fault.at]
        prior = before[-1] if before else None
        holder = _holder_at(fault, obs)
        return next((o.t for o in _after(fault, obs) if o.leader != holder or (
            prior is not None and o.leader_restarts > prior.leader_restarts)), None)

    def replaced(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        """A Lease holder other than the killed one (the standby, or the killed pod's restarted container: a new
        identity ``<pod>_<pid>`` on process nodes); on real nodes its pid is the same, so the holder pod's
        container restarted and the Lease renewed after the kill."""
        killed = _holder_at(fault, obs)
        restarts = max([o.leader_restarts for o in obs if o.t <= fault.at and o.leader == killed], default=0)
        for o in _after(fault, obs):
            if o.leader and (o.leader != killed if killed else o.leader.rsplit("_", 1)[0] != fault.target):
                return o.t
            if killed and o.leader == killed and o.leader_restarts > restarts and o.leader_renewed > fault.at:
                return o.t  # the killed container restarted in its pod (same identity) and renews the Lease
        return None

    def awaited(self, fault: Injected, obs: Sequence[Observation]) -> bool:
        """The standby takes the Lease only after the lease duration: a leader killed near the job's end."""
        return not fault.error and self.replaced(fault, obs) is None


def during_restart_node(killed_on: str, worker_nodes: Sequence[str], rng: random.Random) -> str:
    """The node ``notice-during-restart`` gives its notice to, once it killed a trainer on ``killed_on``: another
    worker's node, drawn; where every worker shares the killed one's node (the scheduler put a replacement beside
    the other worker), that node: the notice then dooms both, still during the kill's restart (pure)."""
    others = sorted({n for n in worker_nodes if n != killed_on})
    return rng.choice(others) if others else killed_on


class NoticeDuringRestart(NoticeKind):
    name = "notice-during-restart"
    what = ("a GKE spot notice on the other worker's node while a restart is under way (a hard kill first, the "
            "notice as soon as the attempt ends)")
    restarts = 2
    costly = True

    def inject(self, env: Env, at: float) -> str:
        workers = env.workers()
        pod = env.choose(workers, "a running worker pod")
        node = during_restart_node(pod.spec.node_name, [p.spec.node_name for p in workers], env.rng)
        before = env.attempt()
        env.kill(pod, "trainer")
        deadline = time.monotonic() + 20
        while env.attempt() == before and time.monotonic() < deadline:
            time.sleep(0.2)
        env.notice(node, GKE_SPOT)
        return f"{pod.metadata.name}+{node}"

    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        return next_attempt(fault, obs)  # its kill comes first


def two_doomed_nodes(worker_nodes: Sequence[str], spare_nodes: Sequence[str], rng: random.Random) -> list[str]:
    """The nodes ``two-nodes-doomed`` notices at once: two workers' nodes, drawn; where the workers share one
    node, that node and a spare's (the gang's other node), so two nodes are still doomed at once (pure)."""
    nodes = sorted(set(worker_nodes))
    if len(nodes) >= 2:
        return rng.sample(nodes, 2)
    extra = sorted(set(spare_nodes) - set(nodes))
    if not nodes or not extra:
        raise RuntimeError(f"no target: two-nodes-doomed needs the job's pods on two live nodes: workers on {nodes}, "
                           f"spares on {sorted(set(spare_nodes))}")
    return [nodes[0], rng.choice(extra)]


class TwoNodesDoomed(NoticeKind):
    name = "two-nodes-doomed"
    what = "GKE spot notices on both workers' nodes at once, both deleted at the deadline"
    nodes = 2
    costly = True

    def inject(self, env: Env, at: float) -> str:
        chosen = two_doomed_nodes([p.spec.node_name for p in env.workers()],
                                  [p.spec.node_name for p in env.spares() if p.spec.node_name not in env.doomed],
                                  env.rng)
        for node in chosen:
            env.notice(node, GKE_SPOT)
        return "+".join(chosen)


def apiserver_down_seconds(rng: random.Random) -> float:
    """How long an ``apiserver-restart`` keeps the kube-apiserver down: 5-15 s, drawn from the soak's rng."""
    return round(rng.uniform(5.0, 15.0), 1)


def status_written(fault: Injected, obs: Sequence[Observation]) -> float | None:
    """Wall time the harness first saw the operator write the job's status after ``fault`` (an apiserver restart:
    the operator reconnected): a ``lastCheckpointStep`` newer than the last one seen before it, or a final
    phase."""
    before = [o.checkpoint_step for o in obs if o.t <= fault.at and o.checkpoint_step is not None]
    last = before[-1] if before else None
    for o in _after(fault, obs):
        if o.phase in ("Succeeded", "Failed") or (o.checkpoint_step is not None and
                                                   (last is None or o.checkpoint_step > last)):
            return o.t
    return None


class ApiserverRestart(Irreversible):
    name = "apiserver-restart"
    what = "the kube-apiserver stopped (SIGTERM), kept down 5-15 s and started again on the same etcd (every object kept)"
    interrupts = False
    costly = True

    def inject(self, env: Env, at: float) -> str:
        down = apiserver_down_seconds(env.rng)
        took = env.restart_apiserver(down)
        log.info("kube-apiserver restarted: %.1fs down, ready %.1fs after it was stopped", down, took)
        return f"kube-apiserver ({down:.1f}s down)"

    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        """The operator writing the job's status after it (it reconnected)."""
        return status_written(fault, obs)

    def recovered(self, fault: Injected, seen: Seen) -> Recovery:
        """The operator wrote the job's status after it and the job stepped after it; a restart it caused anyway is
        one no fault explains."""
        written = status_written(fault, seen.obs)
        ok = written is not None and seen.last_step_t > fault.at
        return Recovery(ok, "no restart" if ok else "", "" if ok else (
            "no step after it" if written is not None else "the operator wrote no status after it"))


def partition_seconds(rng: random.Random) -> float:
    """How long a ``partition`` cuts its pod off: 10-30 s, drawn from the soak's rng."""
    return round(rng.uniform(10.0, 30.0), 1)


class Partition(EndsAttempt):
    name = "partition"
    what = ("one worker pod cut off the network for 10-30 s (DROP rules in its network namespace but loopback; its "
            "interfaces kept), then healed")
    needs = (REAL_NODES, IPTABLES)
    costly = True  # the restart waits for a peer to be judged lost

    def inject(self, env: Env, at: float) -> str:
        return env.partition(at, partition_seconds)

    def undo(self, env: Env) -> list[str]:
        return env.heal_partitions()

    def recovered(self, fault: Injected, seen: Seen) -> Recovery:
        """A partition that ended no attempt: recovered once the job stepped after it was healed."""
        return stepped_after(fault, seen, seen.ended.get(fault.at, fault.at))


def storage_recovered(until: float, committed: Sequence[tuple[float, int | None]]) -> float | None:
    """When the job was seen, after a storage fault that ended at ``until``, with a checkpoint newer than every
    one seen until then (nothing commits while the storage is read-only or full, and a step first reported during
    the fault was committed before it): the next due save after the fault committed. ``committed``: ``(time, the
    status's lastCheckpointStep)`` of each observation, in order. None: never."""
    before = max((step for t, step in committed if t < until and step is not None), default=-1)
    return next((t for t, step in committed if t >= until and step is not None and step > before), None)


class StorageFault(FaultKind):
    """The job's checkpoint storage (a tmpfs the soak mounts) unusable for a while; no attempt ends."""

    interrupts = False
    needs = (ROOT,)
    tmpfs = True

    @staticmethod
    @abstractmethod
    def seconds(rng: random.Random) -> float:
        """How long it lasts."""

    def undo(self, env: Env) -> list[str]:
        return env.end_storage_fault()

    def detected(self, fault: Injected, obs: Sequence[Observation]) -> float | None:
        return next_attempt(fault, obs)  # it ends no attempt: seen only if one ended anyway

    def recovered(self, fault: Injected, seen: Seen) -> Recovery:
        """Once the next due save after it committed."""
        until = seen.ended.get(fault.at, fault.at)
        saved = storage_recovered(until, [(o.t, o.checkpoint_step) for o in seen.obs])
        return Recovery(saved is not None, "no restart" if saved is not None else "",
                        f"the next checkpoint committed {saved - until:.1f}s after it ended" if saved is not None
                        else "no newer checkpoint seen committed after it")


STORAGE_UNAVAILABLE_SECONDS = 10.0


class StorageUnavailable(StorageFault):
    name = "storage-unavailable"
    what = ("the checkpoint storage (a tmpfs) not writable for 10 s (real nodes: its directories' write bits off; "
            "process nodes: remounted read-only)")

    @staticmethod
    def seconds(rng: random.Random) -> float:
        return STORAGE_UNAVAILABLE_SECONDS

    def inject(self, env: Env, at: float) -> str:
        return env.storage_unwritable(at, self.seconds)


class StorageFull(StorageFault):
    name = "storage-full"
    what = "the checkpoint storage (a tmpfs) filled with a ballast file for 10-20 s"

    @staticmethod
    def seconds(rng: random.Random) -> float:
        return round(rng.uniform(10.0, 20.0), 1)

    def inject(self, env: Env, at: float) -> str:
        return env.storage_full(at, self.seconds)


# -- the registry -----------------------------------------------------------------------------------------------

class Registry(Mapping[str, FaultKind]):
    """Fault kinds by name, in the order registered (the default schedule's order)."""

    def __init__(self, kinds: Iterable[FaultKind] = ()) -> None:
        self._kinds: dict[str, FaultKind] = {}
        for kind in kinds:
            self.register(kind)

    def register(self, kind: FaultKind) -> FaultKind:
        """Add ``kind``; a name taken already is a ValueError."""
        if kind.name in self._kinds:
            raise ValueError(f"fault kind {kind.name!r} is registered already ({type(self._kinds[kind.name]).__name__})")
        self._kinds[kind.name] = kind
        return kind

    def __getitem__(self, name: str) -> FaultKind:
        return self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)


REGISTRY = Registry([
    *(SignalNotice(s) for s in BUILTIN_SIGNALS),
    NodeLost(),
    KillWorkerProcess("trainer", "SIGKILL of a worker's trainer process (the supervisor lives on)"),
    KillWorkerProcess("supervisor", "SIGKILL of a worker's supervisor (reprieve-supervisor, the container's PID 1)"),
    KillSpare(), KillOperatorLeader(), NoticeDuringRestart(),
    TwoNodesDoomed(), ApiserverRestart(), Partition(), StorageUnavailable(), StorageFull(),
])
