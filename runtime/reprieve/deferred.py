"""``DeferredState``: a state :meth:`reprieve.Job.save` builds only when it saves.

A loop that holds its state as one tree hands it to ``job.save`` every step for nothing: the decision reads the
step, not the state. A caller that has to *assemble* the tree (``reprieve.keras``: a ``{group: {path: array}}`` dict
of every Keras variable, rebuilt from ``fit``'s state lists after each batch) would pay that per step, in proportion
to the number of variables (57 µs a batch at 1000 variables on this VM). Handed a :class:`DeferredState`, ``job.save``
calls ``build()`` only when the step is saved (or checked, at the first call); ``FinishedSteps.note`` calls
``probe()`` at every step of a job of several processes (:mod:`reprieve.finished`: it looks at one leaf).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DeferredState:
    """The state of the step being saved, built on demand.

    Attributes:
        build: returns the whole state (the tree a save writes); called at most once per ``job.save``.
        probe: returns a small tree holding one leaf of the step's output at the key path it has in ``build()``'s
            tree (what :class:`reprieve.finished.FinishedSteps` looks at: any leaf, as a step's outputs are computed
            together); called every step of a job of several processes, so it must cost a few lookups.
    """

    build: Callable[[], Any]
    probe: Callable[[], Any]


def built(state: Any) -> Any:
    """``state`` itself, or the tree a :class:`DeferredState` builds."""
    return state.build() if type(state) is DeferredState else state
