"""End-to-end fixtures: the chart, the operator under the chart's RBAC, and nodes of the test's own."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster.stack import OperatorProcess, install_chart
from localcluster.testing import wait_for


@pytest.fixture(scope="session")
def chart_installed(cluster: Any) -> None:
    install_chart(cluster)


@pytest.fixture
def operator(cluster: Any, chart_installed: None, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, tmp_path / "operator", namespaces=[namespace]).start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def pool(cluster: Any) -> Iterator[Callable[..., tuple[str, list[str]]]]:
    """``pool(n, costs=None)`` adds n nodes labelled with a fresh pool name (``costs``: their emulated pull and
    start, localcluster.costs.EmulatedCosts); returns (pool, node names). Removed after."""
    added: list[str] = []

    def make(n: int, costs: Any = None) -> tuple[str, list[str]]:
        name = f"p{uuid.uuid4().hex[:6]}"
        nodes = [cluster.add_node(f"{name}-{i}", {"reprieve.test/pool": name}, costs=costs) for i in range(n)]
        added.extend(nodes)
        return name, nodes

    yield make
    for node in added:
        if node in cluster.node_names():
            cluster.remove_node(node)


def get_tj(cluster: Any, namespace: str, name: str) -> dict:
    return json.loads(cluster.kubectl("get", "tj", name, "-n", namespace, "-o", "json").stdout)


def wait_tj(cluster: Any, namespace: str, name: str, predicate: Callable[[dict], bool], timeout: float,
            what: str, operator: OperatorProcess | None = None) -> dict:
    last: dict = {}

    def check() -> dict | None:
        body = get_tj(cluster, namespace, name)
        last["status"] = body.get("status")
        return body if predicate(body.get("status") or {}) else None

    def describe() -> str:
        text = f"status {json.dumps(last.get('status'))}"
        if operator is not None:
            text += f"\noperator log:\n{operator.tail(30)}"
        return text

    return wait_for(check, timeout, f"TrainingJob {namespace}/{name}: {what}", interval=0.3, describe=describe)


def pod_node(cluster: Any, namespace: str, pod: str) -> str:
    return str(cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "jsonpath={.spec.nodeName}").stdout)


def worker_logs(cluster: Any, namespace: str, job: str, replicas: int) -> str:
    out = []
    for i in range(replicas):
        for path in cluster.pod_logs(namespace, f"{job}-{i}", "trainer"):
            out.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(out)


def sleep_until(pred: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False
