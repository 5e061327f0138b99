"""node_notice: one row per built-in signal key and per kind, plus precedence, overrides and malformed nodes; and
the compact Node the operator keeps gives every signal the same notice."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from reprieve_operator.models import BUILTIN_SIGNAL_NAMES, PreemptionSpec
from reprieve_operator.policy import signals as sg
from reprieve_operator.policy.placement import could_schedule
from reprieve_operator.policy.signals import BUILTIN_SIGNALS, node_notice, signal_table, signals_for_job
from reprieve_operator.policy.views import NODE_FIELDS, compact_node

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)
ADDED = "2026-11-22T02:59:50Z"
AWS = "aws-node-termination-handler"


def node(taints: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None,
         conditions: list[dict[str, Any]] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": "node-a", "labels": labels or {}},
            "spec": {"taints": taints or [], "unschedulable": unschedulable},
            "status": {"conditions": conditions or [{"type": "Ready", "status": "True"}]}}


def taint(key: str, effect: str = "NoSchedule", **kw: str) -> dict[str, Any]:
    return {"key": key, "effect": effect, **kw}


# (signal reason, node, expected observedAt, expected deadline)
ROWS = [
    ("gke-spot", node([taint("cloud.google.com/impending-node-termination", "NoSchedule")]), NOW, NOW + timedelta(seconds=15)),
    ("gke-maintenance-ongoing", node(labels={"cloud.google.com/active-node-maintenance": "ONGOING"}), NOW,
     NOW + timedelta(seconds=30)),
    ("gke-scheduled-maintenance", node(labels={"cloud.google.com/scheduled-maintenance-time": str(
        int((NOW + timedelta(minutes=10)).timestamp()))}), NOW, NOW + timedelta(minutes=10)),
    ("gke-maintenance-window", node([taint("cloud.google.com/maintenance-window-started")]), NOW,
     NOW + timedelta(seconds=30)),
    ("aws-spot-itn", node([taint(f"{AWS}/spot-itn", "NoExecute", timeAdded=ADDED)]),
     NOW - timedelta(seconds=10), NOW + timedelta(seconds=20)),
    ("aws-scheduled-maintenance", node([taint(f"{AWS}/scheduled-maintenance")]), NOW, NOW + timedelta(seconds=30)),
    ("aws-asg-lifecycle", node([taint(f"{AWS}/asg-lifecycle-termination")]), NOW, NOW + timedelta(seconds=30)),
    ("aws-rebalance", node([taint(f"{AWS}/rebalance-recommendation", "PreferNoSchedule")]), NOW,
     NOW + timedelta(seconds=30)),
    ("karpenter-disrupted", node([taint("karpenter.sh/disrupted")]), NOW, NOW + timedelta(seconds=30)),
    ("cluster-autoscaler", node([taint("ToBeDeletedByClusterAutoscaler", value="1763780000")]), NOW,
     NOW + timedelta(seconds=30)),
    ("aks-scheduled-event", node(conditions=[{"type": "VMEventScheduled", "status": "True",
                                              "lastTransitionTime": ADDED}]),
     NOW - timedelta(seconds=10), NOW + timedelta(seconds=5)),
    ("aks-remediator", node([taint("remediator.kubernetes.azure.com/unschedulable")]), NOW,
     NOW + timedelta(seconds=15)),
    ("cordon", node(unschedulable=True), NOW, NOW + timedelta(seconds=30)),
    ("out-of-service", node([taint("node.kubernetes.io/out-of-service", "NoExecute", timeAdded=ADDED)]),
     NOW - timedelta(seconds=10), NOW - timedelta(seconds=10)),
]


def showing(sig: sg.Signal) -> dict[str, Any]:
    """A node that shows ``sig`` and nothing else, made from its row of the table (no timestamp on it)."""
    if sig.kind == sg.TAINT:
        return node([taint(sig.key, **({"value": sig.value} if sig.value is not None else {}))])
    if sig.kind == sg.LABEL:
        return node(labels={sig.key: sig.value if sig.value is not None else "yes"})
    if sig.kind == sg.LABEL_EPOCH:
        return node(labels={sig.key: str(int((NOW + timedelta(hours=1)).timestamp()))})
    if sig.kind == sg.CONDITION:
        return node(conditions=[{"type": sig.key, "status": sig.value or "True"}])
    return node(unschedulable=True)


@pytest.mark.parametrize("sig", BUILTIN_SIGNALS, ids=BUILTIN_SIGNAL_NAMES)
def test_every_builtin_signal_is_seen_on_a_node_made_from_its_row(sig: sg.Signal) -> None:
    """No test row to add with a new built-in signal: its row in the table is enough (the hand-written ROWS
    above pin the rules of each kind, timestamps included)."""
    notice = node_notice(showing(sig), NOW, BUILTIN_SIGNALS)
    assert notice is not None and notice.reason == sig.name and notice.observed_at == NOW
    if sig.kind == sg.LABEL_EPOCH:  # the label is the deadline; the window is a margin before it
        assert notice.deadline == NOW + timedelta(hours=1) - timedelta(seconds=sig.notice_seconds)
    else:
        assert notice.deadline == NOW + timedelta(seconds=sig.notice_seconds) and notice.estimated
    assert node_notice(showing(sig), NOW, [s for s in BUILTIN_SIGNALS if s.name != sig.name]) is None


@pytest.mark.parametrize("reason,n,observed,deadline", ROWS, ids=[r[0] for r in ROWS])
def test_builtin_signal(reason: str, n: dict[str, Any], observed: datetime, deadline: datetime) -> None:
    notice = node_notice(n, NOW, BUILTIN_SIGNALS)
    assert notice is not None
    assert (notice.reason, notice.node, notice.observed_at, notice.deadline) == (reason, "node-a", observed, deadline)
    assert notice.id.startswith(f"{reason}/node-a/")
    # Disabling that one signal silences the node.
    others = [s for s in BUILTIN_SIGNALS if s.name != reason]
    assert node_notice(n, NOW, others) is None


QUIET = [
    ("healthy node", node()),
    ("maintenance label other value", node(labels={"cloud.google.com/active-node-maintenance": "PENDING"})),
    ("condition false", node(conditions=[{"type": "VMEventScheduled", "status": "False"}])),
    ("unrelated taint", node([taint("example.com/gpu")])),
    ("malformed maintenance time", node(labels={"cloud.google.com/scheduled-maintenance-time": "soon"})),
    ("malformed taints", {"metadata": {"name": "node-a"}, "spec": {"taints": [{"key": None}]}}),
    ("empty object", {}),
]


@pytest.mark.parametrize("n", [q[1] for q in QUIET], ids=[q[0] for q in QUIET])
def test_no_notice(n: dict[str, Any]) -> None:
    assert node_notice(n, NOW, BUILTIN_SIGNALS) is None


def test_earliest_deadline_wins_and_first_seen_is_used() -> None:
    n = node([taint(f"{AWS}/rebalance-recommendation"), taint("cloud.google.com/impending-node-termination")])
    earlier = NOW - timedelta(seconds=5)
    notice = node_notice(n, NOW, BUILTIN_SIGNALS, {"gke-spot": earlier})
    assert notice is not None and notice.reason == "gke-spot"
    assert notice.deadline == earlier + timedelta(seconds=15)
    assert notice.id == f"gke-spot/node-a/{int(earlier.timestamp())}"


def test_annotation_json_matches_contract() -> None:
    import json

    n = sg.Notice("gke-spot/node-a/1", "gke-spot", "node-a", NOW + timedelta(seconds=30), NOW)
    assert json.loads(n.annotation()) == {"id": "gke-spot/node-a/1", "reason": "gke-spot", "node": "node-a",
                                          "deadline": "2026-11-22T03:00:30Z", "observedAt": "2026-11-22T03:00:00Z"}


def test_chart_table_and_job_overrides() -> None:
    table = signal_table({"builtin": {"cordon": {"enabled": False}, "gke-spot": {"noticeSeconds": 20}},
                          "custom": [{"name": "site-drain", "type": "Label", "key": "example.com/drain",
                                      "value": "true", "noticeSeconds": 45}]})
    names = [s.name for s in table]
    assert "cordon" not in names and "site-drain" in names
    assert node_notice(node(unschedulable=True), NOW, table) is None
    drained = node_notice(node(labels={"example.com/drain": "true"}), NOW, table)
    assert drained is not None and drained.deadline == NOW + timedelta(seconds=45)

    pre = PreemptionSpec.model_validate({"signals": ["gke-spot"], "noticeSeconds": {"gke-spot": 5},
                                         "custom": [{"name": "fire", "type": "Condition", "key": "OnFire"}],
                                         "defaultNoticeSeconds": 7})
    job_sigs = signals_for_job(table, pre)
    assert {s.name for s in job_sigs} == {"gke-spot", "site-drain", "fire"}  # customs stay; builtins narrowed
    spot = node_notice(node([taint("cloud.google.com/impending-node-termination")]), NOW, job_sigs)
    assert spot is not None and spot.deadline == NOW + timedelta(seconds=5)
    fire = node_notice(node(conditions=[{"type": "OnFire", "status": "True"}]), NOW, job_sigs)
    assert fire is not None and fire.reason == "fire" and fire.deadline == NOW + timedelta(seconds=7)
    assert signals_for_job(table, PreemptionSpec(enabled=False)) == ()


@pytest.mark.parametrize("config,needle", [
    ({"builtin": {"gce-spot": {}}}, "gce-spot"),
    ({"custom": [{"name": "x", "type": "Annotation", "key": "k"}]}, "Annotation"),
    ({"custom": [{"name": "x", "type": "Taint", "key": ""}]}, "key"),
])
def test_bad_signal_table_is_rejected(config: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        signal_table(config)


# --- what the operator keeps of a Node (views.compact_node) is exactly what the signal kinds read ---
def noisy(n: dict[str, Any]) -> dict[str, Any]:
    """``n`` with what a real Node carries besides (the cache must drop it without changing any notice)."""
    out = json.loads(json.dumps(n))
    out.setdefault("metadata", {})["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    out.setdefault("spec", {})["providerID"] = "gce://p/z/node-a"
    status = out.setdefault("status", {})
    status["capacity"] = {"cpu": "8"}
    for c in status.get("conditions") or []:
        c.update(message="kubelet is posting ready status", lastHeartbeatTime="2026-11-22T02:59:59Z")
    return out


# One node per kind of signal: a kind added to signalkinds.KINDS without a row here fails the test below.
KIND_ROWS: dict[str, tuple[sg.Signal, dict[str, Any]]] = {
    sg.TAINT: (sg.Signal("t", sg.TAINT, "example.com/drain"), node([taint("example.com/drain", "NoExecute", timeAdded=ADDED)])),
    sg.LABEL: (sg.Signal("l", sg.LABEL, "example.com/drain", "true"), node(labels={"example.com/drain": "true"})),
    sg.LABEL_EPOCH: (sg.Signal("e", sg.LABEL_EPOCH, "example.com/at", notice_seconds=5),
                  node(labels={"example.com/at": str(int(NOW.timestamp()) + 60)})),
    sg.CONDITION: (sg.Signal("c", sg.CONDITION, "Draining", "True"),
                node(conditions=[{"type": "Draining", "status": "True", "lastTransitionTime": ADDED}])),
    sg.UNSCHEDULABLE: (sg.Signal("u", sg.UNSCHEDULABLE), node(unschedulable=True)),
}


def changed_by(compact: Callable[[dict[str, Any]], dict[str, Any]],
               cases: list[tuple[str, list[sg.Signal], dict[str, Any]]]) -> list[str]:
    """The cases whose notice is not the same on ``compact(node)`` as on the node itself."""
    return [name for name, sigs, n in cases
            if node_notice(compact(noisy(n)), NOW, sigs) != node_notice(noisy(n), NOW, sigs)
            or node_notice(noisy(n), NOW, sigs) is None]


def every_case() -> list[tuple[str, list[sg.Signal], dict[str, Any]]]:
    return [(r[0], list(BUILTIN_SIGNALS), r[1]) for r in ROWS] + [
        (kind, [sig], n) for kind, (sig, n) in KIND_ROWS.items()]


def test_every_kind_of_signal_has_a_row() -> None:
    assert sorted(KIND_ROWS) == sorted(sg.KINDS)


def test_the_compact_node_gives_every_signal_the_same_notice() -> None:
    assert changed_by(compact_node, every_case()) == []


def test_a_compact_node_that_drops_a_field_a_kind_reads_is_caught() -> None:
    def without_conditions(n: dict[str, Any]) -> dict[str, Any]:
        out = compact_node(n)
        out["status"].pop("conditions", None)
        return out

    assert changed_by(without_conditions, every_case()) == ["aks-scheduled-event", sg.CONDITION]


def test_a_rule_reading_a_key_its_kind_does_not_declare_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were ``lastTransitionTime`` not declared, the compact Node would drop it and the condition's deadline would
    be dated from first sight, in silence: the read itself refuses."""
    monkeypatch.setitem(sg.KINDS, sg.CONDITION, replace(sg.KINDS[sg.CONDITION],
                                                        field=sg.NodeField("status", "conditions", ("type", "status"))))
    sig, n = KIND_ROWS[sg.CONDITION]
    with pytest.raises(sg.UndeclaredNodeField, match=r"status.conditions\[\].lastTransitionTime.*add it there"):
        node_notice(n, NOW, [sig])


def test_the_compact_node_keeps_only_the_declared_fields() -> None:
    n = noisy(ROWS[0][1])
    assert compact_node(n) == {"metadata": {"name": "node-a"},
                               "spec": {"taints": [taint("cloud.google.com/impending-node-termination")]},
                               "status": {"conditions": [{"type": "Ready", "status": "True",
                                                          "lastTransitionTime": None}]}}
    declared = {(f.section, f.key) for f in NODE_FIELDS}
    assert declared == {(k.field.section, k.field.key) for k in sg.KINDS.values()} | {("spec", "unschedulable"),
                                                                              ("spec", "taints"),
                                                                              ("metadata", "labels")}


@pytest.mark.parametrize("tolerations", [[], [{"operator": "Exists"}]])
def test_placement_sees_the_same_on_the_compact_node(tolerations: list[dict[str, Any]]) -> None:
    pod = {"tolerations": tolerations, "nodeSelector": {"pool": "a"}}
    for _, n, _, _ in ROWS:
        labelled = noisy({**n, "metadata": {**n["metadata"], "labels": {**n["metadata"]["labels"], "pool": "a"}}})
        assert could_schedule(pod, compact_node(labelled)) == could_schedule(pod, labelled)


def test_a_kind_needs_a_node_field() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        sg.Signal("x", "Annotation", "example.com/drain")
