"""The chart installed with real helm on the local cluster (real kube-apiserver, controller-manager, scheduler):
people's rights through Kubernetes' aggregated `edit`/`view` roles, where the scheduler puts the operator
(priority, spot nodes, spread, disruption budget), bad values refused before anything is created, and the
install notes' commands run as printed."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml
from conftest import job_manifest
from localcluster.stack import CHART, RELEASE, RELEASE_NS
from localcluster.testing import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TJ = "trainingjobs.reprieve.dev"


def can(cluster: Any, user: str, *args: str) -> str:
    out = cluster.kubectl("auth", "can-i", *args, "--as", user, check=False)
    return str(out.stdout.strip())


def test_edit_and_view_holders_run_and_read_trainingjobs(cluster: Any, chart: str, namespace: str) -> None:
    """A RoleBinding to the built-in `edit` is all a user needs to run TrainingJobs in a namespace, `view` to read
    them: the chart's editor/viewer ClusterRoles are aggregated into them by the controller-manager."""
    cluster.kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit", "--user=alice", "-n", namespace)
    cluster.kubectl("create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob", "-n", namespace)
    # Aggregation is asynchronous (the clusterrole-aggregation controller); the chart was installed earlier.
    wait_for(lambda: can(cluster, "alice", "create", TJ, "-n", namespace) == "yes", 30,
             "the editor role to be aggregated into edit")
    wait_for(lambda: can(cluster, "bob", "list", TJ, "-n", namespace) == "yes", 30,
             "the viewer role to be aggregated into view")

    job = job_manifest("by-alice", namespace)
    cluster.kubectl("create", "-f", "-", "--as", "alice", input=json.dumps(job))  # as alice herself
    cluster.kubectl("patch", TJ, "by-alice", "-n", namespace, "--as", "alice", "--type=merge",
                    "-p", '{"spec": {"suspend": true}}')
    listed = cluster.kubectl("get", TJ, "-n", namespace, "--as", "bob", "-o", "name").stdout.split()
    assert listed == [f"{TJ.replace('s.', '.', 1)}/by-alice"], listed
    assert can(cluster, "bob", "watch", TJ, "-n", namespace) == "yes"
    assert can(cluster, "bob", "get", f"{TJ}/by-alice", "--subresource=status", "-n", namespace) == "yes"

    refused = cluster.kubectl("create", "-f", "-", "--as", "bob", check=False,
                              input=json.dumps(job_manifest("by-bob", namespace)))
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    for verb in ("create", "delete", "patch"):
        assert can(cluster, "bob", verb, TJ, "-n", namespace) == "no"
    for user in ("alice", "bob"):  # status is the operator's to write
        assert can(cluster, user, "patch", f"{TJ}/by-alice", "--subresource=status", "-n", namespace) == "no"
    assert can(cluster, "alice", "create", TJ, "-n", "default") == "no"  # only where she holds edit
    assert can(cluster, "carol", "list", TJ, "-n", namespace) == "no"  # no binding, no rights
    assert can(cluster, "alice", "deletecollection", TJ, "-n", namespace) == "yes"
    cluster.kubectl("delete", TJ, "by-alice", "-n", namespace, "--as", "alice")


def schedulable_nodes(cluster: Any) -> dict[str, dict[str, str]]:
    """Ready, schedulable, untainted Nodes and their labels."""
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    out = {}
    for n in nodes:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        if ready and not n["spec"].get("unschedulable") and not n["spec"].get("taints"):
            out[n["metadata"]["name"]] = n["metadata"].get("labels", {})
    return out


def test_the_scheduler_keeps_the_operator_off_spot_nodes(cluster: Any, namespace: str) -> None:
    """Three replicas, two spot nodes free and (at least) two on-demand ones: the preferred spread would put a
    replica on an empty spot node if the spot affinity were only a preference; it is required, so none goes there.
    Every pod runs at the chart's PriorityClass, and the budget covers exactly the operator's pods."""
    tag = uuid.uuid4().hex[:6]
    spot = [cluster.add_node(f"spot-gke-{tag}", labels={"cloud.google.com/gke-spot": "true"}),
            cluster.add_node(f"spot-karpenter-{tag}", labels={"karpenter.sh/capacity-type": "spot"})]
    release = f"sched-{tag}"
    fullname = f"{release}-reprieve"
    try:
        on_demand = [n for n in schedulable_nodes(cluster) if n not in spot]
        assert len(on_demand) >= 2, f"the session cluster should have two on-demand nodes, has {on_demand}"
        cluster.helm("install", release, str(CHART), "-n", namespace, "--set", "replicaCount=3",
                     "--set", "crds.enabled=false", "--set", "podDisruptionBudget.minAvailable=2")
        selector = f"app.kubernetes.io/instance={release}"

        def placed() -> list[dict[str, Any]]:
            pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
                              .stdout)["items"]
            return pods if len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods) else []

        pods = wait_for(placed, 60, "three scheduled operator pods",
                        describe=lambda: cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout)
        where = [p["spec"]["nodeName"] for p in pods]
        assert not set(where) & set(spot), f"operator pods on spot nodes: {where}"
        assert len(set(where)) >= 2, f"replicas not spread over nodes: {where}"
        for p in pods:  # resolved by the API server's Priority admission from the chart's PriorityClass
            assert p["spec"]["priorityClassName"] == f"{fullname}-operator"
            assert p["spec"]["priority"] == 1_000_000

        def budget() -> dict[str, Any]:
            pdb = json.loads(cluster.kubectl("get", "pdb", fullname, "-n", namespace, "-o", "json").stdout)
            return pdb if pdb.get("status", {}).get("expectedPods") == 3 else {}

        pdb = wait_for(budget, 60, "the disruption controller to count the operator pods")
        assert pdb["spec"]["minAvailable"] == 2
    finally:
        cluster.helm("uninstall", release, "-n", namespace, "--wait", check=False)
        for n in spot:
            cluster.remove_node(n)
    gone = cluster.kubectl("get", "priorityclass", f"{fullname}-operator", check=False)
    assert gone.returncode != 0, "the release's PriorityClass outlived the release"


@pytest.mark.parametrize("sets,needle", [
    (["replicaCount=9"], "at '/replicaCount'"),
    (["priorityClass.value=2000000000"], "at '/priorityClass/value': maximum"),
    (["avoidSpotNodes.nodeLabels.pool=spot"], "at '/avoidSpotNodes/nodeLabels/pool'"),
    (["leaderElection.leaseSeconds=forever"], "at '/leaderElection/leaseSeconds'"),
    # Not the schema: this cluster serves no monitoring.coreos.com/v1, and the chart says so.
    (["metrics.serviceMonitor.enabled=true"], ("metrics.serviceMonitor.enabled needs the Prometheus Operator's "
                                              "ServiceMonitor CRD")),
])
def test_bad_values_fail_the_install_naming_the_field(cluster: Any, namespace: str, sets: list[str],
                                                      needle: str) -> None:
    release = f"bad-{uuid.uuid4().hex[:6]}"
    flags = [a for s in sets for a in ("--set", s)]
    out = cluster.helm("install", release, str(CHART), "-n", namespace, "--set", "crds.enabled=false", *flags,
                       check=False)
    assert out.returncode != 0, out.stdout
    assert needle in out.stderr, out.stderr
    # Nothing half-created: no release, no objects of it in the namespace or cluster-wide.
    assert cluster.helm("status", release, "-n", namespace, check=False).returncode != 0
    left = cluster.kubectl("get", "all,serviceaccounts,roles,rolebindings,poddisruptionbudgets", "-n", namespace,
                           "-l", f"app.kubernetes.io/instance={release}", "-o", "name").stdout.split()
    cluster_wide = cluster.kubectl("get", "clusterroles,clusterrolebindings,priorityclasses", "-l",
                                   f"app.kubernetes.io/instance={release}", "-o", "name").stdout.split()
    assert not left and not cluster_wide, left + cluster_wide


def test_install_notes_commands_work_as_printed(cluster: Any, chart: str, namespace: str) -> None:
    """The notes of the session's release (replicaCount=0): the token command, `kubectl explain`, and the
    inline job, which the CRD accepts (server-side dry run)."""
    notes = cluster.helm("get", "notes", RELEASE, "-n", RELEASE_NS).stdout
    lines = [ln.strip() for ln in notes.splitlines()]
    commands = [ln.split() for ln in lines if ln.startswith("kubectl ") and "<<" not in ln and " -w" not in ln]
    assert any(c[1:4] == ["-n", RELEASE_NS, "create"] for c in commands), notes
    assert [c for c in commands if c[1] == "explain"], notes
    for command in commands:
        out = cluster.kubectl(*command[1:], check=False)
        assert out.returncode == 0, f"{' '.join(command)}: {out.stderr}"
        if command[1] == "explain":
            assert "FIELDS:" in out.stdout  # the CRD publishes its schema
    job = yaml.safe_load(notes.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])
    job["metadata"]["namespace"] = namespace
    out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(job), check=False)
    assert out.returncode == 0, out.stderr
