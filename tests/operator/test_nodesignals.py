"""nodesignals.NodeSignals, the owner of what the operator knows of node signals, with a fake clock."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from fake_clock import START, FakeClock
from op_jobs import make_job
from reprieve_operator.cache import Cache
from reprieve_operator.nodesignals import HELD_MARGIN_SECONDS, NodeSignals
from reprieve_operator.policy.signals import BUILTIN_SIGNALS, signal_table
from reprieve_operator.policy.times import rfc3339

pytestmark = pytest.mark.unit

SPOT = "cloud.google.com/impending-node-termination"  # gke-spot: 15 s, no timestamp on a NoSchedule taint
EPOCH_LABEL = "cloud.google.com/scheduled-maintenance-time"  # gke-scheduled-maintenance: the deadline itself


def node(name: str, taints: tuple[str, ...] = (), labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, "managedFields": [{"big": "x" * 100}]},
            "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "x"}]}}


def owner(clock: FakeClock | None = None) -> tuple[NodeSignals, Cache, FakeClock]:
    clock = clock or FakeClock()
    cache = Cache()
    return NodeSignals(BUILTIN_SIGNALS, 600.0, cache, clock), cache, clock


def job(**spec: Any) -> Any:
    return make_job(namespace="ml", **spec).model()


def worker(name: str, on: str, notice: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": {"reprieve.dev/job-name": "llama",
                                                                           "reprieve.dev/replica-index": "0",
                                                                           "reprieve.dev/attempt": "1"}}
    if notice:
        meta["annotations"] = {"reprieve.dev/notice": json.dumps(notice)}
    return {"metadata": meta, "spec": {"nodeName": on}, "status": {"phase": "Running"}}


def test_a_signal_already_there_at_start_counts_from_the_operators_start() -> None:
    nodes, cache, clock = owner()
    clock.advance(40.0)  # listing took a while: still the start
    nodes.prime(node("n1", (SPOT,)))
    nodes.prime(node("n2"))
    assert nodes.first_seen("n1") == {"gke-spot": START} and nodes.first_seen("n2") is None
    assert nodes.carrying == 1 and set(cache.nodes) == {"n1", "n2"}
    assert "managedFields" not in cache.nodes["n1"]["metadata"]  # the cache keeps the compact node
    assert nodes.doomed(job(), clock.now()) == {"n1"}  # its deadline (START + 15 s) has passed: still doomed


def test_a_new_signal_is_dated_when_first_seen_and_forgotten_when_gone() -> None:
    nodes, _, clock = owner()
    clock.advance(5.0)
    _, signalled = nodes.observe(node("n1", (SPOT,)))
    assert signalled and nodes.first_seen("n1") == {"gke-spot": START + timedelta(seconds=5)}
    assert nodes.since("n1") == clock.monotonic() and nodes.carrying == 1
    clock.advance(10.0)
    nodes.observe(node("n1", (SPOT,)))  # another event of the same node: still first seen then
    assert nodes.first_seen("n1") == {"gke-spot": START + timedelta(seconds=5)}
    assert nodes.since("n1") == clock.monotonic() - 10.0
    _, signalled = nodes.observe(node("n1"))  # the taint is gone
    assert not signalled and nodes.first_seen("n1") == {} and nodes.since("n1") is None and nodes.carrying == 0
    clock.advance(1.0)
    nodes.observe(node("n1", (SPOT,)))  # and back: a new signal
    assert nodes.first_seen("n1") == {"gke-spot": START + timedelta(seconds=16)}


def test_a_signal_is_dated_by_a_notice_an_operator_before_this_one_delivered() -> None:
    """An operator restarted mid-preemption derives the same deadline (and notice id) as its predecessor."""
    nodes, cache, clock = owner()
    before = START - timedelta(minutes=3)
    cache.upsert_pod(worker("llama-0", "n1", {"id": "x", "node": "n1", "reason": "gke-spot",
                                              "observedAt": rfc3339(before)}))
    cache.upsert_pod(worker("llama-1", "n2", {"id": "y", "node": "n2", "reason": "gke-spot",
                                              "observedAt": rfc3339(before)}))  # another node's notice
    nodes.observe(node("n1", (SPOT,)))
    nodes.observe(node("n3", (SPOT,)))
    assert nodes.first_seen("n1") == {"gke-spot": before} and nodes.first_seen("n3") == {"gke-spot": clock.now()}


@pytest.mark.parametrize("first", ["prime", "refresh", "observe"])
def test_every_way_a_node_is_first_learnt_dates_its_signal_by_a_predecessors_notice(first: str) -> None:
    """A restarted operator lists the Nodes at start (prime) and a reconcile may read one (refresh) before the
    Node watch's event (observe): whichever comes first dates the signal, so each must read the notices on the
    node's pods (the CI run where prime dated it at the operator's start: another notice id, a second
    PreemptionNotice Event for the delivery the killed operator had already posted)."""
    nodes, cache, clock = owner()
    before = START - timedelta(minutes=3)
    cache.upsert_pod(worker("llama-0", "n1", {"id": "x", "node": "n1", "reason": "gke-spot",
                                              "observedAt": rfc3339(before)}))
    clock.advance(40.0)
    getattr(nodes, first)(node("n1", (SPOT,)))
    nodes.observe(node("n1", (SPOT,)))  # the watch's event after it changes nothing
    assert nodes.first_seen("n1") == {"gke-spot": before}


def test_a_fresh_read_reports_what_changed() -> None:
    nodes, _, _ = owner()
    assert nodes.refresh(node("n1"))  # new to the cache
    assert not nodes.refresh(node("n1"))
    assert nodes.refresh(node("n1", (SPOT,))) and nodes.carrying == 1
    assert not nodes.refresh(node("n1", (SPOT,)))
    assert nodes.first_seen("n1") == {"gke-spot": START}


def test_a_deleted_node_is_forgotten() -> None:
    nodes, cache, _ = owner()
    nodes.observe(node("n1", (SPOT,)))
    nodes.forget("n1")
    assert nodes.first_seen("n1") is None and nodes.since("n1") is None and nodes.carrying == 0
    assert "n1" not in cache.nodes


def test_a_held_notice_looks_again_once_it_opens_and_the_latest_hold_wins() -> None:
    nodes, _, clock = owner()
    looked: list[str] = []
    nodes.hold("n1", START + timedelta(seconds=100), lambda: looked.append("first"))
    nodes.hold("n1", START + timedelta(seconds=60), lambda: looked.append("second"))
    first, second = clock.timers
    assert first.cancelled and second.delay == pytest.approx(60.0 + HELD_MARGIN_SECONDS)
    clock.advance(200.0)
    assert looked == ["second"]
    nodes.hold("n2", START, lambda: looked.append("past"))  # opened already: at once (plus the margin)
    assert clock.timers[-1].delay == pytest.approx(HELD_MARGIN_SECONDS)
    nodes.release("n2")
    clock.advance(1.0)
    assert looked == ["second"] and clock.pending() == []


def test_custom_signals_make_every_node_a_candidate() -> None:
    nodes, _, _ = owner()
    for name, taints in (("n1", (SPOT,)), ("n2", ())):
        nodes.observe(node(name, taints))
    custom = job(preemption={"custom": [{"name": "site-drain", "type": "Taint", "key": "example.com/drain"}]})
    assert [n["metadata"]["name"] for n in nodes.candidates(job())] == ["n1"]
    assert sorted(n["metadata"]["name"] for n in nodes.candidates(custom)) == ["n1", "n2"]
    nodes.track_job(("ml", "llama"), True)
    assert nodes.has_custom(("ml", "llama")) and not nodes.has_custom(("ml", "gpt"))
    nodes.track_job(("ml", "llama"), False)
    assert not nodes.has_custom(("ml", "llama"))


def test_doomed_and_avoid_follow_the_horizon_and_the_jobs_signals() -> None:
    nodes, _, clock = owner()
    due = START + timedelta(seconds=3600)  # scheduled maintenance in an hour: held until 10 min before
    nodes.observe(node("n1", labels={EPOCH_LABEL: str(int(due.timestamp()))}))
    nodes.observe(node("n2", (SPOT,)))
    assert nodes.doomed(job(), clock.now()) == {"n2"} and nodes.avoid(job(), clock.now()) == ()  # n2: NoSchedule
    clock.advance(3000.0)
    assert nodes.doomed(job(), clock.now()) == {"n1", "n2"} and nodes.avoid(job(), clock.now()) == ("n1",)
    assert nodes.doomed(job(preemption={"signals": ["gke-spot"]}), clock.now()) == {"n2"}
    assert nodes.doomed(job(preemption={"enabled": False}), clock.now()) == set()


def test_a_narrower_operator_table_sees_less() -> None:
    table = signal_table({"builtin": {"gke-spot": {"enabled": False}}})
    cache = Cache()
    nodes = NodeSignals(table, 600.0, cache, FakeClock())
    _, signalled = nodes.observe(node("n1", (SPOT,)))
    assert not signalled and nodes.carrying == 0 and nodes.doomed(job(), START) == set()


def test_deliveries_are_remembered_per_job_attempt_and_notice() -> None:
    nodes, _, _ = owner()
    nodes.mark_delivered("uid-llama", 1, "gke-spot/n1/1")
    assert nodes.delivered("uid-llama", 1, "gke-spot/n1/1")
    assert not nodes.delivered("uid-llama", 2, "gke-spot/n1/1") and not nodes.delivered("uid-gpt", 1, "gke-spot/n1/1")
