"""``reprieve-supervisor -- <command...>``: the worker container's PID 1 for in-place gang restarts.

It runs the trainer (the command) once per attempt the operator assigns to this pod, inside the same pod:
the assignment comes from the ``<job>-assignment`` ConfigMap (watched with the pod's ServiceAccount token), each
trainer exit is reported on the pod (``reprieve.dev/exit``), SIGTERM is forwarded, a trainer whose attempt was
superseded is killed (SIGTERM, SIGKILL after the grace) before the next attempt starts, and the next attempt's
process is pre-warmed (started and parked in ``reprieve.init()``) while the current one trains.
``docs/contract.md`` ("In-place restarts and the supervisor") is the protocol, ``docs/runtime.md`` ("Running
under reprieve-supervisor") the user's guide. Every decision is :mod:`.protocol` (pure), every format
:mod:`.contract`; this module only carries them out: processes, signals, reaping, sockets to the children, the API.

As PID 1 (and, elsewhere, as a child subreaper) it reaps every orphan in the container, and before it starts
a trainer it kills every process an earlier attempt left behind. Logs go to stderr, one line per decision.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import DEFAULT_SERVICEACCOUNT_DIR, RuntimeConfig, kubernetes_host, kubernetes_port
from ..env import Env, warn_unknown
from ..kube import KubeClient, ObjectWatch, PodAnnotator
from . import contract
from . import protocol as sm

log = logging.getLogger("reprieve.supervisor")

TICK_S = 0.25  # timers (grace, pre-warm delay) are checked at least this often
FLUSH_S = 5.0  # how long the last exit report may take before the supervisor exits anyway
READER_DRAIN_S = 1.0  # how long an ended child's last event lines may take to be read (its socket end is closed)
PR_SET_CHILD_SUBREAPER = 36


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reprieve")
    except PackageNotFoundError:
        return "0+unknown"


class _Child:
    """A process this supervisor started and its end of the socket to it."""

    def __init__(self, pid: int, sock: socket.socket, role: str) -> None:
        self.pid, self.sock, self.role = pid, sock, role
        self.reader: threading.Thread | None = None  # turns its event lines into ChildMessage events


class Supervisor:
    """The shell around :func:`.protocol.step` (see the module docstring)."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], settings: sm.Settings, *,
                 env_assignment: contract.Assignment, client: KubeClient | None, namespace: str, pod: str | None,
                 configmap: str | None, local: bool = False) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.client, self.namespace, self.pod, self.configmap = client, namespace, pod, configmap
        self.local = local
        static = local or client is None or not configmap or not pod
        off = ("REPRIEVE_PREWARM=0" if not settings.prewarm else
               "a local run: a warm process would compete with the trainer for the machine" if local else
               "not in a cluster: no next attempt can be assigned" if static else None)
        self.state = sm.State(env_assignment, settings, prewarm_off=off, static=static, local=local)
        self.events: queue.SimpleQueue[sm.Event] = queue.SimpleQueue()
        self.children: dict[int, _Child] = {}
        self.annotator = PodAnnotator(client, namespace, pod) if client is not None and pod else None
        self.watch: ObjectWatch | None = None
        self.replicas: Any = None  # memory tier hook: this pod's replica server (reprieve.memtier.server)

    # -- main loop -------------------------------------------------------------------------------------------
    def run(self) -> int:
        _become_subreaper()
        self._serve_replicas()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.events.put(sm.Terminate(signal.Signals(signum).name)))
        signal.signal(signal.SIGCHLD, lambda *_: self.events.put(sm.Tick()))
        if self.annotator is not None:
            self.annotator.put(contract.supervisor_annotation(_version()))
        if self.local:
            log.info("restarting the command after every saved preemption (exit %d), stopping on anything else; "
                     "Ctrl-C saves at the next step and stops (exit %d), a second Ctrl-C kills",
                     self.state.settings.restart_code, sm.INTERRUPTED_EXIT)
            self.events.put(sm.AssignmentSeen(None))
        elif self.client is not None and self.configmap:
            self.watch = ObjectWatch(self.client, self.namespace, "configmaps", self.configmap,
                                     self._on_configmap).start()
            log.info("watching ConfigMap %s/%s for assignments", self.namespace, self.configmap)
        else:
            log.info("not in a cluster (no KUBERNETES_SERVICE_HOST, REPRIEVE_POD_NAME or REPRIEVE_JOB): the "
                     "environment is the only assignment and exits are not reported")
            self.events.put(sm.AssignmentSeen(None))
        while True:
            try:
                event: sm.Event = self.events.get(timeout=TICK_S)
            except queue.Empty:
                event = sm.Tick()
            for ev in [event, *self._reap()]:
                code = self._handle(ev)
                if code is not None:
                    return self._exit(code)

    def _handle(self, event: sm.Event) -> int | None:
        """Feed one event through the pure step and carry out its actions; an exit code when it is time to go."""
        pending = [event]
        while pending:
            self.state, actions = sm.step(self.state, pending.pop(0), time.time())
            for action in actions:
                result = self._do(action)
                if isinstance(result, int):
                    return result
                if result is not None:
                    pending.append(result)
        return None

    def _do(self, action: sm.Action) -> sm.Event | int | None:
        if isinstance(action, sm.Note):
            log.log(logging.ERROR if action.loud else logging.DEBUG if action.debug else logging.INFO, "%s",
                    action.text)
        elif isinstance(action, sm.Signal):
            name = signal.Signals(action.sig).name
            if _exited(action.pid):  # its exit is being reaped: a signal now would reach nothing, and say otherwise
                log.info("%s: pid %d has exited already; no %s sent", action.why, action.pid, name)
            else:
                log.info("%s: sending %s to pid %d", action.why, name, action.pid)
                _kill(action.pid, action.sig)
        elif isinstance(action, sm.Report):
            if self.annotator is not None:
                self.annotator.put(contract.exit_annotation(action.attempt, action.code, time.time(), action.agreed,
                                                         action.peer_lost, action.last_step, action.peer_gone))
        elif isinstance(action, sm.StartTrainer):
            log.info("%s", action.why)
            self._kill_leftovers()
            return self._spawn("trainer", contract.trainer_env(self.env, action.assignment, local=self.local),
                               action.assignment)
        elif isinstance(action, sm.StartWarm):
            log.info("%s: starting a warm process", action.why)
            env = contract.warm_env(self.env, action.topology, action.landing, action.owned)
            return self._spawn("warm", env, None, warm=True)
        elif isinstance(action, sm.HandOver):
            log.info("%s", action.why)
            self._kill_leftovers(keep=action.pid)
            child = self.children.get(action.pid)
            try:
                assert child is not None
                child.sock.sendall(action.assignment.line().encode() + b"\n")
            except (OSError, AssertionError) as err:  # it died: its exit (unconfirmed) makes the start cold
                log.warning("could not hand the assignment to pid %d: %s", action.pid, err)
        elif isinstance(action, sm.Exit):
            log.info("%s: exiting with code %d", action.why, action.code)
            return action.code
        return None

    def _serve_replicas(self) -> None:
        """Memory tier hook: the pod's replica server runs here, where it outlives every trainer (docs/memory.md);
        trainers learn its address from ``REPRIEVE_MEMORY_SERVER``."""
        from ..memtier.config import SERVER_ENV
        from ..memtier.server import serve_pod

        self.replicas = serve_pod(self.env)
        if self.replicas is not None:
            self.env[SERVER_ENV] = self.replicas.address

    def _exit(self, code: int) -> int:
        if self.replicas is not None:
            self.replicas.close()
        if self.watch is not None:
            self.watch.close()
        if self.annotator is not None and not self.annotator.flush(FLUSH_S):
            log.warning("the last annotations did not land within %.0fs", FLUSH_S)
        return code

    # -- processes ---------------------------------------------------------------------------------------------
    def _spawn(self, role: str, env: dict[str, str], assignment: contract.Assignment | None, *,
               warm: bool = False) -> sm.Event:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.set_inheritable(theirs.fileno(), True)
            env[contract.EVENTS_FD_ENV] = str(theirs.fileno())
            if warm:
                env[contract.WARM_FD_ENV] = str(theirs.fileno())
            # posix_spawn, not subprocess: the supervisor reaps every child itself (waitpid(-1)), which would
            # race subprocess's own bookkeeping. Signals Python ignores go back to their defaults.
            # A local run puts the trainer in its own process group: the terminal's Ctrl-C reaches only this
            # supervisor, which forwards it as SIGINT: the runtime's stop (save at the next step, then exit).
            if self.local:
                pid = os.posix_spawnp(self.command[0], self.command, env,
                                      setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), setsigmask=(), setpgroup=0)
            else:
                pid = os.posix_spawnp(self.command[0], self.command, env,
                                      setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), setsigmask=())
        except OSError as err:
            ours.close()
            log.error("cannot start %s: %s", self.command[0], err)
            return sm.SpawnFailed(role, f"{self.command[0]}: {err.strerror or err}", assignment)
        finally:
            theirs.close()
        child = self.children[pid] = _Child(pid, ours, role)
        child.reader = threading.Thread(target=self._read, args=(pid, ours), name=f"reprieve-child-{pid}", daemon=True)
        child.reader.start()
        log.info("started %s pid %d: %s", role, pid, json.dumps(self.command)[:200])
        return sm.Spawned(pid, role, assignment)

    def _read(self, pid: int, sock: socket.socket) -> None:
        """The child's event lines (:mod:`.trainer`) -> ChildMessage events, until it closes."""
        try:
            for line in sock.makefile("rb"):
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("pid %d sent a malformed line: %r", pid, line[:200])
                    continue
                if isinstance(message, dict):
                    self.events.put(sm.ChildMessage(pid, message))
        except OSError:
            pass

    def _reap(self) -> list[sm.Event]:
        """Every child that ended (orphans included): as PID 1 no zombie may stay."""
        out: list[sm.Event] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return out
            if pid == 0:
                return out
            code = contract.exit_code(os.waitstatus_to_exitcode(status))
            child = self.children.pop(pid, None)
            if child is not None:
                # Every line it sent before it ended comes first (a peerLost just before JAX's abort): its end is shut.
                if child.reader is not None:
                    child.reader.join(READER_DRAIN_S)
                child.sock.close()
                out.extend(self._queued())
            out.append(sm.ChildExited(pid, code))

    def _queued(self) -> list[sm.Event]:
        """The events waiting in the queue, in order (handled before the exit that follows them)."""
        out: list[sm.Event] = []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def _kill_leftovers(self, keep: int | None = None) -> None:
        """SIGKILL and reap every child not started by us as trainer or warm process (orphans of earlier
        attempts, reparented here), so nothing of an earlier attempt runs beside the next one."""
        deadline = time.monotonic() + 10.0
        while True:
            left = [p for p in _children_of(os.getpid()) if p != keep and p not in self.children]
            if not left:
                return
            if time.monotonic() > deadline:
                log.error("processes %s of an earlier attempt survive SIGKILL for 10s; starting anyway", left)
                return
            for pid in left:
                log.info("killing pid %d, left behind by an earlier attempt", pid)
                _kill(pid, signal.SIGKILL)
            for pid in left:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass

    def _on_configmap(self, obj: dict[str, Any] | None) -> None:
        """Watch thread: the ConfigMap (or None) -> an AssignmentSeen / Refuse event; a bad one is logged."""
        if obj is None:
            self.events.put(sm.AssignmentSeen(None))
            return
        data = obj.get("data") or {}
        where = f"ConfigMap {self.namespace}/{self.configmap}"
        problem = contract.contract_problem(data.get("contract"), where=where)
        if problem is not None:
            if self.annotator is not None:
                self.annotator.put(contract.supervisor_annotation(_version(), problem))
            self.events.put(sm.Refuse(problem))
            return
        try:
            assert self.pod is not None
            self.events.put(sm.AssignmentSeen(contract.parse_assignment(data, self.pod,
                                                                  configmap=f"{self.namespace}/{self.configmap}")))
        except contract.AssignmentError as err:
            log.error("ignoring a malformed assignment: %s", err)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _exited(pid: int) -> bool:
    """Whether ``pid`` has ended (gone, or a zombie not reaped yet), from /proc; False where /proc cannot tell."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def _children_of(parent: int) -> list[int]:
    """Live (not zombie) children of ``parent``, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1 and int(fields[1]) == parent and fields[0] != b"Z":
            out.append(int(entry))
    return out


def _become_subreaper() -> None:
    """Outside a PID namespace (a shell, the local process kubelet) orphans of the trainer still come to us."""
    if os.getpid() == 1 or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as err:
        log.warning("cannot become a child subreaper: %s", err)


def build(command: Sequence[str], env: Mapping[str, str], *, local: bool = False,
          max_restarts: int | None = None) -> Supervisor:
    """The supervisor for ``command`` under ``env``. Raises ValueError (a bad knob or assignment variable).
    ``local``: the laptop's restart loop (``reprieve run``, ``reprieve-supervisor --local``), whatever the environment;
    it also refuses what the trainer's ``reprieve.init()`` would (:func:`check_trainer_env`)."""
    settings = dataclasses.replace(sm.Settings.from_env(env), max_restarts=max_restarts)
    env_assignment = contract.assignment_from_env(env)
    if local:
        check_trainer_env(contract.trainer_env(env, env_assignment, local=True))
        return Supervisor(command, env, settings, env_assignment=env_assignment, client=None,
                          namespace=RuntimeConfig.namespace, pod=None, configmap=None, local=True)
    r = Env(env)
    job, pod = r.opt_text("REPRIEVE_JOB"), r.opt_text("REPRIEVE_POD_NAME")
    namespace = r.text("REPRIEVE_NAMESPACE", RuntimeConfig.namespace)
    host = kubernetes_host(env)
    client = None
    if host and pod and job:
        client = KubeClient(host, kubernetes_port(env), r.text("REPRIEVE_SERVICEACCOUNT_DIR", DEFAULT_SERVICEACCOUNT_DIR))
    return Supervisor(command, env, settings, env_assignment=env_assignment, client=client, namespace=namespace,
                      pod=pod, configmap=f"{job}{contract.ASSIGNMENT_SUFFIX}" if job else None)


def check_trainer_env(env: Mapping[str, str]) -> None:
    """Raises ConfigError naming the variable, its value and what is accepted when ``reprieve.init()`` would refuse
    ``env`` (the runtime's and the memory tier's variables): ``reprieve run`` says it in one line and starts
    nothing, instead of every attempt's script ending in a traceback."""
    from ..memtier.config import MemoryConfig

    RuntimeConfig.from_env(env)
    MemoryConfig.from_env(env, pod_ip=Env(env).opt_text("REPRIEVE_POD_IP"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="reprieve-supervisor", description="Run a Reprieve trainer as the worker container's PID 1: one process per "
        "assigned attempt, restarted in place (docs/runtime.md, 'Running under reprieve-supervisor'). --local: the "
        "laptop's restart loop, as `reprieve run` (docs/runtime.md, 'Running locally').",
        usage="reprieve-supervisor [--version] [--local [--max-restarts N]] -- COMMAND [ARG...]")
    parser.add_argument("--version", action="version", version=f"reprieve-supervisor {_version()} (contract "
                                                                f"{contract.CONTRACT_VERSION})")
    parser.add_argument("--local", action="store_true", help="restart the command after every saved preemption, "
                        "stop on anything else; no cluster")
    parser.add_argument("--max-restarts", type=int, default=None, metavar="N",
                        help="with --local: stop after N restarts")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return run(args.command, local=args.local, max_restarts=args.max_restarts, usage=parser.format_usage(),
               prog="reprieve run" if args.local else "reprieve-supervisor")


def run(command: Sequence[str], *, local: bool = False, max_restarts: int | None = None, usage: str = "",
        prog: str = "reprieve-supervisor") -> int:
    """The supervisor's main: ``reprieve-supervisor`` (``local``: ``reprieve run``). The exit code to end with."""
    command = list(command[1:] if command[:1] == ["--"] else command)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {prog}[%(process)d] %(levelname)s %(message)s")
    if not command:
        sys.stderr.write(usage)
        log.error("no command given: %s -- python train.py ...", prog)
        return 2
    if max_restarts is not None and (not local or max_restarts < 0):
        log.error("--max-restarts takes a number >= 0, and only with a local run")
        return 2
    env = dict(os.environ)
    warn_unknown(env)
    problem = contract.contract_problem(Env(env).opt_text(contract.CONTRACT_ENV), where=f"{contract.CONTRACT_ENV} in the environment")
    try:
        supervisor = build(command, env, local=local, max_restarts=max_restarts)
    except ValueError as err:
        if problem is None:
            log.error("%s; nothing started", err)
            return 2
        supervisor = None  # the contract is the problem to report; the rest may be another version's layout
    if problem is not None:
        log.error("%s", problem)
        if supervisor is not None and supervisor.annotator is not None:
            supervisor.annotator.put(contract.supervisor_annotation(_version(), problem))
            supervisor.annotator.flush(FLUSH_S)
        return 2
    assert supervisor is not None
    return supervisor.run()

