"""One write per job (docs/notices.md): the operator, with exactly the chart's RBAC, against the local control
plane, and the runtime's real notice-object watch (``reprieve.notice_object.JobNoticeWatch``) run here for each pod
with the token of the job's own ServiceAccount (the operator's per-job Role): the pods hear a notice from the job's
object with no annotation written; a pod that cannot watch, or an object the API server refuses, gets the annotation,
and the job's ``NoticeFallback`` Event says so. The pods run the stand-in worker of ``conftest``, which does not watch
anything itself."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import apply, job_manifest, node_tag
from kubernetes import client
from localcluster.testing import serviceaccount_dir, taint_node, wait_for
from reprieve.kube import KubeClient
from reprieve.notice import NOTICE_WATCH_ANNOTATION, Notice
from reprieve.notice_object import JobNoticeWatch
from test_operator_integration import (
    SPOT_TAINT,
    events,
    handled_afresh,
    job_pods,
    notices,
    status,
    wait_running,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@contextmanager
def runtimes(cluster: Any, namespace: str, tmp_path: Path, pods: dict[str, str]) -> Iterator[dict[str, list[Notice]]]:
    """The runtime's notice-object watch of each pod (name -> the ServiceAccount whose token it holds); yields the
    notices each heard."""
    heard: dict[str, list[Notice]] = {p: [] for p in pods}
    watches = []
    for pod, sa in pods.items():
        sa_dir = serviceaccount_dir(cluster, namespace, sa, tmp_path / f"sa-{pod}")
        kube = KubeClient("127.0.0.1", cluster.api_port, str(sa_dir))
        watches.append(JobNoticeWatch(kube, namespace, "llama", pod, heard[pod].append, attempt=1).start())
    try:
        yield heard
    finally:
        for w in watches:
            w.close()


def watch_said(api: Any, namespace: str) -> dict[str, str | None]:
    return {p.metadata.name: (p.metadata.annotations or {}).get(NOTICE_WATCH_ANNOTATION)
            for p in job_pods(api, namespace, "llama")}


def fallbacks(api: Any, namespace: str) -> list[str]:
    return [e.message for e in events(api, namespace, "NoticeFallback")]


def start(cluster: Any, api: Any, namespace: str, nodes: list[str]) -> str:
    """A running two-pod job on ``nodes``; the node of its pod 0."""
    apply(cluster, job_manifest("llama", namespace, replicas=2, tag=node_tag(cluster, nodes[0])))
    return str(wait_running(api, namespace, "llama")[0].spec.node_name)


def test_the_pods_hear_the_notice_from_the_jobs_object_and_no_pod_is_written(
        cluster, api, namespace, operator, nodes, tmp_path) -> None:
    doomed = start(cluster, api, namespace, nodes)
    with runtimes(cluster, namespace, tmp_path, {"llama-0": "llama-worker", "llama-1": "llama-worker"}) as heard:
        wait_for(lambda: set(watch_said(api, namespace).values()) == {"llama-notice"}, 20,
                 "both pods saying they watch llama-notice", describe=lambda: str(watch_said(api, namespace)))
        time.sleep(1.0)  # the operator's pod watch carries the declarations into its cache (a watch event away)
        taint_node(api, doomed, SPOT_TAINT, "true", "NoSchedule")
        wait_for(lambda: all(heard.values()), 30, "the notice heard by both pods' runtimes",
                 describe=lambda: f"{heard}\n{operator.tail(40)}")
    got = {pod: [(n.id, n.source, n.reason) for n in ns] for pod, ns in heard.items()}
    (first,) = set(got["llama-0"])
    assert got == {"llama-0": [first], "llama-1": [first]} and first[1:] == ("job-notice", "gke-spot")
    assert notices(api, namespace, "llama") == {"llama-0": None, "llama-1": None}  # no per-pod write
    cm = client.CoreV1Api(api).read_namespaced_config_map("llama-notice", namespace)
    assert json.loads(cm.data["notice"])["id"] == first[0] and cm.metadata.owner_references[0].kind == "TrainingJob"
    wait_for(lambda: status(api, namespace, "llama").get("lastNotice"), 30, "status.lastNotice")
    assert status(api, namespace, "llama")["lastNotice"]["id"] == first[0]
    assert len(events(api, namespace, "PreemptionNotice")) == 1
    assert events(api, namespace, "PreemptionNotice", kind="Pod") == [] and fallbacks(api, namespace) == []
    assert "(0 pods annotated, llama-notice written" in operator.log_path.read_text()
    operator.assert_no_errors()
    # A restarted operator lists the object at start (with the chart's RBAC): its notice dates the signal still on
    # the node, and nothing is delivered, written or posted again.
    operator.restart()
    handled_afresh(operator, namespace, "llama", doomed)
    log = operator.log_path.read_text()
    assert "1 notice object(s) listed" in log and "pods annotated" not in log, operator.tail(40)
    assert json.loads(client.CoreV1Api(api).read_namespaced_config_map("llama-notice", namespace).data["notice"])[
        "id"] == first[0]
    assert len(events(api, namespace, "PreemptionNotice")) == 1 and status(api, namespace, "llama")["lastNotice"][
        "id"] == first[0]
    operator.assert_no_errors()


def test_a_pod_whose_watch_is_refused_is_annotated_and_the_job_event_names_it(
        cluster, api, namespace, operator, nodes, tmp_path) -> None:
    """Pod 1's runtime holds a token without the Role (RBAC removed): its list is refused and so is the patch that
    would say so; it never says it watches, so the operator annotates it, and only it."""
    doomed = start(cluster, api, namespace, nodes)
    with runtimes(cluster, namespace, tmp_path, {"llama-0": "llama-worker", "llama-1": "default"}) as heard:
        wait_for(lambda: watch_said(api, namespace)["llama-0"] == "llama-notice", 20, "pod 0 saying it watches")
        time.sleep(1.0)  # as above
        taint_node(api, doomed, SPOT_TAINT, "true", "NoSchedule")
        wait_for(lambda: heard["llama-0"] and notices(api, namespace, "llama")["llama-1"], 30,
                 "pod 0 hearing the object and pod 1 annotated", describe=lambda: operator.tail(40))
        assert heard["llama-1"] == [] and watch_said(api, namespace)["llama-1"] is None
    on_pods = notices(api, namespace, "llama")
    assert on_pods["llama-0"] is None and json.loads(on_pods["llama-1"])["id"] == heard["llama-0"][0].id
    (message,) = wait_for(lambda: fallbacks(api, namespace), 15, "the NoticeFallback Event")
    assert "1 pod(s) do not watch llama-notice" in message and message.endswith("llama-1")
    operator.assert_no_errors()


def test_a_refused_notice_object_falls_back_to_annotating_every_pod(
        cluster, api, namespace, operator, nodes, tmp_path) -> None:
    """The namespace's quota allows no further ConfigMap: the object's create is refused (403) and both pods, though
    watching, get the annotation; the Event says why."""
    doomed = start(cluster, api, namespace, nodes)
    core = client.CoreV1Api(api)
    count = len(core.list_namespaced_config_map(namespace).items)
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "no-more-configmaps"},
                                                      "spec": {"hard": {"count/configmaps": str(count)}}})
    wait_for(lambda: (core.read_namespaced_resource_quota("no-more-configmaps", namespace).status.used or {}), 30,
             "the quota's usage counted")
    with runtimes(cluster, namespace, tmp_path, {"llama-0": "llama-worker", "llama-1": "llama-worker"}):
        wait_for(lambda: set(watch_said(api, namespace).values()) == {"llama-notice"}, 20, "both pods watching")
        time.sleep(1.0)  # as above
        taint_node(api, doomed, SPOT_TAINT, "true", "NoSchedule")
        wait_for(lambda: all(notices(api, namespace, "llama").values()), 30, "the annotation on both pods",
                 describe=lambda: operator.tail(40))
    (message,) = wait_for(lambda: fallbacks(api, namespace), 15, "the NoticeFallback Event")
    assert message == "llama-notice could not be written (HTTP 403): the notice was annotated on 2 pod(s) instead"
    assert not core.list_namespaced_config_map(namespace, field_selector="metadata.name=llama-notice").items
