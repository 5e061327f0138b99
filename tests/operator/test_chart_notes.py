"""The chart's NOTES work for someone who installed it from a registry: no paths into this repository, the
commands to check that the operator is up and which replica leads, `kubectl explain`, an inline job that the
CRD accepts (tests/operator/test_chart_install_integration.py applies it to the real API server), the docs URL.

`helm template` does not render NOTES (and ``helm install --dry-run`` wants a cluster), so a copy of the chart
gets one extra template that renders NOTES.txt with ``tpl`` into a ConfigMap, with the same values and helpers.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import CHART, KUBE_VERSION, helm

pytestmark = pytest.mark.unit

# What a chart user does not have: paths into the repository.
REPO_PATHS = re.compile(r"(?<![\w/.])(examples|crds|docs|charts|hack|operator|runtime)/")

PROBE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: notes-under-test
data:
  notes: |
{{ tpl (.Files.Get "notes-under-test.txt") . | indent 4 }}
"""


@pytest.fixture(scope="module")
def chart_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("chart") / "reprieve"
    shutil.copytree(CHART, dest)
    shutil.copy(CHART / "templates" / "NOTES.txt", dest / "notes-under-test.txt")
    (dest / "templates" / "notes-under-test.yaml").write_text(PROBE)
    return dest


def notes(chart: Path, *sets: str) -> str:
    args = ["template", "reprieve", str(chart), "-n", "ml-platform", "--kube-version", KUBE_VERSION,
            "--show-only", "templates/notes-under-test.yaml", *[a for s in sets for a in ("--set", s)]]
    return str(yaml.safe_load(helm(*args).stdout)["data"]["notes"])


def example_job(text: str) -> dict[str, Any]:
    """The inline manifest of the notes: a heredoc whose closing `EOF` starts its line (else a shell never ends
    it when the block is pasted)."""
    body = text.split("kubectl apply -f - <<'EOF'\n", 1)[1]
    assert "\nEOF\n" in body, "the heredoc's EOF must start its line"
    return yaml.safe_load(body.split("\nEOF\n", 1)[0])  # type: ignore[no-any-return]


def test_default_notes(chart_copy: Path) -> None:
    text = notes(chart_copy)
    assert not REPO_PATHS.search(text), REPO_PATHS.search(text)
    assert "kubectl -n ml-platform rollout status deployment/reprieve" in text
    assert "app.kubernetes.io/instance=reprieve,app.kubernetes.io/name=reprieve" in text
    # The Lease the replicas elect on: the Deployment's --leader-election-name, in the release namespace.
    assert "kubectl -n ml-platform get lease reprieve -o jsonpath='{.spec.holderIdentity}" in text
    assert "kubectl -n ml-platform logs \"$(kubectl -n ml-platform get lease reprieve" in text
    assert "kubectl explain trainingjob.spec" in text
    assert "https://github.com/reprieve-dev/reprieve/blob/v0.1.0/docs/operator.md" in text
    assert "`edit` or `admin`" in text and "reprieve-editor" in text
    job = example_job(text)
    assert job["apiVersion"] == "reprieve.dev/v1alpha1" and job["kind"] == "TrainingJob"
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "ghcr.io/reprieve-dev/reprieve-example:0.1.0"  # the release's example image


def test_notes_follow_the_values(chart_copy: Path) -> None:
    text = notes(chart_copy, "replicaCount=0", "crds.enabled=false", "rbac.aggregateClusterRoles=false",
                 "watchNamespaces={ml,research}")
    assert not REPO_PATHS.search(text), REPO_PATHS.search(text)
    assert "kubectl -n ml-platform create token reprieve --duration=24h" in text
    assert "rollout status" not in text and "get lease" not in text
    assert "--set crds.enabled=true" in text and "--show-only templates/crd.yaml" in text
    assert "It watches TrainingJobs in: ml, research." in text
    assert "bind them there to the ClusterRole reprieve-editor" in text
    no_election = notes(chart_copy, "replicaCount=1", "leaderElection.enabled=false")
    assert "get lease" not in no_election and "logs deployment/reprieve" in no_election
