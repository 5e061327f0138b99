"""What a pre-warmed process does before it parks in ``reprieve.init()`` (``docs/restarts.md``, "Pre-warmed
next attempt"): the work that ``init()`` and the restore would otherwise do after the assignment arrives, on the
restart's critical path, and that needs neither the assignment nor a device.

- **Imports** that ``init()``, the checkpointer and the restore make lazily (so that a job that never uses them
  does not pay for them): the checkpoint manager and its restore, the memory tier when it is configured.
- **JAX's plugin discovery**: the first ``jax.devices()`` scans every installed distribution's entry points for
  PJRT plugins (a GPU plugin's shared library loads there too; benchmarks/RESULTS.md, "Goodput").
  Registering the plugins creates no backend and touches no device, so the warm process still joins the next
  attempt (:func:`reprieve.supervisor.trainer.device_problem` checks exactly that).
- **The heap settled**: the cyclic garbage of the process's start collected once, and every object left moved out of
  the garbage collector's passes (``gc.freeze``, :func:`settle_heap`). Without it the first full collection after the
  assignment walked the whole heap of imports, model and trace, the process's other threads held meanwhile, and so
  did every full collection while the attempt trained (benchmarks/RESULTS.md, "Goodput and restart gaps").
- **The restore's landing memory** (``REPRIEVE_WARM_LANDING_BYTES``, the bytes the last trainer's restore landed):
  populated now, where the pod has room for it (:mod:`reprieve.landing`), so the restore writes into pages the
  process already has; and the memory XLA allocates for the restore's copy when the step donates the state on CPU
  devices (``REPRIEVE_WARM_OWNED_BYTES``), populated in the process's C heap. Both go back to the kernel while the
  process waits once the machine (or the pod) no longer has room for them once over (:class:`WhileWaiting`): a
  head start never costs the machine its headroom at a restart, when the next trainer restores and a doomed pod's
  memory has not gone yet.

Everything here is a head start: a failure is logged at debug level and the same work happens after the
assignment, as it did before.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from . import exiting, landing
from .env import Env
from .memtier.config import DIR_ENV
from .supervisor.contract import LANDING_BYTES_ENV, OWNED_BYTES_ENV

log = logging.getLogger(__name__)

# What init() and Job.restore_or import inside functions (grep "^\s+from \." in runtime/reprieve).
LAZY_MODULES = (
    "reprieve.rollcall",
    "reprieve.tether",
    "reprieve.checkpoint.manager",
    "reprieve.checkpoint.reader",
    "reprieve.checkpoint.restore",
    "reprieve.checkpoint.save",
)
MEMORY_TIER_MODULES = ("reprieve.memtier.tier", "reprieve.memtier.restore_round", "reprieve.memtier.restore")


def modules_for(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The modules a pre-warmed process imports for a job with this environment (pure)."""
    return LAZY_MODULES + (MEMORY_TIER_MODULES if Env(environ).opt_text(DIR_ENV) else ())


def prepare(environ: Mapping[str, str], *, landing_memory: bool = True) -> LandingAhead:
    """Import :func:`modules_for` ``environ``, register JAX's PJRT plugins when JAX is imported, then populate the
    restore's landing memory when its size is known (:class:`LandingAhead`, returned: a spare asks again while it
    waits). ``landing_memory=False`` (the assignment is already here): not populated, the restore makes its own."""
    for name in modules_for(environ):
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a head start: init() imports it again and says what fails
            log.debug("pre-warm: importing %s failed: %s", name, err)
    if "jax" in sys.modules:
        discover_jax_plugins()
    ahead = LandingAhead(environ)
    if landing_memory:
        ahead.attempt()  # last: the memory the restore lands in, populated while the process waits
    return ahead


class LandingAhead:
    """The restore's landing memory, populated by a warm process while it waits (:mod:`reprieve.landing`): as many
    bytes as the previous trainer in this pod reported (``REPRIEVE_WARM_LANDING_BYTES``), else as the latest
    checkpoint records for its process 0 (``landing_bytes`` in ``reprieve.json``: a spare, in whose pod no trainer
    ran). :meth:`attempt` is called again while the process waits until the size is known (a spare started before
    the job's first checkpoint); ``done`` once it was (a pool made, or refused for the room: logged once). The
    memory XLA allocates for the restore's copy (:func:`reprieve.landing.reserve_owned`) is populated first, once: as
    much as the previous trainer in this pod reported (``REPRIEVE_WARM_OWNED_BYTES``), else as the checkpoint records
    (``owned_bytes``, when the writer's step donates its state)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._env = environ
        self.done = False
        self._owned_tried = False

    def _reserve_owned(self, nbytes: int | None) -> None:
        if nbytes and not self._owned_tried:  # once: a refusal for the room is logged once
            self._owned_tried = True
            landing.reserve_owned(nbytes)

    def attempt(self) -> None:
        if self.done:
            return
        try:
            env = Env(self._env)
            nbytes = env.opt_integer(LANDING_BYTES_ENV, minimum=0)
            self._reserve_owned(env.opt_integer(OWNED_BYTES_ENV, minimum=0))  # first, as it is the larger
            if not nbytes:
                from .trace_ahead import latest_metadata

                found = latest_metadata(self._env, "landing memory", "not populated ahead")
                if found is None:
                    return  # no checkpoint yet: asked again while the process waits
                nbytes = found[0].landing_bytes  # None: written by an older reprieve, and no more asking
                self._reserve_owned(found[0].owned_bytes)  # recorded when the writer's step donates its state
            self.done = True
            if nbytes:
                landing.reserve(nbytes)
        except Exception as err:  # noqa: BLE001 - a head start: the restore makes fresh buffers instead
            self.done = True
            log.warning("pre-warm: no landing memory populated ahead: %s", err)


MEMORY_CHECK_SECONDS = 1.0  # how often a waiting warm process reads the memory left (/proc/meminfo, its cgroup)


class HeadStart(Protocol):
    """Work a warm process retries while it waits until it is ``done`` (``TraceAhead``, :class:`LandingAhead`)."""

    done: bool

    def attempt(self) -> None: ...


class WhileWaiting:
    """A warm process's work while it waits for its assignment (``await_assignment``'s ``idle``, called every
    :data:`MEMORY_CHECK_SECONDS`): the memory populated ahead given back when the machine runs short
    (:func:`reprieve.landing.give_back_if_tight`), and every ``poll_s`` the head starts not made yet asked again (a
    spare's trace and landing memory, which wait for the job's first checkpoint), the heap settled again once one is
    made. ``clock``: injected in tests."""

    def __init__(self, pending: list[HeadStart | None], poll_s: float, clock: Callable[[], float] = time.monotonic,
                 check: Callable[[], int] = landing.give_back_if_tight) -> None:
        self._pending = [w for w in pending if w is not None and not w.done]
        self._poll_s, self._clock, self._check = poll_s, clock, check
        self._due = clock() + poll_s

    def __call__(self) -> None:
        self._check()
        if not self._pending or self._clock() < self._due:
            return
        self._due = self._clock() + self._poll_s
        for w in self._pending:
            w.attempt()
        left = [w for w in self._pending if not w.done]
        if len(left) < len(self._pending):  # a trace or landing memory made: not asked again
            self._pending = left
            settle_heap(first=False)


def settle_heap(*, first: bool, collect: bool = True) -> None:
    """Collect the cyclic garbage made so far, then freeze every object left (``gc.freeze``: moved to the permanent
    generation, which no collection walks). Called by a warm process before it waits, and again when a head start
    it retried while waiting (a spare's trace) has been made; ``first``: say it at info level.

    Objects frozen are still freed when their last reference goes; only a cycle among them is never collected (the
    imports, the model's structure and the traces: they live as long as the process). Files among them are still
    flushed at exit (:func:`reprieve.exiting.freeze` remembers them). ``collect=False`` (the assignment is already
    here): frozen without the collection, which takes a tenth of a second or more; its garbage then stays."""
    t = time.perf_counter()
    collected = gc.collect() if collect else 0
    exiting.freeze()
    (log.info if first else log.debug)(
        "pre-warm: %d objects frozen out of the garbage collector's passes in %.2fs (%d collected): the attempt's "
        "first full collection walks only what it makes", gc.get_freeze_count(), time.perf_counter() - t, collected)


def discover_jax_plugins() -> None:
    """JAX's own discovery of PJRT plugins, done once per process (``jax._src.xla_bridge``, not public API: a JAX
    without it is left to discover them at its first ``jax.devices()``)."""
    try:
        from jax._src import xla_bridge

        discover = getattr(xla_bridge, "_discover_and_register_pjrt_plugins", None)
        if callable(discover) and not xla_bridge.backends_are_initialized():
            discover()
    except Exception as err:  # noqa: BLE001 - a head start only
        log.debug("pre-warm: JAX's plugin discovery failed: %s", err)
