"""The Helm chart: lint, render, documented values, schema, commented RBAC, restricted pod, CRD handling.

The helpers here (``render``, ``template``) serve the other ``test_chart_*`` modules too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

CHART = Path(__file__).resolve().parents[2] / "charts" / "reprieve"


def _helm() -> str:
    found = shutil.which("helm") or str(Path.home() / ".cache/reprieve/bin/helm")
    if not os.access(found, os.X_OK):
        pytest.skip("helm binary not found (built by hack/localcluster into ~/.cache/reprieve/bin)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=60, check=check)


# `helm template` assumes Kubernetes 1.20 unless told, and the chart needs 1.30 (Chart.yaml kubeVersion).
KUBE_VERSION = "1.31.0"


def template(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``helm template r CHART -n reprieve-system --kube-version 1.31.0 ARGS`` (not checked by default)."""
    return helm("template", "r", str(CHART), "-n", "reprieve-system", "--kube-version", KUBE_VERSION, *args,
                check=check)


def render(*sets: str, args: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    flags = [a for s in sets for a in ("--set", s)]
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 6,000 lines: libyaml parses it 3x faster
    return [d for d in yaml.load_all(template(*flags, *args, check=True).stdout, Loader=loader) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operator_role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's own ClusterRole (not the editor/viewer ones for people)."""
    (role,) = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "r-reprieve"]
    return role


def test_lint() -> None:
    out = helm("lint", "--strict", str(CHART), check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_default_render() -> None:
    docs = render()
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
                                               "CustomResourceDefinition", "Deployment", "PodDisruptionBudget",
                                               "PriorityClass", "Role", "RoleBinding", "ServiceAccount"]
    (lease_role,) = by_kind(docs, "Role")
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                    "verbs": ["get", "create", "update"]}]
    (crd,) = by_kind(docs, "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    (dep,) = by_kind(docs, "Deployment")
    # Two replicas with leader election: a drained operator node does not stop notices.
    assert dep["spec"]["replicas"] == 2 and "strategy" not in dep["spec"]
    assert "--leader-elect" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    env = {e["name"]: e.get("value") for e in c["env"]}
    signals = yaml.safe_load(env["REPRIEVE_SIGNALS_JSON"])
    from reprieve_operator.policy.signals import BUILTIN_SIGNALS, signal_table

    defaults = {s.name: s.notice_seconds for s in BUILTIN_SIGNALS}
    assert {s.name: s.notice_seconds for s in signal_table(signals)} == defaults  # chart == code defaults
    assert not any(a.startswith("--namespace") for a in c["args"])


def test_values_switches() -> None:
    docs = render("replicaCount=0", "crds.enabled=false", "watchNamespaces={ml,team-*}", "metrics.service=true",
                  "crds.keep=false")
    assert not by_kind(docs, "CustomResourceDefinition")
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["replicas"] == 0
    assert [a for a in dep["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--namespace")] \
        == ["--namespace=ml", "--namespace=team-*"]
    role = operator_role(docs)
    assert any("namespaces" in r["resources"] for r in role["rules"])
    assert by_kind(docs, "Service")
    crd = by_kind(render("crds.keep=false"), "CustomResourceDefinition")[0]
    assert "annotations" not in crd["metadata"]


def test_the_kueue_switch_adds_the_flag_and_exactly_its_rbac() -> None:
    def kueue_rules(docs: list) -> list:
        return [r for d in docs if d.get("kind") in ("ClusterRole", "Role") and d["metadata"]["name"] == "r-reprieve"
                for r in d.get("rules") or [] if "kueue.x-k8s.io" in r["apiGroups"]]

    off = render()
    (dep,) = by_kind(off, "Deployment")
    assert "--kueue" not in dep["spec"]["template"]["spec"]["containers"][0]["args"] and not kueue_rules(off)
    on = render("kueue.enabled=true")
    (dep,) = by_kind(on, "Deployment")
    assert "--kueue" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    got = {tuple(r["resources"]): tuple(r["verbs"]) for r in kueue_rules(on)}
    assert got == {("workloads",): ("get", "list", "watch", "create", "delete", "patch"),
                   ("workloads/status",): ("get", "patch"),
                   ("resourceflavors", "workloadpriorityclasses"): ("get",)}


@pytest.mark.parametrize("bad,needle", [
    ("replicaCount=9", "replicaCount"),
    ("leaderElection.enabled=false", "replicaCount > 1 needs leaderElection.enabled=true"),
    ("signals.builtin.gce-spot.enabled=true", "gce-spot"),
    ("crds.enabled=false,signals.builtin.gce-spot.enabled=true", "not a built-in signal"),  # names without the CRD
    ("signals.builtin.gke-spot.noticeSeconds=-1", "noticeSeconds"),
    ("metrics.port=70000", "port"),
    ("logLevel=LOUD", "logLevel"),
    ("unknownKey=1", "unknownKey"),
    ("priorityClass.value=2000000000", "priorityClass/value"),
    ("podDisruptionBudget.minAvailable=0", "podDisruptionBudget/minAvailable"),
    ("metrics.serviceMonitor.interval=often", "serviceMonitor/interval"),
    ("avoidSpotNodes.nodeLabels.pool=spot", "avoidSpotNodes/nodeLabels/pool"),
    ("rbac.aggregateClusterRoles=maybe", "aggregateClusterRoles"),
])
def test_schema_rejects_bad_values(bad: str, needle: str) -> None:
    out = template("--set", bad)
    assert out.returncode != 0 and needle in out.stderr, out.stderr


def test_every_value_is_documented() -> None:
    """Each key has a `# --` comment in the comment block above it, or inherits one from its parent."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w-]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        block = []
        while j >= 0 and lines[j].strip().startswith("#"):
            block.append(lines[j])
            j -= 1
        documented = any("# --" in b for b in block) or any(d for _, d in stack)
        is_section = not line.split(":", 1)[1].strip()  # children carry their own docs
        if not documented and not is_section:
            undocumented.append(line.strip())
        stack.append((indent, documented))
    assert not undocumented, f"values without a '# --' comment: {undocumented}"


@pytest.mark.parametrize("name", ["clusterrole.yaml", "user-clusterroles.yaml"])
def test_every_clusterrole_rule_is_commented(name: str) -> None:
    rule_lines = (CHART / "templates" / name).read_text().splitlines()
    rules = 0
    for i, line in enumerate(rule_lines):
        if line.strip().startswith("- apiGroups:"):
            rules += 1
            prev = [p for p in rule_lines[:i] if p.strip() and not p.strip().startswith("{{")]
            assert prev[-1].strip().startswith("#"), f"{name}: rule without a comment: {line.strip()}"
    assert rules >= 2


def test_kube_version_is_required() -> None:
    """The CRD's CEL rules need 1.30: Chart.yaml says so, helm refuses older clusters and takes providers'
    pre-release versions (v1.30.5-gke.1014001)."""
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.30.0-0"
    old = helm("template", "r", str(CHART), "--kube-version", "1.29.9", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr and "v1.29.9" in old.stderr, old.stderr
    for ok in ("1.30.0", "1.30.5-gke.1014001", "1.35.4"):
        out = helm("template", "r", str(CHART), "--kube-version", ok, check=False)
        assert out.returncode == 0, out.stderr


def test_user_clusterroles_aggregate_into_edit_and_view() -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(render(), "ClusterRole")}
    editor, viewer = roles["r-reprieve-editor"], roles["r-reprieve-viewer"]
    assert {k: v for k, v in editor["metadata"]["labels"].items() if k.startswith("rbac.")} == {
        "rbac.authorization.k8s.io/aggregate-to-edit": "true", "rbac.authorization.k8s.io/aggregate-to-admin": "true"}
    assert {k: v for k, v in viewer["metadata"]["labels"].items() if k.startswith("rbac.")} == {
        "rbac.authorization.k8s.io/aggregate-to-view": "true"}

    def grants(role: dict[str, Any]) -> dict[str, set[str]]:
        return {r: set(rule["verbs"]) for rule in role["rules"] for r in rule["resources"]
                if rule["apiGroups"] == ["reprieve.dev"]}

    read = {"get", "list", "watch"}
    assert grants(viewer) == {"trainingjobs": read, "trainingjobs/status": read}
    assert grants(editor) == {"trainingjobs": read | {"create", "update", "patch", "delete", "deletecollection"},
                              "trainingjobs/status": read}  # status is the operator's to write
    plain = {r["metadata"]["name"]: r for r in by_kind(render("rbac.aggregateClusterRoles=false"), "ClusterRole")}
    assert not any(k.startswith("rbac.") for k in plain["r-reprieve-editor"]["metadata"]["labels"])
    assert grants(plain["r-reprieve-editor"]) == grants(editor)


def test_chart_rbac_covers_what_the_operator_creates() -> None:
    """Every kind the operator creates for a job is creatable under the chart's ClusterRole."""
    role = operator_role(render())
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    for group, resource in [("", "pods"), ("", "services"), ("", "serviceaccounts"),
                            ("rbac.authorization.k8s.io", "roles"), ("rbac.authorization.k8s.io", "rolebindings")]:
        assert (group, resource, "create") in granted
    for verb in ("get", "list", "watch", "patch"):  # the operator must hold what the worker Role grants
        assert ("", "pods", verb) in granted


def test_namespaced_rbac_grants_pod_rights_only_in_the_watched_namespaces() -> None:
    docs = render("rbac.namespaced=true", "watchNamespaces={ml,team}")
    cluster_role = operator_role(docs)
    cluster_resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert cluster_resources == {"customresourcedefinitions", "namespaces", "nodes"}
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in cluster_role["rules"])
    roles = by_kind(docs, "Role")
    namespaced = {r["metadata"]["namespace"] for r in roles if "pods" in str(r["rules"])}
    assert namespaced == {"ml", "team"}
    assert {b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")} >= {"ml", "team"}


@pytest.mark.parametrize("bad,needle", [
    (["rbac.namespaced=true"], "rbac.namespaced=true needs watchNamespaces"),
    (["rbac.namespaced=true", "watchNamespaces={team-*}"], "needs literal namespaces"),
])
def test_namespaced_rbac_refuses_what_it_cannot_grant(bad: list[str], needle: str) -> None:
    args = [a for b in bad for a in ("--set", b)]
    out = template(*args)
    assert out.returncode != 0 and needle in out.stderr, out.stderr


@pytest.mark.parametrize("tag", ["9711789198e1", "0123456789ab", "123456", "v0.1.0"])
def test_the_operator_values_the_tests_install_with_keep_a_content_tag_a_string(tag: str, tmp_path: Path) -> None:
    """A content tag of hack/build-images.sh can look like a number to helm (9711789198e1 is 9.7e13): the values
    file localcluster.stack writes must still give the chart a string (its schema refuses a number)."""
    from localcluster.stack import operator_values

    values = tmp_path / "values.yaml"
    values.write_text(operator_values(f"reprieve.local/reprieve-operator:{tag}", node_selector={"pool": "system"}))
    docs = [d for d in yaml.safe_load_all(template("-f", str(values), check=True).stdout) if d]
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"] == f"reprieve.local/reprieve-operator:{tag}"
