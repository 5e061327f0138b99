"""The supervisor's side of the contract (pure): the assignment ConfigMap and its line to a warm process, the
trainer's environment, the pod annotations (``reprieve.dev/exit``, ``reprieve.dev/supervisor``).

``docs/contract.md``, "In-place restarts and the supervisor", is the format; the operator writes the assignment
(``reprieve_operator.policy.builders.build_assignment``) and reads the annotations, and ``tests/test_contract.py`` passes
each format across both halves.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..env import Env
from ..jsonobject import json_object
from ..memtier.config import INTERVAL_SECONDS_ENV, INTERVAL_STEPS_ENV, LOSS_EVERY_ENV
from ..notice import format_rfc3339

CONTRACT_VERSION = 1
CONTRACT_ENV = "REPRIEVE_CONTRACT"
ASSIGNMENT_SUFFIX = "-assignment"
EXIT_ANNOTATION = "reprieve.dev/exit"
SUPERVISOR_ANNOTATION = "reprieve.dev/supervisor"
SUPERVISED_ENV = "REPRIEVE_SUPERVISED"
# Its value for a trainer of `reprieve run` (the local loop), "1" for any other: there the runtime's SIGINT (the
# supervisor's forwarded Ctrl-C) is a stop: save at the next step and exit (docs/runtime.md, "Signals").
SUPERVISED_LOCAL = "local"
WARM_FD_ENV = "REPRIEVE_WARM_FD"
EVENTS_FD_ENV = "REPRIEVE_SUPERVISOR_FD"
# A warm process's hint: the devices of the last trainer that ran in this pod (reprieve.topology, JSON).
EXPECTED_TOPOLOGY_ENV = "REPRIEVE_EXPECTED_TOPOLOGY"
# A warm process's other hint: the bytes the last trainer's restore landed (reprieve.landing populates them ahead).
LANDING_BYTES_ENV = "REPRIEVE_WARM_LANDING_BYTES"
# And the bytes its restore copied into memory XLA allocates (a donating step on CPU devices: reprieve.landing).
OWNED_BYTES_ENV = "REPRIEVE_WARM_OWNED_BYTES"
# The assignment's part of the environment (docs/contract.md): set from the assignment, absent in a warm process.
ASSIGNMENT_ENV = ("REPRIEVE_ATTEMPT", "REPRIEVE_PROCESS_ID", "REPRIEVE_NUM_PROCESSES", "REPRIEVE_COORDINATOR_ADDRESS")
MEMORY_PEERS_KEY = "memoryPeers"  # memory tier: assignment key, JSON {"<process index>": "host:port"}
MEMORY_PEER_ENV = "REPRIEVE_MEMORY_PEER"
MEMORY_PEER_NODES_KEY = "memoryPeerNodes"  # memory tier: JSON {"<process index>": "<node of its peer>"}
MEMORY_PEER_NODE_ENV = "REPRIEVE_MEMORY_PEER_NODE"
# memory tier: the job's mean seconds between losses without notice so far (written only when the spec spaces the
# copies neither by an interval nor by its own rate: the container's REPRIEVE_MEMORY_LOSS_EVERY_SECONDS then stands)
LOSS_EVERY_KEY = "lossEverySeconds"
# Elastic jobs (docs/contract.md, "Elastic jobs"): the assignment of a grow says so; a supervisor stops its running
# trainer with RESIZE_SIGNAL instead of SIGTERM, and the runtime saves the agreed step to the memory tier alone.
RESIZE_KEY = "resize"
RESIZE_GROW = "grow"
RESIZE_SIGNAL = signal.SIGUSR1
UNASSIGNED_PROCESS_ID = "-1"  # spares and replacement pods: no index until an assignment lists them
NO_TRAINER_EXIT = 128 + signal.SIGTERM  # SIGTERM with no trainer's code to pass on
SPAWN_FAILED_EXIT = 127  # the command could not be started (a shell's "command not found")


class AssignmentError(ValueError):
    """The assignment ConfigMap (or its line to a warm process) is malformed; the message names the key."""


@dataclass(frozen=True)
class Assignment:
    """What one pod runs in one attempt. ``process_id`` None: the pod is not listed (a spare) and runs nothing."""

    attempt: int
    process_id: int | None
    num_processes: int
    coordinator: str | None
    source: str = "configmap"
    # memory tier (docs/memory.md): the replica server that holds this process's copies in this attempt; None: the
    # assignment does not say (the container's REPRIEVE_MEMORY_PEER stands), "": nobody
    memory_peer: str | None = None
    memory_peer_node: str | None = None  # that server's node, when the assignment says (else the container's)
    resize: str | None = None  # RESIZE_GROW: this attempt grows the gang that trains (None: any other attempt)
    loss_every: int | None = None  # memory tier: the job's mean seconds between losses without notice so far

    @property
    def listed(self) -> bool:
        return self.process_id is not None

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The ``REPRIEVE_*`` variables this assignment sets in the trainer's environment. The job's loss rate is
        left out when ``base`` (the container's environment) spaces the memory copies itself
        (:func:`spaces_copies`): the runtime would refuse a rate beside an interval."""
        assert self.process_id is not None, "an unlisted pod runs no trainer"
        out = {"REPRIEVE_ATTEMPT": str(self.attempt), "REPRIEVE_PROCESS_ID": str(self.process_id),
               "REPRIEVE_NUM_PROCESSES": str(self.num_processes)}
        if self.coordinator:
            out["REPRIEVE_COORDINATOR_ADDRESS"] = self.coordinator
        if self.memory_peer is not None:
            out[MEMORY_PEER_ENV] = self.memory_peer
        if self.memory_peer_node is not None:
            out[MEMORY_PEER_NODE_ENV] = self.memory_peer_node
        if self.loss_every is not None and not (base is not None and spaces_copies(base)):
            out[LOSS_EVERY_ENV] = str(self.loss_every)
        return out

    def line(self) -> str:
        """The JSON line a warm process receives on ``REPRIEVE_WARM_FD`` (without the newline)."""
        fields = {"attempt": self.attempt, "processId": self.process_id, "numProcesses": self.num_processes,
                  "coordinator": self.coordinator}
        if self.memory_peer is not None:
            fields["memoryPeer"] = self.memory_peer
        if self.memory_peer_node is not None:
            fields["memoryPeerNode"] = self.memory_peer_node
        if self.loss_every is not None:
            fields[LOSS_EVERY_KEY] = self.loss_every
        return json.dumps(fields, sort_keys=True)

    def describe(self) -> str:
        where = f"process {self.process_id}/{self.num_processes}" if self.listed else "this pod not listed"
        return f"attempt {self.attempt}, {where} (from the {self.source})"


def _int(value: Any, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise AssignmentError(f"{what} must be an integer >= {minimum}, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise AssignmentError(f"{what} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise AssignmentError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return number


def _coordinator(value: Any, what: str) -> str:
    host, sep, port = str(value).rpartition(":")
    if not isinstance(value, str) or not sep or not host or not port.isdigit():
        raise AssignmentError(f"{what} must be host:port, got {value!r}")
    return value


def assignment_from_env(env: Mapping[str, str]) -> Assignment:
    """The container's own ``REPRIEVE_*`` environment as an assignment: the attempt the pod was created for.
    Defaults as the runtime's (attempt 1, process 0 of 1); ``REPRIEVE_PROCESS_ID=-1`` (a spare, or a pod created
    to replace a worker) is not listed: it runs only what an assignment gives it. Raises
    :class:`AssignmentError`."""
    r = Env(env, error=AssignmentError)
    attempt = r.integer("REPRIEVE_ATTEMPT", 1, minimum=1)
    count = r.integer("REPRIEVE_NUM_PROCESSES", 1, minimum=1)
    if r.raw("REPRIEVE_PROCESS_ID") == UNASSIGNED_PROCESS_ID:  # a spare or a replacement: waits to be listed
        return Assignment(attempt, None, count, None, source="environment")
    index = r.integer("REPRIEVE_PROCESS_ID", 0, minimum=0)
    if index >= count:
        raise AssignmentError(f"REPRIEVE_PROCESS_ID must be < REPRIEVE_NUM_PROCESSES ({count}), got {index}")
    coordinator = r.opt_text("REPRIEVE_COORDINATOR_ADDRESS")
    if coordinator is not None:
        _coordinator(coordinator, "REPRIEVE_COORDINATOR_ADDRESS")
    return Assignment(attempt, index, count, coordinator, source="environment")


def parse_assignment(data: Mapping[str, Any], pod: str, *, configmap: str) -> Assignment:
    """ConfigMap ``data`` -> this pod's :class:`Assignment` (docs/contract.md, "Assignment").

    Raises:
        AssignmentError: a key is missing or malformed (the message names the ConfigMap and the key), or the
            listed index is out of range. The ``contract`` key is checked by :func:`contract_problem`.
    """
    def key(name: str) -> Any:
        if name not in data:
            raise AssignmentError(f"ConfigMap {configmap}: key {name!r} is missing (has {sorted(data)})")
        return data[name]

    attempt = _int(key("attempt"), f"ConfigMap {configmap}: attempt", minimum=1)
    count = _int(key("numProcesses"), f"ConfigMap {configmap}: numProcesses", minimum=1)
    coordinator = _coordinator(key("coordinator"), f"ConfigMap {configmap}: coordinator")
    processes = _json_object(key("processes"), f"ConfigMap {configmap}: processes", "pod name -> index")
    index = None
    if pod in processes:
        index = _int(processes[pod], f"ConfigMap {configmap}: processes[{pod!r}]", minimum=0)
        if index >= count:
            raise AssignmentError(f"ConfigMap {configmap}: processes[{pod!r}] must be < numProcesses ({count}), "
                                  f"got {index}")
    return Assignment(attempt, index, count, coordinator, source=f"ConfigMap {configmap}",
                      memory_peer=_memory_peer(data, index, configmap),
                      memory_peer_node=_memory_peer_node(data, index, configmap), resize=_resize(data, configmap),
                      loss_every=_loss_every(data.get(LOSS_EVERY_KEY), f"ConfigMap {configmap}: {LOSS_EVERY_KEY}"))


def spaces_copies(env: Mapping[str, str]) -> bool:
    """Whether ``env`` spaces the memory copies itself: a non-zero ``REPRIEVE_MEMORY_INTERVAL_STEPS`` or
    ``_SECONDS`` (the operator sets both to 0 when the spec gives none), or its own loss rate (pure)."""
    for name in (LOSS_EVERY_ENV, INTERVAL_STEPS_ENV, INTERVAL_SECONDS_ENV):
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            if float(raw) != 0:
                return True
        except ValueError:
            return True  # malformed: the runtime refuses it, naming it; no rate is added beside it
    return False


def _loss_every(raw: Any, what: str) -> int | None:
    """``lossEverySeconds``: an integer >= 1, or absent."""
    return None if raw is None else _int(raw, what, minimum=1)


def _resize(data: Mapping[str, Any], configmap: str) -> str | None:
    """``resize``: :data:`RESIZE_GROW` for a grow's assignment, absent for any other."""
    raw = data.get(RESIZE_KEY)
    if raw is not None and raw != RESIZE_GROW:
        raise AssignmentError(f"ConfigMap {configmap}: {RESIZE_KEY} must be {RESIZE_GROW!r} or absent, got {raw!r}")
    return raw


def _memory_peer(data: Mapping[str, Any], index: int | None, configmap: str) -> str | None:
    """``memoryPeers[index]`` (memory tier): the replica server of this process in this attempt; "" when the key
    exists without this index, None when there is no key."""
    raw = data.get(MEMORY_PEERS_KEY)
    if raw is None or index is None:
        return None
    peers = _json_object(raw, f"ConfigMap {configmap}: {MEMORY_PEERS_KEY}", "process index -> host:port")
    peer = peers.get(str(index))
    return "" if peer is None else _coordinator(peer, f"ConfigMap {configmap}: {MEMORY_PEERS_KEY}[{index}]")


def _memory_peer_node(data: Mapping[str, Any], index: int | None, configmap: str) -> str | None:
    """``memoryPeerNodes[index]``: the node of that replica server ("" when the key exists without this index)."""
    raw = data.get(MEMORY_PEER_NODES_KEY)
    if raw is None or index is None:
        return None
    node = _json_object(raw, f"ConfigMap {configmap}: {MEMORY_PEER_NODES_KEY}", "process index -> node").get(str(index))
    return "" if node is None else str(node)


def _json_object(raw: Any, what: str, of: str) -> dict[str, Any]:
    """``raw`` parsed as a JSON object (pure); :class:`AssignmentError` naming ``what`` and the expected ``of``."""
    return json_object(raw, what, AssignmentError, f"a JSON object of {of}")


def parse_assignment_line(text: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The line a warm process reads -> the environment updates (the runtime's side of :meth:`Assignment.line`)
    over ``base``, the process's own environment (:meth:`Assignment.env`). Raises :class:`AssignmentError` naming
    the field."""
    raw = json_object(text, f"{WARM_FD_ENV}: the assignment line", AssignmentError)
    attempt = _int(raw.get("attempt"), f"{WARM_FD_ENV} assignment: attempt", minimum=1)
    count = _int(raw.get("numProcesses"), f"{WARM_FD_ENV} assignment: numProcesses", minimum=1)
    index = _int(raw.get("processId"), f"{WARM_FD_ENV} assignment: processId", minimum=0)
    coordinator = raw.get("coordinator")
    if coordinator is not None:
        _coordinator(coordinator, f"{WARM_FD_ENV} assignment: coordinator")
    if index >= count:
        raise AssignmentError(f"{WARM_FD_ENV} assignment: processId must be < numProcesses ({count}), got {index}")
    peer = raw.get("memoryPeer")
    if peer not in (None, ""):
        _coordinator(peer, f"{WARM_FD_ENV} assignment: memoryPeer")
    node = raw.get("memoryPeerNode")
    return Assignment(attempt, index, count, coordinator, memory_peer=peer,
                      memory_peer_node=None if node is None else str(node),
                      loss_every=_loss_every(raw.get(LOSS_EVERY_KEY),
                                             f"{WARM_FD_ENV} assignment: {LOSS_EVERY_KEY}")).env(base)


def contract_problem(value: str | None, *, where: str) -> str | None:
    """Why this supervisor cannot run under contract ``value`` (None: it can; unset means this version)."""
    if value is None or value.strip() in ("", str(CONTRACT_VERSION)):
        return None
    return (f"{where} asks for operator contract version {value.strip()!r}, but this reprieve-supervisor speaks version "
            f"{CONTRACT_VERSION}: use an image whose reprieve runtime matches the operator (docs/contract.md)")


def trainer_env(base: Mapping[str, str], assignment: Assignment, *, local: bool = False) -> dict[str, str]:
    """The trainer's environment: the container's, with the assignment's variables and ``REPRIEVE_SUPERVISED``
    (:data:`SUPERVISED_LOCAL` for ``local``, the trainer of ``reprieve run``)."""
    env = {k: v for k, v in base.items() if k not in ASSIGNMENT_ENV and k not in (WARM_FD_ENV, EVENTS_FD_ENV)}
    env.update(assignment.env(base))
    env[SUPERVISED_ENV] = SUPERVISED_LOCAL if local else "1"
    return env


def under_supervisor(env: Mapping[str, str]) -> bool:
    """Whether ``env`` is the environment of a trainer ``reprieve-supervisor`` started (any of its loops): only a
    supervisor sends :data:`RESIZE_SIGNAL`, so only there does the runtime take it as a resize."""
    return bool(Env(env).opt_text(SUPERVISED_ENV))


def under_local_run(env: Mapping[str, str]) -> bool:
    """Whether ``env`` is the environment of a trainer ``reprieve run`` started (its SIGINT is a Ctrl-C to stop)."""
    return Env(env).opt_text(SUPERVISED_ENV) == SUPERVISED_LOCAL


def warm_env(base: Mapping[str, str], topology: str | None = None, landing: int | None = None,
             owned: int | None = None) -> dict[str, str]:
    """A warm process's environment: the container's without the assignment's variables (they are not known
    yet; ``reprieve.init()`` sets them when the assignment arrives), with the devices the last trainer reported
    (``topology``, JSON: what ``reprieve.expected_topology()`` returns first) and the bytes its restore landed
    (``landing``) and copied into memory XLA allocates (``owned``) when there are."""
    env = {k: v for k, v in base.items() if k not in ASSIGNMENT_ENV
           and k not in (WARM_FD_ENV, EVENTS_FD_ENV, EXPECTED_TOPOLOGY_ENV, LANDING_BYTES_ENV, OWNED_BYTES_ENV)}
    env[SUPERVISED_ENV] = "1"
    if topology is not None:
        env[EXPECTED_TOPOLOGY_ENV] = topology
    if landing:
        env[LANDING_BYTES_ENV] = str(landing)
    if owned:
        env[OWNED_BYTES_ENV] = str(owned)
    return env


def exit_code(waitstatus_code: int) -> int:
    """``os.waitstatus_to_exitcode`` -> a container's exit code: ``128+N`` when killed by signal ``N``."""
    return 128 - waitstatus_code if waitstatus_code < 0 else waitstatus_code


def exit_annotation(attempt: int, code: int, now: float, agreed: bool | None = None,
                    peer_lost: tuple[int, ...] = (), last_step: tuple[int, float] | None = None,
                    peer_gone: tuple[int, ...] = ()) -> dict[str, str]:
    """``agreed`` (only for the restart code): whether the exit was a saved preemption (the runtime announced it),
    or a program's own ``sys.exit(<restart code>)`` that saved nothing (``reprieve.restarts``). ``peer_lost``: the
    processes the trainer reported silent before it ended (JAX's coordination service ends a process whose peer
    died): the exit is that loss's, not a failure of its own. ``last_step``: the trainer's last finished step and
    when (unix seconds), as it told the supervisor with ``peerLost`` (``lastStep``, ``lastStepAt``): the gang's
    last step, after process 0's last progress report when process 0 is the one lost. ``peer_gone``: of
    ``peer_lost``, those whose pulse did not answer (their node gone or cut off): the operator counts them lost
    without probing them itself."""
    value: dict[str, Any] = {"attempt": attempt, "code": code, "time": format_rfc3339(now)}
    if agreed is not None:
        value["agreed"] = agreed
    if peer_lost:
        value["peerLost"] = list(peer_lost)
        if gone := [p for p in peer_gone if p in peer_lost]:
            value["peerGone"] = gone
    if last_step is not None:
        value["lastStep"], value["lastStepAt"] = last_step[0], round(last_step[1], 3)
    return {EXIT_ANNOTATION: json.dumps(value, sort_keys=True)}


def supervisor_annotation(version: str, error: str | None = None) -> dict[str, str]:
    value: dict[str, Any] = {"contract": CONTRACT_VERSION, "version": version}
    if error:
        value["error"] = error
    return {SUPERVISOR_ANNOTATION: json.dumps(value, sort_keys=True)}
