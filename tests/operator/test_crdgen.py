"""The checked-in CRD (crds/ and the chart) is exactly what the models generate, and is structural; the chart's
template names exactly the built-in signals (``reprieve.builtinSignals``, what ``signals.builtin`` accepts)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from reprieve_operator import crdgen

pytestmark = pytest.mark.unit


def test_checked_in_crds_match_the_models() -> None:
    assert crdgen.CRD_PATH.read_text() == crdgen.render_plain(), \
        "crds/ drifted from models.py: run python -m reprieve_operator.crdgen"
    assert crdgen.CHART_CRD_PATH.read_text() == crdgen.render_chart(), \
        "charts/reprieve/templates/crd.yaml drifted: run python -m reprieve_operator.crdgen"
    assert crdgen.main(["--check"]) == 0


def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_schema_is_structural() -> None:
    crd = yaml.safe_load(crdgen.CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "title" not in node, path
        # anyOf only as Kubernetes allows it: int-or-string (Quantity, IntOrString in the embedded PodSpec).
        assert "anyOf" not in node or node.get("x-kubernetes-int-or-string") is True, path
        assert node.get("additionalProperties") is not False, f"{path}: additionalProperties false"
        if "properties" in node:
            assert node.get("type") == "object", f"{path}: properties without type object"


def test_validation_rules_and_columns() -> None:
    crd = yaml.safe_load(crdgen.CRD_PATH.read_text())
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    immutable = [k for k, v in spec.items()
                 if any(r["rule"] == "self == oldSelf" for r in v.get("x-kubernetes-validations", []))]
    assert sorted(immutable) == ["coordinatorPort", "replicas", "restartMode", "template"]
    code_rules = [r["rule"] for r in spec["restartPolicy"]["properties"]["restartExitCode"]["x-kubernetes-validations"]]
    assert code_rules == ["self >= 3 && self <= 125", "self == oldSelf"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == \
        ["Phase", "Ready", "Desired", "Current", "Step", "Goodput", "Attempt", "Restarts", "Age", "Checkpoint", "Mode"]
    # kubectl get tj shows the sizes (every job has them once it runs); -o wide adds the rest
    assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0] == \
        ["Phase", "Ready", "Desired", "Current", "Step", "Goodput", "Attempt", "Restarts", "Age"]
    assert crd["spec"]["names"]["shortNames"] == ["tj"]
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
