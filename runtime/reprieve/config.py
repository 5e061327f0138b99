"""The runtime's view of the operator contract: every ``REPRIEVE_*`` variable, parsed once (pure).

``RuntimeConfig.from_env(os.environ)`` is where the trainer reads its environment (through
:class:`reprieve.env.Env`, the one reader of ``REPRIEVE_*`` variables); everything else takes a ``RuntimeConfig``. Outside Kubernetes every variable is optional and the defaults give a single-process job
checkpointing to ``./checkpoints``. A malformed value raises :class:`ConfigError` naming the variable, what was
expected and what was found.

Runtime-only knobs (not set by the operator, documented in ``docs/runtime.md``):

``REPRIEVE_HEARTBEAT_TIMEOUT_SECONDS`` (10), ``REPRIEVE_PEER_LOST_SECONDS`` (2, at least 1.75: how soon process 0
names a lost peer and ends the gang, ``reprieve.pulse``), ``REPRIEVE_SHUTDOWN_TIMEOUT_SECONDS`` (30),
``REPRIEVE_INIT_TIMEOUT_SECONDS`` (300), ``REPRIEVE_AGREEMENT_TIMEOUT_SECONDS`` (60),
``REPRIEVE_NOTICE_POLL_SECONDS`` (1), ``REPRIEVE_METRICS_PORT`` (unset = no exporter),
``REPRIEVE_SAVE_SECONDS_ESTIMATE`` (30, used until a save has been measured),
``REPRIEVE_COMPILATION_CACHE_DIR`` (unset = JAX's defaults; set = JAX's persistent compilation cache there,
for every program, so a restarted gang does not compile again), ``REPRIEVE_PROGRESS_INTERVAL_SECONDS`` (5: how
often process 0 reports live progress on its pod; 0 = only at commits), ``REPRIEVE_MAX_FAILED_SAVES`` (3:
storage saves failed in a row, over a minute at least, that fail the job; ``reprieve.policy.save_failure_verdict``),
``REPRIEVE_RUN_ID`` (unset: a run
is known by its state's structure only; see ``reprieve.identity``), ``REPRIEVE_START_OVER_QUARANTINED`` (0: a root
that holds quarantined checkpoints and no usable one refuses to start at step 0; 1: starts anyway),
``REPRIEVE_NOTICE_TO_MEMORY`` (0: every notice's agreed step is saved to storage; 1: with the memory tier on, a
notice's agreed step stays in the pods' memory alone when every process's copy outlives the noticed nodes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from .env import ConfigError, Env
from .pulse import DEFAULT_PEER_LOST_SECONDS, MIN_PEER_LOST_SECONDS
from .termination import TERMINATION_LOG

DEFAULT_MAX_FAILED_SAVES = 3  # REPRIEVE_MAX_FAILED_SAVES: storage saves failed in a row that are fatal

DEFAULT_RESTART_EXIT_CODE = 42
# The restart codes the operator's CRD accepts (docs/contract.toml, [restart_exit_code]): 0 is success, 1 and 2 are
# Python's crash and usage error, 126-127 the shell's, 128+N death by signal N. A crash must never read as a saved
# preemption, so the runtime accepts exactly the same range.
RESTART_CODE_MIN, RESTART_CODE_MAX = 3, 125
DEFAULT_TERMINATION_GRACE_SECONDS = 30.0
DEFAULT_SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
START_OVER_QUARANTINED = "REPRIEVE_START_OVER_QUARANTINED"


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything the runtime reads from its environment. See ``docs/contract.md`` for meanings."""

    job: str = "local"
    namespace: str = "default"
    pod_name: str | None = None
    pod_ip: str | None = None
    num_processes: int = 1
    process_id: int = 0
    coordinator_address: str | None = None
    checkpoint_uri: str = "./checkpoints"
    checkpoint_interval_steps: int = 0
    checkpoint_interval_seconds: float = 0.0
    checkpoint_keep: int = 3
    attempt: int = 1
    restart_exit_code: int = DEFAULT_RESTART_EXIT_CODE
    notice_file: str | None = None
    termination_grace_seconds: float = DEFAULT_TERMINATION_GRACE_SECONDS
    serviceaccount_dir: str = DEFAULT_SERVICEACCOUNT_DIR
    kubernetes_host: str | None = None
    kubernetes_port: int = 443
    # runtime-only knobs
    heartbeat_timeout_seconds: int = 10
    peer_lost_seconds: float = DEFAULT_PEER_LOST_SECONDS  # REPRIEVE_PEER_LOST_SECONDS: the bound on naming a lost peer
    shutdown_timeout_seconds: int = 30
    init_timeout_seconds: int = 300
    agreement_timeout_seconds: float = 60.0
    notice_poll_seconds: float = 1.0
    metrics_port: int | None = None
    save_seconds_estimate: float = 30.0
    compilation_cache_dir: str | None = None
    progress_interval_seconds: float = 5.0
    max_failed_saves: int = DEFAULT_MAX_FAILED_SAVES  # REPRIEVE_MAX_FAILED_SAVES: storage saves failed in a row that are fatal
    run_id: str | None = None  # REPRIEVE_RUN_ID: recorded in every checkpoint; a restore refuses another run's
    termination_log: str = TERMINATION_LOG  # REPRIEVE_TERMINATION_LOG: the container's termination message file
    # REPRIEVE_START_OVER_QUARANTINED: start at step 0 where every checkpoint was quarantined (refused by default)
    start_over_quarantined: bool = False
    # REPRIEVE_NOTICE_TO_MEMORY: a notice's agreed step kept in the pods' memory alone where every copy outlives it
    notice_to_memory: bool = False
    # REPRIEVE_VIRTUAL_SHARDS: the job's virtual data-parallel shards (spec.elastic.virtualShards; None: not declared)
    virtual_shards: int | None = None

    @property
    def distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def in_cluster(self) -> bool:
        """True when the Kubernetes API and this pod's identity are known (watch + progress patches)."""
        return bool(self.kubernetes_host and self.pod_name)

    def coordinator_bind_address(self) -> str | None:
        """``<pod ip>:<coordinator port>`` when the pod IP is known, else None (JAX binds all interfaces)."""
        if not self.pod_ip or not self.coordinator_address:
            return None
        port = self.coordinator_address.rsplit(":", 1)[1]
        host = f"[{self.pod_ip}]" if ":" in self.pod_ip else self.pod_ip
        return f"{host}:{port}"

    def replace(self, **changes: object) -> RuntimeConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RuntimeConfig:
        """Parse the contract environment. Raises :class:`ConfigError` naming the bad variable."""
        r = Env(env)
        cfg = cls(
            job=r.text("REPRIEVE_JOB", cls.job),
            namespace=r.text("REPRIEVE_NAMESPACE", cls.namespace),
            pod_name=r.opt_text("REPRIEVE_POD_NAME"),
            pod_ip=r.opt_text("REPRIEVE_POD_IP"),
            num_processes=r.integer("REPRIEVE_NUM_PROCESSES", 1, minimum=1),
            process_id=r.integer("REPRIEVE_PROCESS_ID", 0, minimum=0),
            coordinator_address=r.opt_text("REPRIEVE_COORDINATOR_ADDRESS"),
            checkpoint_uri=r.text("REPRIEVE_CHECKPOINT_URI", cls.checkpoint_uri),
            checkpoint_interval_steps=r.integer("REPRIEVE_CHECKPOINT_INTERVAL_STEPS", 0, minimum=0),
            checkpoint_interval_seconds=r.number("REPRIEVE_CHECKPOINT_INTERVAL_SECONDS", 0.0, minimum=0.0),
            checkpoint_keep=r.integer("REPRIEVE_CHECKPOINT_KEEP", 3, minimum=1),
            attempt=r.integer("REPRIEVE_ATTEMPT", 1, minimum=1),
            restart_exit_code=r.integer("REPRIEVE_RESTART_EXIT_CODE", DEFAULT_RESTART_EXIT_CODE,
                                        minimum=RESTART_CODE_MIN, maximum=RESTART_CODE_MAX),
            notice_file=r.opt_text("REPRIEVE_NOTICE_FILE"),
            termination_grace_seconds=r.number("REPRIEVE_TERMINATION_GRACE_SECONDS",
                                              DEFAULT_TERMINATION_GRACE_SECONDS, minimum=0.0),
            serviceaccount_dir=r.text("REPRIEVE_SERVICEACCOUNT_DIR", DEFAULT_SERVICEACCOUNT_DIR),
            kubernetes_host=kubernetes_host(env),
            kubernetes_port=kubernetes_port(env),
            heartbeat_timeout_seconds=r.integer("REPRIEVE_HEARTBEAT_TIMEOUT_SECONDS", 10, minimum=1),
            peer_lost_seconds=r.number("REPRIEVE_PEER_LOST_SECONDS", DEFAULT_PEER_LOST_SECONDS,
                                       minimum=MIN_PEER_LOST_SECONDS),
            shutdown_timeout_seconds=r.integer("REPRIEVE_SHUTDOWN_TIMEOUT_SECONDS", 30, minimum=1),
            init_timeout_seconds=r.integer("REPRIEVE_INIT_TIMEOUT_SECONDS", 300, minimum=1),
            agreement_timeout_seconds=r.number("REPRIEVE_AGREEMENT_TIMEOUT_SECONDS", 60.0, minimum=0.1),
            notice_poll_seconds=r.number("REPRIEVE_NOTICE_POLL_SECONDS", 1.0, minimum=0.01),
            metrics_port=r.opt_integer("REPRIEVE_METRICS_PORT", minimum=0, maximum=65535),
            save_seconds_estimate=r.number("REPRIEVE_SAVE_SECONDS_ESTIMATE", 30.0, minimum=0.0),
            compilation_cache_dir=r.opt_text("REPRIEVE_COMPILATION_CACHE_DIR"),
            progress_interval_seconds=r.number("REPRIEVE_PROGRESS_INTERVAL_SECONDS", 5.0, minimum=0.0),
            max_failed_saves=r.integer("REPRIEVE_MAX_FAILED_SAVES", DEFAULT_MAX_FAILED_SAVES, minimum=1),
            run_id=r.opt_text("REPRIEVE_RUN_ID"),
            termination_log=r.opt_text("REPRIEVE_TERMINATION_LOG") or TERMINATION_LOG,
            start_over_quarantined=r.flag(START_OVER_QUARANTINED, False),
            notice_to_memory=r.flag("REPRIEVE_NOTICE_TO_MEMORY", False),
            virtual_shards=r.opt_integer("REPRIEVE_VIRTUAL_SHARDS", minimum=1),
        )
        if cfg.process_id >= cfg.num_processes:
            raise ConfigError(
                f"REPRIEVE_PROCESS_ID must be < REPRIEVE_NUM_PROCESSES ({cfg.num_processes}), "
                f"got {cfg.process_id}"
            )
        if cfg.distributed and not cfg.coordinator_address:
            raise ConfigError(
                f"REPRIEVE_COORDINATOR_ADDRESS must be set (host:port) when REPRIEVE_NUM_PROCESSES > 1, "
                f"got REPRIEVE_NUM_PROCESSES={cfg.num_processes} and no address"
            )
        if cfg.coordinator_address is not None:
            host, sep, port = cfg.coordinator_address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(
                    f"REPRIEVE_COORDINATOR_ADDRESS must be host:port, got {cfg.coordinator_address!r}"
                )
        return cfg


def kubernetes_host(env: Mapping[str, str]) -> str | None:
    """``KUBERNETES_SERVICE_HOST``: the kubelet's variable, not reprieve's (so not :class:`Env`'s)."""
    value = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    return value or None


def kubernetes_port(env: Mapping[str, str]) -> int:
    raw = env.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not raw:
        return 443
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ConfigError(f"KUBERNETES_SERVICE_PORT must be a port number between 1 and 65535, got {raw!r}")
    return int(raw)
