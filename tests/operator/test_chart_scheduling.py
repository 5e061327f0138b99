"""Where the chart puts the operator: its PriorityClass, the affinity that keeps it off spot nodes and spreads its
replicas, and the PodDisruptionBudget (rendered; tests/operator/test_chart_install_integration.py runs them
against the real scheduler)."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import yaml
from test_chart import by_kind, render, template

pytestmark = pytest.mark.unit

SPOT_LABELS = {
    "cloud.google.com/gke-spot": ["true"],
    "cloud.google.com/gke-preemptible": ["true"],
    "eks.amazonaws.com/capacityType": ["SPOT"],
    "karpenter.sh/capacity-type": ["spot"],
    "kubernetes.azure.com/scalesetpriority": ["spot"],
}
SELECTOR = {"app.kubernetes.io/name": "reprieve", "app.kubernetes.io/instance": "r"}


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = by_kind(docs, "Deployment")
    return dep["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def avoided(term: dict[str, Any]) -> dict[str, list[str]]:
    return {e["key"]: e["values"] for e in term.get("matchExpressions", []) if e["operator"] == "NotIn"}


def test_priority_class_is_created_and_used() -> None:
    docs = render()
    (pc,) = by_kind(docs, "PriorityClass")
    assert pc["metadata"]["name"] == "r-reprieve-operator"
    # High, but a user-definable value (<= 1e9) below system-cluster-critical (2e9); never the cluster default.
    assert pc["value"] == 1_000_000 and pc["globalDefault"] is False
    assert pod_spec(docs)["priorityClassName"] == "r-reprieve-operator"


@pytest.mark.parametrize("sets,created,used", [
    (["priorityClassName=platform-critical"], True, "platform-critical"),
    (["priorityClass.create=false", "priorityClassName=platform-critical"], False, "platform-critical"),
    (["priorityClass.create=false"], False, None),
    (["priorityClass.value=50000"], True, "r-reprieve-operator"),
])
def test_priority_class_opt_out_and_override(sets: list[str], created: bool, used: str | None) -> None:
    docs = render(*sets)
    assert bool(by_kind(docs, "PriorityClass")) is created
    assert pod_spec(docs).get("priorityClassName") == used
    if "priorityClass.value=50000" in sets:
        assert by_kind(docs, "PriorityClass")[0]["value"] == 50000


def test_default_affinity_refuses_every_clouds_spot_nodes_and_spreads_replicas() -> None:
    affinity = pod_spec(render())["affinity"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert avoided(term) == SPOT_LABELS
    (spread,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread["weight"] == 100
    assert spread["podAffinityTerm"] == {"labelSelector": {"matchLabels": SELECTOR},
                                         "topologyKey": "kubernetes.io/hostname"}
    (dep,) = by_kind(render(), "Deployment")
    assert dep["spec"]["selector"]["matchLabels"] == SELECTOR  # the anti-affinity selects exactly these pods


def test_user_affinity_keeps_spot_avoidance_in_every_required_term() -> None:
    """Kubernetes ORs node selector terms: each of the user's terms gets the spot expressions ANDed in (a term
    of our own next to theirs would let spot nodes back in); their preferences and anti-affinity are kept."""
    user = {"affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                                                                   "values": ["a"]}]}}],
        },
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"team": "ml"}}, "topologyKey": "zone"}]},
    }}
    affinity = render_values(user)["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    assert all(avoided(t) == SPOT_LABELS for t in terms)
    assert {"key": "pool", "operator": "In", "values": ["system"]} in terms[0]["matchExpressions"]
    assert terms[1]["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
        user["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["podAntiAffinity"] == user["affinity"]["podAntiAffinity"]  # theirs replaces the spread


def render_values(values: dict[str, Any]) -> dict[str, Any]:
    """The operator pod spec rendered with a values file (what `--set` cannot express)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        return pod_spec(render(args=("-f", f.name)))


@pytest.mark.parametrize("sets,expect_avoid,expect_spread", [
    (["avoidSpotNodes.enabled=false"], {}, True),
    (["avoidSpotNodes.nodeLabels.karpenter\\.sh/capacity-type=null"],
     {k: v for k, v in SPOT_LABELS.items() if k != "karpenter.sh/capacity-type"}, True),
    (["avoidSpotNodes.nodeLabels.example\\.com/lifecycle={spot,preemptible}"],
     {**SPOT_LABELS, "example.com/lifecycle": ["spot", "preemptible"]}, True),
    (["spreadReplicas=false"], SPOT_LABELS, False),
    (["replicaCount=1"], SPOT_LABELS, False),  # nothing to spread
])
def test_affinity_switches(sets: list[str], expect_avoid: dict[str, list[str]], expect_spread: bool) -> None:
    affinity = pod_spec(render(*sets)).get("affinity", {})
    terms = affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {}) \
        .get("nodeSelectorTerms", [])
    assert (avoided(terms[0]) if terms else {}) == expect_avoid
    assert ("podAntiAffinity" in affinity) is expect_spread


def test_pod_disruption_budget_keeps_one_replica_through_a_drain() -> None:
    docs = render()
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a crash-looping replica blocks no drain
    (dep,) = by_kind(docs, "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["metadata"]["namespace"] == "reprieve-system"


@pytest.mark.parametrize("sets", [["replicaCount=1", "leaderElection.enabled=false"], ["replicaCount=0"],
                                  ["podDisruptionBudget.enabled=false"]])
def test_no_budget_that_would_block_every_drain(sets: list[str]) -> None:
    assert not by_kind(render(*sets), "PodDisruptionBudget")


def test_budget_at_or_above_the_replicas_is_refused() -> None:
    out = template("--set", "podDisruptionBudget.minAvailable=2")
    assert out.returncode != 0
    assert "podDisruptionBudget.minAvailable must be below replicaCount (2), got 2" in out.stderr, out.stderr
    (pdb,) = by_kind(render("replicaCount=3", "podDisruptionBudget.minAvailable=2"), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2
