"""``delivery``: a Node event's notice reaches the pods (annotations, the pods' Events) and is handed to the job's
reconcile, which alone writes the status (``status.lastNotice``, phase ``Preempting``) after the job's named
``PreemptionNotice`` Event. The API server here is a recorder of calls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from fake_clock import FakeClock
from kubernetes.client.exceptions import ApiException
from op_jobs import make_job
from reprieve_operator import ANNOTATION_NOTICE_WATCH as WATCH
from reprieve_operator import delivery
from reprieve_operator.cache import Cache
from reprieve_operator.nodesignals import NodeSignals
from reprieve_operator.policy.signals import BUILTIN_SIGNALS
from reprieve_operator.reconcile import reconcile
from reprieve_operator.state import State
from test_decide import RUN

pytestmark = pytest.mark.unit

SPOT = "cloud.google.com/impending-node-termination"


class Group:
    """One API group: every call is recorded as (method, args, kwargs); answers by method."""

    def __init__(self, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]], answers: dict[str, Any],
                 refusals: dict[str, int]) -> None:
        self.calls, self.answers, self.refusals = calls, answers, refusals

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, args, kwargs))
            if method in self.refusals:
                raise ApiException(status=self.refusals[method], reason="refused")
            return SimpleNamespace(data=json.dumps(self.answers.get(method, {})).encode(), release_conn=lambda: None)
        return call


def worker(name: str, index: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "creationTimestamp": RUN["startTime"],
                         "labels": {"reprieve.dev/job-name": "llama", "reprieve.dev/attempt": "1",
                                    "reprieve.dev/replica-index": str(index)}, "annotations": annotations or {}},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": f"10.0.0.{index + 1}"}}


def setup(watching: tuple[int, ...] = (), refusals: dict[str, int] | None = None,
          ) -> tuple[State, list[tuple[str, tuple[Any, ...], dict[str, Any]]], list[tuple[str, str]], str]:
    """A running job of two pods on node ``n1`` (those of ``watching`` watch the job's notice object; the API
    refuses the methods of ``refusals`` with their status): the state, the API calls, the reconciles run, the
    job's uid."""
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    body = dict(make_job(name="llama", namespace="ml").with_status(**RUN))
    body["metadata"] = {**body["metadata"], "uid": "0123456789abcdef"}
    refused = {"read_namespaced_config_map": 404, **(refusals or {})}  # no notice object yet
    api = SimpleNamespace(**{g: Group(calls, {"get_namespaced_custom_object": body}, refused)
                             for g in ("core", "rbac", "custom", "events")})
    reconciled: list[tuple[str, str]] = []

    async def recorded(st: State, namespace: str, name: str, fresh: bool) -> None:
        reconciled.append((namespace, name))

    cache = Cache()
    st = State(api=api, cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache, FakeClock()),  # type: ignore[arg-type]
               reconcile=recorded)
    cache.upsert_job(body)
    for i in range(2):
        cache.upsert_pod(worker(f"llama-{i}", i, {WATCH: "llama-notice"} if i in watching else None))
    cache.mark_primed()
    return st, calls, reconciled, body["metadata"]["uid"]


def spot_node() -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": {}},
            "spec": {"taints": [{"key": SPOT, "value": "true", "effect": "NoSchedule"}]}}


def methods(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[str]:
    return [m for m, _, _ in calls]


def deliver(st: State) -> None:
    async def main() -> None:
        await delivery.on_node(st, "MODIFIED", "n1", spot_node())
        for _ in range(20):  # the kicked reconcile runs in the background
            await asyncio.sleep(0.01)

    asyncio.run(main())
    st.events.drain()  # the pods' Events are posted by the sink's threads


def events(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[tuple[str, str, str]]:
    """(kind, reason, message) of every Event posted."""
    return sorted((e["involvedObject"]["kind"], e["reason"], e["message"])
                  for e in (args[1] for m, args, _ in calls if m == "create_namespaced_event"))


def test_a_node_notice_is_on_the_pods_and_handed_to_the_reconcile_which_alone_writes_the_status() -> None:
    st, calls, reconciled, uid = setup()  # no pod watches the notice object yet (its runtime has not started)
    deliver(st)
    assert sorted(args[0] for m, args, _ in calls if m == "patch_namespaced_pod") == ["llama-0", "llama-1"]
    assert "patch_namespaced_custom_object_status" not in methods(calls)  # delivery writes no status
    kinds = [(kind, reason) for kind, reason, _ in events(calls)]
    assert kinds == [("Pod", "PreemptionNotice"), ("Pod", "PreemptionNotice"), ("TrainingJob", "NoticeFallback")]
    # written all the same: a runtime that starts now lists it
    (created,) = [args[1] for m, args, _ in calls if m == "create_namespaced_config_map"]
    assert created["metadata"]["name"] == "llama-notice"
    (handed,) = st.nodes.unrecorded(uid)
    assert (handed.attempt, handed.notice.reason, handed.notice.node) == (1, "gke-spot", "n1")
    assert "notice gke-spot/n1" in handed.message and reconciled == [("ml", "llama")]


def test_the_reconcile_posts_the_named_event_then_records_the_notice_once() -> None:
    st, calls, _, uid = setup()

    async def main() -> None:
        await delivery.on_node(st, "MODIFIED", "n1", spot_node())
        await asyncio.to_thread(st.events.drain)  # the pods' Events, posted by the sink's threads
        del calls[:]
        await reconcile(st, "ml", "llama")

    asyncio.run(main())
    events = [(i, args[1]) for i, (m, args, _) in enumerate(calls) if m == "create_namespaced_event"]
    patches = [(i, args[-1]["status"]) for i, (m, args, _) in enumerate(calls)
               if m == "patch_namespaced_custom_object_status"]
    ((at, event),), ((patched_at, status),) = events, patches
    assert event["reason"] == "PreemptionNotice" and event["involvedObject"]["kind"] == "TrainingJob"
    assert event["metadata"]["name"].startswith("llama.01234567.notice-1-") and at < patched_at
    assert status["phase"] == "Preempting"
    assert {k: status["lastNotice"][k] for k in ("reason", "node", "attempt")} == {
        "reason": "gke-spot", "node": "n1", "attempt": 1}
    assert st.nodes.unrecorded(uid) == ()  # recorded: the next reconcile has nothing of it to write


def test_decide_records_the_earliest_of_the_deliveries_and_only_what_the_status_lacks() -> None:
    from datetime import timedelta

    from reprieve_operator.policy.decide import View, decide
    from reprieve_operator.policy.notice import Delivered
    from reprieve_operator.policy.signals import Notice
    from test_decide import NOW, job, nodes, pod

    def delivered(reason: str, seconds: int) -> Delivered:
        return Delivered(Notice(f"{reason}/n1/1", reason, "n1", NOW + timedelta(seconds=seconds), NOW), 1,
                         f"{reason} message")

    pods = [pod("llama-0", 0), pod("llama-1", 1)]
    rebalance, spot, later = delivered("aws-rebalance", 120), delivered("gke-spot", 30), delivered("cordon", 300)
    out = decide(View(job=job(RUN), pods=pods, now=NOW, known_nodes=nodes(*pods), placed=True, looked=True,
                      delivered=(rebalance, spot, later)))
    assert out.notices == (rebalance, spot)  # each posts its Event; the later one changes nothing
    assert out.status["lastNotice"]["reason"] == "gke-spot" and out.status["phase"] == "Preempting"
    recorded = job({**RUN, "lastNotice": out.status["lastNotice"]})
    again = decide(View(job=recorded, pods=pods, now=NOW, known_nodes=nodes(*pods), placed=True, looked=True,
                        delivered=(rebalance, spot)))
    assert again.notices == () and "lastNotice" not in again.status


def test_pods_that_watch_the_notice_object_hear_it_from_one_write_and_get_no_annotation() -> None:
    st, calls, reconciled, uid = setup(watching=(0, 1))
    deliver(st)
    writes = [(m, args) for m, args, _ in calls if m.startswith(("patch", "create", "replace"))
              and m != "create_namespaced_event"]
    ((method, args),) = writes  # one write for the whole job
    assert method == "create_namespaced_config_map" and args[1]["metadata"]["name"] == "llama-notice"
    value = json.loads(args[1]["data"]["notice"])
    assert (value["reason"], value["node"], value["attempt"]) == ("gke-spot", "n1", 1)
    assert events(calls) == []  # no pod Events, no fallback: the job's PreemptionNotice is the reconcile's
    (handed,) = st.nodes.unrecorded(uid)
    assert handed.notice.id == value["id"] and reconciled == [("ml", "llama")]
    del calls[:]
    st.nodes.release("n1")
    deliver(st)  # the same node again (another event): the object already carries it, nothing is written
    assert [m for m in methods(calls) if m.startswith(("patch", "create"))] == []


@pytest.mark.parametrize("listed", [None, "absent", "same", "earlier"])
def test_notice_objects_listed_at_start_spare_the_read_before_the_write(listed: str | None) -> None:
    """Once the objects were listed at start (``NodeSignals.prime_objects``), a job missing from the list has none:
    the burst's write is the only call; an object listed with this notice already is not written again, and one
    with an earlier deadline keeps it (a later notice is not delivered)."""
    st, calls, _, _ = setup(watching=(0, 1))
    if listed == "absent":
        st.nodes.prime_objects([])
    elif listed is not None:
        first, _, _, uid = setup(watching=(0, 1))
        deliver(first)
        (handed,) = first.nodes.unrecorded(uid)
        value = handed.notice.annotation(1)
        if listed == "earlier":
            value = json.dumps({**json.loads(value), "deadline": "2000-01-01T00:00:00Z", "id": "gke-spot/n1/0"})
        st.nodes.prime_objects([(("ml", "llama"), value)])
    deliver(st)
    reads = [m for m in methods(calls) if m == "read_namespaced_config_map"]
    writes = [m for m in methods(calls) if m.endswith("_config_map") and m != "read_namespaced_config_map"]
    assert (len(reads), writes) == {None: (1, ["create_namespaced_config_map"]),
                                    "absent": (0, ["create_namespaced_config_map"]),
                                    "same": (0, []), "earlier": (0, [])}[listed]


def test_a_pod_that_does_not_watch_is_annotated_and_the_job_event_names_it() -> None:
    st, calls, _, _ = setup(watching=(0,))
    deliver(st)
    assert [args[0] for m, args, _ in calls if m == "patch_namespaced_pod"] == ["llama-1"]
    assert "create_namespaced_config_map" in methods(calls)
    ((_, reason, message),) = [e for e in events(calls) if e[0] == "TrainingJob"]
    assert reason == "NoticeFallback" and "1 pod(s) do not watch llama-notice" in message and "llama-1" in message


@pytest.mark.parametrize("refused", [None, 429])
def test_a_job_no_pod_of_which_watches_is_annotated_first_and_its_object_written_after(refused: int | None) -> None:
    """No pod watches yet: the object only waits for a process that starts later, so the pods' annotations (their
    only way to hear it now) go first and the object after; a refused write then annotates no pod twice."""
    st, calls, _, uid = setup(watching=(), refusals={"create_namespaced_config_map": refused} if refused else None)
    deliver(st)
    writes = [(m, args[0]) for m, args, _ in calls if m in ("patch_namespaced_pod", "create_namespaced_config_map")]
    assert sorted(writes[:2]) == [("patch_namespaced_pod", "llama-0"), ("patch_namespaced_pod", "llama-1")]
    assert [m for m, _ in writes[2:]] == ["create_namespaced_config_map"], writes
    (fallback,) = [e for e in events(calls) if e[0] == "TrainingJob"]
    assert ("could not be written (HTTP 429)" in fallback[2]) is bool(refused)
    assert st.nodes.notice_object(("ml", "llama"))[0] is not bool(refused)
    (handed,) = st.nodes.unrecorded(uid)
    assert handed.notice.reason == "gke-spot"


@pytest.mark.parametrize("status", [403, 429])
def test_a_refused_notice_object_falls_back_to_annotating_every_pod_and_says_so(status: int) -> None:
    st, calls, _, uid = setup(watching=(0, 1), refusals={"create_namespaced_config_map": status})
    deliver(st)
    assert sorted(args[0] for m, args, _ in calls if m == "patch_namespaced_pod") == ["llama-0", "llama-1"]
    (fallback,) = [e for e in events(calls) if e[0] == "TrainingJob"]
    assert fallback[1] == "NoticeFallback"
    assert f"llama-notice could not be written (HTTP {status})" in fallback[2] and "2 pod(s)" in fallback[2]
    assert st.nodes.notice_object(("ml", "llama")) == (False, None)  # not written: read again next time
    (handed,) = st.nodes.unrecorded(uid)
    assert handed.notice.reason == "gke-spot"
