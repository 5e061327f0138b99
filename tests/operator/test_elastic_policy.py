"""policy/elastic.py: when an elastic job shrinks, waits or grows, to which size, who takes which process id, and
the Degraded condition and Events (one row per case of issue #47's Faults and Bad input a decision can express)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.models import ElasticSpec
from reprieve_operator.policy import elastic as el
from reprieve_operator.policy.elastic import Candidate, ElasticView, Resize, Role, Wait, decide_resize
from reprieve_operator.policy.podsready import SchedulerVerdict
from reprieve_operator.policy.restart import Condition

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)
FULL = "0/4 nodes are available: 3 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def stuck(pod: str, seconds: float, role: Role = Role.REPLACEMENT) -> Candidate:
    """A pod the scheduler has refused for ``seconds``."""
    return Candidate(pod, role, False, SchedulerVerdict(FULL, ago(seconds)))


def coming(pod: str) -> Candidate:
    """A replacement the scheduler has not refused: being scheduled, or placed and starting."""
    return Candidate(pod, Role.REPLACEMENT, False)


def ready(pod: str, role: Role = Role.SPARE) -> Candidate:
    return Candidate(pod, role, True)


def view(size: int = 4, alive: tuple[int, ...] = (0, 1, 2, 3), *candidates: Candidate, replicas: int = 4,
         last_resize: datetime | None = None, resizing: bool = False, **elastic: Any) -> ElasticView:
    spec = ElasticSpec.model_validate({"minReplicas": 1, **elastic})
    return ElasticView(spec=spec, replicas=replicas, size=size, alive=alive, now=NOW, candidates=candidates,
                       last_resize=last_resize, resizing=resizing)


# (case, view, expected: None, a Wait's reason, or (direction, size, keep, join, stand_by))
CASES: list[tuple[str, ElasticView, Any]] = [
    ("full size, nothing lost: train on", view(), None),
    ("lost, replacement refused for less than unschedulableSeconds: wait for it",
     view(4, (0, 1, 3), stuck("r1", 59)), None),
    ("lost, replacement refused for unschedulableSeconds: shrink to the survivors, renumbered by rank",
     view(4, (0, 1, 3), stuck("r1", 60)),
     (el.Direction.SHRINK, 3, ((0, 0), (1, 1), (3, 2)), (), ())),
    ("unschedulableSeconds 0: shrink at the scheduler's first refusal",
     view(4, (0, 1, 3), stuck("r1", 0), unschedulableSeconds=0),
     (el.Direction.SHRINK, 3, ((0, 0), (1, 1), (3, 2)), (), ())),
    ("process 0 lost: the lowest survivor becomes process 0",
     view(4, (1, 2, 3), stuck("r0", 300)), (el.Direction.SHRINK, 3, ((1, 0), (2, 1), (3, 2)), (), ())),
    ("lost, a ready spare: today's restart puts it in the lost index", view(4, (0, 1, 3), ready("s"), stuck("r1", 300)),
     None),
    ("lost, the replacement is being scheduled (no refusal): wait for it", view(4, (0, 1, 3), coming("r1")), None),
    (("lost, the spare that would take its index is itself refused (made after the last restart, no node with "
      "room) for unschedulableSeconds: shrink (make demo's stockout waited for it)"),
     view(4, (0, 1, 3), stuck("s", 60, Role.SPARE)), (el.Direction.SHRINK, 3, ((0, 0), (1, 1), (3, 2)), (), ())),
    ("lost, a spare still starting and not refused: wait for it",
     view(4, (0, 1, 3), Candidate("s", Role.SPARE, False)), None),
    ("lost, no replacement pod yet: nothing to judge by (never a guess)", view(4, (0, 1, 3)), None),
    ("two lost, both replacements refused, a ready spare: shrink to 3, the spare takes process 2",
     view(4, (0, 3), ready("s"), stuck("r1", 90), stuck("r2", 60)),
     (el.Direction.SHRINK, 3, ((0, 0), (3, 1)), (("s", 2),), ())),
    ("two lost, a ready spare for one, the other's replacement refused for less than unschedulableSeconds: wait",
     view(4, (0, 3), ready("s"), stuck("r1", 90), stuck("r2", 30)), None),
    ("two lost, a ready spare, the other replacement refused: shrink to 3, the spare takes process 2",
     view(4, (0, 3), ready("s"), stuck("r1", 90)),
     (el.Direction.SHRINK, 3, ((0, 0), (3, 1)), (("s", 2),), ())),
    ("two lost, one replacement refused, the other coming: shrink without waiting for both",
     view(4, (0, 3), stuck("r1", 90), coming("r2")), (el.Direction.SHRINK, 2, ((0, 0), (3, 1)), (), ())),
    ("a second loss while degraded, down to the minimum",
     view(3, (0, 2), stuck("r1", 61), minReplicas=2, last_resize=ago(10)),
     (el.Direction.SHRINK, 2, ((0, 0), (2, 1)), (), ())),
    ("a loss below the minimum: wait as without the block, condition says so",
     view(2, (1,), stuck("r0", 120), minReplicas=2), el.Reason.BELOW_MIN),
    ("a loss during a grow (the grown attempt not started yet): shrink again",
     view(4, (0, 1, 2), stuck("r3", 60), resizing=True, last_resize=ago(5)),
     (el.Direction.SHRINK, 3, ((0, 0), (1, 1), (2, 2)), (), ())),
    ("virtual shards: 3 survivors of 8 shards shrink to 2, the third stands by",
     view(4, (0, 1, 3), stuck("r2", 60), virtualShards=8), (el.Direction.SHRINK, 2, ((0, 0), (1, 1)), (), (3,))),
    ("virtual shards: no allowed size from the minimum fits the survivors: wait, naming the sizes",
     view(4, (0, 1, 3), stuck("r2", 60), virtualShards=8, minReplicas=3), el.Reason.NO_SIZE),
    ("shrunk with a standby, another worker lost: the standby takes the lost id, no second shrink",
     view(2, (0,), ready("w3", Role.STANDBY), stuck("r1", 300), virtualShards=8, last_resize=ago(10)), None),
    ("capacity returns while the shrink is in flight: no second change until it trains",
     view(3, (0, 1, 2), ready("r3", Role.REPLACEMENT), resizing=True, last_resize=ago(400)), None),
    ("a spare ready after the shrink, interval passed: grow back, the spare takes process 3",
     view(3, (0, 1, 2), ready("s"), last_resize=ago(300)),
     (el.Direction.GROW, 4, ((0, 0), (1, 1), (2, 2)), (("s", 3),), ())),
    ("flapping prevented: capacity back 100 s after the last change, interval 300",
     view(3, (0, 1, 2), ready("s"), last_resize=ago(100)), None),
    ("growBack false: stays shrunk", view(3, (0, 1, 2), ready("s"), last_resize=ago(900), growBack=False), None),
    ("the replacement scheduled but not ready (pulling its image): train on shrunk",
     view(3, (0, 1, 2), coming("r3"), last_resize=ago(900)), None),
    ("grow with virtual shards: one ready pod cannot make 2 into an allowed 3",
     view(2, (0, 1), ready("r2", Role.REPLACEMENT), last_resize=ago(900), virtualShards=4), None),
    ("grow with virtual shards: the standby first, then a replacement, a spare left a spare",
     view(2, (0, 1), ready("s"), ready("r3", Role.REPLACEMENT), ready("w3", Role.STANDBY), last_resize=ago(900),
          virtualShards=4),
     (el.Direction.GROW, 4, ((0, 0), (1, 1)), (("w3", 2), ("r3", 3)), ())),
    ("partial grow: two of three missing return", view(1, (0,), ready("a"), ready("b"), last_resize=ago(900)),
     (el.Direction.GROW, 3, ((0, 0),), (("a", 1), ("b", 2)), ())),
]


@pytest.mark.parametrize("v,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_resize(v: ElasticView, expected: Any) -> None:
    got = decide_resize(v)
    if expected is None:
        assert got is None
    elif isinstance(expected, el.Reason):
        assert isinstance(got, Wait) and got.condition.reason == expected.value, got
        assert (got.condition.type, got.condition.status) == (el.DEGRADED, "True")
    else:
        assert isinstance(got, Resize), got
        assert (got.direction, got.size, got.keep, got.join, got.stand_by) == expected
        assert got.size_from == v.size
        ids = sorted([new for _, new in got.keep] + [i for _, i in got.join])
        assert ids == list(range(got.size)), "process ids must stay contiguous 0..size-1"


def test_never_both_a_loss_is_judged_before_a_grow() -> None:
    """A lost worker and ready capacity at once: the capacity fills the loss (today's restart), never a grow."""
    assert decide_resize(view(3, (0, 2), ready("s"), ready("t"), stuck("r1", 300), last_resize=ago(900))) is None


def test_shrink_names_the_pod_the_scheduler_and_since_when() -> None:
    got = decide_resize(view(4, (0, 1, 3), stuck("llama-r1", 75)))
    assert isinstance(got, Resize)
    c = got.condition
    assert (c.type, c.status, c.reason) == (el.DEGRADED, "True", "Shrunk")
    assert c.message == (f"training on 3 of 4 workers since 2026-11-28T12:00:00Z: pod llama-r1 (replacement for "
                         f"a lost worker) unschedulable since 2026-11-28T11:58:45Z: {FULL}")
    assert (got.event.reason, got.event.type) == (el.SHRINKING, "Warning")
    assert got.event.message == (f"shrinking from 4 to 3 workers: pod llama-r1 (replacement for a lost worker) "
                                 f"unschedulable for 75 s since 2026-11-28T11:58:45Z: {FULL}; process 3 -> 2")


def test_grow_back_to_full_size_clears_degraded() -> None:
    got = decide_resize(view(3, (0, 1, 2), ready("llama-spare-x"), last_resize=ago(300)))
    assert isinstance(got, Resize)
    assert got.condition == Condition(el.DEGRADED, "False", "FullSize",
                                      "training on all 4 workers again since 2026-11-28T12:00:00Z")
    assert (got.event.reason, got.event.type) == (el.GROWING, "Normal")
    assert got.event.message == ("growing from 3 to 4 workers: capacity returned; pod llama-spare-x (spare) takes "
                                 "process 3")


def test_a_partial_grow_stays_degraded() -> None:
    got = decide_resize(view(1, (0,), ready("a"), ready("b"), last_resize=ago(900)))
    assert isinstance(got, Resize) and (got.condition.status, got.condition.reason) == ("True", "Shrunk")
    assert got.condition.message.startswith("training on 3 of 4 workers since 2026-11-28T12:00:00Z")


def test_a_wait_below_the_minimum_says_why_and_stays_the_same() -> None:
    first = decide_resize(view(2, (1,), stuck("llama-r0", 120), minReplicas=2))
    later = decide_resize(replace(view(2, (1,), stuck("llama-r0", 120), minReplicas=2), now=NOW + timedelta(60)))
    assert isinstance(first, Wait) and first == later, "the message must not change while nothing does"
    assert first.condition.message == (
        "waiting for capacity: 1 worker(s) could train, fewer than spec.elastic.minReplicas 2; pod llama-r0 "
        f"(replacement for a lost worker) unschedulable since 2026-11-28T11:58:00Z: {FULL}")


def test_the_mesh_that_cannot_shrink_names_the_axis_and_the_sizes() -> None:
    got = decide_resize(view(4, (0, 1, 3), stuck("r2", 60), virtualShards=8, minReplicas=3))
    assert isinstance(got, Wait)
    assert "the data-parallel axis of 8 virtual shards (spec.elastic.virtualShards) cannot be split over the 3 " \
           "worker(s)" in got.condition.message
    assert "the sizes from minReplicas 3 to replicas 4 that divide 8 are 4;" in got.condition.message


def test_shrink_event_with_a_standby() -> None:
    got = decide_resize(view(4, (0, 1, 3), stuck("r2", 60), virtualShards=8))
    assert isinstance(got, Resize)
    assert got.event.message.endswith("every surviving process keeps its id; process(es) 3 stand by (no allowed "
                                      "size fits them)")


@pytest.mark.parametrize("elastic,replicas,expected", [
    ({"minReplicas": 2}, 4, (2, 3, 4)),
    ({"minReplicas": 1, "virtualShards": 8}, 4, (1, 2, 4)),
    ({"minReplicas": 3, "virtualShards": 12}, 6, (3, 4, 6)),
    ({"minReplicas": 4}, 4, (4,)),
])
def test_sizes(elastic: dict[str, Any], replicas: int, expected: tuple[int, ...]) -> None:
    assert el.sizes(ElasticSpec.model_validate(elastic), replicas) == expected


LOOKS = [
    ("lost, replacement refused 45 s of 60", view(4, (0, 1, 3), stuck("r1", 45)), 15.0),
    ("lost, replacement overdue", view(4, (0, 1, 3), stuck("r1", 90)), None),
    ("lost, the spare in its index refused 45 s of 60 (make demo waited 25 s for an unrelated event)",
     view(4, (0, 1, 3), stuck("s", 45, Role.SPARE)), 15.0),
    ("capacity waits for the interval", view(3, (0, 1, 2), ready("s"), last_resize=ago(100)), 200.0),
    ("shrunk, no capacity", view(3, (0, 1, 2), last_resize=ago(100)), None),
    ("full size", view(), None),
]


@pytest.mark.parametrize("v,expected", [c[1:] for c in LOOKS], ids=[c[0] for c in LOOKS])
def test_next_look(v: ElasticView, expected: float | None) -> None:
    assert el.next_look(v) == expected


SETTLED = [
    ("resumed after a wait below the minimum", view(), Condition(el.DEGRADED, "True", "BelowMinReplicas", "..."),
     Condition(el.DEGRADED, "False", "FullSize", "training on all 4 workers")),
    ("never degraded: no condition at all", view(), None, None),
    ("already clear", view(), Condition(el.DEGRADED, "False", "FullSize", "x"), None),
    ("still shrunk: the resize's words stay", view(3, (0, 1, 2)), Condition(el.DEGRADED, "True", "Shrunk", "x"), None),
    ("full size but a worker lost", view(4, (0, 1, 2)), Condition(el.DEGRADED, "True", "BelowMinReplicas", "x"), None),
    ("a wait below the minimum ended on fewer workers: it trains shrunk, it no longer waits", view(2, (0, 1)),
     Condition(el.DEGRADED, "True", "BelowMinReplicas", "waiting for capacity: 0 worker(s) could train, ..."),
     Condition(el.DEGRADED, "True", "Shrunk", "training on 2 of 4 workers: capacity returned for some of them")),
    ("a wait for an allowed size ended on fewer workers", view(2, (0, 1)),
     Condition(el.DEGRADED, "True", "NoAllowedSize", "waiting for capacity: ..."),
     Condition(el.DEGRADED, "True", "Shrunk", "training on 2 of 4 workers: capacity returned for some of them")),
    ("shrunk and a worker lost: nothing to say yet", view(2, (0,)),
     Condition(el.DEGRADED, "True", "BelowMinReplicas", "x"), None),
]


@pytest.mark.parametrize("v,current,expected", [c[1:] for c in SETTLED], ids=[c[0] for c in SETTLED])
def test_settled(v: ElasticView, current: Condition | None, expected: Condition | None) -> None:
    assert el.settled(v, current) == expected


def test_candidate_reads_the_schedulers_condition() -> None:
    pod = {"metadata": {"name": "llama-r1"}, "spec": {}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": FULL,
         "lastTransitionTime": "2026-11-28T11:58:45Z"}]}}
    assert el.candidate(pod, Role.REPLACEMENT, False) == stuck("llama-r1", 75)
    placed = {"metadata": {"name": "llama-r1"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}
    assert el.candidate(placed, Role.REPLACEMENT, False) == coming("llama-r1")


def test_elastic_view_of_a_job() -> None:
    plain = make_job(replicas=4).with_command("python", "t.py").model()
    assert el.elastic_view(plain, (0, 1, 2, 3), (), NOW) is None
    job = make_job(replicas=4, elastic={"minReplicas": 2}).with_command("python", "t.py")
    fresh = el.elastic_view(job.model(), (3, 0, 1), (), NOW)
    assert fresh is not None and (fresh.size, fresh.alive, fresh.last_resize) == (4, (0, 1, 3), None)
    shrunk = job.with_status(currentWorkers=3, lastResizeTime="2026-11-28T11:55:00Z").model()
    got = el.elastic_view(shrunk, (0, 1, 2), (), NOW)
    assert got is not None and (got.size, got.last_resize) == (3, ago(300))


def test_pod_candidates_name_a_probe_that_never_joined_a_replacement_and_a_left_out_worker_a_standby() -> None:
    """The Growing Event says what the pod is: the e2e's second grow named a replacement made for attempt 4 (a
    probe that got a node only during attempt 5) ``(standby)``, a word for a survivor a shrink left out."""
    from reprieve_operator.policy.views import PodView

    probe = PodView("el-1-wqt7k", "worker", 1, 4, ip="10.0.0.2", node="n2")  # made for attempt 4, never ran
    left_out = PodView("el-2", "worker", 2, 1, ip="10.0.0.3", node="n3", exit_attempt=4, exit_code=42)
    found = el.pod_candidates([probe, left_out], {"el-0-dldh4": 0}, 5, (), {})
    assert [(c.pod, c.role) for c in found] == [("el-1-wqt7k", Role.REPLACEMENT), ("el-2", Role.STANDBY)]
