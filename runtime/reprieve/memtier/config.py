"""The memory tier's part of the contract environment, parsed once (pure).

``MemoryConfig.from_env(os.environ)`` is the only place that reads these variables, through the runtime's one
reader (:class:`reprieve.env.Env`, which knows them as :data:`reprieve.env.MEMORY`); ``docs/contract.md`` ("Memory
tier") and ``docs/memory.md`` say what they mean. A malformed or inconsistent value raises
:class:`reprieve.config.ConfigError` naming the variable, what was expected and what was found: the job refuses
to start rather than run without the tier it asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..env import ConfigError, Env

DIR_ENV = "REPRIEVE_MEMORY_DIR"
LIMIT_ENV = "REPRIEVE_MEMORY_LIMIT_BYTES"
INTERVAL_STEPS_ENV = "REPRIEVE_MEMORY_INTERVAL_STEPS"
INTERVAL_SECONDS_ENV = "REPRIEVE_MEMORY_INTERVAL_SECONDS"
# the mean seconds of training between losses without notice anywhere in the job (a machine, a pod, a partition):
# with no interval given, copies are spaced by Young/Daly's optimum for it where that is closer than the cost
# budget's
LOSS_EVERY_ENV = "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS"
PORT_ENV = "REPRIEVE_MEMORY_PORT"
PEER_ENV = "REPRIEVE_MEMORY_PEER"
PEER_NODE_ENV = "REPRIEVE_MEMORY_PEER_NODE"
NODE_ENV = "REPRIEVE_NODE_NAME"
TOKEN_ENV = "REPRIEVE_MEMORY_TOKEN"  # the job's secret for the replica servers (optional)
# set by reprieve-supervisor for the trainer: the address of the replica server the supervisor runs for this pod
SERVER_ENV = "REPRIEVE_MEMORY_SERVER"

MIN_LOSS_EVERY_SECONDS = 1.0  # below a second between losses no step would ever finish: a typo (milliseconds?)
DEFAULT_PORT = 8477  # beside the coordinator's default 8476
# The tier's cost budget when no interval is given ("auto"): saves are spaced so that the loop's stall plus the
# background thread's CPU time stay within this share of the training time (docs/memory.md, "Interval").
DEFAULT_BUDGET = 0.01


@dataclass(frozen=True)
class MemoryConfig:
    """Where the memory tier keeps its copies, how often it saves, and who holds this process's replica.

    Attributes:
        directory: a directory on a memory-backed file system (a ``medium: Memory`` emptyDir, /dev/shm...).
        limit_bytes: what the directory may hold (the emptyDir's ``sizeLimit``); None: unbounded (not checked).
        interval_steps: save after every N-th step; 0: scheduled by time (``interval_seconds``) or by the budget.
        interval_seconds: save about every N seconds of training; 0 with ``interval_steps`` 0: auto (budget).
        loss_every_seconds: the mean seconds of training between losses without notice in the job; with auto, saves
            are spaced by Young/Daly's optimum for it (``sqrt(2 x a copy's cost x it)``) where that is closer than
            the budget's.
        port: the replica server's port (reprieve-supervisor, or the trainer itself outside reprieve-supervisor); 0: any free
            port (the restore round advertises it, but no peer can be pointed at it in advance).
        peer: ``host:port`` of the replica server that holds this process's copies; None: own copies only.
        peer_node: the node the peer runs on, when the operator says (the pairing check refuses the own node).
        node: the node this pod runs on (downward API ``spec.nodeName``), for the pairing check.
        server: ``host:port`` of the replica server reprieve-supervisor runs for this pod (set by reprieve-supervisor only).
        token: the job's secret every request to a replica server carries; None: none asked for.
    """

    directory: str
    limit_bytes: int | None = None
    interval_steps: int = 0
    interval_seconds: float = 0.0
    loss_every_seconds: float = 0.0
    port: int = DEFAULT_PORT
    peer: str | None = None
    peer_node: str | None = None
    node: str | None = None
    server: str | None = None
    token: str | None = None
    budget: float = DEFAULT_BUDGET

    @property
    def auto(self) -> bool:
        """No interval given: saves are spaced by the cost budget, or by the loss rate when one is given."""
        return self.interval_steps == 0 and self.interval_seconds == 0

    @staticmethod
    def port_from_env(env: Mapping[str, str]) -> int:
        """``REPRIEVE_MEMORY_PORT`` (the replica server's port; the default beside the coordinator's).

        Raises:
            ConfigError: it is not a port number.
        """
        return Env(env).integer(PORT_ENV, DEFAULT_PORT, minimum=0, maximum=65535)

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, pod_ip: str | None = None) -> MemoryConfig | None:
        """The tier's settings, or None when ``REPRIEVE_MEMORY_DIR`` is unset (the tier is off).

        Raises:
            ConfigError: a variable is malformed, or the pairing puts the replica on this pod or node.
        """
        e = Env(env)
        directory = e.opt_text(DIR_ENV)
        if directory is None:
            for name in (INTERVAL_STEPS_ENV, INTERVAL_SECONDS_ENV, LOSS_EVERY_ENV, LIMIT_ENV, PEER_ENV):
                if e.raw(name) is not None:
                    raise ConfigError(f"{name} is set but {DIR_ENV} is not: set {DIR_ENV} to a directory on a "
                                      "memory-backed volume (a medium: Memory emptyDir, /dev/shm/...) to turn the "
                                      f"memory tier on, or unset {name}")
            return None
        steps = e.integer(INTERVAL_STEPS_ENV, 0, minimum=0)
        seconds = e.number(INTERVAL_SECONDS_ENV, 0.0, minimum=0)
        if steps and seconds:
            raise ConfigError(f"{INTERVAL_STEPS_ENV}={steps} and {INTERVAL_SECONDS_ENV}={seconds} are both set: "
                              "give one (or neither, to space saves by the 1 % cost budget)")
        loss_every = e.number(LOSS_EVERY_ENV, 0.0, minimum=0)
        if 0 < loss_every < MIN_LOSS_EVERY_SECONDS:
            raise ConfigError(f"{LOSS_EVERY_ENV} must be 0 (not known) or at least {MIN_LOSS_EVERY_SECONDS:g} s of "
                              f"training between losses, got {loss_every:g}")
        if loss_every and (steps or seconds):
            given = f"{INTERVAL_STEPS_ENV}={steps}" if steps else f"{INTERVAL_SECONDS_ENV}={seconds:g}"
            raise ConfigError(f"{LOSS_EVERY_ENV}={loss_every:g} and {given} are both set: the loss rate spaces the "
                              "copies only when no interval is given; unset one")
        limit = e.opt_integer(LIMIT_ENV, minimum=1)
        port = cls.port_from_env(env)
        peer = e.opt_text(PEER_ENV)
        if peer is not None:
            address_problem(peer, PEER_ENV)
        server = e.opt_text(SERVER_ENV)
        if server is not None:
            address_problem(server, SERVER_ENV)
        cfg = cls(directory=directory, limit_bytes=limit, interval_steps=steps, interval_seconds=seconds,
                  loss_every_seconds=loss_every, port=port,
                  peer=peer, peer_node=e.opt_text(PEER_NODE_ENV), node=e.opt_text(NODE_ENV), server=server,
                  token=e.opt_text(TOKEN_ENV))
        problem = pairing_problem(cfg, own=own_addresses(cfg, pod_ip))
        if problem:
            raise ConfigError(problem)
        return cfg


def own_addresses(cfg: MemoryConfig, pod_ip: str | None) -> set[str]:
    """Addresses that name this pod's own replica server."""
    out = {f"{host}:{cfg.port}" for host in ("127.0.0.1", "localhost") if pod_ip is None}
    if pod_ip:
        out.add(f"{pod_ip}:{cfg.port}")
    if cfg.server:
        out.add(cfg.server)
    return out


def pairing_problem(cfg: MemoryConfig, *, own: set[str]) -> str | None:
    """Why this process's pairing is refused (pure): its replica would live on its own pod or node."""
    if cfg.peer is None:
        return None
    if cfg.peer in own:
        return (f"{PEER_ENV}={cfg.peer} is this pod's own replica server: the replica would die with the copy it "
                "protects. Pair the process with a pod on another node (docs/memory.md, \"Pairing\")")
    if cfg.node and cfg.peer_node and cfg.node == cfg.peer_node:
        return (f"{PEER_ENV}={cfg.peer} runs on node {cfg.node}, this pod's node ({NODE_ENV}): one node failure "
                f"would take both copies. Pair the process with a pod on another node ({PEER_NODE_ENV} must differ)")
    return None


def address_problem(value: str, name: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> (host, port); ConfigError naming ``name`` otherwise."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{name} must be host:port, got {value!r}")
    return host, int(port)

