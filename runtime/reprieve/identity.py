"""Which run a checkpoint belongs to, and whether this program may resume it (pure).

Every checkpoint the job writes records its run's identity in its ``reprieve`` record: ``{"id": REPRIEVE_RUN_ID or
null, "tree": <digest of the state's structure>, "leaves": <count>}``. The structure is the state's leaf paths
with their shapes (a 0-d array and a Python scalar alike; dtypes are left out, a restore may cast). Before
``Job.restore_or`` reads a checkpoint's arrays it compares: another run id, or a state of another structure, is
refused with :class:`RunMismatchError` saying what differs, instead of resuming a run that is not this one (a
second run with another seed in the same directory) or failing deep in the restore. A checkpoint without the
record (written by an older runtime) is resumed as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

Structure = list[tuple[str, tuple[int, ...] | None]]  # (leaf path, shape; None for a Python scalar or a 0-d leaf)

SHOWN = 6  # differing leaves named in an error


class RunMismatchError(ValueError):
    """The checkpoint belongs to another run (its run id or its state's structure differs)."""


def structure(tree: Any) -> Structure:
    """The leaf paths and shapes of ``tree`` (arrays, ``jax.ShapeDtypeStruct``, numpy, Python scalars)."""
    import jax

    out: Structure = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = getattr(leaf, "shape", None)
        out.append((jax.tree_util.keystr(path), tuple(int(d) for d in shape) if shape else None))
    return out


def digest(lines: Structure) -> str:
    text = "\n".join(f"{p} {'' if s is None else list(s)}" for p, s in sorted(lines))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record(run_id: str | None, lines: Structure) -> dict[str, Any]:
    """The ``run`` entry of a checkpoint's ``reprieve`` record."""
    return {"id": run_id, "tree": digest(lines), "leaves": len(lines)}


def difference(saved: Structure, ours: Structure) -> str:
    """What differs between two structures, in words (the first :data:`SHOWN` of each kind)."""
    a, b = dict(saved), dict(ours)
    only_saved = sorted(set(a) - set(b))
    only_ours = sorted(set(b) - set(a))
    shapes = [f"{p}: {_shape(a[p])} in the checkpoint, {_shape(b[p])} here" for p in sorted(set(a) & set(b))
              if a[p] != b[p]]
    parts = []
    if only_saved:
        parts.append(f"{len(only_saved)} leaves only in the checkpoint ({', '.join(only_saved[:SHOWN])}"
                     f"{', ...' if len(only_saved) > SHOWN else ''})")
    if only_ours:
        parts.append(f"{len(only_ours)} leaves only in this program's state ({', '.join(only_ours[:SHOWN])}"
                     f"{', ...' if len(only_ours) > SHOWN else ''})")
    if shapes:
        parts.append(f"{len(shapes)} leaves of another shape ({'; '.join(shapes[:SHOWN])}"
                     f"{'; ...' if len(shapes) > SHOWN else ''})")
    return "; ".join(parts) or "the same leaves in another tree structure"


def _shape(shape: tuple[int, ...] | None) -> str:
    return "a scalar" if shape is None else str(list(shape))


def mismatch(saved: Any, run_id: str | None, ours: Structure, saved_structure: Sequence[tuple[str, Any]] | None,
             where: str) -> str | None:
    """Why the checkpoint at ``where`` is not this run's, or None.

    Args:
        saved: the checkpoint's ``run`` record (None: written by an older runtime: nothing to compare).
        run_id: this run's ``REPRIEVE_RUN_ID`` (None when unset).
        ours: the structure of the state this program restores onto.
        saved_structure: the checkpoint's own leaves when its format lists them (the default format does), to
            say which leaves differ; None: only the digests are compared.
    """
    if not isinstance(saved, dict):
        return None
    theirs = saved.get("id")
    if theirs != run_id:
        whose = f"run {theirs!r}" if theirs is not None else "a run with no REPRIEVE_RUN_ID"
        here = f"this is run {run_id!r} (REPRIEVE_RUN_ID)" if run_id is not None else "this run has no REPRIEVE_RUN_ID"
        resume = f"set REPRIEVE_RUN_ID={theirs}" if theirs is not None else "unset REPRIEVE_RUN_ID"
        return (f"checkpoint {where} belongs to {whose}, and {here}: a new run needs its own "
                f"REPRIEVE_CHECKPOINT_URI; to resume that run, {resume}")
    if saved.get("tree") in (None, digest(ours)):
        return None
    if saved_structure is not None:
        lines: Structure = [(p, None if not s else tuple(s)) for p, s in saved_structure]
        what = difference(lines, ours)
    else:
        what = f"structure digest {saved.get('tree')} in the checkpoint, {digest(ours)} here"
    return (f"checkpoint {where} holds a state of another structure than this program's ({what}): it is another "
            "run's (use another REPRIEVE_CHECKPOINT_URI) or the model changed since it was saved")


def past_total(start: int, total: int | None) -> str | None:
    """Why ``Job.steps(start, total)`` cannot run (pure): the restored checkpoint is past the last step."""
    if total is None or start <= total:
        return None
    return (f"the checkpoint is past total steps: it holds step {start - 1} and this run has total={total} (steps 0 "
            f"to {total - 1}); it is another run's (use another REPRIEVE_CHECKPOINT_URI or REPRIEVE_RUN_ID), or "
            "raise the total to train on")


def resuming(step: int, record: Any) -> str:
    """The end of a restore's line: ``resuming at step N (saved by attempt A of run R)``."""
    record = record if isinstance(record, dict) else {}
    run = record.get("run")
    run_id = run.get("id") if isinstance(run, dict) else None
    return (f"resuming at step {step + 1} (saved by attempt {record.get('attempt', '?')}"
            f"{'' if run_id is None else f' of run {run_id!r}'})")
