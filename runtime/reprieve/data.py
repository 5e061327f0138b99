"""Per-process data positions: what each process needs to resume its input pipeline (pure).

Every process of a job reads its own slice of the data (a grain ``DataLoader`` sharded by process keeps its
own position), so ``job.save(step, state, data=...)`` saves one value *per process* and
``job.restore_or(..., data=...)`` gives each process its own back. ``data`` is either an iterator with
``get_state()`` / ``set_state()`` (grain's ``DataLoader`` and dataset iterators; restored in place) or a
JSON value (a dict of counters, a bytes blob).

When the process count changed between save and restore, :func:`value_for_process` decides what a process gets:
the saved positions move only if they are one global position (every process saved the same value, as a
pipeline over global batches does) or if the user gives ``reshard_data``; otherwise it is an error that says so.
Positions of virtual shards (:class:`reprieve.virtual.VirtualData`, one per shard, each process saving its own
shards') are merged instead: every process gets every shard's position and takes the shards it owns now.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

_BYTES = "__reprieve_bytes__"
VIRTUAL = "__reprieve_virtual_shards__"  # a process's saved positions of its virtual shards (reprieve.virtual)


class DataPositionError(ValueError):
    """The saved data positions cannot be given to this process (see :func:`value_for_process`)."""


def to_json_value(value: Any, what: str) -> Any:
    """``value`` through a JSON round trip; a ``TypeError`` naming ``what`` and the key path that fails."""
    try:
        return json.loads(json.dumps(value, allow_nan=True))
    except (TypeError, ValueError) as err:
        raise TypeError(f"{what} must be JSON-serialisable: {_first_bad(value, '')} ({err})") from None


def _first_bad(value: Any, path: str) -> str:
    if isinstance(value, dict):
        for k, v in value.items():
            if k is not None and not isinstance(k, str | int | float | bool):
                return f"key {path}[{k!r}] is a {type(k).__name__}"
            if found := _first_bad(v, f"{path}[{k!r}]"):
                return found
        return ""
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if found := _first_bad(v, f"{path}[{i}]"):
                return found
        return ""
    if value is None or isinstance(value, str | int | float | bool):
        return ""
    return f"{path or 'the value'} is a {type(value).__name__}"


def encode(data: Any, what: str) -> Any:
    """The JSON value saved for ``data``: ``data.get_state()`` for an iterator, bytes as base64."""
    value = data.get_state() if hasattr(data, "get_state") and callable(data.get_state) else data
    if isinstance(value, bytes | bytearray):
        return {_BYTES: base64.b64encode(bytes(value)).decode()}
    return to_json_value(value, what)


def decode(value: Any) -> Any:
    """Inverse of :func:`encode` (without the iterator: the value its ``set_state`` takes)."""
    if isinstance(value, dict) and set(value) == {_BYTES}:
        return base64.b64decode(value[_BYTES])
    return value


def value_for_process(saved: list[Any] | None, process_index: int, process_count: int,
                      reshard: Callable[[list[Any], int, int], Any] | None = None) -> Any:
    """This process's data position out of every process's saved one (decoded); None when none was saved.

    Virtual shards (every process saved its shards' positions): every shard's position, for any process count.
    Same process count: the value process ``process_index`` saved. Another count: ``reshard(saved, index,
    count)`` if given, else the common value when every process saved the same one (a global position),
    else :class:`DataPositionError`.
    """
    if saved is None:
        return None
    values = [decode(v) for v in saved]
    if any(isinstance(v, dict) and VIRTUAL in v for v in values):
        return _merged_virtual(values)
    if len(values) == process_count:
        return values[process_index]
    if reshard is not None:
        return reshard(values, process_index, process_count)
    if all(v == values[0] for v in values):
        return values[0]
    differ = [p for p, v in enumerate(values) if v != values[0]]
    raise DataPositionError(
        f"the checkpoint holds the data positions of {len(values)} processes and this job has {process_count}; "
        f"they are per-process (process 0 and processes {differ} differ, e.g. a grain DataLoader sharded by "
        "process), so they cannot be moved to another process count. Pass restore_or(..., reshard_data=fn) "
        "or use a pipeline whose position is global (docs/runtime.md, \"Data position\")")


def _virtual_count(values: list[Any]) -> int:
    """The virtual shard count every process saved; DataPositionError when they differ or one saved another kind."""
    counts = {v[VIRTUAL].get("count") if isinstance(v, dict) and isinstance(v.get(VIRTUAL), dict) else None
              for v in values}
    count = next(iter(counts)) if len(counts) == 1 else None
    if not isinstance(count, int):
        kinds = ["virtual shards" if isinstance(v, dict) and VIRTUAL in v else type(v).__name__ for v in values]
        raise DataPositionError(f"the checkpoint's data positions mix virtual shards with other values or shard "
                                f"counts (per process: {kinds}, counts {sorted(map(str, counts))}); every "
                                "process must save a reprieve.virtual.VirtualData of the same count")
    return count


def _merged_virtual(values: list[Any]) -> dict[str, Any]:
    """Every virtual shard's saved position out of the processes' values (each shard saved exactly once), in the
    saved form of one process that owned them all."""
    count = _virtual_count(values)
    found: dict[str, tuple[int, Any]] = {}  # shard -> (the process that saved it, its position)
    for process, value in enumerate(values):
        for key, position in value[VIRTUAL].get("positions", {}).items():
            if key in found:
                raise DataPositionError(f"virtual shard {key}'s data position was saved by two processes "
                                        f"({found[key][0]} and {process})")
            found[key] = (process, position)
    missing = [v for v in range(count) if str(v) not in found]
    if missing:
        raise DataPositionError(f"the checkpoint has no data position for virtual shards {missing} of {count}")
    positions = {key: position for key, (_, position) in sorted(found.items(), key=lambda kv: int(kv[0]))}
    return {VIRTUAL: {"count": count, "positions": positions}}


def restore_into(data: Any, value: Any) -> None:
    """Give ``value`` back to an iterator (``set_state``); a plain value needs nothing."""
    if value is not None and hasattr(data, "set_state") and callable(data.set_state):
        data.set_state(value)
