"""The counters that say the operator has handled something (docs/operator.md, Metrics): a reconcile, a Node
event, a read of the leader-election Lease is counted once it has ended, whatever its outcome."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_clock import FakeClock
from kubernetes.client.rest import ApiException
from reprieve_operator import delivery, metrics
from reprieve_operator.cache import Cache
from reprieve_operator.leadership import CountedLeaseLock
from reprieve_operator.nodesignals import NodeSignals
from reprieve_operator.policy.signals import BUILTIN_SIGNALS
from reprieve_operator.state import State
from reprieve_operator.workqueue import ReconcileQueue

pytestmark = pytest.mark.unit

SPOT = "cloud.google.com/impending-node-termination"


def value(counter: Any) -> float:
    return float(counter._value.get())


def test_a_reconcile_is_counted_per_job_once_it_has_ended_even_when_it_failed() -> None:
    seen: list[float] = []
    llama = metrics.RECONCILES.labels("ml", "llama")
    gpt = metrics.RECONCILES.labels("ml", "gpt")

    async def reconcile(namespace: str, name: str, fresh: bool) -> None:
        seen.append(value(llama))  # not yet counted while it runs
        if name == "gpt":
            raise RuntimeError("API down")

    async def main() -> None:
        queue = ReconcileQueue(reconcile, FakeClock())
        before, before_gpt = value(llama), value(gpt)
        await queue.run("ml", "llama")
        assert seen == [before] and value(llama) == before + 1
        with pytest.raises(RuntimeError, match="API down"):
            await queue.run("ml", "gpt")
        assert value(gpt) == before_gpt + 1 and value(llama) == before + 1

    asyncio.run(main())


def test_the_job_label_off_counts_per_namespace() -> None:
    async def reconcile(namespace: str, name: str, fresh: bool) -> None:
        return None

    async def main() -> None:
        blank = metrics.RECONCILES.labels("ml-off", "")
        before = value(blank)
        metrics.set_job_label(False)
        try:
            await ReconcileQueue(reconcile, FakeClock()).run("ml-off", "llama")
        finally:
            metrics.set_job_label(True)
        assert value(blank) == before + 1

    asyncio.run(main())


def node(name: str, *taints: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}},
            "spec": {"taints": [{"key": k, "value": "true", "effect": "NoSchedule"} for k in taints]}}


def state() -> State:
    async def reconcile(st: State, namespace: str, name: str, fresh: bool) -> None:
        return None

    cache = Cache()
    return State(api=None, cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache, FakeClock()),  # type: ignore[arg-type]
                 reconcile=reconcile)


@pytest.mark.parametrize("event,body", [
    ("ADDED", node("n1")),  # no signal, no job: returns early
    ("MODIFIED", node("n1", SPOT)),  # a signal, no job on the node
    ("DELETED", node("n1")),
])
def test_a_node_event_is_counted_per_node_once_handled(event: str, body: dict[str, Any]) -> None:
    counter = metrics.NODE_EVENTS.labels("n1")
    before, other = value(counter), value(metrics.NODE_EVENTS.labels("n2"))
    asyncio.run(delivery.on_node(state(), event, "n1", body))
    assert value(counter) == before + 1 and value(metrics.NODE_EVENTS.labels("n2")) == other


def test_a_node_event_that_fails_is_counted_too() -> None:
    counter = metrics.NODE_EVENTS.labels("bad")
    before = value(counter)
    with pytest.raises(TypeError):  # no body at all
        asyncio.run(delivery.on_node(state(), "MODIFIED", "bad", None))
    assert value(counter) == before + 1


class Leases:
    """The CoordinationV1Api part a LeaseLock reads: a Lease held by someone, or none (404)."""

    def __init__(self, held: bool) -> None:
        self.held, self.reads = held, 0

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        self.reads += 1
        if not self.held:
            raise ApiException(status=404, reason="Not Found")
        from kubernetes import client

        return client.V1Lease(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                              spec=client.V1LeaseSpec(holder_identity="other", lease_duration_seconds=15,
                                                      acquire_time=None, renew_time=None))


@pytest.mark.parametrize("held", [True, False], ids=["held", "missing"])
def test_every_read_of_the_lease_is_counted(held: bool) -> None:
    lock = CountedLeaseLock("reprieve", "ops", "me")
    lock.api_instance = Leases(held)
    before = value(metrics.LEADER_TRIES)
    for _ in range(3):
        found, _record = lock.get("reprieve", "ops")
        assert found is held
    assert value(metrics.LEADER_TRIES) == before + 3 and lock.api_instance.reads == 3


def test_a_job_found_at_start_is_kicked_and_its_handler_returns_before_the_reconcile_runs() -> None:
    """kopf's resume handler (every job an operator finds at its start) returns at once: thousands of them awaiting
    the reconcile slots held kopf's workers and each job's decoded body meanwhile. The reconcile still runs, and one
    that fails is run again by the next kick (the resync's)."""
    from types import SimpleNamespace

    from reprieve_operator import handlers

    runs: list[str] = []
    gate = asyncio.Event()

    async def reconcile(st: State, namespace: str, name: str, fresh: bool) -> None:
        await gate.wait()
        runs.append(name)
        if len(runs) == 1:
            raise RuntimeError("the API refused")

    async def main() -> None:
        cache = Cache()
        st = State(api=None, cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache, FakeClock()),  # type: ignore[arg-type]
                   reconcile=reconcile)
        await asyncio.wait_for(handlers.job_resumed(namespace="ml", name="llama", memo=SimpleNamespace(state=st)), 1)
        assert runs == [] and st.queue.busy == 1  # returned while the reconcile waits
        gate.set()
        while st.queue.busy:
            await asyncio.sleep(0.01)
        assert runs == ["llama"]  # it ran (and failed: logged, counted)
        st.queue.kick("ml", "llama", fresh=True)  # the resync's kick runs it again
        while st.queue.busy:
            await asyncio.sleep(0.01)
        assert runs == ["llama", "llama"]

    asyncio.run(main())
