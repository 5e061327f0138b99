"""The resync's fresh LIST of a job's pods (``reconcile``) repairs the cache, but never undoes a watch event that
came while it was in flight (before: a burst of progress reports left jobs without goodput accounting until the
job's next fresh LIST, a minute or more). The API server here is a recorder; the LIST's answer is a function."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from fake_clock import FakeClock
from op_jobs import make_job
from reprieve_operator.cache import Cache
from reprieve_operator.nodesignals import NodeSignals
from reprieve_operator.policy.signals import BUILTIN_SIGNALS
from reprieve_operator.reconcile import reconcile
from reprieve_operator.state import State
from test_decide import RUN
from test_delivery import worker

pytestmark = pytest.mark.unit
PROGRESS = "reprieve.dev/progress"


class Api:
    """Every API group at once: ``list_namespaced_pod`` answers with ``listing()``; other calls answer ``{}`` (the
    job's GET its body)."""

    def __init__(self, body: dict[str, Any], listing: Callable[[], list[dict[str, Any]]]) -> None:
        self.body, self.listing = body, listing
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, kwargs))
            answer: Any = {}
            if method == "list_namespaced_pod":
                answer = {"items": self.listing(), "metadata": {"resourceVersion": "7"}}
            elif method == "get_namespaced_custom_object":
                answer = self.body
            return SimpleNamespace(data=json.dumps(answer).encode(), release_conn=lambda: None)
        return call


def state(listing: Callable[[], list[dict[str, Any]]]) -> State:
    """A primed cache of a running job's two pods; the API's LIST of pods answers ``listing()``."""
    body = dict(make_job(name="llama", namespace="ml").with_status(**RUN))
    body["metadata"] = {**body["metadata"], "uid": "0123456789abcdef"}
    api = Api(body, listing)
    cache = Cache()
    st = State(api=SimpleNamespace(core=api, rbac=api, custom=api, events=api),  # type: ignore[arg-type]
               cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache, FakeClock()), reconcile=reconcile)
    cache.upsert_job(body)
    for i in range(2):
        cache.upsert_pod(worker(f"llama-{i}", i))
    cache.mark_primed()
    return st


def annotations(st: State) -> dict[str, dict[str, str]]:
    return {p["metadata"]["name"]: p["metadata"].get("annotations") or {} for p in st.cache.pods_of("ml", "llama")}


def test_a_watch_event_during_the_fresh_list_is_not_undone_by_the_older_listing() -> None:
    report = {PROGRESS: json.dumps({"attempt": 1, "step": 500})}
    older = [worker("llama-0", 0), worker("llama-1", 1)]  # as the API server listed them, before the report
    holder: dict[str, State] = {}

    def listing() -> list[dict[str, Any]]:
        holder["st"].cache.upsert_pod(worker("llama-0", 0, report))  # the watch's event, while the LIST is in flight
        return older

    st = holder["st"] = state(listing)
    asyncio.run(reconcile(st, "ml", "llama", True))
    assert annotations(st)["llama-0"] == report  # kept: the listing was older than the cache


def test_a_fresh_list_with_nothing_changed_meanwhile_repairs_a_missed_event() -> None:
    report = {PROGRESS: json.dumps({"attempt": 1, "step": 500})}
    st = state(lambda: [worker("llama-0", 0, report), worker("llama-1", 1)])  # the cache missed the report
    asyncio.run(reconcile(st, "ml", "llama", True))
    assert annotations(st)["llama-0"] == report
    st2 = state(lambda: [worker("llama-0", 0)])  # and a pod the cache still holds is gone
    asyncio.run(reconcile(st2, "ml", "llama", True))
    assert sorted(annotations(st2)) == ["llama-0"]


def lists(st: State) -> list[dict[str, Any]]:
    return [kw for m, kw in st.api.core.calls if m == "list_namespaced_pod"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("seen", [None, "4711"])
def test_the_fresh_list_is_served_by_the_watch_cache_not_older_than_what_the_watch_applied(seen: str | None) -> None:
    """Never a consistent read: the API server serves a label-selector LIST it cannot take from its watch cache at
    once from etcd, a range over every pod of the namespace (264 MB a LIST at 50,000 pods)."""
    st = state(lambda: [worker("llama-0", 0), worker("llama-1", 1)])
    st.cache.pods_seen = seen
    asyncio.run(reconcile(st, "ml", "llama", True))
    (kw,) = lists(st)
    want = {"resource_version": "0"} if seen is None else {"resource_version": seen,
                                                            "resource_version_match": "NotOlderThan"}
    assert {k: kw[k] for k in ("resource_version", "resource_version_match") if k in kw} == want


def test_a_refused_fresh_list_leaves_the_watched_cache_and_the_reconcile_goes_on() -> None:
    from kubernetes.client.rest import ApiException

    def listing() -> list[dict[str, Any]]:
        raise ApiException(status=504, reason="Too large resource version")

    st = state(listing)
    report = {PROGRESS: json.dumps({"attempt": 1, "step": 500})}
    st.cache.upsert_pod(worker("llama-0", 0, report))
    plan = asyncio.run(reconcile(st, "ml", "llama", True))
    assert plan is not None and annotations(st)["llama-0"] == report


def test_the_pod_watch_says_what_it_applied_after_each_event() -> None:
    """``PodWatch`` hands each event to the loop, then the resourceVersion it carried (``main.saw_pods``): a fresh
    LIST then asks for no older state than the cache holds."""
    from reprieve_operator import podwatch

    seen: list[tuple[str, str]] = []

    async def run() -> None:
        watch = podwatch.PodWatch(SimpleNamespace(), asyncio.get_running_loop(),  # type: ignore[arg-type]
                                  lambda kind, pod: seen.append(("event", pod["metadata"]["name"])), lambda: None,  # type: ignore[arg-type,return-value]
                                  lambda r: None, lambda p: True, "1", "ml",
                                  on_seen=lambda rv: seen.append(("seen", rv)))
        pod = worker("llama-0", 0)
        await asyncio.to_thread(watch._handle, {"type": "MODIFIED", "object": {
            **pod, "metadata": {**pod["metadata"], "resourceVersion": "17"}}})
        await asyncio.to_thread(watch._handle, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "23"}}})
        await asyncio.sleep(0.05)

    asyncio.run(run())
    assert seen == [("event", "llama-0"), ("seen", "17"), ("seen", "23")]
