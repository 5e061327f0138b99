"""avoid_nodes: the doomed nodes a new pod must be kept off, scoped to the job and to what the scheduler allows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.placement import avoid_nodes, could_schedule, tolerates
from reprieve_operator.policy.signals import BUILTIN_SIGNALS

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)
SPOT = {"key": "cloud.google.com/impending-node-termination", "value": "true", "effect": "NoSchedule"}
MAINT = {"cloud.google.com/active-node-maintenance": "ONGOING"}


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         unschedulable: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "a", **(labels or {})}},
            "spec": {"taints": taints or [], "unschedulable": unschedulable}, "status": {}}


def job(pod: dict[str, Any] | None = None, **spec: Any) -> Any:
    body = make_job(**spec)
    body["spec"]["template"]["spec"].update(pod or {})
    return body.model()


ROWS: list[tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]], tuple[str, ...]]] = [
    ("no signals", {}, {}, [node("n0"), node("n1")], ()),
    ("maintenance label (does not block scheduling) is avoided", {}, {}, [node("n0", MAINT), node("n1")], ("n0",)),
    ("two doomed nodes anywhere: both, one requirement each", {}, {},
     [node("n0", MAINT), node("n1", MAINT), node("n2")], ("n0", "n1")),
    ("spot taint the pod does not tolerate: the scheduler keeps it off", {}, {}, [node("n0", taints=[SPOT])], ()),
    ("spot taint the pod tolerates: avoided", {"tolerations": [{"operator": "Exists"}]}, {},
     [node("n0", taints=[SPOT])], ("n0",)),
    ("cordoned: the scheduler keeps it off", {}, {}, [node("n0", unschedulable=True)], ()),
    ("a condition taint (not ready yet, unreachable) goes when the node recovers: avoided", {}, {},
     [node("n0", MAINT, [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
      node("n1", MAINT, [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])], ("n0", "n1")),
    ("another pool: nodeSelector keeps it off", {"nodeSelector": {"pool": "b"}}, {}, [node("n0", MAINT)], ()),
    ("another pool: required affinity keeps it off",
     {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
         {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]}}}}, {}, [node("n0", MAINT)], ()),
    ("job opted out of notices avoids nothing", {}, {"preemption": {"enabled": False}}, [node("n0", MAINT)], ()),
    ("job that does not listen to this signal", {}, {"preemption": {"signals": ["gke-spot"]}}, [node("n0", MAINT)], ()),
    ("job's custom signal counts", {}, {"preemption": {"custom": [
        {"name": "site-drain", "type": "Label", "key": "example.com/drain", "value": "true"}]}},
     [node("n0", {"example.com/drain": "true"}), node("n1")], ("n0",)),
    ("far-future maintenance (beyond the horizon) is not avoided", {}, {},
     [node("n0", {"cloud.google.com/scheduled-maintenance-time": str(int(NOW.timestamp()) + 7200)})], ()),
    ("maintenance within the horizon is avoided", {}, {},
     [node("n0", {"cloud.google.com/scheduled-maintenance-time": str(int(NOW.timestamp()) + 300)})], ("n0",)),
]


@pytest.mark.parametrize("pod,spec,nodes,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_avoid_nodes(pod: dict[str, Any], spec: dict[str, Any], nodes: list[dict[str, Any]],
                     expected: tuple[str, ...]) -> None:
    assert avoid_nodes(job(pod, **spec), nodes, BUILTIN_SIGNALS, NOW, 600) == expected


def test_earliest_deadlines_first_and_capped() -> None:
    nodes = [node(f"n{i:03d}", {"cloud.google.com/scheduled-maintenance-time": str(int(NOW.timestamp()) + 500 - i)})
             for i in range(150)]
    got = avoid_nodes(job(), nodes, BUILTIN_SIGNALS, NOW, 600, limit=100)
    assert len(got) == 100 and got[0] == "n149" and got[-1] == "n050"


@pytest.mark.parametrize("toleration,matches", [
    ({"operator": "Exists"}, True),
    ({"key": SPOT["key"], "operator": "Exists"}, True),
    ({"key": SPOT["key"], "value": "true"}, True),
    ({"key": SPOT["key"], "value": "false"}, False),
    ({"key": SPOT["key"], "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False),
    ({"key": "", "operator": "Equal"}, False),
])
def test_tolerates(toleration: dict[str, Any], matches: bool) -> None:
    assert tolerates([toleration], SPOT) is matches


@pytest.mark.parametrize("expr,matches", [
    ({"key": "pool", "operator": "In", "values": ["a", "b"]}, True),
    ({"key": "pool", "operator": "NotIn", "values": ["a"]}, False),
    ({"key": "pool", "operator": "Exists"}, True),
    ({"key": "gpu", "operator": "DoesNotExist"}, True),
    ({"key": "gpus", "operator": "Gt", "values": ["3"]}, True),
    ({"key": "gpus", "operator": "Lt", "values": ["3"]}, False),
])
def test_could_schedule_follows_required_affinity(expr: dict[str, Any], matches: bool) -> None:
    pod = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}}
    assert could_schedule(pod, node("n0", {"gpus": "8"})) is matches
