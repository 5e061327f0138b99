"""Lowering the step before the devices (``reprieve.lower_ahead``), and compiling that module once they are known.

``reprieve.init(trace_ahead=fn)`` calls ``fn(topology)`` before any device is touched (in a pre-warmed process:
while the previous attempt trains). Where ``fn`` calls :func:`lower_ahead` instead of ``step.trace(...)``, the
runtime also *lowers* the traced step there, so that once the devices are known ``Job.compile_ahead(step, ...)``
only has to read the compiled program from the persistent cache: the lowering (Python, which beside the restore
slows it down, on every restart) leaves the restart's critical path.

JAX 0.10 creates the default backend to lower, even under an ``AbstractMesh``, and a process must not hold a backend
when it joins the job (``jax.distributed.initialize``). So the runtime lowers only for a CPU topology, with
``jax_platforms`` held to ``cpu``, and clears the backends again before ``reprieve.init()`` goes on
(``jax.extend.backend.clear_backends``: it also empties JAX's caches, the traces too). The module is the one the
devices' mesh lowers to, so its compile for the devices (``Lowered.compile(device_assignment=...)``, on the new
backend) is the persistent cache's entry of an earlier attempt. The compiled program is not in ``jax.jit``'s own
caches: the loop calls what ``Job.compile_ahead`` returns (:class:`AheadStep`), which falls back to the jitted
function for good when the program refuses its arguments. On another platform (a GPU or TPU would have to be
opened in the warm process, and lowering for it from a CPU backend is not verified) the step is traced only.

Everything here is a head start: a failure is logged, and the step is lowered and compiled as without it
(docs/restarts.md, "Lowering the step before the devices").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("reprieve")

PLATFORMS = ("cpu",)  # the topologies whose step is lowered before the devices (see the module's docstring)


@dataclasses.dataclass
class _Pending:
    fn: Any
    traced: Any
    mesh: Any  # the abstract mesh the trace ran under (or None)


_collecting: list[list[_Pending]] = []  # set while a trace_ahead function runs (TraceAhead)
_lowered: dict[int, tuple[Any, Any]] = {}  # id(fn) -> (fn, jax.stages.Lowered), this process's
_lock = threading.Lock()


def fn_name(fn: Any) -> str:
    """A jitted function's name for log lines (its ``__name__``, the wrapped function's, or its type's)."""
    return str(getattr(fn, "__name__", None) or getattr(getattr(fn, "__wrapped__", None), "__name__", None)
               or type(fn).__name__)


def lower_ahead(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """In ``reprieve.init(trace_ahead=...)``'s function: trace the ``jax.jit`` function ``fn`` for ``args`` (as
    ``fn.trace(*args, **kwargs)``: ``jax.ShapeDtypeStruct`` with shardings on the ``topology.abstract_mesh(...)``
    in context) and, on a CPU topology, lower it once the function returns. ``Job.compile_ahead(fn, ...)`` then
    compiles that module for the devices; call what it returns in the loop. Returns the ``jax.stages.Traced``."""
    if not _collecting:
        raise RuntimeError(f"reprieve.lower_ahead({fn_name(fn)}): call it inside the function passed to "
                           "reprieve.init(trace_ahead=...), which runs before any device is touched; after init() "
                           "use job.compile_ahead(step, ...) alone")
    trace = getattr(fn, "trace", None)
    if not callable(trace):
        raise TypeError(f"reprieve.lower_ahead: {fn_name(fn)!r} has no .trace(): pass the jax.jit function itself "
                        "(the one the training loop calls)")
    import jax

    traced = trace(*args, **kwargs)
    mesh = jax.sharding.get_abstract_mesh()
    _collecting[-1].append(_Pending(fn, traced, None if mesh.empty else mesh))
    return traced


@contextlib.contextmanager
def collecting() -> Iterator[list[_Pending]]:
    """What :func:`lower_ahead` records inside the block (TraceAhead runs the user's function in it)."""
    pending: list[_Pending] = []
    _collecting.append(pending)
    try:
        yield pending
    finally:
        _collecting.pop()


def lower_pending(pending: list[_Pending], platform: str) -> int:
    """Lower what :func:`lower_ahead` traced for a ``platform`` topology, then clear the backend the lowering made;
    returns how many were lowered (0 on another platform, or when anything failed: logged)."""
    if not pending:
        return 0
    names = ", ".join(fn_name(p.fn) for p in pending)
    if platform not in PLATFORMS:
        log.info("lower_ahead(%s): traced only; lowering before the devices is done for %s topologies, not %s "
                 "(JAX would open the devices to lower)", names, "/".join(PLATFORMS), platform)
        return 0
    import jax
    from jax._src import xla_bridge  # not public API: the only way to ask without initialising a backend

    if xla_bridge.backends_are_initialized():  # the user's code touched a device: init() says so
        log.info("lower_ahead(%s): not lowered, a JAX backend is already initialised", names)
        return 0
    t = time.perf_counter()
    previous = getattr(jax.config, "jax_platforms", None)  # (typed stubs lack the flags)
    done: list[tuple[Any, Any]] = []
    try:
        jax.config.update("jax_platforms", platform)
        for p in pending:
            with jax.sharding.use_abstract_mesh(p.mesh) if p.mesh is not None else contextlib.nullcontext():
                done.append((p.fn, p.traced.lower(lowering_platforms=(platform,))))
    except Exception as err:  # noqa: BLE001 - a head start only: compile_ahead lowers instead
        log.warning("lower_ahead(%s) failed (%s: %s); the step is lowered beside the restore", names,
                    type(err).__name__, err)
        done = []
    finally:
        import jax.extend.backend

        jax.extend.backend.clear_backends()  # the process joins the job with no backend (jax.distributed)
        jax.config.update("jax_platforms", previous)
    with _lock:
        for fn, lowered in done:
            _lowered[id(fn)] = (fn, lowered)
    if done:
        log.info("lowered %s ahead in %.2fs, before touching a device (the backend it made is cleared)", names,
                 time.perf_counter() - t)
    return len(done)


def take(fn: Any) -> Any:
    """The module :func:`lower_ahead` lowered for ``fn`` (this object, not an equal one), once; None otherwise."""
    with _lock:
        entry = _lowered.pop(id(fn), None)
    return entry[1] if entry is not None and entry[0] is fn else None


def _spec_of(sharding: Any) -> tuple[Any, ...] | None:
    """``(spec, mesh axis names, mesh axis sizes)`` of a named sharding, concrete or abstract; None otherwise."""
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is None or spec is None:
        return None
    return tuple(spec), tuple(mesh.axis_names), tuple(mesh.axis_sizes)


def mismatch(lowered: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why the module lowered ahead is not the one ``args``/``kwargs`` would lower to (their tree, shapes, dtypes,
    shardings' specs and mesh shape), or None when it is."""
    import jax

    leaves, tree = jax.tree.flatten((args, kwargs))
    if tree != lowered.in_tree:
        return f"the arguments' structure differs ({tree} against {lowered.in_tree})"
    infos = jax.tree.leaves(lowered.args_info)
    shardings = lowered._lowering.compile_args["in_shardings"]  # private: no public view of them
    for i, (leaf, info, sharding) in enumerate(zip(leaves, infos, shardings, strict=True)):
        if tuple(leaf.shape) != tuple(info.shape) or leaf.dtype != info.dtype:
            return f"argument {i}: {leaf.dtype}{list(leaf.shape)} against {info.dtype}{list(info.shape)} lowered"
        got, want = _spec_of(getattr(leaf, "sharding", None)), _spec_of(sharding)
        if got is None or got != want:
            return f"argument {i}: sharding {got} against {want} lowered"
    return None


def devices_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The concrete mesh's devices of the arguments' shardings (the program's device assignment), None when they
    name no concrete mesh or more than one."""
    import jax

    meshes = {id(m): m for leaf in jax.tree.leaves((args, kwargs))
              if (m := getattr(getattr(leaf, "sharding", None), "mesh", None)) is not None
              and getattr(m, "devices", None) is not None}
    if len(meshes) != 1:
        return None
    return tuple(next(iter(meshes.values())).devices.flat)


def compile_lowered(lowered: Any, devices: tuple[Any, ...]) -> Any:
    """``lowered.compile`` for ``devices`` on this process's current backend (the one the lowering made is gone)."""
    from jax._src import xla_bridge

    args = lowered._lowering.compile_args  # private: the lowering's backend is cleared
    args["backend"] = xla_bridge.get_backend(devices[0].platform)
    return lowered.compile(device_assignment=devices)


class AheadStep:
    """What ``Job.compile_ahead`` returns for a step lowered ahead: calls the compiled program once it is compiled,
    else the jitted function; when the program refuses its arguments (another shape or sharding: it raises before
    it runs, nothing donated) the jitted function for good, logged once."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.name = fn, fn_name(fn)
        self.compiled: Any = None  # set by CompileAhead once compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled = self.compiled
        if compiled is None:
            return self.fn(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except (TypeError, ValueError) as err:
            self.compiled = None
            log.warning("compile_ahead(%s): the program compiled ahead refused the step's arguments (%s); calling "
                        "the jitted function from here (it compiles for them)", self.name, err)
            return self.fn(*args, **kwargs)
