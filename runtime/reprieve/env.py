"""The one reader of ``REPRIEVE_*`` variables: the trainer's, the supervisor's and the checkpoint manager's.

Every name the runtime reads is in :data:`READS`, and ``docs/contract.toml`` lists each of them (the test
``tests/test_contract.py`` compares the two and fails on a name read anywhere else). Nothing else in the runtime
parses a ``REPRIEVE_*`` variable: :class:`Env` does, with one rule for every variable (surrounding blanks are
ignored, an empty value is unset) and errors that name the variable, what was expected and what was found.

A set variable that nothing reads is almost always a misspelling (``..._CHECKPOINT_INTERVAL=5`` for
``REPRIEVE_CHECKPOINT_INTERVAL_STEPS``) and would otherwise be ignored in silence: :func:`unknown_names` (pure)
finds them with the closest known names and :func:`warn_unknown` logs them once per process. Names that other
parts of the project read (the operator, ``hack/``, the tests: :data:`ELSEWHERE`) are not warned about.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable, Mapping
from typing import TypeVar

log = logging.getLogger(__name__)

PREFIX = "REPRIEVE_"

# Read by the trainer's reprieve.init() (RuntimeConfig): the operator contract and the runtime-only knobs.
RUNTIME = frozenset({
    "REPRIEVE_JOB", "REPRIEVE_NAMESPACE", "REPRIEVE_POD_NAME", "REPRIEVE_POD_IP", "REPRIEVE_NUM_PROCESSES",
    "REPRIEVE_PROCESS_ID", "REPRIEVE_COORDINATOR_ADDRESS", "REPRIEVE_CHECKPOINT_URI",
    "REPRIEVE_CHECKPOINT_INTERVAL_STEPS", "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS", "REPRIEVE_CHECKPOINT_KEEP",
    "REPRIEVE_ATTEMPT", "REPRIEVE_RESTART_EXIT_CODE", "REPRIEVE_NOTICE_FILE", "REPRIEVE_TERMINATION_GRACE_SECONDS",
    "REPRIEVE_SERVICEACCOUNT_DIR",
    # runtime-only knobs (docs/runtime.md, "Configuration")
    "REPRIEVE_HEARTBEAT_TIMEOUT_SECONDS", "REPRIEVE_PEER_LOST_SECONDS", "REPRIEVE_SHUTDOWN_TIMEOUT_SECONDS", "REPRIEVE_INIT_TIMEOUT_SECONDS",
    "REPRIEVE_AGREEMENT_TIMEOUT_SECONDS", "REPRIEVE_NOTICE_POLL_SECONDS", "REPRIEVE_METRICS_PORT",
    "REPRIEVE_SAVE_SECONDS_ESTIMATE", "REPRIEVE_COMPILATION_CACHE_DIR", "REPRIEVE_PROGRESS_INTERVAL_SECONDS",
    "REPRIEVE_RUN_ID", "REPRIEVE_S3_ENDPOINT", "REPRIEVE_TERMINATION_LOG", "REPRIEVE_MAX_FAILED_SAVES",
    "REPRIEVE_START_OVER_QUARANTINED", "REPRIEVE_NOTICE_TO_MEMORY",
})
# Read by the memory tier (reprieve.memtier.config.MemoryConfig, in the trainer and in reprieve-supervisor's replica
# server): set by the operator for a job with spec.checkpoint.memory (docs/contract.toml [memory]), or by users.
MEMORY = frozenset({
    "REPRIEVE_MEMORY_DIR", "REPRIEVE_MEMORY_LIMIT_BYTES", "REPRIEVE_MEMORY_INTERVAL_STEPS",
    "REPRIEVE_MEMORY_INTERVAL_SECONDS", "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS", "REPRIEVE_MEMORY_PORT",
    "REPRIEVE_MEMORY_PEER", "REPRIEVE_MEMORY_PEER_NODE",
    "REPRIEVE_NODE_NAME", "REPRIEVE_MEMORY_TOKEN",
})
# Read by the supervisor (reprieve-supervisor, `reprieve run`) only.
SUPERVISOR = frozenset({"REPRIEVE_CONTRACT", "REPRIEVE_PREWARM", "REPRIEVE_PREWARM_DELAY_SECONDS",
                        "REPRIEVE_PREWARM_READY_TIMEOUT_SECONDS"})
# Read by reprieve.init() (RuntimeConfig): set by the operator for a job with spec.elastic.virtualShards
# (docs/contract.toml [elastic]).
ELASTIC = frozenset({"REPRIEVE_VIRTUAL_SHARDS"})
# Set by the supervisor for the processes it starts, read by their reprieve.init().
FROM_SUPERVISOR = frozenset({"REPRIEVE_SUPERVISED", "REPRIEVE_WARM_FD", "REPRIEVE_SUPERVISOR_FD",
                             "REPRIEVE_EXPECTED_TOPOLOGY", "REPRIEVE_WARM_LANDING_BYTES",
                             "REPRIEVE_WARM_OWNED_BYTES"})
# Set by the supervisor for its trainers when the memory tier is on: the address of the pod's replica server.
FROM_SUPERVISOR_MEMORY = frozenset({"REPRIEVE_MEMORY_SERVER"})
# Read by the runtime for the tests' fault injection only.
TESTING = frozenset({"REPRIEVE_CKPT_TEST_CRASH_AT", "REPRIEVE_CKPT_TEST_STOP_IN_AGREED_SAVE",
                     "REPRIEVE_MEMTIER_TEST_CRASH_AT", "REPRIEVE_MEMTIER_TEST_SLOW_COPY"})
READS = RUNTIME | MEMORY | ELASTIC | SUPERVISOR | FROM_SUPERVISOR | FROM_SUPERVISOR_MEMORY | TESTING
# Read by other parts of the project (the operator, hack/, the tests), never by the runtime: not misspellings.
ELSEWHERE = frozenset({
    "REPRIEVE_LOG_LEVEL", "REPRIEVE_LOG_FORMAT", "REPRIEVE_KUEUE", "REPRIEVE_LEADER_ELECT", "REPRIEVE_HEALTH_PORT",
    "REPRIEVE_SIGNALS_JSON", "REPRIEVE_METRICS_JOB_LABEL", "REPRIEVE_NOTICE_HORIZON_SECONDS",
    "REPRIEVE_PEER_LOST_WAIT_SECONDS", "REPRIEVE_TRACEMALLOC", "REPRIEVE_CACHE", "REPRIEVE_MEMORY_CENSUS",
    "REPRIEVE_REAL_NODES",
    "REPRIEVE_REQUIRE_REAL_NODES", "REPRIEVE_REQUIRE_PROMETHEUS",
    "REPRIEVE_EMULATE_PULL_SECONDS", "REPRIEVE_EMULATE_START_SECONDS", "REPRIEVE_NODE_TEMPLATES",
    "REPRIEVE_KEEP_CLUSTER_DIR", "REPRIEVE_REAL_NODE_TIMEOUT", "REPRIEVE_KEEP_NAMESPACES",
    "REPRIEVE_SHOW_OPERATOR_LOG", "REPRIEVE_MOTO_PYTHON", "REPRIEVE_TEST_TIMES", "REPRIEVE_SOAK_SEED",
})


_N = TypeVar("_N", int, float)

class ConfigError(ValueError):
    """A ``REPRIEVE_*`` variable is malformed or inconsistent with the others."""


class Env:
    """Typed access to ``REPRIEVE_*`` variables of ``env``; only names in :data:`READS` may be asked for.

    ``error``: the exception class raised for a bad value (a subclass of ValueError); the message names the
    variable, what was expected and what was found.
    """

    def __init__(self, env: Mapping[str, str], *, error: type[ValueError] = ConfigError) -> None:
        self._env = env
        self._error = error

    def raw(self, name: str) -> str | None:
        """The value, stripped; None when unset or blank."""
        if name not in READS:
            raise KeyError(f"{name} is not a variable the runtime reads (reprieve.env.READS, docs/contract.toml)")
        value = self._env.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def text(self, name: str, default: str) -> str:
        return self.raw(name) or default

    def opt_text(self, name: str) -> str | None:
        return self.raw(name)

    def integer(self, name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.opt_integer(name, minimum=minimum, maximum=maximum)
        return default if value is None else value

    def opt_integer(self, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
        return self._parsed(name, int, "an integer", minimum, maximum)

    def number(self, name: str, default: float, *, minimum: float | None = None,
               maximum: float | None = None) -> float:
        value = self._parsed(name, float, "a number", minimum, maximum)
        return default if value is None else value

    def _parsed(self, name: str, parse: Callable[[str], _N], what: str, minimum: _N | None,
                maximum: _N | None) -> _N | None:
        """``name`` parsed (None when unset), finite and within the bounds; else the error naming all three."""
        raw = self.raw(name)
        if raw is None:
            return None
        try:
            value = parse(raw)
        except ValueError:
            raise self._error(f"{name} must be {what}{_bounds(minimum, maximum)}, got {raw!r}") from None
        if not math.isfinite(value):
            raise self._error(f"{name} must be a finite number, got {raw!r}")
        self._check_range(name, value, minimum, maximum, raw)
        return value

    def flag(self, name: str, default: bool) -> bool:
        raw = self.raw(name)
        if raw is None:
            return default
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise self._error(f"{name} must be 1 or 0, got {raw!r}")

    def _check_range(self, name: str, value: float, minimum: float | None, maximum: float | None,
                     raw: str) -> None:
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise self._error(f"{name} must be{_bounds(minimum, maximum)}, got {raw!r}")


def env_attempt(env: Mapping[str, str] | None = None) -> int:
    """``REPRIEVE_ATTEMPT`` of ``env`` (default: the process's environment), 1 when unset."""
    import os

    return Env(os.environ if env is None else env).integer("REPRIEVE_ATTEMPT", 1, minimum=1)


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" between {minimum:g} and {maximum:g}"
    if minimum is not None:
        return f" >= {minimum:g}"
    if maximum is not None:
        return f" <= {maximum:g}"
    return ""


def unknown_names(names: object) -> list[tuple[str, list[str]]]:
    """``(name, closest known names)`` for every set name that looks meant for reprieve but that nothing reads:
    ``REPRIEVE_*`` names outside :data:`READS` and :data:`ELSEWHERE`, and names whose prefix is a misspelt
    ``REPRIEVE_`` (``REPREIVE_CHECKPOINT_URI``). Pure; ``names`` is any iterable of variable names."""
    known = sorted(READS)
    out = []
    for name in sorted(str(n) for n in names):  # type: ignore[attr-defined]
        head = name.split("_", 1)[0]
        if name.startswith(PREFIX):
            if name in READS or name in ELSEWHERE:
                continue
        elif not (head != "REPRIEVE" and len(head) >= 6
                  and difflib.SequenceMatcher(None, head, "REPRIEVE").ratio() >= 0.75):
            continue
        guess = name if name.startswith(PREFIX) else PREFIX + name.split("_", 1)[-1]
        out.append((name, _closest(guess, known)))
    return out


def _closest(name: str, known: list[str]) -> list[str]:
    """The known name nearest ``name``, and a second one only when it is about as near (``..._INTERVAL`` is as near
    to ``..._INTERVAL_STEPS`` as to ``..._INTERVAL_SECONDS``)."""
    scored = sorted(((difflib.SequenceMatcher(None, name, k).ratio(), k) for k in known), reverse=True)
    best = scored[0][0] if scored else 0.0
    return [k for ratio, k in scored[:2] if ratio >= 0.6 and ratio >= best - 0.05]


def describe_unknown(name: str, closest: list[str]) -> str:
    """The warning for one unknown name (pure)."""
    hint = f": did you mean {' or '.join(closest)}?" if closest else " (docs/runtime.md lists the variables it reads)"
    return f"{name} is set, but reprieve reads no variable of that name; it is ignored{hint}"


_warned: set[str] = set()


def warn_unknown(env: Mapping[str, str]) -> list[str]:
    """Log a WARNING for each unknown ``REPRIEVE_*``-like name in ``env`` (once per name and process); the
    messages logged."""
    lines = []
    for name, closest in unknown_names(env.keys()):
        if name in _warned:
            continue
        _warned.add(name)
        lines.append(describe_unknown(name, closest))
        log.warning("%s", lines[-1])
    return lines
