"""The optional Prometheus Operator scrape configs: a ServiceMonitor over the metrics Service or a PodMonitor over
the operator pods, off by default, selecting exactly what serves `/metrics` on the port named `metrics`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import by_kind, render, template

pytestmark = pytest.mark.unit

SM_API = ("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
PM_API = ("--api-versions", "monitoring.coreos.com/v1/PodMonitor")


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = by_kind(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c  # type: ignore[no-any-return]


def test_off_by_default() -> None:
    docs = render(args=(*SM_API, *PM_API))
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PodMonitor") and not by_kind(docs, "Service")


def test_service_monitor_selects_the_metrics_service_and_its_port() -> None:
    docs = render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom",
                  "metrics.serviceMonitor.interval=15s", args=SM_API)
    (sm,) = by_kind(docs, "ServiceMonitor")
    (svc,) = by_kind(docs, "Service")  # created with the monitor, though metrics.service is false
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"] == "reprieve-system"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["reprieve-system"]}
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "metrics"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s",
                        "honorLabels": True}  # the per-job series' namespace is the job's
    (port,) = svc["spec"]["ports"]
    assert port["name"] == endpoint["port"] and port["targetPort"] == "metrics"
    # The Service reaches the pods, and their container serves the port under that name.
    (dep,) = by_kind(docs, "Deployment")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in container(docs)["ports"]


def test_pod_monitor_selects_the_operator_pods_and_their_port() -> None:
    docs = render("metrics.podMonitor.enabled=true", "metrics.port=9090", args=PM_API)
    (pm,) = by_kind(docs, "PodMonitor")
    assert not by_kind(docs, "Service")
    (dep,) = by_kind(docs, "Deployment")
    assert pm["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert pm["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s",
                        "honorLabels": True}
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container(docs)["ports"]
    assert "--metrics-port=9090" in container(docs)["args"]


@pytest.mark.parametrize("sets,apis,needle", [
    (["metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true"], (*SM_API, *PM_API),
     "enable metrics.serviceMonitor or metrics.podMonitor, not both"),
    (["metrics.serviceMonitor.enabled=true"], (), ("metrics.serviceMonitor.enabled needs the Prometheus Operator's "
     "ServiceMonitor CRD (monitoring.coreos.com/v1)")),
    (["metrics.podMonitor.enabled=true"], SM_API, ("metrics.podMonitor.enabled needs the Prometheus Operator's "
     "PodMonitor CRD")),
    (["metrics.podMonitor.enabled=true", "metrics.port=0"], PM_API, "metrics.podMonitor.enabled needs metrics.port"),
])
def test_monitors_refuse_what_cannot_work(sets: list[str], apis: tuple[str, ...], needle: str) -> None:
    out = template(*[a for s in sets for a in ("--set", s)], *apis)
    assert out.returncode != 0 and needle in out.stderr, out.stderr


def test_job_label_value_reaches_the_operator() -> None:
    env = {e["name"]: e.get("value") for e in container(render())["env"]}
    assert env["REPRIEVE_METRICS_JOB_LABEL"] == "true"
    env = {e["name"]: e.get("value") for e in container(render("metrics.jobLabel=false"))["env"]}
    assert env["REPRIEVE_METRICS_JOB_LABEL"] == "false"


def test_dashboard_and_kube_state_metrics_configmaps() -> None:
    import json

    assert not [d for d in by_kind(render(), "ConfigMap") if "dashboard" in d["metadata"]["name"]]
    docs = render("metrics.dashboard.enabled=true", "metrics.kubeStateMetrics.enabled=true")
    maps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    dash = maps["r-reprieve-dashboard"]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dash["data"]["reprieve.json"])
    assert board["uid"] == "reprieve-goodput" and len(board["panels"]) >= 9
    ksm = yaml.safe_load(maps["r-reprieve-kube-state-metrics"]["data"]["trainingjob-state.yaml"])
    (res,) = ksm["spec"]["resources"]
    assert res["groupVersionKind"] == {"group": "reprieve.dev", "version": "v1alpha1", "kind": "TrainingJob"}
    # every status path the config reads exists in the CRD's status schema
    from reprieve_operator import crdgen

    crd = yaml.safe_load(crdgen.CRD_PATH.read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    for m in res["metrics"]:
        path = (m["each"].get("gauge") or m["each"].get("stateSet"))["path"]
        node = {"properties": {"status": status}}
        for key in path:
            assert key in node.get("properties", {}), (m["name"], path)
            node = node["properties"][key]


def test_every_per_job_metric_the_dashboard_graphs_is_one_the_operator_exports() -> None:
    """The restores by tier and the newest step per tier (the memory tier) included: a panel on a metric nobody
    exports would stay empty without an error."""
    import json
    import re

    from reprieve_operator import metrics

    board = json.loads((Path(__file__).resolve().parents[2] / "charts/reprieve/dashboards/reprieve.json").read_text())
    graphed = {m for p in board["panels"] for t in p.get("targets", [])
               for m in re.findall(r"reprieve_job_[a-z_]+", t["expr"])}
    collector = metrics.JobCollector()
    collector.update("ns", "j", {"phase": "Running"})
    exported = {family.name for family in collector.collect()}
    assert {"reprieve_job_restores", "reprieve_job_restore_seconds", "reprieve_job_saved_step"} <= graphed
    # elastic (issue #47): degraded time beside the productive time, its throughput, current vs desired workers
    assert {"reprieve_job_degraded_seconds", "reprieve_job_degraded_throughput_ratio", "reprieve_job_desired_workers",
            "reprieve_job_current_workers"} <= graphed
    assert graphed <= exported, graphed - exported
