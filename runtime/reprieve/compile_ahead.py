"""Compile the training step while the state is restored (``Job.compile_ahead``).

After a restart the first call of a ``jax.jit`` step lowers it for the job's devices and reads (or compiles) its
program: 1-1.5 s per process on the benchmark's model, on the restart's critical path after the restore. Lowering
is keyed on the concrete devices, so it cannot be done before ``reprieve.init()`` has joined the job (tracing can:
``reprieve.init(trace_ahead=...)``). It can run beside the restore, though: :class:`CompileAhead` lowers and
compiles in a background thread, in the caller's mesh context, and ``Job.steps()`` waits for it before the first
step, so the step's first call finds the lowered and compiled program in JAX's caches instead of doing the work
again (docs/restarts.md, "Compiling the step while the state is restored").

The thread copies the one piece of thread-local JAX context a step's lowering is keyed on that a user sets per
thread, the mesh (``jax.set_mesh`` / ``jax.sharding.use_abstract_mesh``); other thread-local configuration
(``with jax.default_matmul_precision(...)`` and the like) is not copied: set it with ``jax.config.update``, or
the first step lowers again (``Job.first_step_lowerings``, logged). Failures are logged and never stop training:
compiling ahead only saves time.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import prelower

log = logging.getLogger("reprieve")

LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"  # jax.monitoring: one per lowering


_lock = threading.Lock()
_installed: list[bool] = []
_active: dict[int, LoweringCount] = {}  # thread ident -> its counter


def _on_event(event: str, duration_secs: float, **_: str | int) -> None:
    if event != LOWERING_EVENT:
        return
    counter = _active.get(threading.get_ident())
    if counter is not None:
        counter.count += 1
        counter.seconds += duration_secs


class LoweringCount:
    """The lowerings JAX reports (``jax.monitoring``) in the thread that made this, until :meth:`stop`. One
    listener per process (JAX has no public way to remove one), installed at the first use; nothing is counted
    (and JAX is not imported) in a process that has not imported JAX."""

    def __init__(self) -> None:
        self.count, self.seconds = 0, 0.0
        self._ident = threading.get_ident()
        if "jax" not in sys.modules:
            return
        import jax.monitoring

        with _lock:
            if not _installed:
                jax.monitoring.register_event_duration_secs_listener(_on_event)
                _installed.append(True)
        _active[self._ident] = self

    def stop(self) -> tuple[int, float]:
        """Stop counting (idempotent); ``(count, seconds)``."""
        if _active.get(self._ident) is self:
            del _active[self._ident]
        return self.count, self.seconds

    def stop_first_step(self, *, stepped: bool) -> tuple[int, float] | None:
        """:meth:`stop` for the count of an attempt's first step (logged if any); None when no step was taken."""
        count, seconds = self.stop()
        if not stepped:
            return None
        if count:
            logging.getLogger("reprieve.job").info("the first step lowered %d program(s) in %.2fs", count, seconds)
        return count, seconds


@contextlib.contextmanager
def watch_lowerings() -> Iterator[LoweringCount]:
    """:class:`LoweringCount` for the calling thread inside the block."""
    counter = LoweringCount()
    try:
        yield counter
    finally:
        counter.stop()


def _mesh_context() -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A factory re-entering, in another thread, the calling thread's mesh context (or none)."""
    import jax

    mesh = jax.sharding.get_mesh()
    if not mesh.empty:
        return lambda: jax.set_mesh(mesh)  # type: ignore[no-any-return]
    abstract = jax.sharding.get_abstract_mesh()
    if not abstract.empty:
        return lambda: jax.sharding.use_abstract_mesh(abstract)  # type: ignore[no-any-return]
    return contextlib.nullcontext


def donates(lowered: Any) -> bool:
    """Whether a ``jax.stages.Lowered`` step donates any of its inputs (its ``args_info``'s ``donated``)."""
    import jax

    return any(getattr(info, "donated", False) for info in jax.tree.leaves(getattr(lowered, "args_info", ())))


def start_ahead(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                on_compiled: Callable[[Any], None] | None = None) -> tuple[CompileAhead, Any]:
    """A :class:`CompileAhead` of ``fn`` (from the module ``reprieve.lower_ahead`` lowered for it, if any), and the
    step the loop calls: ``fn``, or the :class:`reprieve.prelower.AheadStep` that calls that module's program."""
    pre = prelower.take(fn)
    step = None if pre is None else prelower.AheadStep(fn)
    return CompileAhead(fn, args, kwargs, on_compiled, prelowered=pre, step=step), fn if step is None else step


class CompileAhead:
    """``fn.lower(*args, **kwargs).compile()`` in a daemon thread, in the caller's mesh context.

    ``fn`` is a ``jax.jit`` function; ``args`` are what its first call will get, as arrays or as
    ``jax.ShapeDtypeStruct`` with ``sharding=`` (the same shardings as the real arguments: another sharding is
    another program). :meth:`wait` joins; the outcome is logged, never raised.
    """

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 on_compiled: Callable[[Any], None] | None = None, *, prelowered: Any = None,
                 step: Any = None) -> None:
        """``on_compiled``: called in the thread with the compiled step's outputs (``Compiled.out_info``: shapes,
        dtypes, shardings) once it compiled; what it raises is logged, never the step's outcome. ``prelowered``:
        the module ``reprieve.lower_ahead`` lowered for ``fn`` before the devices; compiled for the arguments'
        devices when it fits them (else ``fn`` is lowered as without it), the program then handed to ``step``
        (:class:`reprieve.prelower.AheadStep`), which the loop calls."""
        lower = getattr(fn, "lower", None)
        if not callable(lower):
            raise TypeError(f"Job.compile_ahead: {prelower.fn_name(fn)!r} has no .lower(): pass the jax.jit function "
                            "itself (the one the training loop calls)")
        self.name = prelower.fn_name(fn)
        self.ok: bool | None = None  # None: running
        self.seconds: float | None = None
        self._donates = False  # whether the lowered step donates any of its inputs (``Lowered.args_info``)
        self._lowered = threading.Event()  # set once lowered, or once that failed
        self._context = _mesh_context()
        self._on_compiled = on_compiled
        self._prelowered, self._step = prelowered, step
        self.from_ahead = False  # the module lowered before the devices was compiled (no lowering here)
        self._thread = threading.Thread(target=self._run, args=(lower, args, kwargs), daemon=True,
                                        name=f"reprieve-compile-ahead-{self.name}")
        self._started = time.perf_counter()
        self._thread.start()

    def _run(self, lower: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            with self._context():
                compiled = self._compile_prelowered(args, kwargs) if self._prelowered is not None else None
                if compiled is None:
                    lowered = lower(*args, **kwargs)
                    self._donates = donates(lowered)
                    self._lowered.set()
                    compiled = lowered.compile()
        except Exception as err:  # noqa: BLE001  a head start only: the first call compiles instead
            self.ok = False
            log.warning("compile_ahead(%s) failed (%s: %s); the step compiles at its first call", self.name,
                        type(err).__name__, err)
            return
        finally:
            self._lowered.set()
            self.seconds = time.perf_counter() - self._started
        self.ok = True
        if self.from_ahead and self._step is not None:
            self._step.compiled = compiled
        if self._on_compiled is not None:
            try:
                self._on_compiled(getattr(compiled, "out_info", None))
            except Exception as err:  # noqa: BLE001 - a head start for something else: never the step's
                log.debug("compile_ahead(%s): after the compile: %s", self.name, err)

    def _compile_prelowered(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The module lowered before the devices, compiled for the arguments' devices; None when it does not fit
        them or its compile failed (logged: ``fn`` is lowered instead)."""
        pre = self._prelowered
        try:
            why = prelower.mismatch(pre, args, kwargs)
            devices = None if why is not None else prelower.devices_of(args, kwargs)
            if devices is None:
                log.info("compile_ahead(%s): the step lowered before the devices does not fit them (%s); lowering "
                         "it again", self.name, why or "the arguments' shardings name no single concrete mesh")
                return None
            # the module says whether the step donates before it is compiled: the restore, which asks, goes on
            # beside the compile (its copy into memory XLA owns) instead of waiting for it
            self._donates = donates(pre)
            self._lowered.set()
            compiled = prelower.compile_lowered(pre, devices)
        except Exception as err:  # noqa: BLE001 - a head start only: lowered as without it
            log.warning("compile_ahead(%s): the step lowered before the devices did not compile (%s: %s); lowering "
                        "it again", self.name, type(err).__name__, err)
            return None
        self.from_ahead = True
        return compiled

    def lowered(self) -> bool:
        """Whether :meth:`donates_inputs` answers without waiting."""
        return self._lowered.is_set()

    def donates_inputs(self) -> bool:
        """Whether the step donates any of its inputs (``jax.jit(..., donate_argnums=...)``), once it is lowered
        (waits for the lowering, not the compile); False when the lowering failed."""
        self._lowered.wait()
        return self._donates

    def wait(self) -> None:
        t = time.perf_counter()
        self._thread.join()
        waited = time.perf_counter() - t
        if self.ok:
            log.info("compiled %s ahead in %.2fs beside the restore%s (the first step waited %.2fs for it)", self.name,
                     self.seconds or 0.0, ", lowered before the devices" if self.from_ahead else "", waited)
