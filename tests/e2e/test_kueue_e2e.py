"""End to end with real Kueue: one ClusterQueue with quota for one job; the example trainer (2 JAX processes)
queued at low priority is preempted by a higher-priority job, saves on the operator's notice, gives its quota back,
waits, resumes when the quota frees, and ends with the same parameters as an uninterrupted run (docs/kueue.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster.goodput import analyse, read_step_log
from localcluster.kueue import cluster_queue, local_queue, priority_class, resource_flavor
from localcluster.stack import CHART, RELEASE, RELEASE_NS, OperatorProcess

from .conftest import get_tj, submit_recreate, succeeded, wait_step, wait_tj

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
# As few steps as the assertions need (tests/e2e/test_realnodes_e2e.py's constants say how they were measured): the
# preemptor is applied once the victim's step log reaches PREEMPT_AT; the notice is saved at the earliest step no
# process has passed, and process 1 runs ahead of process 0 up to the example's next loss log (every 50 steps), so
# the save lands at step 50, or at 100 if process 0 passed 50 before Kueue's eviction reached it. STEPS = 110 leaves
# attempt 2 steps to prove the resume either way (the reference runs the same steps).
STEPS, SLEEP, PREEMPT_AT = 110, 0.03, 15


@pytest.fixture
def kueue_operator(cluster: Any, chart_installed: None, compiled_example: None, kueue: Any, namespace: str,
                   tmp_path: Path) -> Iterator[OperatorProcess]:
    cluster.helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NS, "--reuse-values", "--set", "kueue.enabled=true",
                 "--wait", timeout=90)
    op = OperatorProcess(cluster, tmp_path / "operator", namespaces=[namespace], extra_args=["--kueue"]).start()
    try:
        yield op
    finally:
        op.stop()


def test_a_kueue_preemption_saves_releases_the_quota_and_resumes_without_losing_a_step(
        cluster: Any, namespace: str, kueue: Any, kueue_operator: OperatorProcess, pool: Any,
        tmp_path: Path) -> None:
    """Why this long: three jobs of the example (the preempted one in two attempts, the uninterrupted reference)
    and the preemptor, each through Kueue's admission."""
    pool_a, _ = pool(2)
    pool_b, _ = pool(2)
    flavor, cq = f"f-{namespace}", f"cq-{namespace}"
    kueue.apply(resource_flavor(flavor, {"reprieve.test/pool": pool_a}), cluster_queue(cq, flavor, "2"),
                local_queue(namespace, "lq", cq), priority_class(f"low-{namespace}", 100),
                priority_class(f"high-{namespace}", 1000))
    # The preempted job: queued, 1 CPU per worker (the whole quota), saves only on a notice (no periodic save:
    # without the notice every step would be lost). No nodeSelector: the flavor's node labels place it on pool A.
    ckpt = _submit_queued(cluster, namespace, "victim", tmp_path, "lq", f"low-{namespace}")
    ref = submit_recreate(cluster, namespace, "reference", tmp_path, steps=STEPS, step_sleep=SLEEP,
                          node_selector={"reprieve.test/pool": pool_b})
    wait_step(ckpt, PREEMPT_AT, 240, cluster, namespace, "victim")

    preemptor = {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
                 "metadata": {"name": "boss", "namespace": namespace,
                              "labels": {"kueue.x-k8s.io/queue-name": "lq",
                                         "kueue.x-k8s.io/priority-class": f"high-{namespace}"}},
                 "spec": {"replicas": 2, "restartMode": "Recreate", "checkpoint": {"uri": "/tmp/boss"},
                          "template": {"spec": {"containers": [{
                              "name": "t", "image": "python:3.11", "command": ["python", "-c", "import time; time.sleep(2)"],
                              "resources": {"requests": {"cpu": "1"}}}]}}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(preemptor))
    wait_tj(cluster, namespace, "boss", succeeded, 240, "the preemptor admitted and done", kueue_operator)
    final = wait_tj(cluster, namespace, "victim", succeeded, 300, "the victim resumed and done", kueue_operator)
    wait_tj(cluster, namespace, "reference", succeeded, 300, "the reference done", kueue_operator)

    st = final["status"]
    assert st["lastNotice"]["reason"] == "kueue-preemption", st
    assert st["attempt"] == 2, st
    assert (st["restarts"]["preemption"], st["restartCount"]) == (1, 1), st  # the eviction: one preemption restart
    for job in ("boss", "victim"):  # the quota is freed by the pass that ends the job (issue #46, item 12)
        assert _finished_after(cluster, namespace, job) <= 1.0
    report = analyse(read_step_log(ckpt / "steps.jsonl"), start=0, end=1)
    assert [i.lost_steps for i in report.interruptions] == [0], report.summary()
    cut = report.interruptions[0]
    assert cut.resumed_at > PREEMPT_AT, report.summary()  # resumed from the agreed save, not from the start
    result, reference = (json.loads((d / "result.json").read_text()) for d in (ckpt, ref))
    assert result["sha256"] == reference["sha256"], "the resumed run's parameters differ from the uninterrupted run's"
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                        "involvedObject.name=victim", "-o", "json").stdout)["items"]
    reasons = [e["reason"] for e in events]
    assert "PreemptionNotice" in reasons and "QuotaReleased" in reasons, reasons
    # the eviction's notice took one write, the job's notice object, which both runtimes watch: no pod annotated
    # instead (issue #51: a Kueue eviction's notice goes as a node's does)
    assert "NoticeFallback" not in reasons, [e["message"] for e in events if e["reason"] == "NoticeFallback"]
    held = json.loads(cluster.read("configmaps", "victim-notice", namespace=namespace)["data"]["notice"])
    assert (held["reason"], held["attempt"]) == ("kueue-preemption", 1), held
    # Without the notice (the eviction deleting the pods, as Kueue does to a plain Job) the job had no checkpoint
    # (no periodic save): every step before the eviction would have been computed again.
    print(f"\nkueue preemption: 0 steps lost, resumed at step {cut.resumed_at} after a {cut.gap_seconds:.1f} s gap; "
          f"without the notice {cut.last_step + 1} steps would have been computed again")
    assert get_tj(cluster, namespace, "victim")["status"]["lastCheckpointStep"] == STEPS - 1


def _submit_queued(cluster: Any, namespace: str, name: str, root: Path, queue: str, prio: str) -> Path:
    from .conftest import e2e_job

    ckpt = root / name
    body = e2e_job(cluster, name, replicas=2, steps=STEPS, step_sleep=SLEEP, interval=0, checkpoint_dir=ckpt,
                   extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl"}, requests={"cpu": "1"})
    body["spec"]["restartMode"] = "Recreate"
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue, "kueue.x-k8s.io/priority-class": prio}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    return ckpt


def _finished_after(cluster: Any, namespace: str, job: str) -> float:
    """Seconds from the job's ``completionTime`` to its Workload's ``Finished=True`` (both RFC 3339 seconds)."""
    from datetime import datetime

    def at(value: str) -> float:
        return datetime.fromisoformat(value).timestamp()

    tj = get_tj(cluster, namespace, job)
    wl = json.loads(cluster.kubectl("get", "workloads", "-n", namespace, "-l", f"reprieve.dev/job-name={job}",
                                    "-o", "json").stdout)["items"]
    assert len(wl) == 1, [w["metadata"]["name"] for w in wl]
    fin = next((c for c in wl[0]["status"].get("conditions") or [] if c["type"] == "Finished"), None)
    assert fin is not None and fin["status"] == "True", wl[0]["status"]
    return at(fin["lastTransitionTime"]) - at(tj["status"]["completionTime"])
