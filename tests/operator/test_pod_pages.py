"""podwatch.pod_pages / apply.list_pages_versioned: a paginated LIST of worker pods, a page of bodies at a time, each
with the list's resourceVersion; the priming fills the cache from one page before it asks for the next."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from reprieve_operator import LABEL_JOB, apply, podwatch
from reprieve_operator.cache import Cache

pytestmark = pytest.mark.unit


class Pods:
    """The CoreV1Api LIST of pods: ``total`` worker pods served ``limit`` at a time; records each call."""

    def __init__(self, total: int, seen: Cache | None = None, node: str = "n0") -> None:
        self.total, self.seen, self.node = total, seen, node
        self.calls: list[dict[str, Any]] = []

    def list_namespaced_pod(self, namespace: str, label_selector: str, limit: int, _preload_content: bool,
                            _continue: str = "0") -> Any:
        self.calls.append({"namespace": namespace, "selector": label_selector, "limit": limit,
                           "cached": self.seen.stats()["pods"] if self.seen is not None else None,
                           "listed": on_node(self.seen, self.node) if self.seen is not None else None})
        start = int(_continue)
        items = [{"metadata": {"name": f"j-{i}", "namespace": namespace, "labels": {LABEL_JOB: "j"}},
                  "spec": {"nodeName": self.node}} for i in range(start, min(start + limit, self.total))]
        more = start + limit < self.total
        body = {"metadata": {"resourceVersion": "42", **({"continue": str(start + limit)} if more else {})},
                "items": items}
        return SimpleNamespace(data=json.dumps(body).encode(), release_conn=lambda: None)


def on_node(cache: Cache, node: str) -> int:
    return sum(p["spec"].get("nodeName") == node for p in cache.pods_of("ml", "j"))


def test_pages_of_the_limit_each_with_the_lists_resource_version() -> None:
    core = Pods(1234)
    pages = list(podwatch.pod_pages(SimpleNamespace(core=core), "ml"))  # type: ignore[arg-type]
    assert [(len(items), rv) for items, rv in pages] == [(apply.LIST_PAGE, "42")] * 2 + [(234, "42")]
    assert {(c["namespace"], c["selector"], c["limit"]) for c in core.calls} == {("ml", LABEL_JOB, apply.LIST_PAGE)}


def test_the_priming_caches_each_page_before_it_lists_the_next() -> None:
    """``main.prime``: never a list of every pod beside the cache's own copies (that doubled the start-up's peak)."""
    from reprieve_operator.main import prime
    from reprieve_operator.nodesignals import NodeSignals
    from reprieve_operator.policy.signals import BUILTIN_SIGNALS
    from reprieve_operator.state import State

    def empty(*_: Any, **__: Any) -> Any:
        return SimpleNamespace(data=json.dumps({"metadata": {}, "items": []}).encode(), release_conn=lambda: None)

    cache = Cache()
    pods = Pods(1200, seen=cache)

    class Core:
        list_node = staticmethod(empty)
        list_namespaced_config_map = staticmethod(empty)  # no notice objects

        def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
            if kw.pop("watch", False):
                raise ConnectionError("no watch in this test")
            return pods.list_namespaced_pod(namespace, **kw)

    async def reconcile(st: State, namespace: str, name: str, fresh: bool) -> None:
        return None

    api = SimpleNamespace(core=Core(), custom=SimpleNamespace(list_namespaced_custom_object=empty))
    state = State(api=api, cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache),  # type: ignore[arg-type]
                  reconcile=reconcile)
    watches = asyncio.run(prime(state, ["ml"]))
    for watch in watches:
        watch.stop()
    assert [c["cached"] for c in pods.calls] == [0, 500, 1000]
    assert cache.primed and cache.stats()["pods"] == 1200 and watches[0].rv == "42"


def test_a_relist_after_410_caches_each_page_before_it_lists_the_next() -> None:
    """``PodWatch`` told its resourceVersion is too old: the pods go into the cache page by page, as at the priming
    (a list of every compact pod before the cache's own copies doubled the memory at that moment); the pods no page
    listed are forgotten at the end and every job that had or has pods is reconciled once."""
    cache = Cache()
    for i in range(1300):  # before the 410: 1,300 pods on n0, one job of another namespace
        cache.upsert_pod({"metadata": {"name": f"j-{i}", "namespace": "ml", "labels": {LABEL_JOB: "j"}},
                          "spec": {"nodeName": "n0"}})
    other = {"metadata": {"name": "k-0", "namespace": "other", "labels": {LABEL_JOB: "k"}}, "spec": {}}
    cache.upsert_pod(other)
    core = Pods(1200, seen=cache, node="n1")  # the re-list: 1,200 of them, moved to n1
    relisted: list[set[tuple[str, str]]] = []

    async def run() -> str:
        watch = podwatch.PodWatch(SimpleNamespace(core=core), asyncio.get_running_loop(),  # type: ignore[arg-type]
                                  lambda *_: None, lambda: cache.relist("ml"),
                                  lambda r: relisted.append(r.end()), lambda p: True, "1", "ml")
        await asyncio.to_thread(watch._handle, {"type": "ERROR", "object": {"code": 410}})
        return watch.rv

    assert asyncio.run(run()) == "42"
    assert [c["listed"] for c in core.calls] == [0, 500, 1000]  # each page cached before the next LIST
    assert on_node(cache, "n1") == 1200 and on_node(cache, "n0") == 0  # the 100 pods not listed are forgotten
    assert relisted == [{("ml", "j")}] and cache.pods_of("other", "k")  # another namespace's pods are kept


@pytest.mark.parametrize("refused", [False, True])
def test_the_priming_lists_the_jobs_notice_objects_or_leaves_each_to_be_read(refused: bool) -> None:
    """``main.prime`` lists the ConfigMaps labelled with a job: a job's notice object (``<job>-notice`` owned by the
    job) is known with its notice, a job without one is known to have none; anything else labelled is not taken
    for one. A refused LIST (RBAC) leaves every job's object to be read before its first notice."""
    from kubernetes.client.rest import ApiException
    from reprieve_operator.main import prime
    from reprieve_operator.nodesignals import NodeSignals
    from reprieve_operator.policy.signals import BUILTIN_SIGNALS
    from reprieve_operator.state import State

    def page(items: list[dict[str, Any]]) -> Any:
        return SimpleNamespace(data=json.dumps({"metadata": {}, "items": items}).encode(), release_conn=lambda: None)

    def cm(name: str, owner_kind: str, owner: str, notice: str | None) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ml", "labels": {LABEL_JOB: owner},
                             "ownerReferences": [{"kind": owner_kind, "name": owner}]},
                "data": {"notice": notice} if notice else {}}

    class Core:
        def list_node(self, **_: Any) -> Any:
            return page([])

        def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
            if kw.get("watch"):
                raise ConnectionError("no watch in this test")
            return page([])

        def list_namespaced_config_map(self, namespace: str, label_selector: str, **_: Any) -> Any:
            assert (namespace, label_selector) == ("ml", LABEL_JOB)
            if refused:
                raise ApiException(status=403, reason="Forbidden")
            return page([cm("a-notice", "TrainingJob", "a", '{"id": "n1"}'), cm("a-assignment", "TrainingJob", "a", None),
                         cm("c-notice", "Deployment", "c", '{"id": "x"}'), cm("d-notice", "TrainingJob", "d", None)])

    async def reconcile(st: State, namespace: str, name: str, fresh: bool) -> None:
        return None

    cache = Cache()
    api = SimpleNamespace(core=Core(), custom=SimpleNamespace(list_namespaced_custom_object=lambda *_, **__: page([])))
    state = State(api=api, cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache),  # type: ignore[arg-type]
                  reconcile=reconcile)
    for watch in asyncio.run(prime(state, ["ml"])):
        watch.stop()
    known = {job: (state.nodes.notice_object(("ml", job)), state.nodes.object_exists(("ml", job)))
             for job in "abcd"}
    if refused:
        assert known == {job: ((False, None), False) for job in "abcd"}
    else:
        assert known == {"a": ((True, '{"id": "n1"}'), True), "b": ((True, None), False),
                         "c": ((True, None), False), "d": ((True, None), True)}
