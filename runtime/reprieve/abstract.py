"""Restore targets: the abstract state ``restore_or`` restores onto, and what can be wrong with one (pure)."""

from __future__ import annotations

from typing import Any, cast

RECIPE = "docs/runtime.md, \"flax NNX\""


def abstract_of(state: Any) -> Any:
    """``jax.ShapeDtypeStruct`` leaves (with shardings) for restore targets; numpy arrays and other leaves
    unchanged (a numpy leaf is restored as numpy, on the host: it has no sharding to give)."""
    import jax
    import numpy as np

    def leaf(x: Any) -> Any:
        if isinstance(x, np.ndarray | np.generic):
            return x
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
        return x

    return jax.tree.map(leaf, state)


def abstract_problem(abstract: Any, built: Any = None) -> str | None:
    """What is wrong with a user-given abstract state, or None. Pure: a table test covers it.

    ``abstract`` and ``built`` are trees as :func:`abstract_of` makes them (``ShapeDtypeStruct`` for arrays).
    Every array leaf of ``abstract`` needs a concrete sharding (not one on an abstract mesh, which is what
    ``nnx.eval_shape`` under ``jax.set_mesh`` gives); with ``built`` (what ``init_fn()`` returned) the two must
    have one structure and the same shape and dtype per array leaf (numpy leaves included: they need no
    sharding and come back as numpy). A Python scalar in ``built`` matches a 0-d
    leaf (``jax.eval_shape`` makes one of it; it is saved and restored as a scalar). Checked on the first run
    too, so a wrong abstract state fails at once, not at the first restart.
    """
    import jax
    import numpy as np

    want, want_def = jax.tree_util.tree_flatten_with_path(abstract)
    for path, a in want:
        if isinstance(a, jax.ShapeDtypeStruct) and a.sharding is None:
            return (f"abstract leaf {jax.tree_util.keystr(path)} has no sharding; give "
                    "jax.ShapeDtypeStruct(shape, dtype, sharding=...) for every array (flax NNX: nnx.eval_shape "
                    f"leaves carry none; see {RECIPE})")
        if isinstance(a, jax.ShapeDtypeStruct) and isinstance(getattr(a.sharding, "mesh", None),
                                                              jax.sharding.AbstractMesh):
            return (f"abstract leaf {jax.tree_util.keystr(path)} has a sharding on an abstract mesh (no devices to "
                    f"restore onto); map concrete ones in, e.g. nnx.get_named_sharding(abstract, mesh) ({RECIPE})")
    if built is None:
        return None
    got, got_def = jax.tree_util.tree_flatten_with_path(built)
    if cast(Any, want_def) != got_def:  # PyTreeDef equality (the stubs do not declare it)
        return f"init_fn() returned a tree of another structure than abstract:\n  abstract: {want_def}\n" \
               f"  init_fn(): {got_def}"
    for (path, a), (_, b) in zip(want, got, strict=True):
        arrays = (jax.ShapeDtypeStruct, np.ndarray, np.generic)
        if not isinstance(a, arrays) or (isinstance(b, int | float | complex) and a.shape == ()):
            continue
        if not isinstance(b, arrays) or (a.shape, a.dtype) != (b.shape, b.dtype):
            described = f"{b.dtype}{list(b.shape)}" if isinstance(b, arrays) else repr(b)
            return (f"leaf {jax.tree_util.keystr(path)}: abstract says {a.dtype}{list(a.shape)}, "
                    f"init_fn() returned {described}")
    return None


def require(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(f"restore_or: {problem}")
