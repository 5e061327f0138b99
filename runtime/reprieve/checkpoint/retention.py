"""Which checkpoints, and which quarantined copies, retention deletes (pure).

Quarantined copies (``<name>.corrupt`` directories, or on object stores the ``corrupt/<name>-<ms>.json`` records
whose data is already gone) are evidence for a person to look at, not checkpoints: retention keeps the ``keep``
newest of them (by step, then by when they were quarantined) and deletes the older ones, so a job that keeps
finding damage does not fill its storage with full-size copies.
"""

from __future__ import annotations

from collections.abc import Sequence

from .layout import CheckpointName


def select_deletions(
    visible: Sequence[CheckpointName],
    invisible: Sequence[CheckpointName],
    *,
    keep: int,
    keep_every: int | None = None,
) -> list[CheckpointName]:
    """Checkpoints to delete, given the visible (complete, unfenced) and invisible committed ones.

    Keeps the ``keep`` newest visible checkpoints, and every visible checkpoint whose step is a
    multiple of ``keep_every``. Committed checkpoints that fencing made invisible are garbage and are
    always deleted.
    """
    if keep < 1:
        raise ValueError(f"retention keep must be >= 1, got {keep}")
    if keep_every is not None and keep_every < 1:
        raise ValueError(f"retention keep_every must be >= 1 or None, got {keep_every}")
    ordered = sorted(visible, key=lambda c: (c.step, c.attempt))
    newest = set(ordered[-keep:])
    doomed = [
        c for c in ordered if c not in newest and not (keep_every is not None and c.step % keep_every == 0)
    ]
    return doomed + sorted(invisible, key=lambda c: (c.step, c.attempt))


Quarantined = tuple[int, int, int, str]  # (step, attempt, order among copies of one name, what to delete)


def select_quarantined(quarantined: Sequence[Quarantined], *, keep: int) -> list[str]:
    """The quarantined copies to delete: all but the ``keep`` newest (by step, attempt, then order)."""
    if keep < 1:
        raise ValueError(f"retention keep must be >= 1, got {keep}")
    ordered = sorted(quarantined)
    return [q[3] for q in ordered[:-keep]]


def select_abandoned(entries: Sequence[CheckpointName], *, attempt: int,
                     committed_step: int | None) -> list[CheckpointName]:
    """What else retention deletes once attempt ``attempt`` committed ``committed_step`` (pure): interrupted
    deletions, unfinished (``tmp``) checkpoints of older attempts (fenced out: they can never commit), and this
    attempt's of earlier steps (a failed save whose unfinished directory process 0 could not remove, e.g. on a
    storage that was read-only then). Never one of a later step (that save may be writing now) nor of a newer
    attempt. ``committed_step`` None (a pass after a failed save, before this attempt committed anything): none of
    this attempt's."""
    return sorted((e for e in entries if e.state == "deleting" or (e.state == "tmp" and (
        e.attempt < attempt or (committed_step is not None and e.attempt == attempt and e.step < committed_step)))),
                  key=lambda c: (c.step, c.attempt))
