"""The devices a job ran on, recorded in every checkpoint, and read back before ``reprieve.init()``.

A restarted attempt's first training step traces and lowers the step function again before it can read the
compiled program from the persistent compilation cache (``benchmarks/first_step.py``: about half of the first
call). A pre-warmed process waiting in ``reprieve.init()`` (``reprieve-supervisor``) has time to do that tracing
while the previous attempt still trains, but it may not touch a device before its assignment, so it does not
know the mesh. Every trainer under ``reprieve-supervisor`` reports its devices with its first step (the supervisor hands
them to the next warm process), every checkpoint records the topology of the attempt that wrote it (platform,
device kind, process and device counts), and :func:`reprieve.trace_ahead.expected_topology` returns the first of
those it finds without touching a device. In place restarts keep the topology, so the guess is almost always
right; when it is wrong the trace made ahead is simply not used (the step traces again, as without it).

    def trace_ahead(topology: reprieve.Topology) -> None:   # called before any device is touched
        with jax.sharding.use_abstract_mesh(topology.abstract_mesh((topology.device_count,), ("data",))):
            train_step.trace(abstract_state, abstract_batch)  # a jax.jit function: its trace is cached

    job = reprieve.init(trace_ahead=trace_ahead)

``docs/restarts.md`` ("Tracing the step before the devices") has the whole recipe.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

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


def recorded(num_processes: int) -> dict[str, Any] | None:
    """This job's devices as a checkpoint (either tier) records them, for a pre-warmed process to trace ahead
    (:mod:`reprieve.trace_ahead`); None when this process has no JAX backend yet."""
    here = current_if_initialised()
    if here is None:
        return None
    return Topology(here.platform, here.device_kind, here.num_cores, num_processes, here.device_count).to_json()
