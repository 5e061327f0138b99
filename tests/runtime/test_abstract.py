"""reprieve.abstract.abstract_problem: what is wrong with a user-given abstract state (pure, a table).

The table names its leaves (:class:`Leaf`) and the test builds the ``jax.ShapeDtypeStruct``\\ s: a concrete
sharding needs a device, and building one in the parametrize list would start JAX's backend while pytest only
collects (for every run that collects tests/runtime)."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np
import pytest

pytestmark = pytest.mark.unit


class Leaf(NamedTuple):
    """An array leaf to build: ``sharding`` is "device" (concrete), "abstract" (on an AbstractMesh) or None."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    sharding: str | None = "device"


def _build(tree: Any) -> Any:
    import jax
    from jax.sharding import AbstractMesh, NamedSharding, SingleDeviceSharding
    from jax.sharding import PartitionSpec as P

    def leaf(x: Any) -> Any:
        if not isinstance(x, Leaf):
            return x
        sharding = {"device": lambda: SingleDeviceSharding(jax.devices("cpu")[0]),
                    "abstract": lambda: NamedSharding(AbstractMesh((1,), ("d",)), P()),
                    None: lambda: None}[x.sharding]()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(leaf, tree, is_leaf=lambda x: isinstance(x, Leaf))


@pytest.mark.parametrize(
    ("abstract", "built", "problem"),
    [
        ({"w": Leaf((2, 3))}, None, None),
        ({"w": Leaf((2, 3)), "n": 4}, None, None),  # non-array leaves need no sharding
        ({"w": Leaf((2, 3), sharding=None)}, None, r"abstract leaf \['w'\] has no sharding"),
        ({"a": [Leaf((1,)), Leaf((1,), sharding=None)]}, None, r"abstract leaf \['a'\]\[1\] has no sharding"),
        ({"w": Leaf((2, 3), sharding="abstract")}, None, r"abstract leaf \['w'\] has a sharding on an abstract mesh"),
        ({"w": Leaf((2, 3))}, {"w": Leaf((2, 3), sharding=None)}, None),  # built shardings do not matter
        ({"w": Leaf((2, 3))}, {"w": Leaf((3, 2))}, (r"leaf \['w'\]: abstract says float32\[2, 3\], init_fn\(\) "
                                                   r"returned float32\[3, 2\]")),
        ({"w": Leaf((2,))}, {"w": Leaf((2,), "bfloat16")}, (r"abstract says float32\[2\], init_fn\(\) returned "
                                                           r"bfloat16\[2\]")),
        ({"w": Leaf((2,))}, {"v": Leaf((2,))}, "another structure"),
        ({"w": Leaf((2,))}, {"w": Leaf((2,)), "n": 1}, "another structure"),
        ({"n": Leaf((), "int32")}, {"n": 7}, None),  # a Python scalar matches eval_shape's 0-d leaf
        ({"n": Leaf((), "float32")}, {"n": 0.5}, None),
        ({"n": Leaf((1,), "int32")}, {"n": 7}, r"leaf \['n'\]: abstract says int32\[1\], init_fn\(\) returned 7"),
        ({"r": np.zeros(3, np.int64)}, None, None),  # numpy leaves need no sharding: restored on the host
        ({"r": np.zeros(3, np.int64)}, {"r": np.ones(3, np.int64)}, None),
        ({"r": np.zeros(3, np.int64)}, {"r": np.zeros(4, np.int64)},
         r"leaf \['r'\]: abstract says int64\[3\], init_fn\(\) returned int64\[4\]"),
    ],
)
def test_abstract_problem(abstract: Any, built: Any, problem: str | None) -> None:
    from reprieve.abstract import abstract_problem

    got = abstract_problem(_build(abstract), None if built is None else _build(built))
    if problem is None:
        assert got is None
    else:
        assert got is not None and re.search(problem, got), got
