"""The training step over virtual shards: the loss and gradient as the sum over every virtual shard of the job.

    step = reprieve.VirtualStep(loss_fn, shards=8, canonical=True)
    loss, grads = step(params, next(data))    # data: reprieve.VirtualData(8, step.shards, open_shard)

Each device owns a contiguous block of the shards (:func:`reprieve.virtual.owned`) and computes every shard's
``jax.value_and_grad(loss_fn)(params, batch)`` on its own, with one compiled function whatever the device count,
so a shard's gradient is bitwise the same on any size. The sum over shards is then:

* default: each device adds its shards in order, then one ``psum`` over the devices (an all-reduce of one
  gradient). Another device count adds the same terms in another association: the result differs from the full
  size's by rounding, at most ``2 * (count - 1) * u * sum(|g_v|)`` per element (each order is within half that
  of the exact sum; ``u`` the dtype's unit roundoff).
* ``canonical=True``: every device all-gathers every shard's gradient and adds them in the order ``0 .. count-1``,
  so the result is bitwise the same on every device count that divides ``count``. It holds ``count`` gradients per
  device during the step (``count / devices`` + ``count`` instead of 2), and moves ``count - count/devices``
  gradients per device instead of an all-reduce's ~2.

The parameters must be replicated on every device (:meth:`VirtualStep.replicate`); the result is replicated too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .per_process import local_copies
from .virtual import VirtualShardsError, note_step, owned

AXIS = "virtual_shards"


def _ordered_sum(stacked: Any) -> Any:
    """Inside ``shard_map``: every shard's (loss, gradient), gathered, added in shard order (no reassociation:
    the same additions in the same order on any device count)."""
    def chain(local: jax.Array) -> jax.Array:
        every = jax.lax.all_gather(local, AXIS, tiled=True)
        total = every[0]
        for v in range(1, every.shape[0]):
            total = total + every[v]
        return total
    return jax.tree.map(chain, stacked)


def _device_sum(stacked: Any) -> Any:
    """Inside ``shard_map``: every device's own sum of its shards, all-reduced."""
    return jax.tree.map(lambda local: jax.lax.psum(local[0], AXIS), stacked)


def _stack(*trees: Any) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _add(a: Any, b: Any) -> Any:
    return jax.tree.map(jnp.add, a, b)


class VirtualStep:
    """``step(params, batches) -> (loss, grads)``: the sums over all ``count`` virtual shards of the job.

    Args:
        loss_fn: ``loss_fn(params, batch) -> scalar`` for one shard's batch (its share of the global batch;
            for a mean over the global batch, divide by ``count`` inside it); with ``with_shard_index``,
            ``loss_fn(params, batch, shard)``.
        count: the number of virtual shards, fixed for the run (the job's full size, or a multiple of it); a
            multiple of the device count.
        canonical: add the shards in the fixed order ``0 .. count-1`` (bitwise the same on every size); the
            default adds per device, then across devices (faster, equal to rounding).
        devices: the devices, in mesh order (default ``jax.devices()``: every process's, process by process).
        with_shard_index: pass the shard's index to ``loss_fn`` as a traced ``uint32`` scalar (one compiled
            program for every shard), e.g. to fold into a dropout key, so that a shard draws the same randomness
            on any device count (a device's index would change it).

    Raises:
        VirtualShardsError: ``count`` does not split evenly over the devices, or this process's devices do not
            own one contiguous block of shards.
    """

    def __init__(self, loss_fn: Callable[..., Any], count: int, *, canonical: bool = False,
                 devices: Sequence[Any] | None = None, with_shard_index: bool = False) -> None:
        devices = list(jax.devices() if devices is None else devices)
        self.count, self.canonical, self.with_shard_index = count, canonical, with_shard_index
        self.mesh = Mesh(np.array(devices), (AXIS,))
        me = jax.process_index()
        self._blocks = [(owned(count, len(devices), i), d) for i, d in enumerate(devices) if d.process_index == me]
        if not self._blocks:
            raise VirtualShardsError(f"VirtualStep: none of the {len(devices)} devices given is process {me}'s")
        first, last = self._blocks[0][0], self._blocks[-1][0]
        self.shards = range(first.start, last.stop)
        expected = owned(count, jax.process_count(), me)
        if self.shards != expected or sum(len(b) for b, _ in self._blocks) != len(expected):
            raise VirtualShardsError(
                f"VirtualStep: process {me} of {jax.process_count()} should own virtual shards {expected} of {count}, "
                f"and its devices own {[list(b) for b, _ in self._blocks]} (every process needs the same number of "
                "devices, in process order)")
        self._value_and_grad = jax.jit(jax.value_and_grad(loss_fn))
        self._add, self._stack = jax.jit(_add), jax.jit(_stack)
        self._reduce = jax.jit(jax.shard_map(_ordered_sum if canonical else _device_sum, mesh=self.mesh,
                                             in_specs=PartitionSpec(AXIS), out_specs=PartitionSpec(),
                                             # the gathered sum is the same on every device, which JAX's check
                                             # cannot see through all_gather (psum it can)
                                             check_vma=not canonical))

    @property
    def replicated(self) -> NamedSharding:
        """The sharding of the parameters and of the step's result: a full copy on every device."""
        return NamedSharding(self.mesh, PartitionSpec())

    def replicate(self, tree: Any) -> Any:
        """``tree``'s leaves (host values, the same on every process) as arrays replicated on every device."""
        return jax.tree.map(lambda leaf: jax.make_array_from_callback(
            np.shape(leaf), self.replicated, lambda _: np.asarray(leaf)), tree)

    def __call__(self, params: Any, batches: Sequence[Any]) -> tuple[Any, Any]:
        """``(loss, grads)`` summed over every virtual shard of the job; ``batches``: this process's shards' batches
        in shard order (``next(VirtualData)``). Every process calls it at every step (it has collectives)."""
        batches = list(batches)
        if len(batches) != len(self.shards):
            raise VirtualShardsError(f"VirtualStep: got {len(batches)} batches, and process {jax.process_index()} "
                                     f"owns virtual shards {list(self.shards)}: pass one batch per owned shard")
        note_step(self.count)
        per_device = []
        copies = local_copies(params, [device for _, device in self._blocks], who="VirtualStep: parameter",
                              fix=" (VirtualStep.replicate)", error=VirtualShardsError)
        for (block, device), local in zip(self._blocks, copies, strict=True):
            terms = [self._value_and_grad(local, jax.device_put(batches[v - self.shards.start], device),
                                          *self._shard_index(v, device)) for v in block]
            if self.canonical:
                per_device.append(self._stack(*terms))
            else:
                total = terms[0]
                for term in terms[1:]:
                    total = self._add(total, term)
                per_device.append(self._stack(total))
        leaves = [jax.tree.leaves(tree) for tree in per_device]
        treedef = jax.tree.structure(per_device[0])
        rows = self.count if self.canonical else len(self.mesh.devices.flat)
        sharded = NamedSharding(self.mesh, PartitionSpec(AXIS))
        stacked = [jax.make_array_from_single_device_arrays((rows, *parts[0].shape[1:]), sharded, parts)
                   for parts in zip(*leaves, strict=True)]
        loss, grads = self._reduce(jax.tree.unflatten(treedef, stacked))
        return loss, grads

    def _shard_index(self, shard: int, device: Any) -> tuple[jax.Array, ...]:
        return (jax.device_put(np.uint32(shard), device),) if self.with_shard_index else ()

