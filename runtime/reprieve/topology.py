"""The devices a job ran on, recorded in every checkpoint, and read back before ``reprieve.init()``.

A restarted attempt's first training step traces and lowers the step function again before it can read the
compiled program from the persistent compilation cache (``benchmarks/first_step.py``: about half of the first
call). A pre-warmed process waiting in ``reprieve.init()`` (``reprieve-run``) has time to do that tracing
while the previous attempt still trains, but it may not touch a device before its assignment, so it does not
know the mesh. Every trainer under ``reprieve-run`` reports its devices with its first step (the supervisor hands them
to the next warm process), every checkpoint records the topology of the attempt that wrote it (platform, device
kind, process and device counts), and :func:`expected_topology` returns the first of those it finds without
touching a device. In place restarts keep the topology, so the guess is almost always
right; when it is wrong the trace made ahead is simply not used (the step traces again, as without it).

    def trace_ahead(topology: reprieve.Topology) -> None:   # called before any device is touched
        with jax.sharding.use_abstract_mesh(topology.abstract_mesh((topology.device_count,), ("data",))):
            train_step.trace(abstract_state, abstract_batch)  # a jax.jit function: its trace is cached

    job = reprieve.init(trace_ahead=trace_ahead)

``docs/restarts.md`` ("Tracing the step before the devices") has the whole recipe.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .env import Env

log = logging.getLogger(__name__)


class TopologyError(ValueError):
    """A recorded topology is malformed (names the field), or a mesh does not fit it."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where an attempt ran: what a mesh over all its devices looks like, without the devices.

    ``device_kind``, ``num_cores`` and ``platform`` are what JAX puts in an ``AbstractDevice`` for a concrete
    mesh over these devices (``jax.sharding.Mesh.abstract_mesh``), so a trace made under
    :meth:`abstract_mesh` is found again by the same step called under the real mesh.
    """

    platform: str
    device_kind: str
    num_cores: int | None
    num_processes: int
    device_count: int

    def __post_init__(self) -> None:
        for name in ("platform", "device_kind"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise TopologyError(f"topology {name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.num_cores is not None and (not _is_int(self.num_cores) or self.num_cores < 1):
            raise TopologyError(f"topology num_cores must be a positive integer or null, got {self.num_cores!r}")
        for name in ("num_processes", "device_count"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise TopologyError(f"topology {name} must be a positive integer, got {getattr(self, name)!r}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> Topology:
        """Parse a recorded topology; :class:`TopologyError` names what is wrong."""
        if not isinstance(raw, Mapping):
            raise TopologyError(f"topology must be a JSON object, got {type(raw).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown, missing = sorted(set(raw) - fields), sorted(fields - set(raw))
        if unknown:
            raise TopologyError(f"topology has unknown fields {unknown}")
        if missing:
            raise TopologyError(f"topology lacks {missing}")
        return cls(**raw)

    @classmethod
    def of_devices(cls, devices: Sequence[Any], num_processes: int) -> Topology:
        """The topology of ``devices`` (all of the job's: ``jax.devices()``), the way JAX abstracts them."""
        if not devices:
            raise TopologyError("a topology needs at least one device")
        d = devices[0]
        cores = {"tpu": "num_cores", "gpu": "core_count"}.get(d.platform)  # as jax.sharding.Mesh.abstract_mesh
        num_cores = getattr(d, cores, None) if cores else None
        return cls(platform=d.platform, device_kind=d.device_kind, num_cores=num_cores,
                   num_processes=num_processes, device_count=len(devices))

    def abstract_mesh(self, axis_sizes: Sequence[int], axis_names: Sequence[str],
                      axis_types: Any = None) -> Any:
        """A ``jax.sharding.AbstractMesh`` of these devices with the given axes (their sizes must multiply to
        :attr:`device_count`, as a mesh over all devices does). Touches no device."""
        import math

        import jax

        sizes, names = tuple(int(s) for s in axis_sizes), tuple(axis_names)
        if len(sizes) != len(names):
            raise TopologyError(f"mesh axis sizes {sizes} and names {names} differ in length")
        if math.prod(sizes) != self.device_count:
            raise TopologyError(f"mesh axis sizes {sizes} make {math.prod(sizes)} devices; this topology has "
                                f"{self.device_count}")
        device = jax.sharding.AbstractDevice(device_kind=self.device_kind, num_cores=self.num_cores,
                                             platform=self.platform)
        return jax.sharding.AbstractMesh(sizes, names, axis_types, abstract_device=device)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def current() -> Topology:
    """The topology this process runs in (after ``reprieve.init()``: every process's devices)."""
    import jax

    return Topology.of_devices(jax.devices(), jax.process_count())


def current_if_initialised() -> Topology | None:
    """:func:`current` when this process has a JAX backend already (it never initialises one: a save of host-only
    state or a trainer that never touched a device reports nothing), else None; never raises."""
    import sys

    if "jax" not in sys.modules:
        return None
    try:
        from jax._src import xla_bridge  # not public API: the only way to ask without initialising a backend

        if not xla_bridge.backends_are_initialized():
            return None
        return current()
    except Exception as err:  # noqa: BLE001  a hint: never a reason to fail
        log.debug("topology: not known (%s: %s)", type(err).__name__, err)
        return None


def expected_topology(env: Mapping[str, str] | None = None) -> Topology | None:
    """The devices the next attempt will most likely run on, found without touching a device; None when unknown.

    First the devices the previous trainer in this pod reported with its first step (``reprieve-run`` passes them
    to the warm process in ``REPRIEVE_EXPECTED_TOPOLOGY``), else those recorded in the latest complete checkpoint
    under ``REPRIEVE_CHECKPOINT_URI`` (the checkpoint manager's visibility rules: committed, not fenced out). None
    on a first start, for a checkpoint written before topologies were recorded, or when neither can be read
    (logged: this is a hint for tracing ahead, never a reason to fail). Safe before ``reprieve.init()``.
    """
    from .supervisor.contract import EXPECTED_TOPOLOGY_ENV

    environ = os.environ if env is None else env
    hint = Env(environ).opt_text(EXPECTED_TOPOLOGY_ENV)
    if hint:
        try:
            return Topology.from_json(json.loads(hint))
        except (ValueError, TopologyError) as err:
            log.warning("expected topology: ignoring %s (%s); reading the latest checkpoint", EXPECTED_TOPOLOGY_ENV,
                        err)
    return _checkpoint_topology(environ)


def _checkpoint_topology(environ: Mapping[str, str]) -> Topology | None:
    from .checkpoint import fencing, layout
    from .checkpoint.metadata import CheckpointMeta
    from .checkpoint.storage import open_storage
    from .config import RuntimeConfig

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
            log.warning("expected topology: %s is missing; not tracing ahead", where)
            return None
        meta = CheckpointMeta.from_json(raw, where)
        if meta.topology is None:
            log.info("expected topology: %s records none (written by an older reprieve)", where)
            return None
        return Topology.from_json(meta.topology)
    except Exception as err:  # noqa: BLE001  a hint: any failure means "unknown"
        log.warning("expected topology: could not read the latest checkpoint under %s (%s: %s); not tracing "
                    "ahead", uri, type(err).__name__, err)
        return None


class TraceAhead:
    """``reprieve.init(trace_ahead=fn)``: call ``fn(topology)`` once, before any device is touched, as soon as the
    expected topology is known.

    :meth:`attempt` is called by ``init()`` before it joins the job and, in a pre-warmed process with no topology
    yet (a spare started before the job's first checkpoint), again every ``POLL_SECONDS`` while it waits for its
    assignment, until a checkpoint records one. A failing ``fn`` is logged and not retried: tracing ahead only
    saves time, the step traces at its first call anyway. Touching devices in ``fn`` is the user's error that
    ``reprieve.init()`` refuses in a warm process, as for any code before it.
    """

    POLL_SECONDS = 5.0

    def __init__(self, fn: Callable[[Topology], Any], env: Mapping[str, str]) -> None:
        self._fn, self._env = fn, env
        self.done = False

    def attempt(self) -> None:
        if self.done:
            return
        topology = expected_topology(self._env)
        if topology is None:
            log.debug("trace_ahead: the expected topology is not known yet (no hint from the previous trainer, no "
                      "checkpoint records one)")
            return
        self.done = True
        t = time.perf_counter()
        try:
            self._fn(topology)
        except Exception as err:  # noqa: BLE001  a hint: the first call of the step traces instead
            log.warning("trace_ahead for %s failed (%s: %s); the step will be traced at its first call", topology,
                        type(err).__name__, err)
            return
        log.info("traced ahead for %d %s device(s) of %d process(es) in %.2fs, before touching a device",
                 topology.device_count, topology.platform, topology.num_processes, time.perf_counter() - t)
