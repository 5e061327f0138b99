"""The Grafana dashboard in the chart, checked against a real Prometheus: every panel query returns data.

Prometheus (Debian's package, hack/install-prometheus.sh) runs as a plain process on loopback with a config
written here, scraping the operator's metrics port and the two workers' ``REPRIEVE_METRICS_PORT`` (bound on their
pod IPs) every second, while an example job is preempted with a notice, saves periodically and finishes. Then every
query of every panel runs as the range query Grafana would send; a panel whose queries return no (non-NaN)
sample fails the test.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from localcluster.testing import taint_node, wait_for

from .conftest import SPOT_TAINT, e2e_job, pod_node, wait_step, wait_tj

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "reprieve" / "dashboards" / "reprieve.json"
# As few steps as the panels need. The runtime's series (step time, save blocking) come from attempt 1, scraped from
# Prometheus's start to the notice, the periodic save at INTERVAL before it; the operator's (restores, restart gap,
# goodput...) from the restart and the end. The notice is made at step FAULT_AT and saved at the earliest step no
# process has passed: process 1 runs ahead of process 0 up to the example's next loss log (every 50 steps), so at step
# 50, or 100 if process 0 passed 50 before the notice (tests/e2e/test_realnodes_e2e.py's constants) -- unless the
# notice's deadline leaves time to train on: the runtime then plans the agreed save up to ~5 s before the deadline
# (15 s here), ~200 steps later at the fastest (0.05 s a step), never past the job's last step. At STEPS = 150 a
# quiet machine reached the last step first and the job ended without the restart the panels need; 300 leaves attempt
# 2 at least 50 steps however fast the steps are.
STEPS, INTERVAL, FAULT_AT = 300, 25, 40
# Series only a job that trained on fewer workers than desired has (an elastic job that shrank; docs/goodput.md,
# "Degraded"): this job never shrinks, so their queries have no data here (tests/operator/test_jobwatch.py exports
# them). Every other query of the elastic panels (workers, degraded seconds) has data for any job.
SHRUNK_ONLY = ("reprieve_job_degraded_throughput_ratio",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prom_query(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def panel_queries(namespace: str, job: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, Grafana's variables filled in."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$namespace", namespace).replace("$job", job)
                    .replace("$__rate_interval", "15s"))
            out.append((panel["title"], expr))
    return out


def has_data(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _, v in series.get("values", []))


def test_every_dashboard_panel_has_data_from_the_operator_and_a_running_job(
        cluster: Any, namespace: str, operator: Any, pool: Any, api: Any, tmp_path: Path,
        prometheus_binary: str) -> None:
    """Why this long: Every panel needs series from a whole restart (a notice, an agreed save, a second
    attempt, goodput at the end) scraped by a real Prometheus at 1 s: two attempts of a 2-process job plus
    scrapes."""
    pool_a, _ = pool(3)
    name, ckpt = "watched", tmp_path / "watched"
    worker_port = free_port()
    body = e2e_job(cluster, name, replicas=2, steps=STEPS, step_sleep=0.03, interval=INTERVAL, checkpoint_dir=ckpt,
                       node_selector={"reprieve.test/pool": pool_a},
                       extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl", "REPRIEVE_METRICS_PORT": str(worker_port),
                                  "REPRIEVE_PROGRESS_INTERVAL_SECONDS": "1"})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    wait_tj(cluster, namespace, name, lambda s: s.get("phase") == "Running", 240, "Running", operator)
    # Pod IPs are a function of the pods' DNS identity on the local cluster: the same for every attempt.
    ips = wait_for(lambda: [ip for ip in (cluster.read("pod", f"{name}-{i}", namespace)["status"].get("podIP")
                                          for i in range(2)) if ip] or None, 60, "worker pod IPs")
    assert len(ips) == 2, ips

    port = free_port()
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [
                  {"job_name": "reprieve-operator", "honor_labels": True,
                   "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}]},
                  {"job_name": "reprieve-workers",
                   "static_configs": [{"targets": [f"{ip}:{worker_port}" for ip in ips],
                                       "labels": {"namespace": namespace, "trainingjob": name}}]}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed in finally
    prom = subprocess.Popen([prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    start = time.time()
    try:
        def targets_up() -> bool:
            active = prom_query(base, "targets")["activeTargets"]
            return sum(t["health"] == "up" for t in active) == 3

        wait_for(targets_up, 60, "Prometheus scraping the operator and both workers", interval=0.5,
                 describe=lambda: json.dumps(prom_query(base, "targets")["activeTargets"])[:2000])

        wait_step(ckpt, FAULT_AT, 240, cluster, namespace, name)
        taint_node(api, pod_node(cluster, namespace, f"{name}-1"), SPOT_TAINT, "true", "NoSchedule")
        wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 2 and s.get("phase") == "Running",
                180, "attempt 2 running", operator)
        final = wait_tj(cluster, namespace, name, lambda s: s.get("phase") == "Succeeded", 300, "Succeeded",
                        operator)
        assert final["status"]["goodput"]["goodput"] > 0
        panels: dict[str, list[str]] = {}

        def every_panel_has_data() -> bool:  # the last scrapes of the operator's gauges may still be coming
            panels["empty"], panels["seen"] = [], []
            for title, expr in panel_queries(namespace, name):
                if any(metric in expr for metric in SHRUNK_ONLY):
                    continue
                result = prom_query(base, "query_range", query=expr, start=f"{start:.3f}", end=f"{time.time():.3f}",
                                    step="2")["result"]
                panels["seen" if has_data(result) else "empty"].append(f"{title}: {expr}")
            return bool(panels["seen"]) and not panels["empty"]

        wait_for(every_panel_has_data, 60, "every dashboard panel to have data", interval=2,
                 describe=lambda: "panels without data:\n" + "\n".join(panels.get("empty", [])))
        seen = panels["seen"]
        print(f"\n{len(seen)} panel queries returned data")
    finally:
        prom.terminate()
        try:
            prom.wait(15)
        except subprocess.TimeoutExpired:
            prom.kill()
        log.close()
