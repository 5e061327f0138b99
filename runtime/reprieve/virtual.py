"""Virtual data-parallel shards: which process owns which shard, and every shard's own data position (pure).

A job that may shrink and grow keeps its maths by splitting its data into ``count`` *virtual* shards, fixed at the
job's full size: shard ``v`` always reads the same examples in the same order, whatever the number of processes.
Processes own contiguous blocks of shards (:func:`owned`); every shard keeps its own position
(:class:`VirtualData`), saved with the checkpoint per shard, so a restore onto another process count hands each
process the positions of the shards it owns now. The step over them is :mod:`reprieve.virtual_step`.

Nothing here imports JAX: the layout and the positions are decisions over integers and JSON values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from . import data as data_mod


class VirtualShardsError(ValueError):
    """A virtual-shard layout, position or step that does not fit the job (the message names the numbers)."""


def owned(count: int, members: int, index: int) -> range:
    """The virtual shards member ``index`` of ``members`` owns: the ``index``-th of ``members`` equal contiguous
    blocks of ``range(count)``. Every shard has one owner, and a shard stays with the member whose block holds it
    for every member count (shard ``v`` is on member ``v * members // count``).

    Raises:
        VirtualShardsError: ``count`` is not a multiple of ``members`` (an uneven split would give members
            different amounts of work per step, and the step's global array could not be split evenly), or an
            argument is out of range.
    """
    if count < 1 or members < 1:
        raise VirtualShardsError(f"virtual shards: need count >= 1 and members >= 1, got count={count}, "
                                 f"members={members}")
    if not 0 <= index < members:
        raise VirtualShardsError(f"virtual shards: member index {index} is not in 0..{members - 1}")
    if count % members:
        raise VirtualShardsError(
            f"virtual shards: {count} shards cannot be split evenly over {members} processes/devices; the shard "
            f"count must be a multiple of every size the job may run on (sizes {list(sizes(count))} divide "
            f"{count}; e.g. {math.lcm(*range(1, members + 1))} shards allow every size from 1 to {members})")
    per = count // members
    return range(index * per, (index + 1) * per)


def sizes(count: int) -> tuple[int, ...]:
    """Every process (or device) count ``count`` virtual shards can be spread over: its divisors."""
    return tuple(m for m in range(1, count + 1) if count % m == 0)


class VirtualData:
    """This process's owned virtual shards, each with its own iterator and position.

    ``open_shard(v)`` returns shard ``v``'s iterator (the same examples in the same order whatever the process
    count: e.g. a grain ``DataLoader`` with ``ShardOptions(shard_index=v, shard_count=count)``, not sharded by
    process). Pass the object as ``data=`` to ``job.save`` and ``job.restore_or``: :meth:`get_state` saves the
    position of every owned shard, and :meth:`set_state` takes this process's shards out of every shard's saved
    position, so the positions follow the shards onto another process count.
    """

    def __init__(self, count: int, shards: range, open_shard: Callable[[int], Iterator[Any]]) -> None:
        if shards.step != 1 or not (0 <= shards.start <= shards.stop <= count) or not shards:
            raise VirtualShardsError(f"VirtualData: shards {shards} is not a non-empty block of range({count})")
        self.count, self.shards = count, shards
        self.iterators = {v: open_shard(v) for v in shards}

    def __next__(self) -> list[Any]:
        """One batch per owned shard, in shard order (what :class:`reprieve.virtual_step.VirtualStep` takes)."""
        return [next(self.iterators[v]) for v in self.shards]

    def __iter__(self) -> VirtualData:
        return self

    def get_state(self) -> dict[str, Any]:
        """The saved form: ``{VIRTUAL: {"count": count, "positions": {"<shard>": position, ...}}}`` (this
        process's shards only; each position as :func:`reprieve.data.encode` makes it)."""
        positions = {str(v): data_mod.encode(it, f"virtual shard {v}'s data position")
                     for v, it in self.iterators.items()}
        return {data_mod.VIRTUAL: {"count": self.count, "positions": positions}}

    def set_state(self, state: Any) -> None:
        """Put every owned shard back where ``state`` (one or more processes' saved forms merged by
        :func:`reprieve.data.value_for_process`) says it was."""
        body = state.get(data_mod.VIRTUAL) if isinstance(state, dict) else None
        if not isinstance(body, dict):
            raise VirtualShardsError(
                "VirtualData.set_state: the checkpoint's data position is not a virtual-shard position (it was "
                "saved by a pipeline without virtual shards); start such a run afresh or restore without "
                "VirtualData")
        if body.get("count") != self.count:
            raise VirtualShardsError(f"VirtualData.set_state: the checkpoint has {body.get('count')} virtual shards "
                                     f"and this job {self.count}; the shard count is fixed for a run")
        positions = body.get("positions", {})
        for v, it in self.iterators.items():
            if str(v) not in positions:
                raise VirtualShardsError(f"VirtualData.set_state: no saved position for shard {v}")
            data_mod.restore_into(it, data_mod.decode(positions[str(v)]))


# -- the guard: a job that declares virtual shards must step through them ---------------------------------------

_steps_by_count: dict[int, int] = {}  # shard count -> steps this process ran through reprieve.virtual_step


def note_step(count: int) -> None:
    """Record one step computed over ``count`` virtual shards (called by :mod:`reprieve.virtual_step`)."""
    _steps_by_count[count] = _steps_by_count.get(count, 0) + 1


def usage_problem(declared: int | None, steps_by_count: dict[int, int]) -> str | None:
    """Why a job that declared ``declared`` virtual shards may not change its size with the steps it ran, or
    None. Nothing declared: nothing to check."""
    if declared is None:
        return None
    if declared not in steps_by_count:
        other = "" if not steps_by_count else f" (its steps used {sorted(steps_by_count)} virtual shards)"
        return (f"the job declares {declared} virtual shards but its training step never went through "
                f"reprieve.VirtualStep with {declared} shards{other}: on another process count its global batch "
                "would silently change. Write the step with reprieve.VirtualStep (docs/elastic.md)")
    return None


def require_virtual_step(declared: int | None, steps_by_count: dict[int, int] | None = None) -> None:
    """Raise :class:`VirtualShardsError` when the job declared virtual shards and no step of this process went
    through :class:`reprieve.virtual_step.VirtualStep` with that count; what the runtime calls before the job
    changes size (the first save, a shrink)."""
    record = dict(_steps_by_count if steps_by_count is None else steps_by_count)
    problem = usage_problem(declared, record)
    if problem:
        raise VirtualShardsError(problem)
