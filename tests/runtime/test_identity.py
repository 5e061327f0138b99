"""reprieve.identity: whether a checkpoint is this run's (table tests of the pure decisions)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reprieve.identity import difference, digest, mismatch, past_total, record, structure

pytestmark = pytest.mark.unit

W4 = [("['w']", (4,)), ("['n']", None)]


def test_structure_treats_a_0d_leaf_and_a_scalar_alike() -> None:
    assert sorted(structure({"w": jnp.zeros(4), "n": 3})) == sorted(W4)
    assert sorted(structure({"w": jax.ShapeDtypeStruct((4,), jnp.bfloat16), "n": jnp.zeros(())})) == sorted(W4)
    assert sorted(structure({"w": np.zeros(4), "n": np.float32(1)})) == sorted(W4)
    assert digest(W4) == digest(list(reversed(W4)))


# (saved run record, this run's id, our structure, the checkpoint's structure or None, expected words or None)
MISMATCH = [
    (None, "x", W4, None, None),  # an older runtime's checkpoint: nothing to compare
    (record(None, W4), None, W4, W4, None),
    (record("a", W4), "a", W4, None, None),
    (record("a", W4), "b", W4, W4, "belongs to run 'a', and this is run 'b' (REPRIEVE_RUN_ID)"),
    # it read "this is run (no REPRIEVE_RUN_ID) (REPRIEVE_RUN_ID)" and "set REPRIEVE_RUN_ID=(unset)" (issue 46)
    (record("a", W4), None, W4, W4, ("belongs to run 'a', and this run has no REPRIEVE_RUN_ID: a new run needs its "
                                    "own REPRIEVE_CHECKPOINT_URI; to resume that run, set REPRIEVE_RUN_ID=a")),
    (record(None, W4), "b", W4, W4, ("belongs to a run with no REPRIEVE_RUN_ID, and this is run 'b' (REPRIEVE_RUN_ID): "
                                    "a new run needs its own REPRIEVE_CHECKPOINT_URI; to resume that run, unset "
                                    "REPRIEVE_RUN_ID")),
    (record(None, W4), None, [("['w']", (8,)), ("['n']", None)], W4,
     "1 leaves of another shape (['w']: [4] in the checkpoint, [8] here)"),
    (record(None, W4), None, W4[:1], W4, "1 leaves only in the checkpoint (['n'])"),
    (record(None, W4), None, [*W4, ("['m']", (2,))], None, "structure digest"),  # no leaf list to compare
    ({"id": None}, None, W4, W4, None),  # no digest recorded
]


@pytest.mark.parametrize("saved,run_id,ours,theirs,words", MISMATCH)
def test_mismatch(saved: object, run_id: str | None, ours: list, theirs: list | None, words: str | None) -> None:
    problem = mismatch(saved, run_id, ours, theirs, "gs://b/run/step_0000000009_a1")
    if words is None:
        assert problem is None
    else:
        assert problem is not None and words in problem and "gs://b/run/step_0000000009_a1" in problem, problem


def test_difference_names_at_most_a_few_leaves_of_each_kind() -> None:
    saved = [(f"['l{i}']", (2,)) for i in range(10)]
    text = difference(saved, [])
    assert text.startswith("10 leaves only in the checkpoint (['l0'], ['l1']") and text.endswith(", ...)")


@pytest.mark.parametrize("start,total,words", [
    (0, 10, None), (10, 10, None), (5, None, None),
    (10, 5, "the checkpoint is past total steps: it holds step 9 and this run has total=5 (steps 0 to 4)"),
])
def test_past_total(start: int, total: int | None, words: str | None) -> None:
    got = past_total(start, total)
    assert got == words if words is None else (got is not None and words in got)
