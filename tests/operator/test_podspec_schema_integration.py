"""The PodSpec schema embedded in the CRD: generated from the control plane's own OpenAPI, shown by
``kubectl explain``, and current (regenerating it from the local API server changes nothing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_embedded_pod_spec_schema_matches_the_api_server(cluster: Any) -> None:
    sys.path.insert(0, str(REPO / "hack"))
    import gen_podspec_schema as gen

    openapi = json.loads(cluster.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    fresh = gen.render(gen.pod_spec_schema(openapi))
    assert gen.OUT.read_text() == fresh, (
        f"{gen.OUT.relative_to(REPO)} is out of date for this Kubernetes version: run "
        f"python hack/gen_podspec_schema.py --kubeconfig <a cluster's kubeconfig>, then python -m "
        f"reprieve_operator.crdgen")


@pytest.mark.parametrize("path,needles", [
    ("trainingjob.spec.template.spec", ["containers", "nodeSelector", "tolerations", "List of containers"]),
    ("trainingjob.spec.template.spec.containers.resources",
     ["Compute Resources required by this container", "limits", "requests"]),
    ("trainingjob.spec.template.spec.restartPolicy", ["Only Never"]),
])
def test_kubectl_explain_documents_the_pod_template(cluster: Any, chart: str, path: str,
                                                    needles: list[str]) -> None:
    out = cluster.kubectl("explain", path).stdout
    missing = [n for n in needles if n not in out]
    assert not missing, f"kubectl explain {path} lacks {missing}:\n{out[:2000]}"
