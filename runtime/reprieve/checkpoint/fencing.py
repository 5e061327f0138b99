"""Fencing by attempt: which committed checkpoints are visible (pure).

Every attempt ``A`` writes, before it restores or saves anything, a fence file
``attempts/attempt_<A>.json`` holding the names of the checkpoints visible at that moment (its
snapshot). The rule readers apply:

    a checkpoint committed by attempt ``a`` is visible iff there is no fence newer than ``a``,
    or its name is in the snapshot of the *first* fence newer than ``a``.

So once attempt ``A' > a`` has written its fence, nothing attempt ``a`` commits afterwards can ever
become visible: the rename (or commit marker) of a stale writer produces a checkpoint that is not in
the snapshot. The race between the stale commit and the listing is harmless: the listing either sees
the finished rename (the checkpoint was complete before ``A'`` started: visible) or it does not
(invisible forever). No clocks, no locks, no compare-and-swap are needed; the fence file is written
once and never changed. Writers also check for a newer fence before committing (to fail fast with
:class:`FencedError`), but correctness does not depend on that check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .layout import CheckpointName


class FencedError(RuntimeError):
    """A newer attempt has started; this (older) attempt may no longer commit checkpoints."""


def newer_fences(fences: Iterable[int], attempt: int) -> list[int]:
    return sorted(a for a in fences if a > attempt)


def visible(committed: Iterable[CheckpointName], fences: Mapping[int, frozenset[str]]) -> list[CheckpointName]:
    """The committed checkpoints readers may use, oldest step first (ties: newer attempt last)."""
    out = [c for c in committed if c.state == "committed" and is_visible(c.committed, c.attempt, fences)]
    return sorted(out, key=lambda c: (c.step, c.attempt))


def is_visible(name: str, attempt: int, fences: Mapping[int, frozenset[str]]) -> bool:
    """The rule above for one checkpoint ``name`` committed by ``attempt`` (also ``reprieve.orbax``'s step names)."""
    later = newer_fences(fences, attempt)
    return not later or name in fences[later[0]]


def latest(committed: Iterable[CheckpointName], fences: Mapping[int, frozenset[str]]) -> CheckpointName | None:
    v = visible(committed, fences)
    return v[-1] if v else None
