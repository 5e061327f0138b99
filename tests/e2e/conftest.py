"""End-to-end fixtures: the chart, the operator under the chart's RBAC, and nodes of the test's own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster.stack import OperatorProcess, example_job, install_chart
from localcluster.testing import wait_for


@pytest.fixture(scope="session")
def chart_installed(cluster: Any) -> None:
    install_chart(cluster)


@pytest.fixture(scope="session")
def compiled_example(cluster: Any, chart_installed: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The example's programs compiled once into the cluster's compilation cache (:func:`e2e_job`) by a 2-step job
    of the same shape, so no end-to-end job pays a cold compilation (up to a minute on 2 cores with two jobs
    compiling at once) and their restarts and first starts alike load it. Cold starts are the demo's and the
    goodput benchmark's to measure."""
    root = tmp_path_factory.mktemp("warm-up")
    cluster.kubectl("create", "namespace", "warm-up")
    op = OperatorProcess(cluster, root / "operator", namespaces=["warm-up"]).start()
    try:
        warm_up(cluster, "warm-up", e2e_job(cluster, "warm-up", replicas=2, steps=2, step_sleep=0, interval=0,
                                            checkpoint_dir=root / "ckpt"), op)
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", "warm-up", "--wait=false", check=False)


def warm_up(cluster: Any, namespace: str, body: dict[str, Any], operator: Any = None) -> None:
    """Run ``body`` (a short job) to Succeeded; a failure here names the warm-up, not the test that needed it."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    name = body["metadata"]["name"]
    wait_tj(cluster, namespace, name, lambda s: s.get("phase") == "Succeeded", 400,
            "the warm-up job that fills the compilation cache to succeed", operator)
    cluster.kubectl("delete", "tj", name, "-n", namespace, "--wait=false", check=False)


@pytest.fixture
def operator(cluster: Any, chart_installed: None, compiled_example: None, namespace: str,
             tmp_path: Path) -> Iterator[OperatorProcess]:
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


def e2e_job(cluster: Any, name: str, **kwargs: Any) -> dict[str, Any]:
    """``localcluster.stack.example_job`` with what every end-to-end job shares: one simulated CPU device per process
    (with two, every cross-process collective of gloo waits about 0.1 s more, which made the example's steps 2x
    slower; two devices per process are covered by tests/runtime/test_example_lm.py), and one JAX compilation
    cache per cluster, so jobs of the same shape compile the example's programs once between them."""
    kwargs.setdefault("devices_per_process", 1)
    return example_job(name, compilation_cache=cluster.workdir / "xla-cache", **kwargs)


def get_tj(cluster: Any, namespace: str, name: str) -> dict:
    return json.loads(cluster.kubectl("get", "tj", name, "-n", namespace, "-o", "json").stdout)


def wait_tj(cluster: Any, namespace: str, name: str, predicate: Callable[[dict], bool], timeout: float,
            what: str, operator: OperatorProcess | None = None) -> dict:
    last: dict = {}

    def check() -> dict | None:
        body = get_tj(cluster, namespace, name)
        last["status"] = body.get("status")
        last["replicas"] = (body.get("spec") or {}).get("replicas", 0)
        return body if predicate(body.get("status") or {}) else None

    def describe() -> str:
        text = f"status {json.dumps(last.get('status'))}"
        if operator is not None:
            text += f"\noperator log:\n{operator.tail(30)}"
        logs = worker_logs(cluster, namespace, name, int(last.get("replicas") or 0))
        return text + (f"\nworker logs (last 25 lines of each run):\n{logs}" if logs else "")

    return wait_for(check, timeout, f"TrainingJob {namespace}/{name}: {what}", interval=0.3, describe=describe)


def pod_node(cluster: Any, namespace: str, pod: str) -> str:
    return str(cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "jsonpath={.spec.nodeName}").stdout)


def worker_logs(cluster: Any, namespace: str, job: str, replicas: int) -> str:
    out = []
    for i in range(replicas):
        for path in cluster.pod_logs(namespace, f"{job}-{i}", "trainer"):
            out.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(out)
