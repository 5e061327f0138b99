"""End-to-end fixtures: the chart, the operator under the chart's RBAC, and nodes of the test's own."""

from __future__ import annotations

import fcntl
import json
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from localcluster.goodput import analyse, read_step_log
from localcluster.procs import cache_dir
from localcluster.stack import OperatorProcess, example_job, install_chart
from localcluster.testing import wait_for

SPOT_TAINT = "cloud.google.com/impending-node-termination"


@pytest.fixture(scope="session")
def chart_installed(cluster: Any) -> None:
    install_chart(cluster)


@pytest.fixture(scope="session")
def compiled_example(cluster: Any, chart_installed: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The example's programs compiled once into the shared compilation cache (:func:`compilation_cache`) by a
    2-step job of the same shape, so no end-to-end job pays a cold compilation (up to a minute on 2 cores with two
    jobs compiling at once) and their restarts and first starts alike load it. Cold starts are the demo's and the
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


def compilation_cache() -> Path:
    """The JAX compilation cache every end-to-end job shares, across the pytest-xdist workers' clusters and across
    runs (``~/.cache/reprieve/xla-cache``, per JAX version; an entry is keyed by the program and the compiler, so a
    changed example compiles afresh)."""
    path = cache_dir() / "xla-cache" / f"jax-{version('jax')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def warm_up(cluster: Any, namespace: str, body: dict[str, Any], operator: Any = None, timeout: float = 400) -> None:
    """Run ``body`` (a short job) to Succeeded; a failure here names the warm-up, not the test that needed it.
    One warm-up at a time on the host: the first compiles, the other workers' then load what it compiled (three
    compiling at once on 2 cores took over 4 minutes each)."""
    name = body["metadata"]["name"]
    with open(compilation_cache().parent / ".warm-up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
        wait_tj(cluster, namespace, name, lambda s: s.get("phase") == "Succeeded", timeout,
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
    cache (:func:`compilation_cache`), so jobs of the same shape compile the example's programs once between them."""
    kwargs.setdefault("devices_per_process", 1)
    return example_job(name, compilation_cache=compilation_cache(), **kwargs)


def make_elastic(body: dict[str, Any], shards: int, host: str) -> dict[str, Any]:
    """``body`` (an :func:`e2e_job`) as the elastic job of the end-to-end tests (#47): in place, the memory tier's
    copy every step, ``minReplicas: 1``, ``shards`` virtual shards (canonical order), a replacement refused for 2 s
    shrinks it, no wait between resizes, one worker per node (required anti-affinity on the node label ``host``)."""
    spec = body["spec"]
    spec["restartMode"] = "InPlace"
    spec["checkpoint"]["memory"] = {"sizeLimit": "256Mi", "intervalSteps": 1}
    spec["elastic"] = {"minReplicas": 1, "unschedulableSeconds": 2, "minResizeIntervalSeconds": 0,
                       "virtualShards": shards}
    spec["template"]["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"reprieve.dev/job-name": body["metadata"]["name"]}}, "topologyKey": host}]}}
    return body


def submit_recreate(cluster: Any, namespace: str, name: str, root: Path, *, steps: int, step_sleep: float,
                    interval: int = 0, extra_env: dict[str, str] | None = None,
                    notice_seconds: dict[str, int] | None = None, **kwargs: Any) -> Path:
    """Apply a 2-worker ``restartMode: Recreate`` job writing its step log to ``<root>/<name>/steps.jsonl``; return
    that directory (its checkpoints and result.json too). ``notice_seconds``: ``spec.preemption.noticeSeconds``.
    ``kwargs`` go to :func:`e2e_job`."""
    ckpt = root / name
    body = e2e_job(cluster, name, replicas=2, steps=steps, step_sleep=step_sleep, interval=interval,
                   checkpoint_dir=ckpt, extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl", **(extra_env or {})},
                   **kwargs)
    body["spec"]["restartMode"] = "Recreate"
    if notice_seconds:
        body["spec"].setdefault("preemption", {})["noticeSeconds"] = notice_seconds
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    return ckpt


def wait_step(ckpt: Path, step: int, timeout: float, cluster: Any, namespace: str, name: str) -> None:
    """Wait until the job's step log (``<ckpt>/steps.jsonl``) has reached ``step``."""
    log = ckpt / "steps.jsonl"
    wait_for(lambda: log.exists() and any(r.step >= step for r in read_step_log(log)), timeout,
             f"{namespace}/{name} to reach step {step}", interval=0.3,
             describe=lambda: worker_logs(cluster, namespace, name, 2))


def succeeded(status: dict) -> bool:
    return status.get("phase") == "Succeeded"


def get_tj(cluster: Any, namespace: str, name: str) -> dict:
    return dict(cluster.read("trainingjob", name, namespace))


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
    return str(cluster.read("pod", pod, namespace)["spec"].get("nodeName") or "")


def worker_logs(cluster: Any, namespace: str, job: str, replicas: int) -> str:
    out = []
    for i in range(replicas):
        for path in cluster.pod_logs(namespace, f"{job}-{i}", "trainer"):
            out.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(out)


def assert_report_renders(cluster: Any, namespace: str, name: str, out: Path, *expected: str) -> str:
    """``python -m reprieve_operator.timeline`` against the cluster: an SVG that parses and an HTML page that
    holds ``expected``."""
    import xml.etree.ElementTree as ET

    from reprieve_operator.timeline import main

    assert main([name, "-n", namespace, "-o", str(out), "--kubeconfig", str(cluster.kubeconfig)]) == 0
    picture = (out / f"{name}.svg").read_text()
    ET.fromstring(picture)
    page = (out / f"{name}.html").read_text()
    missing = [e for e in expected if e not in page]
    assert not missing, (missing, page[-3000:])
    return page


GOODPUT_TOLERANCE = 0.03  # absolute, on goodput in 0..1 (docs/goodput.md, "Two figures, one definition")


def assert_goodput_agrees(status: dict, steplog: Path) -> None:
    """The operator's status.goodput (from sparse progress reports) against the example's own step log, over
    the same wall time. The step log cannot tell a save's wait from the step around it, so its productive
    time is compared with the operator's productive + checkpoint seconds."""
    gp = status["goodput"]
    wall = gp["wallSeconds"]
    buckets = gp["productiveSeconds"] + sum(gp["badputSeconds"].values())
    assert buckets == pytest.approx(wall, abs=0.5), gp  # every second in exactly one bucket
    assert gp["accounting"]["open"] == [], gp  # the job ended: nothing provisional is left
    own = analyse(read_step_log(steplog), start=0, end=wall)
    operator_figure = (gp["productiveSeconds"] + gp["badputSeconds"]["checkpoint"]) / wall
    print(f"\ngoodput: operator {gp['goodput']:.4f} (+checkpoint {operator_figure:.4f}), step log {own.goodput:.4f} "
          f"over {wall:.1f}s; badput {gp['badputSeconds']}; lost steps {gp['lostSteps']} vs {own.lost_steps}")
    assert abs(operator_figure - own.goodput) <= GOODPUT_TOLERANCE, (gp, own.summary())
