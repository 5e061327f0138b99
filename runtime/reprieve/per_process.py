"""A function of replicated arrays run by each process on its own devices, its results replicated on the mesh.

    update = reprieve.PerProcess(update_fn, step.mesh)     # step: a reprieve.VirtualStep
    params, opt_state = update(params, opt_state, grads)   # replicated on step.mesh in, and out

``jax.jit`` over arrays replicated on a mesh compiles one program for the whole mesh: the program, and so the
persistent compilation cache's key, depends on the number of processes. A job that shrinks then runs a program it
never compiled, on the restart's critical path (issue #47: 5.3 s of a cold compile of the example LM's optimizer
update for 3 processes). :class:`PerProcess` runs ``jax.jit(fn)`` over this process's devices only (a program for
one device, or a mesh of the process's devices), on each device's own copy of the arguments, and assembles the
results into arrays replicated on the whole mesh (``jax.make_array_from_single_device_arrays``). Its program does
not depend on the process count, so a shrunk or grown job finds it in the persistent cache (on CPU, whose keys name
the devices, process ``i`` finds what process ``i`` wrote at the job's first start). Every process runs the same
program on the same inputs (processes have the same number of devices), so every process of every size computes
the same bits; nothing crosses processes.

It suits what each device computes on its own from replicated values: an optimizer update after the gradient's
reduction, a ravel of the parameters. A function that needs a collective across processes, or sharded arguments,
is not this. The price is host time per array each call (the copies taken apart and put together again, ~10-50 us
an array): ravel a state of many small arrays, as ``examples/train_lm.py`` does, where that matters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding


class PerProcessError(ValueError):
    """An argument :class:`PerProcess` cannot hand to this process's devices (the message names its path)."""


def local_copies(tree: Any, devices: Sequence[Any], *, who: str, fix: str = "",
                 error: Callable[[str], Exception] = PerProcessError) -> list[Any]:
    """``tree`` once per device of ``devices`` (this process's), each leaf that device's full copy as an array of
    that device alone (``SingleDeviceSharding``: no mesh in its type, so a program traced from it is the same on
    any mesh); host values are copied to each device. ``who`` starts the error's message (``"VirtualStep:
    parameter"``), ``fix`` ends it, ``error`` makes it.

    Raises:
        ``error(...)``: a leaf is sharded, or has no copy on one of ``devices``.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    columns = [_copies(path, leaf, devices, who, fix, error) for path, leaf in leaves]
    return [jax.tree_util.tree_unflatten(treedef, [column[i] for column in columns]) for i in range(len(devices))]


def _copies(path: Any, leaf: Any, devices: Sequence[Any], who: str, fix: str,
            error: Callable[[str], Exception]) -> list[Any]:
    if not isinstance(leaf, jax.Array):
        return [jax.device_put(leaf, device) for device in devices]
    if not leaf.is_fully_replicated:
        raise error(f"{who} {jax.tree_util.keystr(path)} is sharded ({leaf.sharding}); it must be replicated "
                    f"on every device{fix}")
    if leaf.sharding.num_devices == 1:  # its only shard would be the array itself, its type naming the mesh
        only, (home,) = leaf.addressable_data(0), leaf.devices()
        return [only if device == home else jax.device_put(only, device) for device in devices]
    held = {shard.device: shard.data for shard in leaf.addressable_shards}
    missing = [device for device in devices if device not in held]
    if missing and not leaf.is_fully_addressable:
        raise error(f"{who} {jax.tree_util.keystr(path)} has no copy on {missing[0]}")
    return [held[device] if device in held else jax.device_put(leaf, device) for device in devices]


class PerProcess:
    """``fn`` over arrays replicated on ``mesh``, compiled for this process's devices of it only.

    Args:
        fn: a pure function of pytrees of arrays, with no collective across processes; what it returns is
            replicated on ``mesh``.
        mesh: the mesh the arguments are replicated on and the results will be (``VirtualStep.mesh``).

    ``__call__`` takes arrays replicated on ``mesh`` (host values are copied to each device); :meth:`lower` takes
    ``jax.ShapeDtypeStruct`` instead (any sharding), for ``Job.compile_ahead``.

    Raises:
        PerProcessError: ``mesh`` has no device of this process; at a call, an argument is sharded.
    """

    def __init__(self, fn: Callable[..., Any], mesh: Mesh) -> None:
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)  # Job.compile_ahead's log names it
        self.replicated = NamedSharding(mesh, PartitionSpec())
        me = jax.process_index()
        self.devices: list[Any] = [d for d in mesh.devices.flat if d.process_index == me]
        if not self.devices:
            raise PerProcessError(f"PerProcess({self.__name__}): none of the mesh's {mesh.devices.size} devices is "
                                  f"process {me}'s")
        # one device: a single-device program, as each shard's gradient in VirtualStep; several: one program over
        # a mesh of them (compiled once, not once a device)
        self.local: Sharding = (SingleDeviceSharding(self.devices[0]) if len(self.devices) == 1 else
                                NamedSharding(Mesh(np.array(self.devices), ("local",)), PartitionSpec()))
        self._jit = jax.jit(fn, out_shardings=self.local)

    def __call__(self, *args: Any) -> Any:
        copies = local_copies(args, self.devices, who=f"PerProcess({self.__name__}): argument")
        if len(self.devices) == 1:
            local = copies[0]
        else:
            local = jax.tree.map(lambda *parts: jax.make_array_from_single_device_arrays(
                parts[0].shape, self.local, list(parts)), *copies)
        return jax.tree.map(self._replicate, self._jit(*local))

    def _replicate(self, out: jax.Array) -> jax.Array:
        parts = [out] if len(self.devices) == 1 else [shard.data for shard in out.addressable_shards]
        return jax.make_array_from_single_device_arrays(out.shape, self.replicated, parts)

    def lower(self, *args: Any) -> Any:
        """``fn`` lowered for this process's devices and arguments shaped like ``args`` (arrays or
        ``jax.ShapeDtypeStruct``): ``.compile()`` it, and the first call finds the program in JAX's caches."""
        return self._jit.lower(*jax.tree.map(lambda a: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=self.local, weak_type=getattr(a, "weak_type", False)), args))
