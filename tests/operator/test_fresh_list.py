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
        self.body, self.listing, self.calls = body, listing, []  # type: ignore[var-annotated]

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(method)
            answer: Any = {}
            if method == "list_namespaced_pod":
                answer = {"items": self.listing(), "metadata": {"resourceVersion": "7"}}
            elif method == "get_namespaced_custom_object":
                answer = self.body
            return SimpleNamespace(data=json.dumps(answer).encode(), release_conn=lambda: None)
        return call


def state(listing: Callable[[], list[dict[str, Any]]]) -> State:
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
