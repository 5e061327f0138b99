"""benchmarks/goodput.py's decisions about nodes and pulls, table-tested: which flags go together, how many worker
nodes a variant starts with, and when a real variant adds a fresh node. The benchmark itself runs by hand."""

from __future__ import annotations

import pytest

from tests.benchmark_module import load_benchmark

pytestmark = pytest.mark.unit

goodput = load_benchmark("goodput")


@pytest.mark.parametrize(("real_nodes", "real_pulls", "pull_seconds", "wrong"), [
    (False, False, None, None),             # process nodes, the default emulated pull
    (False, False, 5.0, None),              # process nodes, a chosen emulated pull
    (True, False, None, None),              # real nodes, images imported
    (True, True, None, None),               # real nodes, real pulls
    (False, True, None, "--real-pulls needs --real-nodes"),
    (True, False, 20.0, "--pull-seconds emulates a pull on process nodes"),
    (True, True, 0.0, "--pull-seconds emulates a pull on process nodes"),
])
def test_check_modes(real_nodes: bool, real_pulls: bool, pull_seconds: float | None, wrong: str | None) -> None:
    got = goodput.check_modes(real_nodes=real_nodes, real_pulls=real_pulls, pull_seconds=pull_seconds)
    assert (got is None) if wrong is None else (got is not None and got.startswith(wrong))


@pytest.mark.parametrize(("spares", "events", "real", "nodes"), [
    (0, 4, False, 6),    # 2 workers + one per replacement
    (1, 4, False, 11),   # 2 workers + spare + two per event (the worker's and the used spare's replacement)
    (0, 4, True, 3),     # real: 2 workers + one free node
    (1, 4, True, 4),     # real: 2 workers + spare + one free node
])
def test_nodes_up_front(spares: int, events: int, real: bool, nodes: int) -> None:
    assert goodput.nodes_up_front(spares=spares, events=events, real=real) == nodes


@pytest.mark.parametrize(("live", "up_front", "real", "due"), [
    (3, 4, True, 1),     # one deleted: one fresh node
    (4, 4, True, 0),     # the pool is whole
    (2, 4, True, 2),
    (5, 6, False, 0),    # process nodes: all created up front, none added
])
def test_replacements_due(live: int, up_front: int, real: bool, due: int) -> None:
    assert goodput.replacements_due(live=live, up_front=up_front, real=real) == due
