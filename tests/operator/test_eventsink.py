"""``eventsink``: a notice burst's Events are queued and posted by threads of their own; a pod's Event beyond the
queue's limit is dropped and counted, a job's never. The API here records the Events and can be held."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from reprieve_operator import metrics
from reprieve_operator.eventsink import EventSink

pytestmark = pytest.mark.unit


class HeldCore:
    """``create_namespaced_event`` records its body and waits until ``release`` is set."""

    def __init__(self) -> None:
        self.release, self.posted = threading.Event(), []  # type: ignore[var-annotated]

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> Any:
        assert self.release.wait(10)
        self.posted.append(body)
        return SimpleNamespace(data=b"{}", release_conn=lambda: None)


def ref(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "name": name, "namespace": "ml", "uid": f"uid-{name}"}


def dropped() -> float:
    return metrics.REGISTRY.get_sample_value("reprieve_events_dropped_total") or 0.0


def test_pods_events_beyond_the_limit_are_dropped_and_counted_a_jobs_never() -> None:
    core = HeldCore()
    sink = EventSink(SimpleNamespace(core=core), limit=3, posters=1)  # type: ignore[arg-type]
    before = dropped()
    accepted = [sink.emit(ref("Pod", f"p{i}"), "PreemptionNotice", "node n1 will go away", "Warning")
                for i in range(10)]
    assert accepted == [True] * 3 + [False] * 7  # 3 queued or being posted: the rest dropped, emit never waited
    assert sink.emit(ref("TrainingJob", "llama"), "NoticeFallback", "annotated instead", "Warning", droppable=False)
    assert sink.dropped == 7 and dropped() - before == 7
    core.release.set()
    sink.drain()
    assert sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in core.posted) == [
        ("Pod", "p0"), ("Pod", "p1"), ("Pod", "p2"), ("TrainingJob", "llama")]
    # Once posted, room again.
    assert sink.emit(ref("Pod", "p10"), "PreemptionNotice", "again", "Warning")
    sink.drain()
    assert core.posted[-1]["involvedObject"]["name"] == "p10" and core.posted[-1]["reason"] == "PreemptionNotice"


def test_a_refused_post_is_logged_and_the_posters_go_on() -> None:
    class Refusing(HeldCore):
        def create_namespaced_event(self, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
            if body["involvedObject"]["name"] == "bad":
                raise RuntimeError("connection reset")
            return super().create_namespaced_event(namespace, body, **kw)

    core = Refusing()
    core.release.set()
    sink = EventSink(SimpleNamespace(core=core), limit=10, posters=1)  # type: ignore[arg-type]
    for name in ("bad", "good"):
        sink.emit(ref("Pod", name), "PreemptionNotice", "m", "Warning")
    sink.drain()
    assert [e["involvedObject"]["name"] for e in core.posted] == ["good"]
