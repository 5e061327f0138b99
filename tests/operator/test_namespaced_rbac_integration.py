"""The chart's namespaced RBAC mode on the real API server: the operator runs a job in its watched namespace with
Roles only there (no cluster-wide pod rights), and is refused pods anywhere else."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import apply, job_manifest
from localcluster.stack import CHART, OperatorProcess
from test_operator_integration import wait_running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_namespaced_mode_runs_jobs_with_roles_only(cluster: Any, api: Any, namespace: str, chart: str,
                                                   tmp_path: Path) -> None:
    release = f"ns-{uuid.uuid4().hex[:6]}"
    home = f"{release}-system"
    cluster.helm("install", release, str(CHART), "-n", home, "--create-namespace", "--wait",
                 "--set", "replicaCount=0", "--set", "crds.enabled=false", "--set", "rbac.namespaced=true",
                 "--set", f"watchNamespaces={{{namespace}}}")
    sa = f"{release}-reprieve"
    try:
        me = f"system:serviceaccount:{home}:{sa}"
        can = lambda *a: cluster.kubectl("auth", "can-i", *a, "--as", me, check=False).stdout.strip()
        assert can("create", "pods", "-n", namespace) == "yes"
        assert can("create", "pods", "-n", "default") == "no"
        assert can("list", "pods", "--all-namespaces") == "no"
        assert can("list", "nodes") == "yes" and can("patch", "nodes") == "no"
        op = OperatorProcess(cluster, tmp_path, namespaces=[namespace], identity=(home, sa)).start()
        try:
            apply(cluster, job_manifest("llama", namespace))
            wait_running(api, namespace, "llama", timeout=60)
            log = op.log_path.read_text()
            assert "Traceback" not in log and " 403" not in log, op.tail(60)
        finally:
            op.stop()
    finally:
        cluster.helm("uninstall", release, "-n", home, check=False)
        cluster.kubectl("delete", "namespace", home, "--wait=false", check=False)
