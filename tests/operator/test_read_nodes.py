"""``reconcile.read_nodes``: the nodes a decision asked for, read fresh into the cache before it decides again. A node
the API no longer has is forgotten there and then: its deletion's watch event may still be on its way, and a
decision that still sees it would keep a pod on it (issue #46, 7: two nodes lost at once restarted the gang twice)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from fake_clock import FakeClock
from kubernetes.client.rest import ApiException
from reprieve_operator.cache import Cache
from reprieve_operator.nodesignals import NodeSignals
from reprieve_operator.policy.signals import BUILTIN_SIGNALS
from reprieve_operator.reconcile import read_nodes
from reprieve_operator.state import State

pytestmark = pytest.mark.unit


class Nodes:
    """The CoreV1Api part ``apply.get_node`` reads: the Nodes the API server has (404 for any other)."""

    def __init__(self, *names: str) -> None:
        self.names, self.reads = set(names), []  # type: set[str], list[str]

    def read_node(self, name: str, _preload_content: bool = True) -> Any:
        self.reads.append(name)
        if name not in self.names:
            raise ApiException(status=404, reason="Not Found")
        body = json.dumps({"metadata": {"name": name}, "spec": {}, "status": {}}).encode()
        return SimpleNamespace(data=body, release_conn=lambda: None)


def state(core: Nodes, *cached: str) -> State:
    async def reconcile(st: State, namespace: str, name: str, fresh: bool) -> None:
        return None

    cache = Cache()
    st = State(api=SimpleNamespace(core=core),  # type: ignore[arg-type]
               cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache, FakeClock()), reconcile=reconcile)
    for name in cached:
        st.nodes.prime({"metadata": {"name": name}})
    return st


def test_a_node_the_api_no_longer_has_is_forgotten_the_others_stay() -> None:
    core = Nodes("n-0")  # n-1 and n-spare were deleted; the watch has not said so yet
    st = state(core, "n-0", "n-1", "n-spare")
    assert asyncio.run(read_nodes(st, ["n-1", "n-0", "n-spare"])) is True
    assert set(st.cache.nodes) == {"n-0"}
    assert asyncio.run(read_nodes(st, ["n-1", "n-0"])) is False  # nothing new: nothing changed


def test_reads_stop_at_the_limit_in_the_order_asked_each_node_once() -> None:
    core = Nodes()
    st = state(core, "a", "b", "c")
    asyncio.run(read_nodes(st, ["c", "a", "c", "b"], limit=2))
    assert core.reads == ["c", "a"] and set(st.cache.nodes) == {"b"}
