"""The runtime's stdlib Kubernetes client against a real kube-apiserver, with a real ServiceAccount token and
exactly the RBAC the contract promises (get/list/watch/patch on the job's own pods, by resourceNames)."""

from __future__ import annotations

import itertools
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster.testing import serviceaccount_dir, wait_for
from reprieve.kube import KubeClient, KubeError, PodWatchSource
from reprieve.notice import NOTICE_ANNOTATION, NOTICE_WATCH_ANNOTATION, PROGRESS_ANNOTATION, Notice
from reprieve.notice_object import JobNoticeWatch
from reprieve.progress import ProgressReporter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

POD = "job-0"


def _apply(cluster: Any, namespace: str, objects: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                            "items": objects}))


@pytest.fixture
def worker_identity(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[KubeClient]:
    """A pending pod (never scheduled), its ServiceAccount and Role, and a client holding that SA's token."""
    yield _identity(cluster, namespace, tmp_path)


def _identity(cluster: Any, namespace: str, tmp_path: Path, notice_object: str | None = None) -> KubeClient:
    """The pod ``POD``, its ServiceAccount and its Role (with get/list/watch on the ConfigMap ``notice_object`` by
    name, as the operator's per-job Role grants), and a client holding that ServiceAccount's token."""
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"],
              "resourceNames": [POD]}]
    if notice_object:
        rules.append({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"],
                      "resourceNames": [notice_object]})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD},
           "spec": {"nodeSelector": {"reprieve.test/nowhere": "true"},
                    "containers": [{"name": "w", "image": "none", "command": ["true"]}]}}
    other = json.loads(json.dumps(pod))
    other["metadata"]["name"] = "someone-else"
    _apply(cluster, namespace, [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "job-worker"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "job-worker"},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "job-worker"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "job-worker"},
         "subjects": [{"kind": "ServiceAccount", "name": "job-worker", "namespace": namespace}]},
        pod, other,
    ])
    sa_dir = serviceaccount_dir(cluster, namespace, "job-worker", tmp_path / "serviceaccount")
    return KubeClient("127.0.0.1", cluster.api_port, str(sa_dir))


def _wait(got: list[Notice], count: int, timeout: float) -> None:
    limit = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < limit, f"{len(got)} notice(s) after {timeout}s"
        time.sleep(0.05)


def test_watch_sees_the_notice_annotation_and_its_update(cluster: Any, namespace: str,
                                                         worker_identity: KubeClient) -> None:
    got: list[Notice] = []
    events: list[dict[str, Any]] = []
    source = PodWatchSource(worker_identity, namespace, POD, got.append)
    handle = source.handle_event

    def record(event: dict[str, Any]) -> None:
        handle(event)
        events.append(event)

    source.handle_event = record  # type: ignore[method-assign]
    source.start()
    try:
        # the watch is established and has handled the pod as it is (no notice yet): its first event, ADDED
        wait_for(lambda: events, 15, "the pod watch's first event")
        assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == POD
        assert got == []
        first = {"id": "gke-spot/n/1", "reason": "gke-spot", "node": "n", "deadline": "2030-01-01T00:00:00Z"}
        t0 = time.monotonic()
        cluster.kubectl("annotate", "pod", POD, "-n", namespace, f"{NOTICE_ANNOTATION}={json.dumps(first)}")
        _wait(got, 1, 15)
        latency = time.monotonic() - t0
        assert (got[0].id, got[0].source, got[0].deadline_known) == ("gke-spot/n/1", "annotation", True)
        cluster.kubectl("annotate", "--overwrite", "pod", POD, "-n", namespace, f"{NOTICE_ANNOTATION}={{broken")
        _wait(got, 2, 15)
        assert got[1].reason == "malformed" and not got[1].deadline_known
        print(f"\nannotation -> notice through the watch: {latency * 1000:.0f} ms (includes kubectl)")
    finally:
        source.close()


def test_progress_patch_with_the_workers_own_rbac(cluster: Any, namespace: str,
                                                  worker_identity: KubeClient) -> None:
    reporter = ProgressReporter(worker_identity, namespace, POD, attempt=2)
    reporter.report(step=120, committed_step=100, force=True)
    pod = json.loads(cluster.kubectl("get", "pod", POD, "-n", namespace, "-o", "json").stdout)
    value = json.loads(pod["metadata"]["annotations"][PROGRESS_ANNOTATION])
    assert (value["step"], value["committedStep"], value["attempt"]) == (120, 100, 2)
    # the Role names only this job's pods: another pod is forbidden, and the error says so
    with pytest.raises(KubeError, match="HTTP 403"):
        worker_identity.patch_pod_annotations(namespace, "someone-else", {"x": "y"})


def test_an_unreachable_api_never_blocks_and_is_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.runtime.helpers_agreement import free_port

    caplog.set_level(logging.DEBUG, logger="reprieve.kube")
    caplog.set_level(logging.DEBUG, logger="reprieve.progress")
    refused = KubeClient("127.0.0.1", free_port(), str(tmp_path), timeout_s=1.0)  # nothing listens there
    got: list[Notice] = []
    source = PodWatchSource(refused, "ns", POD, got.append).start()
    # an API that takes the connection (the kernel does, from the backlog) and never answers: every request
    # lasts until its timeout, so a caller that waited for one would be seen waiting
    with socket.create_server(("127.0.0.1", 0), backlog=8) as silent:
        client_timeout = 30.0
        mute = KubeClient("127.0.0.1", silent.getsockname()[1], str(tmp_path), timeout_s=client_timeout)
        reporter = ProgressReporter(mute, "ns", POD, attempt=1)
        reporter.report(step=1, committed_step=1, timeout_s=2.0)  # periodic: sent from a thread
        assert reporter._busy.locked() and reporter.patches == 0  # returned while its send still waits
        t0 = time.monotonic()
        reporter.report(step=2, committed_step=2, force=True, timeout_s=1.0)  # the exit path: waits, bounded
        elapsed = time.monotonic() - t0
        assert elapsed >= 0.95, elapsed  # it did wait for this API (its own timeout), ...
        assert elapsed < client_timeout / 2, elapsed  # ... for its timeout_s, not the client's 30 s
        assert reporter.patches == 0
        assert any("could not patch progress annotation of pod ns/job-0" in r.getMessage() and "timed out" in
                   r.getMessage() for r in caplog.records), caplog.text
    # the watch failed, backed off and tried again: still retrying, not crashed
    wait_for(lambda: any("pod watch of ns/job-0 failed" in r.getMessage() and "failure 2)" in r.getMessage()
                         for r in caplog.records), 30, "the watch's second failure", describe=lambda: caplog.text)
    assert source._thread is not None and source._thread.is_alive()
    source.close()
    assert got == []


def test_job_in_cluster_stops_on_the_annotation_and_reports_progress(cluster: Any, namespace: str,
                                                                    worker_identity: KubeClient,
                                                                    tmp_path: Path) -> None:
    """reprieve.init() with the pod's contract env: the notice annotation (set with kubectl, as the operator
    would) stops the loop at an agreed step, and process 0's progress annotation names that committed step."""
    import jax.numpy as jnp
    import reprieve

    from tests.runtime.helpers_agreement import FileCheckpointer

    class Exited(Exception):
        pass

    codes: list[int] = []

    def exit_fn(code: int) -> None:
        codes.append(code)
        raise Exited

    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_POD_NAME": POD,
           "REPRIEVE_NAMESPACE": namespace, "REPRIEVE_ATTEMPT": "3", "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(cluster.api_port),
           "REPRIEVE_SERVICEACCOUNT_DIR": worker_identity.sa_dir, "REPRIEVE_SAVE_SECONDS_ESTIMATE": "1",
           "REPRIEVE_PROGRESS_INTERVAL_SECONDS": "0.1"}
    job = reprieve.init(env=env, install_sigterm=False, exit_fn=exit_fn,
                        checkpointer=lambda cfg, coord: FileCheckpointer(cfg.checkpoint_uri, coord))
    notice = {"id": "gke-spot/n/9", "reason": "gke-spot", "node": "n",
              "deadline": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 4))}
    live: dict[str, Any] = {}
    began: list[float] = []  # when each step began, by the test's own clock
    try:
        for step in job.steps(0, 100_000):
            began.append(time.perf_counter())
            time.sleep(0.005)
            if step == 20:
                for _ in range(50):  # the loop waits here: the reporter thread patches meanwhile
                    annotations = json.loads(cluster.kubectl("get", "pod", POD, "-n", namespace, "-o", "json")
                                             .stdout)["metadata"].get("annotations") or {}
                    if PROGRESS_ANNOTATION in annotations:
                        live.update(json.loads(annotations[PROGRESS_ANNOTATION]))
                        break
                    time.sleep(0.1)
                cluster.kubectl("annotate", "pod", POD, "-n", namespace,
                                f"{NOTICE_ANNOTATION}={json.dumps(notice)}")
            job.save(step, {"x": jnp.full((2,), step + 1.0)})
    except Exited:
        pass
    finally:
        job.abandon()
    assert codes == [42]
    target = job.agreement.target
    assert target is not None and target.notice.source == "annotation"
    pod = json.loads(cluster.kubectl("get", "pod", POD, "-n", namespace, "-o", "json").stdout)
    progress = json.loads(pod["metadata"]["annotations"][PROGRESS_ANNOTATION])
    assert progress["committedStep"] == progress["step"] == target.plan.final_step
    assert progress["attempt"] == 3
    # live reports came before any commit: the loop's position, not only checkpoints
    assert live["committedStep"] == -1 and 0 < live["step"] <= 19 and live["firstStep"] == 0, live
    assert live["firstStepAt"] <= live["stepAt"] <= time.time(), live
    # the reported step time is a moving average of the steps before it (from step 0, which compiles; the reports
    # were read during step 20): between the shortest and the longest of them, x2 either way
    steps = [b - a for a, b in itertools.pairwise(began[:21])]
    assert live["stepSeconds"] >= 0.005 and min(steps) / 2 <= live["stepSeconds"] <= 2 * max(steps), (live, steps)
    assert progress["firstStep"] == 0 and progress["saveBlockingSeconds"] >= 0


def test_a_jobs_first_step_is_reported_before_the_first_interval(cluster: Any, namespace: str,
                                                                   worker_identity: KubeClient,
                                                                   tmp_path: Path) -> None:
    """Live reports every 60 s, yet the annotation names the attempt's first step while its sixth runs: an
    attempt cut off the network seconds after it started has said where it started (docs/goodput.md)."""
    import jax.numpy as jnp
    import reprieve

    from tests.runtime.helpers_agreement import FileCheckpointer

    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_POD_NAME": POD,
           "REPRIEVE_NAMESPACE": namespace, "REPRIEVE_ATTEMPT": "4", "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(cluster.api_port),
           "REPRIEVE_SERVICEACCOUNT_DIR": worker_identity.sa_dir, "REPRIEVE_PROGRESS_INTERVAL_SECONDS": "60"}
    job = reprieve.init(env=env, install_sigterm=False, exit_fn=lambda code: None,
                        checkpointer=lambda cfg, coord: FileCheckpointer(cfg.checkpoint_uri, coord))
    seen: dict[str, Any] = {}

    def annotated() -> bool:
        pod = json.loads(cluster.kubectl("get", "pod", POD, "-n", namespace, "-o", "json").stdout)
        raw = (pod["metadata"].get("annotations") or {}).get(PROGRESS_ANNOTATION)
        seen.update(json.loads(raw) if raw else {})
        return bool(raw)

    try:
        for step in job.steps(0, 6):
            if step == 5:
                wait_for(annotated, 20, "the first step's progress report")
            job.save(step, {"x": jnp.full((2,), step + 1.0)})
    finally:
        job.abandon()
    # sent at once: the loop's position when the thread read it, while the sixth step still waits
    assert (seen["attempt"], seen["firstStep"]) == (4, 0) and seen["step"] <= 4, seen


def _pod_annotation(cluster: Any, namespace: str, key: str) -> str | None:
    pod = json.loads(cluster.kubectl("get", "pod", POD, "-n", namespace, "-o", "json").stdout)
    return (pod["metadata"].get("annotations") or {}).get(key)


def _configmap(name: str, notice: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"notice": json.dumps(notice)}}


def test_the_job_notice_object_is_heard_through_its_watch_and_the_pod_says_it_watches(
        cluster: Any, namespace: str, tmp_path: Path) -> None:
    """With exactly the per-job Role (get/list/watch on ``job-notice`` by name): the notice written once into the
    job's object reaches the runtime, a new id with an earlier deadline after it, one of another attempt not."""
    client = _identity(cluster, namespace, tmp_path, notice_object="job-notice")
    got: list[Notice] = []
    source = JobNoticeWatch(client, namespace, "job", POD, got.append, attempt=3).start()
    try:
        wait_for(lambda: _pod_annotation(cluster, namespace, NOTICE_WATCH_ANNOTATION) == "job-notice", 15,
                 "the pod saying it watches job-notice")
        first = {"id": "gke-spot/n/1", "reason": "gke-spot", "node": "n", "deadline": "2030-01-01T00:10:00Z",
                 "attempt": 3}
        t0 = time.monotonic()
        _apply(cluster, namespace, [_configmap("job-notice", first)])
        _wait(got, 1, 15)
        latency = time.monotonic() - t0
        assert (got[0].id, got[0].source, got[0].deadline_known) == ("gke-spot/n/1", "job-notice", True)
        _apply(cluster, namespace, [_configmap("job-notice", {**first, "id": "other", "attempt": 2})])
        earlier = {**first, "id": "aws/n/2", "deadline": "2030-01-01T00:05:00Z"}
        _apply(cluster, namespace, [_configmap("job-notice", earlier)])
        _wait(got, 2, 15)
        assert [n.id for n in got] == ["gke-spot/n/1", "aws/n/2"]  # attempt 2's was ignored
        assert got[1].deadline < got[0].deadline
        assert _pod_annotation(cluster, namespace, NOTICE_ANNOTATION) is None  # nothing was written on the pod
        print(f"\nConfigMap -> notice through the job object's watch: {latency * 1000:.0f} ms (includes kubectl)")
    finally:
        source.close()


def test_a_refused_watch_of_the_notice_object_is_said_on_the_pod(cluster: Any, namespace: str,
                                                                 tmp_path: Path) -> None:
    """The Role lacks the ConfigMap (RBAC removed): the list is refused with 403 and the pod says so, so the operator
    annotates it; nothing is heard from the object."""
    client = _identity(cluster, namespace, tmp_path)
    got: list[Notice] = []
    source = JobNoticeWatch(client, namespace, "job", POD, got.append, attempt=1).start()
    try:
        wait_for(lambda: _pod_annotation(cluster, namespace, NOTICE_WATCH_ANNOTATION) == "refused: HTTP 403", 15,
                 "the pod saying its watch of job-notice is refused")
        assert got == []
    finally:
        source.close()
