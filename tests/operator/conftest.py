"""Operator test fixtures: the chart installed once per session, the operator as a local process.

The chart is installed with ``replicaCount=0`` (CRD + ServiceAccount + ClusterRole, no operator pod: the image
cannot be built here). Each test runs ``python -m reprieve_operator`` as a subprocess whose kubeconfig holds a
token of the chart's ServiceAccount, so the operator works with exactly the chart's RBAC.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster.stack import OPERATOR_SA, OperatorProcess, install_chart
from localcluster.testing import wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def chart(cluster: Any) -> str:
    """Install (or upgrade) the chart with no operator pod; returns the operator ServiceAccount name."""
    install_chart(cluster)
    out = cluster.kubectl("get", "crd", "trainingjobs.reprieve.dev", "-o",
                          "jsonpath={.status.conditions[?(@.type=='Established')].status}")
    assert out.stdout.strip() == "True", f"CRD not established: {out.stdout!r}"
    return OPERATOR_SA


class Operator(OperatorProcess):
    """The operator process of ``localcluster.stack`` (chart token) plus what these tests read from it."""

    def __init__(self, cluster: Any, namespace: str, workdir: Path) -> None:
        super().__init__(cluster, workdir, namespaces=[namespace], log_level="DEBUG")

    def metric(self, name: str, **labels: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, lab = head.partition("{")
            if metric == name and all(f'{k}="{v}"' in lab for k, v in labels.items()):
                total += float(value)
        return total

    def handled(self, name: str, before: float, timeout: float = 30, **labels: str) -> float:
        """Wait until counter ``name`` (``reprieve_reconciles_total``, ``reprieve_node_events_total``, ...) has
        moved past ``before``: the operator has finished handling something after that value was read. A test
        asserts that nothing came of an event only after this, never after a sleep."""
        return float(wait_for(lambda: (v := self.metric(name, **labels)) > before and v, timeout,
                              f"{name}{labels} past {before}", describe=lambda: self.tail(40)))

    def restart(self) -> Operator:
        self.stop()
        self.start()
        return self

    def assert_no_errors(self) -> None:
        text = self.log_path.read_text(errors="replace")
        bad = [ln for ln in text.splitlines() if "Traceback" in ln or " ERROR " in ln]
        assert not bad, f"operator logged errors:\n{self.tail(120)}"


@pytest.fixture
def operator(cluster: Any, chart: str, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(cluster, namespace, tmp_path).start()
    try:
        yield op
    finally:
        op.stop()
        if os.environ.get("REPRIEVE_SHOW_OPERATOR_LOG"):
            print(op.tail(200))


@pytest.fixture
def nodes(cluster: Any) -> Iterator[list[str]]:
    """Two fresh process-kubelet nodes labelled ``reprieve-test=<id>`` (jobs pin to them with nodeSelector)."""
    tag = uuid.uuid4().hex[:6]
    names = [cluster.add_node(f"op-{tag}-{i}", labels={"reprieve-test": tag}) for i in range(2)]
    try:
        yield names
    finally:
        for n in names:
            try:
                cluster.remove_node(n)
            except (RuntimeError, AssertionError) as err:  # the test may have removed it already
                print(f"node {n}: {err}")


def node_tag(cluster: Any, node: str) -> str:
    out = cluster.kubectl("get", "node", node, "-o", "jsonpath={.metadata.labels.reprieve-test}")
    return str(out.stdout.strip())


# Worker behaviour, chosen by env (one template serves every attempt): MODE for attempt 1, MODE_LATER (if set)
# from attempt 2 on.  wait: run until the notice file shows a notice, "save" (SAVE_SECONDS, or until the file
# RELEASE_FILE exists: the test says when), then exit with the restart code; exit:<n>: exit with code n at once.
WORKER = r"""
import os, sys, time
attempt = int(os.environ["REPRIEVE_ATTEMPT"])
mode = os.environ.get("MODE", "wait")
if attempt >= 2 and os.environ.get("MODE_LATER"):
    mode = os.environ["MODE_LATER"]
if mode.startswith("exit:"):
    sys.exit(int(mode.split(":")[1]))
path = os.environ["REPRIEVE_NOTICE_FILE"]
deadline = time.time() + 300
while time.time() < deadline:
    try:
        if 'reprieve.dev/notice="' in open(path).read():  # the key itself, not reprieve.dev/notice-watch
            release = os.environ.get("RELEASE_FILE")
            while release and not os.path.exists(release) and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(0 if release else float(os.environ.get("SAVE_SECONDS", "0.2")))  # "saving"
            sys.exit(int(os.environ["REPRIEVE_RESTART_EXIT_CODE"]))
    except FileNotFoundError:
        pass
    time.sleep(0.1)
sys.exit(3)
"""


def job_manifest(name: str, namespace: str, replicas: int = 2, mode: str = "wait", tag: str | None = None,
                 later: str | None = None, save_seconds: float = 0.2, release: str | None = None,
                 **spec: Any) -> dict[str, Any]:
    env = [{"name": "MODE", "value": mode}, {"name": "SAVE_SECONDS", "value": str(save_seconds)}]
    env += [{"name": "RELEASE_FILE", "value": release}] if release else []
    env += [{"name": "MODE_LATER", "value": later}] if later else []
    pod_spec: dict[str, Any] = {"containers": [{
        "name": "trainer", "image": "python:3.11", "command": ["python", "-c", WORKER], "env": env}]}
    if tag:
        pod_spec["nodeSelector"] = {"reprieve-test": tag}
    # These jobs run a stand-in worker, not the runtime: Recreate, said explicitly (with a command, the default
    # would be InPlace, which runs the worker under reprieve-supervisor; in-place has its own tests).
    spec.setdefault("restartMode", "Recreate")
    return {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "template": {"spec": pod_spec}, "checkpoint": {"uri": "/tmp/ckpt"},
                     "terminationGracePeriodSeconds": 5, **spec}}


def apply(cluster: Any, manifest: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=check)
