"""Where the runtime leans on JAX's private parts, all in one place, each with why and what happens without it.

- the JAX versions the runtime runs on (:func:`jax_version_problem`): it turns JAX's own preemption service off
  (:func:`disable_preemption_service`, an option JAX added in 0.9.0) because reprieve owns SIGTERM;
- the preemption sync point JAX's helpers and Orbax consult is replaced (:func:`replace_preemption_sync_point`,
  ``jax._src.distributed``): ``reached_preemption`` from user code fails loudly instead of returning False for ever;
- every CPU process writes its own persistent compilation cache entries, not only process 0
  (:func:`enable_compilation_cache`, ``jax._src.compiler._cache_write``).

A JAX without one of these hooks gets a warning naming what is lost, never a failure (the version check aside).
``make test-jax-range`` runs the runtime's tests on the oldest JAX supported.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

from .config import RuntimeConfig

log = logging.getLogger(__name__)

def enable_compilation_cache(config: RuntimeConfig) -> bool:
    """Turn on JAX's persistent compilation cache in ``REPRIEVE_COMPILATION_CACHE_DIR``, if set.

    A gang restart runs the same programs again; with the cache on shared storage the restarted processes
    load them instead of compiling (JAX's default threshold caches only programs that took over 1 s to
    compile; a restart pays for the fast ones too, so every program is cached). Returns whether it is on.
    """
    if not config.compilation_cache_dir:
        return False
    import jax

    jax.config.update("jax_compilation_cache_dir", config.compilation_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    every = _write_cache_from_every_cpu_process()
    log.info("JAX persistent compilation cache in %s%s", config.compilation_cache_dir,
             " (every CPU process writes its own entries)" if every else "")
    return True


def _write_cache_from_every_cpu_process() -> bool:
    """Let every process write its own persistent-cache entries on CPU, not only process 0.

    JAX writes cache entries from process 0 only (one writer per shared key on GCS). On CPU the key includes the
    local client's topology fingerprint, so it differs per process: process 0's entries are never read by the
    others. A restarted CPU gang then had process 0 load its train step in milliseconds and enter the first
    collective while the others compiled; when they took longer than gloo's rendezvous wait, process 0 died
    with SIGABRT ("Gloo context initialization failed ... GetKeyValue() timed out"). With every process
    writing its own (differently keyed, so never contended) entries, every process of a restart loads.
    GPU keys strip the device assignment and TPU topologies are global: there, JAX's rule stays.
    Returns whether the rule was widened (False on a JAX without the private hooks this needs).
    """
    try:
        from jax._src import compilation_cache, compiler, distributed
    except ImportError:
        return False
    original = getattr(compiler, "_cache_write", None)
    put = getattr(compilation_cache, "put_executable_and_time", None)
    if original is None or put is None:
        log.warning("this JAX has no compiler._cache_write: on CPU only process 0 writes compilation cache "
                    "entries (a restarted multi-process CPU gang compiles again on the other processes)")
        return False
    if getattr(original, "reprieve_every_process", False):
        return True

    import inspect

    signature = inspect.signature(original)
    needed = {"cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks"}
    if not needed <= set(signature.parameters):
        log.warning("this JAX's compiler._cache_write takes %s: on CPU only process 0 writes compilation cache "
                    "entries", list(signature.parameters))
        return False

    def cache_write(*args: Any, **kwargs: Any) -> None:
        a = signature.bind(*args, **kwargs).arguments
        if (distributed.global_state.process_id == 0 or getattr(a["backend"], "platform", None) != "cpu"
                or a["host_callbacks"]):
            original(*args, **kwargs)
            return
        if a["compile_time_secs"] < compiler.config.persistent_cache_min_compile_time_secs.value:
            return
        try:
            put(a["cache_key"], a["module_name"], a["executable"], a["backend"], int(a["compile_time_secs"]))
        except Exception as err:  # noqa: BLE001 - a cache write must never fail the step (JAX's own rule)
            log.warning("could not write compilation cache entry %s: %s", a["cache_key"], err)

    cache_write.reprieve_every_process = True  # type: ignore[attr-defined]
    compiler._cache_write = cache_write
    return True


OLDEST_JAX = (0, 9, 0)  # `make test-jax-range` runs the runtime's tests on it; docs/runtime.md states the range


def jax_version_problem(version: str) -> str | None:
    """Why this JAX cannot run the runtime (pure), or None. The runtime uses JAX's private distributed client
    and the ``jax_enable_preemption_service`` option (from 0.9.0)."""
    try:
        parts = tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        return None  # a development build: let it try
    if parts < OLDEST_JAX:
        oldest = ".".join(map(str, OLDEST_JAX))
        return (f"reprieve needs jax >= {oldest} (it turns off JAX's own preemption service, an option JAX added "
                f"in 0.9.0), found jax {version}: pip install 'jax>={oldest}'")
    return None


def disable_preemption_service() -> None:
    """JAX's preemption service installs its own C-level SIGTERM handler; reprieve owns SIGTERM. Call before
    ``jax.distributed.initialize``."""
    import jax

    jax.config.update("jax_enable_preemption_service", False)


class PreemptionServiceDisabled(Exception):
    """``reached_preemption`` / ``reached_preemption_sync_point`` was called under reprieve."""


class _NoPreemptionSyncPoint:
    """Stands in for JAX's preemption sync manager, which reprieve turns off (it owns SIGTERM).

    Without it, ``orbax.checkpoint.CheckpointManager.reached_preemption(step)`` and
    ``jax.experimental.multihost_utils.reached_preemption_sync_point(step)`` silently return False for ever,
    and a MaxText-style loop would never save before its node goes. Answering True instead would be worse: such
    a loop then saves with its own manager and exits 0, which the operator reads as "training finished".
    So a call from user code fails at once, saying what to write instead. Orbax's own methods also ask
    (``CheckpointManager.save`` checks ``reached_preemption`` to force a save): those calls get False, so an
    Orbax manager (``reprieve.orbax.OrbaxCheckpointer`` among them) saves as usual.
    """

    def reached_sync_point(self, step: int) -> bool:
        if _asked_by_orbax_itself():
            return False
        raise PreemptionServiceDisabled(
            f"reached_preemption({step}) cannot work under reprieve: reprieve.init() turns JAX's preemption "
            "service off and agrees the save step itself. Replace `if mngr.reached_preemption(step):` with "
            "`job.save(step, state)` every step (it saves at the agreed step, waits for the commit and exits "
            "with the restart code), or ask `job.should_stop(step)`; pass checkpointer=reprieve.orbax."
            "OrbaxCheckpointer(...) to keep Orbax's format (docs/runtime.md, \"Coming from Orbax / MaxText\")")

    def shutdown(self) -> None:  # called by jax.distributed.shutdown()
        return None


def _asked_by_orbax_itself() -> bool:
    """True when the innermost Orbax ``reached_preemption`` on the stack was called by Orbax code."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "reached_preemption" and str(frame.f_globals.get("__name__", "")).startswith(
                "orbax."):
            caller = frame.f_back
            while caller is not None and caller.f_code.co_name == "reached_preemption":
                caller = caller.f_back  # CheckpointManager.reached_preemption -> utils.reached_preemption
            return caller is not None and str(caller.f_globals.get("__name__", "")).startswith("orbax.")
        frame = frame.f_back
    return False


def replace_preemption_sync_point() -> None:
    """After ``jax.distributed.initialize``: JAX's helpers and Orbax ask :class:`_NoPreemptionSyncPoint`."""
    from jax._src import distributed  # not public API: the sync manager JAX's helpers and Orbax consult

    if distributed.global_state.preemption_sync_manager is None:
        distributed.global_state.preemption_sync_manager = _NoPreemptionSyncPoint()
