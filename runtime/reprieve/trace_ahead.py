"""Tracing the step before the devices: :func:`expected_topology` finds the devices the next attempt will most
likely run on without touching one (the previous trainer's hint, else the latest checkpoint's record, else the
newest attempt's record in the checkpoint root, :func:`record_topology`), and :class:`TraceAhead` calls
``reprieve.init(trace_ahead=fn)``'s ``fn`` with them (:mod:`reprieve.topology` is the record itself).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from . import prelower
from .checkpoint import fencing, layout
from .checkpoint.metadata import CheckpointMeta
from .checkpoint.storage import open_storage
from .config import RuntimeConfig
from .env import Env
from .supervisor.contract import EXPECTED_TOPOLOGY_ENV
from .topology import Topology, TopologyError, recorded

log = logging.getLogger(__name__)


def expected_topology(env: Mapping[str, str] | None = None) -> Topology | None:
    """The devices the next attempt will most likely run on, found without touching a device; None when unknown.

    First the devices the previous trainer in this pod reported with its first step (``reprieve-supervisor`` passes them
    to the warm process in ``REPRIEVE_EXPECTED_TOPOLOGY``), else those recorded in the latest complete checkpoint
    under ``REPRIEVE_CHECKPOINT_URI`` (the checkpoint manager's visibility rules: committed, not fenced out), else,
    when there is no checkpoint yet, those the newest attempt's process 0 recorded in the root after its first step
    (:func:`record_topology`: a spare parked before the job's first checkpoint). None on a first start, for a
    checkpoint written before topologies were recorded, or when none can be read (logged: this is a hint for
    tracing ahead, never a reason to fail). Safe before ``reprieve.init()``.
    """
    return _expected(os.environ if env is None else env)[0]


def _expected(environ: Mapping[str, str]) -> tuple[Topology | None, bool]:
    """:func:`expected_topology`, and whether asking again could find more: False once the hint or a checkpoint
    was read (one that records no topology, or a bad one, records none later either); True when there is no
    checkpoint yet or it could not be read."""
    hint = Env(environ).opt_text(EXPECTED_TOPOLOGY_ENV)
    if hint:
        try:
            return Topology.from_json(json.loads(hint)), False
        except (ValueError, TopologyError) as err:
            log.warning("expected topology: ignoring %s (%s); reading the latest checkpoint", EXPECTED_TOPOLOGY_ENV,
                        err)
    return _checkpoint_topology(environ)


def latest_metadata(environ: Mapping[str, str], what: str, otherwise: str) -> tuple[CheckpointMeta, str] | None:
    """The latest complete checkpoint's metadata under ``REPRIEVE_CHECKPOINT_URI`` (the checkpoint manager's
    visibility rules) and where it was read, for a hint; None when there is none or it cannot be read (logged as
    ``what``: ..., ``otherwise``). Creates nothing, touches no device."""
    uri = Env(environ).text("REPRIEVE_CHECKPOINT_URI", RuntimeConfig.checkpoint_uri)
    try:
        try:
            storage = open_storage(uri, fsync=False, create=False)
        except FileNotFoundError:
            return None  # no checkpoint yet (a hint: a warm process creates nothing)
        latest = fencing.latest(storage.list_entries(uncommitted=False), storage.read_fences())
        if latest is None:
            return None
        where = f"{storage.loc.uri()}/{latest.committed}/{layout.METADATA_FILE}"
        raw = storage.read_file(f"{latest.committed}/{layout.METADATA_FILE}")
        if raw is None:
            log.warning("%s: %s is missing; %s", what, where, otherwise)
            return None
        return CheckpointMeta.from_json(raw, where), where
    except Exception as err:  # noqa: BLE001  a hint: any failure means "unknown"
        log.warning("%s: could not read the latest checkpoint under %s (%s: %s); %s", what, uri, type(err).__name__,
                    err, otherwise)
        return None


def _checkpoint_topology(environ: Mapping[str, str]) -> tuple[Topology | None, bool]:
    found = latest_metadata(environ, "expected topology", "not tracing ahead")
    if found is None:
        return _recorded_topology(environ), True
    meta, where = found
    if meta.topology is None:
        log.info("expected topology: %s records none (written by an older reprieve)", where)
        return None, False
    try:
        return Topology.from_json(meta.topology), False
    except TopologyError as err:
        log.warning("expected topology: could not read the latest checkpoint under %s (%s: %s); not tracing "
                    "ahead", where, type(err).__name__, err)
        return None, False


def topology_record(attempt: int, topology: Mapping[str, Any]) -> bytes:
    """The body of ``<root>/topology.json`` (:data:`layout.TOPOLOGY_FILE`)."""
    return json.dumps({"attempt": attempt, "topology": dict(topology)}, sort_keys=True).encode()


def parse_topology_record(raw: bytes, where: str) -> tuple[int, Topology]:
    """``(attempt, topology)`` of a :func:`topology_record`; ``ValueError`` naming ``where`` and the problem."""
    try:
        doc = json.loads(raw)
        topology = Topology.from_json(doc.get("topology") if isinstance(doc, dict) else doc)
    except (ValueError, TopologyError) as err:
        raise ValueError(f"{where}: {err}") from None
    attempt = doc.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise ValueError(f"{where}: attempt must be a non-negative integer, got {attempt!r}")
    return attempt, topology


def record_topology(uri: str, attempt: int, num_processes: int) -> threading.Thread | None:
    """Write this attempt's devices to ``<uri>/topology.json`` in a background thread (process 0, after its first
    step, under ``reprieve-supervisor``): a spare's warm process that was parked before the job's first checkpoint
    reads it (:func:`expected_topology`) and traces the step ahead for the attempt it may join. Returns the thread,
    or None when this process has no JAX backend (nothing to record). A failed write is logged, never raised: it is
    a hint. Each attempt overwrites the record; a restore never reads it."""
    topology = recorded(num_processes)
    if topology is None:
        return None
    body = topology_record(attempt, topology)

    def write() -> None:
        try:
            open_storage(uri, fsync=False, create=False).write_file(layout.TOPOLOGY_FILE, body)
        except Exception as err:  # noqa: BLE001  a hint: a spare traces at its first step instead
            log.warning("topology record: not written under %s (%s: %s); a spare parked before the first "
                        "checkpoint will not trace ahead", uri, type(err).__name__, err)

    thread = threading.Thread(target=write, name="reprieve-topology-record", daemon=True)
    thread.start()
    return thread


def _recorded_topology(environ: Mapping[str, str]) -> Topology | None:
    """The newest attempt's record in the checkpoint root (:func:`record_topology`); None when there is none or it
    cannot be read (logged)."""
    uri = Env(environ).text("REPRIEVE_CHECKPOINT_URI", RuntimeConfig.checkpoint_uri)
    try:
        try:
            storage = open_storage(uri, fsync=False, create=False)
        except FileNotFoundError:
            return None
        raw = storage.read_file(layout.TOPOLOGY_FILE)
        if raw is None:
            return None
        attempt, topology = parse_topology_record(raw, f"{storage.loc.uri()}/{layout.TOPOLOGY_FILE}")
    except Exception as err:  # noqa: BLE001  a hint: any failure means "unknown"
        log.warning("expected topology: no checkpoint yet and the topology record under %s is unreadable (%s: %s); "
                    "not tracing ahead", uri, type(err).__name__, err)
        return None
    log.info("expected topology: no checkpoint yet; attempt %d recorded %d %s device(s) of %d process(es)", attempt,
             topology.device_count, topology.platform, topology.num_processes)
    return topology


class TraceAhead:
    """``reprieve.init(trace_ahead=fn)``: call ``fn(topology)`` once, before any device is touched, as soon as the
    expected topology is known.

    :meth:`attempt` is called by ``init()`` before it joins the job and, in a pre-warmed process with no topology
    yet (a spare started before the job's first checkpoint), again every ``POLL_SECONDS`` while it waits for its
    assignment, until the running attempt's record (:func:`record_topology`) or a checkpoint is found (one that
    records no topology, written by an older reprieve, ends the asking too: a later one of the same run would be the
    next attempt's). A failing ``fn`` is logged and not
    retried: tracing ahead only saves time, the step traces at its first call anyway. Touching devices in ``fn`` is
    the user's error that ``reprieve.init()`` refuses in a warm process, as for any code before it.
    """

    POLL_SECONDS = 5.0

    def __init__(self, fn: Callable[[Topology], Any], env: Mapping[str, str]) -> None:
        self._fn, self._env = fn, env
        self.done = False

    def attempt(self, hurry: Callable[[], bool] | None = None) -> None:
        """``hurry``: asked once the function has traced; True (the assignment is here, the attempt waits for this
        process) leaves the lowering to ``Job.compile_ahead``, beside the restore."""
        if self.done:
            return
        topology, again = _expected(self._env)
        if topology is None:
            if again:
                log.debug("trace_ahead: the expected topology is not known yet (no hint from the previous trainer, "
                          "no checkpoint yet)")
            else:  # the latest checkpoint records none: no more asking (each time lists the storage)
                self.done = True
            return
        self.done = True
        t = time.perf_counter()
        try:
            with prelower.collecting() as pending:
                self._fn(topology)
        except Exception as err:  # noqa: BLE001  a hint: the first call of the step traces instead
            log.warning("trace_ahead for %s failed (%s: %s); the step will be traced at its first call", topology,
                        type(err).__name__, err)
            return
        log.info("traced ahead for %d %s device(s) of %d process(es) in %.2fs, before touching a device",
                 topology.device_count, topology.platform, topology.num_processes, time.perf_counter() - t)
        if pending and hurry is not None and hurry():
            log.info("the assignment came while the step was traced: not lowered ahead (compile_ahead lowers it "
                     "beside the restore)")
            return
        prelower.lower_pending(pending, topology.platform)
