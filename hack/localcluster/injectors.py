"""The chaos soak's injectors: the I/O through which each fault kind of :mod:`localcluster.faults` is carried out
on the local cluster (:class:`Injectors` is the kinds' :class:`localcluster.faults.Env`).

Thin I/O: the choices (which process is the trainer, what to put on a node) are pure functions here and in
``faults``. Everything an injector leaves behind (a signal on a node, a node deletion due at a deadline) is
registered, so :meth:`Injectors.stop` (Ctrl-C) undoes what has not yet happened: signals removed, pending
deletions cancelled, the checkpoint storage made writable and emptied of its ballast, partitioned pods' network
namespaces healed. Nodes deleted by a fault are replaced in the background by new ones of the same pool, so the
job always has somewhere to go.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cgroups
from .faults import REGISTRY, Injected, notice_patch
from .testing import cordon_node, label_node, set_node_condition, taint_node, untaint_node

log = logging.getLogger("soak")


@dataclass(frozen=True)
class Proc:
    """A process of a container, seen from the host: ``inner`` is its pid in the container's pid namespace."""

    pid: int
    ppid: int
    inner: int
    started: int  # clock ticks after boot (/proc/<pid>/stat field 22)
    comm: str = ""  # /proc/<pid>/comm: the pod's sandbox ("pause") is a PID 1 in the pod's cgroup too


def pick(role: str, procs: Sequence[Proc]) -> Proc | None:
    """The supervisor (the container's PID 1: ``reprieve-supervisor``) or the trainer (the supervisor's oldest child: a
    warm process is always started after the trainer it stands in for, and takes over only when that one is gone).

    The pod's sandbox process (``pause``) is a PID 1 of its own pid namespace in the same pod cgroup: never it
    (the first soak on real nodes killed the sandbox instead of the supervisor, and found no trainer under it)."""
    sup = next((p for p in procs if p.inner == 1 and p.comm != "pause"), None)
    if role == "supervisor" or sup is None:
        return sup
    children = sorted((p for p in procs if p.ppid == sup.pid), key=lambda p: (p.started, p.pid))
    return children[0] if children else None


PARTITION_CHAIN = "REPRIEVE-SOAK-PARTITION"


def partition_rules(cut: bool, chain: str = PARTITION_CHAIN) -> str:
    """``iptables-restore --noflush`` input that cuts a network namespace off (``cut``) or heals it: a chain of our
    own that drops everything, jumped to first from INPUT and OUTPUT for every interface but loopback. Nothing
    else of the namespace is touched: its interfaces, addresses and routes stay (the pod's IP is kept, so healing
    is taking the rules out), its other rules stay, and a process inside it still talks to itself. Pure."""
    jumps = (f"INPUT ! -i lo -j {chain}", f"OUTPUT ! -o lo -j {chain}")
    if cut:
        lines = [f":{chain} - [0:0]", f"-A {chain} -j DROP", *(f"-I {j.replace(' ', ' 1 ', 1)}" for j in jumps)]
    else:
        lines = [*(f"-D {j}" for j in jumps), f"-F {chain}", f"-X {chain}"]
    return "\n".join(["*filter", *lines, "COMMIT", ""])


def netns_holder(procs: Sequence[Proc]) -> Proc | None:
    """The process whose network namespace is the pod's: its sandbox (``pause``, the pid namespace's PID 1 that
    holds the pod's namespaces for the pod's whole life), else any process of the pod (they all share it)."""
    return next((p for p in procs if p.comm == "pause"), procs[0] if procs else None)


@dataclass(frozen=True)
class PodView:
    """What the soak needs of one of the job's pods."""

    name: str
    role: str        # the reprieve.dev/role label: worker | spare ("" outside in-place mode)
    node: str
    live: bool       # Running and not being deleted


def split_roles(pods: Sequence[PodView], assigned: Collection[str] | None) -> tuple[list[PodView], list[PodView]]:
    """(workers, spares) among the live pods. In place, a spare that took over an index keeps its name and its
    ``role=spare`` label: the workers are the pods the current assignment (``processes`` of the
    ``<job>-assignment`` ConfigMap) lists, the spares the other live ``role=spare`` pods. Without an assignment
    (``assigned`` None): by the label."""
    live = [p for p in pods if p.live]
    if assigned is None:
        return [p for p in live if p.role != "spare"], [p for p in live if p.role == "spare"]
    return ([p for p in live if p.name in assigned],
            [p for p in live if p.name not in assigned and p.role == "spare"])


def assigned_pods(configmap_data: Mapping[str, str] | None) -> set[str] | None:
    """The pods of an assignment ConfigMap's ``processes`` (pod -> process index); None without one."""
    raw = (configmap_data or {}).get("processes")
    if not raw:
        return None
    try:
        return set(json.loads(raw))
    except ValueError:
        return None


def view(pod: Any) -> PodView:
    """A Kubernetes client pod as a :class:`PodView`."""
    return PodView(str(pod.metadata.name), str((pod.metadata.labels or {}).get("reprieve.dev/role") or ""),
                   str(pod.spec.node_name or ""), pod.status.phase == "Running" and not pod.metadata.deletion_timestamp)


def _proc(pid: int) -> Proc | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    nspid = fields.get("NSpid", str(pid)).split()
    after_comm = stat.rsplit(")", 1)[1].split()
    return Proc(pid, int(fields.get("PPid", "0")), int(nspid[-1]), int(after_comm[19]),
                fields.get("Name", "").strip())


def pod_processes(cgroup_tree: str, pod_uid: str) -> list[Proc]:
    """Processes of the pod with ``pod_uid`` on the real node whose cgroup tree is ``cgroup_tree``."""
    want = pod_uid.replace("-", "_")
    out = []
    for pid in cgroups.pids(cgroup_tree):
        try:
            if want not in Path(f"/proc/{pid}/cgroup").read_text().replace("-", "_"):
                continue
        except OSError:
            continue
        p = _proc(pid)
        if p is not None and p.inner != 0:
            out.append(p)
    return out


class Injectors:
    """Carries out faults on ``job`` in ``namespace`` of ``cluster`` (real nodes in ``pool``)."""

    def __init__(self, cluster: Any, api: Any, namespace: str, job: str, *, pool_labels: dict[str, str],
                 node_kind: str, rng: random.Random, attempt: Callable[[], int], operator: Any = None,
                 add_node_kwargs: dict[str, Any] | None = None) -> None:
        self.cluster, self.api, self.ns, self.job = cluster, api, namespace, job
        self.pool_labels, self.node_kind, self.rng, self.attempt = pool_labels, node_kind, rng, attempt
        self.operator = operator
        self.add_node_kwargs = add_node_kwargs or {}
        self.undo: dict[str, Callable[[], None]] = {}   # node -> remove the signal put on it
        # the job's checkpoint storage, a tmpfs the soak mounted (storage-* faults); the storage fault in force:
        # (what it did, how to undo it), and when each one injected (by Injected.at) ended or is due to end
        self.storage: Path | None = None
        self.storage_fault: tuple[float, str, Callable[[], None]] | None = None  # (injected at, what, undo)
        self.storage_until: dict[float, float] = {}
        # partitions in force (by Injected.at): (pod, what, heal), and when each one injected ended or is due to end
        self.partitions: dict[float, tuple[str, str, Callable[[], None]]] = {}
        self.partitioned: set[str] = set()  # pods cut off now (a second partition picks another)
        self.partition_until: dict[float, float] = {}
        self.timers: list[threading.Timer] = []
        self.doomed: set[str] = set()
        self.replace: queue.Queue[str | None] = queue.Queue()
        self.added = 0
        self.lock = threading.Lock()
        self.replacer = threading.Thread(target=self._replace_loop, daemon=True, name="soak-replacer")
        self.replacer.start()

    # -- reading the job ---------------------------------------------------------------------------------------
    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def pods(self) -> list[Any]:
        return list(self._core().list_namespaced_pod(self.ns, label_selector=f"reprieve.dev/job-name={self.job}")
                    .items)

    def assigned(self) -> set[str] | None:
        from kubernetes import client

        try:
            cm = self._core().read_namespaced_config_map(f"{self.job}-assignment", self.ns)
        except client.ApiException:
            return None
        return assigned_pods(cm.data)

    def _roles(self) -> tuple[list[Any], list[Any]]:
        pods = {p.metadata.name: p for p in self.pods()}
        workers, spares = split_roles([view(p) for p in pods.values()], self.assigned())
        return [pods[w.name] for w in workers], [pods[s.name] for s in spares]

    def workers(self) -> list[Any]:
        """Running worker pods (those of the current assignment) on nodes not already doomed."""
        return [p for p in self._roles()[0] if p.spec.node_name not in self.doomed]

    def spares(self) -> list[Any]:
        """Running spares not assigned an index."""
        return self._roles()[1]

    # -- the faults: each kind's inject and undo (localcluster.faults) act through these ------------------------
    def inject(self, kind: str) -> Injected:
        """Carry out one fault of ``kind`` now; what went wrong is in ``Injected.error`` (never raised)."""
        at, attempt = time.time(), self.attempt()
        try:
            target = REGISTRY[kind].inject(self, at)
        except Exception as err:  # noqa: BLE001 - a failed injection is recorded, and the soak goes on
            log.warning("fault %s not injected: %s", kind, err)
            return Injected(kind, "", at, attempt, error=str(err)[:300])
        return Injected(kind, target, at, attempt)

    def choose(self, items: list[Any], what: str) -> Any:
        if not items:
            raise RuntimeError(f"no target: {what} was needed and none is there")
        return self.rng.choice(sorted(items, key=lambda p: p.metadata.name))

    def worker_node(self) -> str:
        return str(self.choose(self.workers(), "a running worker pod on a node not already doomed")
                   .spec.node_name)

    def kill(self, pod: Any, role: str) -> None:
        node = pod.spec.node_name
        if not self.cluster.is_real(node):
            raise RuntimeError(f"pod {pod.metadata.name} is on {node}, not a real node")
        procs = pod_processes(self.cluster.real.tree(node), pod.metadata.uid)
        target = pick(role, procs)
        if target is None:
            raise RuntimeError(f"no {role} process in pod {pod.metadata.name} (processes: {procs})")
        log.info("SIGKILL %s of %s: host pid %d", role, pod.metadata.name, target.pid)
        os.kill(target.pid, signal.SIGKILL)

    def kill_leader(self) -> str:
        """SIGKILL the operator pod holding the leader Lease; its name."""
        from .stack import RELEASE_NS

        leader = self.operator.leader() if self.operator is not None else None
        if not leader:
            raise RuntimeError("no operator pod holds the leader Lease")
        self.kill(self._core().read_namespaced_pod(leader, RELEASE_NS), "supervisor")
        return str(leader)

    def restart_apiserver(self, down_seconds: float) -> float:
        """Stop the kube-apiserver for ``down_seconds`` and start it again; seconds until it was ready."""
        return float(self.cluster.restart_apiserver(down_seconds=down_seconds))

    def notice(self, node: str, sig: Any) -> None:
        field, key, value, delete_after = notice_patch(sig, time.time())
        if field == "Taint":
            taint_node(self.api, node, key, value, "NoSchedule")
            undo: Callable[[], None] = lambda: untaint_node(self.api, node, key)
        elif field in ("Label", "LabelEpoch"):
            label_node(self.api, node, {key: value})
            undo = lambda: label_node(self.api, node, {key: None})
        elif field == "Condition":
            set_node_condition(self.api, node, key, str(value), reason="Soak")
            undo = lambda: set_node_condition(self.api, node, key, "False", reason="Soak")
        else:
            cordon_node(self.api, node)
            undo = lambda: cordon_node(self.api, node, False)
        with self.lock:
            self.undo[node] = undo
            self.doomed.add(node)
        log.info("notice %s on %s; node deleted in %.0fs", sig.name, node, delete_after)
        timer = threading.Timer(delete_after, self.delete_node, args=(node,))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def delete_node(self, node: str) -> None:
        with self.lock:
            self.doomed.add(node)
            self.undo.pop(node, None)
        log.info("node %s deleted", node)
        try:
            self.cluster.remove_node(node)
        except Exception as err:  # noqa: BLE001 - on a timer thread: log, a replacement comes anyway
            log.warning("removing node %s: %s", node, err)
        self.replace.put(node)

    def remove_signals(self) -> list[str]:
        """Take the signals put on nodes still there off them (their deletions, not yet due, are cancelled by
        :meth:`stop`)."""
        done = []
        with self.lock:
            undo = dict(self.undo)
            self.undo.clear()
        for node, fn in undo.items():
            try:
                fn()
                done.append(f"signal removed from {node}, its deletion cancelled")
            except Exception as err:  # noqa: BLE001
                done.append(f"could not remove the signal from {node}: {err}")
        return done

    def partition(self, at: float, seconds: Callable[[random.Random], float]) -> str:
        """Cut a worker pod's network namespace off (:func:`partition_rules`) for ``seconds(rng)``, then heal it (a
        timer, or :meth:`stop`): :meth:`cut`, through the pod's sandbox process."""
        pod = self.choose([p for p in self.workers() if p.metadata.name not in self.partitioned],
                          "a running worker pod not already cut off")
        node, name = pod.spec.node_name, str(pod.metadata.name)
        if not self.cluster.is_real(node):
            raise RuntimeError(f"pod {name} is on {node}, not a real node")
        holder = netns_holder(pod_processes(self.cluster.real.tree(node), pod.metadata.uid))
        if holder is None:
            raise RuntimeError(f"no process in pod {name}: its network namespace cannot be found")
        what = self.cut(at, name, holder.pid, seconds(self.rng),
                        not_those_of=[self.cluster.real.net.popen.pid, os.getpid()])
        log.info("partition: %s (network namespace of host pid %d, node %s)", what, holder.pid, node)
        return what

    def cut(self, at: float, pod: str, pid: int, seconds: float, *, not_those_of: Sequence[int]) -> str:
        """Cut the network namespace of process ``pid`` (pod ``pod``'s) off for ``seconds`` and register the heal
        (a timer; :meth:`stop` heals it early). The namespace is held open from the cut to the heal, so the heal
        reaches it even if every process of the pod ended meanwhile; never that of a process in ``not_those_of``
        (the node's, the host's: :func:`cut_netns`)."""
        netns = cut_netns(pid, not_those_of=not_those_of)
        what = f"{pod} cut off for {seconds:.1f}s"

        def heal() -> None:
            try:
                heal_netns(netns)
            finally:
                os.close(netns)

        with self.lock:
            self.partitions[at] = (pod, what, heal)
            self.partitioned.add(pod)
            self.partition_until[at] = time.time() + seconds
        timer = threading.Timer(seconds, self._heal, args=(at,))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()
        return what

    def _heal(self, at: float) -> tuple[str, str] | None:
        """Heal the partition injected at ``at``: (what it was, "" or why the heal failed); None if none is in
        force (healed already)."""
        with self.lock:
            fault = self.partitions.pop(at, None)
            if fault is None:
                return None
            self.partition_until[at] = min(self.partition_until[at], time.time())
            self.partitioned.discard(fault[0])
        what, heal = fault[1], fault[2]
        try:
            heal()
        except Exception as err:  # noqa: BLE001 - on a timer thread: said (the rules die with the pod's netns)
            log.warning("healing the partition (%s) failed: %s", what, err)
            return what, str(err)
        log.info("partition healed: %s is over", what)
        return what, ""

    def heal_partitions(self) -> list[str]:
        """Heal every partition still in force."""
        done = []
        with self.lock:
            pending = list(self.partitions)
        for at in pending:
            healed = self._heal(at)
            if healed:
                done.append(f"partition healed: {healed[0]} ended early" if not healed[1] else
                            f"could not heal the partition ({healed[0]}): {healed[1]}")
        return done

    def storage_unwritable(self, at: float, seconds: Callable[[random.Random], float]) -> str:
        """The checkpoint storage not writable for ``seconds(rng)``: on real nodes every directory of the tmpfs
        loses its write bits (:func:`deny_writes`: the trainer runs as a non-root user); on process nodes
        (trainers run as root) the tmpfs is remounted read-only (the superblock's flag: every bind mount of it
        turns read-only).

        Not the remount on real nodes: runc copies a bind mount's source flags into the container's mount (so
        that its remount is allowed), and a container created while the superblock was read-only kept a
        read-only checkpoint mount for ever (the 30-minute soak of 2026-11-27: a spare made during the fault
        took over later and could not write its fence)."""
        def apply(root: Path, secs: float) -> tuple[str, Callable[[], None]]:
            if self.node_kind == "real":
                return f"{root} not writable (directories' write bits off) for {secs:.0f}s", deny_writes(root)
            remount(root, "ro")
            return f"{root} read-only for {secs:.0f}s", lambda: remount(root, "rw")

        return self._storage_fault(at, seconds, apply)

    def storage_full(self, at: float, seconds: Callable[[random.Random], float]) -> str:
        """The checkpoint storage filled with a ballast file for ``seconds(rng)``."""
        def apply(root: Path, secs: float) -> tuple[str, Callable[[], None]]:
            ballast = root / "soak-ballast"
            size = fill(ballast)
            return (f"{root} full ({size >> 20} MiB of ballast) for {secs:.0f}s",
                    lambda: ballast.unlink(missing_ok=True))

        return self._storage_fault(at, seconds, apply)

    def _storage_fault(self, at: float, seconds: Callable[[random.Random], float],
                       apply: Callable[[Path, float], tuple[str, Callable[[], None]]]) -> str:
        """Put a storage fault on the tmpfs (``apply``: what it did, and its undo), undone by a timer (or
        :meth:`stop`); a storage fault still in force is undone first."""
        if self.storage is None:
            raise RuntimeError("no checkpoint storage tmpfs is mounted (the soak mounts one when storage faults are "
                               "scheduled)")
        self._end_storage_fault()
        secs = seconds(self.rng)
        what, undo = apply(self.storage, secs)
        with self.lock:
            self.storage_fault = (at, what, undo)
            self.storage_until[at] = time.time() + secs
        timer = threading.Timer(secs, self._end_storage_fault, args=(at,))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()
        log.info("checkpoint storage %s", what)
        return what

    def end_storage_fault(self) -> list[str]:
        """Undo the storage fault in force, if any."""
        try:
            ended = self._end_storage_fault()
        except Exception as err:  # noqa: BLE001
            return [f"could not restore the checkpoint storage: {err}"]
        return [f"checkpoint storage restored: {ended} ended early"] if ended else []

    def _end_storage_fault(self, at: float | None = None) -> str | None:
        """Undo the storage fault in force (``at``: only the one injected then, its timer's call)."""
        with self.lock:
            fault = self.storage_fault
            if fault is None or (at is not None and fault[0] != at):
                return None
            self.storage_fault = None
            self.storage_until[fault[0]] = min(self.storage_until[fault[0]], time.time())
        fault[2]()
        log.info("checkpoint storage back: %s is over", fault[1])
        return fault[1]

    # -- node replacement and clean-up --------------------------------------------------------------------------
    def _replace_loop(self) -> None:
        while True:
            gone = self.replace.get()
            if gone is None:
                return
            with self.lock:
                self.added += 1
                name = f"soak-n{self.added}"
            try:
                self.cluster.add_node(name, dict(self.pool_labels), kind=self.node_kind, **self.add_node_kwargs)
                log.info("node %s added in place of %s", name, gone)
            except Exception as err:  # noqa: BLE001 - the soak goes on with fewer nodes; said in its log
                log.warning("adding node %s in place of %s failed: %s", name, gone, err)

    def stop(self) -> list[str]:
        """Undo what is still pending: cancel node deletions not yet due, then each kind's :meth:`undo
        <localcluster.faults.FaultKind.undo>` (signals off the nodes still there, partitions healed, the storage
        back). Returns what was undone."""
        for timer in self.timers:
            timer.cancel()
        done = [line for kind in REGISTRY.values() for line in kind.undo(self)]
        self.replace.put(None)
        return done


def mount_tmpfs(path: Path, size: int, name: str = "soak-ckpt") -> Path:
    """A tmpfs of ``size`` bytes at ``path`` (made if missing), anyone may write. On real nodes it must be mounted
    BEFORE the nodes start: each node has a private mount namespace (``unshare --propagation private``), a copy of
    the host's mounts at its start, so a mount made later on the host never reaches the node nor its pods' bind
    mounts (they would write to the directory under it). Copies share the tmpfs's superblock: its size, its
    read-only flag (:func:`remount`) and its contents are the same in every namespace."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", name, str(path)], check=True,
                   capture_output=True, text=True)
    return path


def resize_tmpfs(path: Path, size: int) -> None:
    """``mount -o remount,size=<size>`` of the tmpfs at ``path`` (a superblock option: every namespace's copy of
    the mount has the new size)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True, text=True)


def remount(path: Path, mode: str, *, tries: int = 100) -> None:
    """``mount -o remount,<mode>`` of the tmpfs at ``path``. Read-only is refused (EBUSY) while a file on it is
    open for writing (a checkpoint being written): tried again every 0.1 s, ``tries`` times."""
    for i in range(tries):
        got = subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True, text=True,
                             check=False)
        if got.returncode == 0:
            return
        if i == tries - 1:
            raise RuntimeError(f"mount -o remount,{mode} {path}: {got.stderr.strip()}")
        time.sleep(0.1)


def deny_writes(root: Path) -> Callable[[], None]:
    """Take the write bits off every directory under ``root`` (``root`` included), top-down, so a non-root
    process can create, rename or delete nothing there (files already open for writing stay writable); returns
    the undo, which puts each directory's mode back. A second pass catches directories made during the first.
    Nothing about the mount changes (its read-only flag stays off: see :meth:`Injectors.storage_unwritable`)."""
    import stat

    modes: dict[str, int] = {}
    for _ in range(2):
        for dirpath, _dirs, _files in os.walk(root):
            if dirpath in modes:
                continue
            try:
                mode = stat.S_IMODE(os.lstat(dirpath).st_mode)
                os.chmod(dirpath, mode & ~0o222)
            except FileNotFoundError:  # deleted meanwhile
                continue
            modes[dirpath] = mode

    def undo() -> None:
        for path, mode in modes.items():
            try:
                os.chmod(path, mode)
            except FileNotFoundError:
                pass

    return undo


def fill(path: Path, chunk: int = 1 << 20) -> int:
    """Write zeros into ``path`` until its file system is full (ENOSPC); returns the bytes written."""
    written = 0
    block = b"\0" * chunk
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n = f.write(block)
            except OSError:
                if chunk <= 4096:
                    return written
                chunk //= 16
                block = block[:chunk]
                continue
            written += n or 0


def _iptables_restore(netns: int, rules: str) -> None:
    got = subprocess.run(["nsenter", f"--net=/proc/self/fd/{netns}", "--", "iptables-restore", "--noflush"],
                         input=rules, pass_fds=(netns,), capture_output=True, text=True, check=False, timeout=30)
    if got.returncode != 0:
        raise RuntimeError(f"iptables-restore in the network namespace: {got.stderr.strip()}")


def cut_netns(pid: int, *, not_those_of: Sequence[int] = ()) -> int:
    """Cut the network namespace of process ``pid`` off (:func:`partition_rules`); returns an open fd of that
    namespace, which holds it until :func:`heal_netns` and ``os.close``. Refused (RuntimeError) when it is the
    namespace of any process in ``not_those_of`` (the node's, the host's: cutting those would cut the cluster)."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        mine = os.fstat(fd).st_ino
        for other in not_those_of:
            try:
                if os.stat(f"/proc/{other}/ns/net").st_ino == mine:
                    raise RuntimeError(f"process {pid} shares the network namespace of process {other}: not a pod's "
                                       "own")
            except FileNotFoundError:
                continue
        _iptables_restore(fd, partition_rules(True))
    except BaseException:
        os.close(fd)
        raise
    return fd


def heal_netns(netns: int) -> None:
    """Take :func:`cut_netns`'s rules out of the network namespace open as ``netns`` (the fd stays open)."""
    _iptables_restore(netns, partition_rules(False))
