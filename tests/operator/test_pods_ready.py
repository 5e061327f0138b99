"""Condition PodsReady (policy/podsready.py): a pod of the job stuck before it runs is said on the job, with the
kubelet's or the scheduler's words; and decide() writes it in both restart modes with one Warning Event."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.decide import View, decide
from reprieve_operator.policy.podsready import (
    IMAGE_PULL,
    UNSCHEDULABLE_GRACE_SECONDS,
    condition,
    stuck,
    unschedulable_due,
)
from reprieve_operator.policy.restart import Condition
from reprieve_operator.policy.views import compact_pod

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC)
PULL_ERR = ('rpc error: code = NotFound desc = failed to pull and unpack image "127.0.0.1:5000/lm:nope": '
            'not found')


def rfc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, index: int = 0, waiting: str | None = None, message: str = "", node: str | None = "n1",
        phase: str = "Pending", unschedulable_for: float | None = None, role: str = "worker",
        init: bool = False, deleting: bool = False) -> dict[str, Any]:
    labels = {"reprieve.dev/job-name": "llama", "reprieve.dev/attempt": "1", "reprieve.dev/role": role}
    if index >= 0:
        labels["reprieve.dev/replica-index"] = str(index)
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        key = "initContainerStatuses" if init else "containerStatuses"
        status[key] = [{"name": "trainer", "state": {"waiting": {"reason": waiting, "message": message}}}]
    if unschedulable_for is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                                 "lastTransitionTime": rfc(NOW - timedelta(seconds=unschedulable_for))}]
        node = None
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = rfc(NOW)
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


@dataclass
class Row:
    pods: list[dict[str, Any]]
    current: Condition | None = None
    running: bool = False
    want: tuple[str, str] | None = None  # (status, reason); None: nothing to write
    says: tuple[str, ...] = ()  # words the message must hold
    not_says: tuple[str, ...] = ()


FAILED_PULL = Condition("PodsReady", "False", IMAGE_PULL,
                        f"1 pod(s) cannot run: pod llama-0 (worker 0 on node n1) container trainer: ErrImagePull: "
                        f"{PULL_ERR}")
ROWS = {
    "a failed pull names the pod, its index, its node, the container and containerd's words": Row(
        [pod("llama-0", waiting="ErrImagePull", message=PULL_ERR), pod("llama-1", 1, phase="Running")],
        want=("False", IMAGE_PULL),
        says=("1 pod(s) cannot run", "pod llama-0 (worker 0 on node n1)", "container trainer: ErrImagePull",
              "127.0.0.1:5000/lm:nope", "not found")),
    "between two pulls the back-off keeps the failed pull's words (no write)": Row(
        [pod("llama-0", waiting=IMAGE_PULL, message='Back-off pulling image "127.0.0.1:5000/lm:nope"')],
        current=FAILED_PULL),
    "the back-off seen first is said as it is": Row(
        [pod("llama-0", waiting=IMAGE_PULL, message='Back-off pulling image "127.0.0.1:5000/lm:nope"')],
        want=("False", IMAGE_PULL), says=("Back-off pulling image",)),
    "a second pod stuck on its pull: written again, naming both": Row(
        [pod("llama-0", waiting=IMAGE_PULL, message="Back-off"), pod("llama-1", 1, waiting="ErrImagePull",
                                                                     message=PULL_ERR)],
        current=FAILED_PULL, want=("False", IMAGE_PULL), says=("2 pod(s)", "pod llama-0", "pod llama-1")),
    "an invalid image name comes first, whatever the order of the pods": Row(
        [pod("llama-0", waiting="ErrImagePull", message=PULL_ERR),
         pod("llama-1", 1, waiting="InvalidImageName", message='invalid image name "LM:x"')],
        want=("False", "InvalidImageName"), says=("2 pod(s)",)),
    "a missing secret (the container cannot be configured)": Row(
        [pod("llama-0", waiting="CreateContainerConfigError", message='secret "hf-token" not found')],
        want=("False", "CreateContainerConfigError"), says=('secret "hf-token" not found',)),
    "an init container's pull counts too": Row(
        [pod("llama-0", waiting="ErrImagePull", message=PULL_ERR, init=True)], want=("False", IMAGE_PULL)),
    "a spare's pull names it as the spare": Row(
        [pod("llama-spare-x", -1, waiting="ErrImagePull", message=PULL_ERR, role="spare")],
        want=("False", IMAGE_PULL), says=("pod llama-spare-x (spare on node n1)",)),
    "ContainerCreating is not stuck": Row([pod("llama-0", waiting="ContainerCreating")]),
    "a pod being deleted is not stuck": Row([pod("llama-0", waiting="ErrImagePull", deleting=True)]),
    "no node for a few seconds is a gang waiting for nodes, not stuck": Row(
        [pod("llama-0", unschedulable_for=UNSCHEDULABLE_GRACE_SECONDS - 5)]),
    "no node past the grace: the scheduler's words": Row(
        [pod("llama-0", unschedulable_for=UNSCHEDULABLE_GRACE_SECONDS + 1)], want=("False", "Unschedulable"),
        says=("pod llama-0 (worker 0)", "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")),
    "more than three pods: three named, the rest counted": Row(
        [pod(f"llama-{i}", i, waiting="ErrImagePull", message="x") for i in range(5)],
        want=("False", IMAGE_PULL), says=("5 pod(s)", "pod llama-2", "and 2 more"), not_says=("pod llama-3",)),
    "nothing stuck, never was: no condition at all": Row([pod("llama-0", phase="Running")], running=True),
    "the image is there now, pods still starting": Row(
        [pod("llama-0", waiting="ContainerCreating")], current=FAILED_PULL, want=("Unknown", "Starting")),
    "every pod runs after the problem": Row(
        [pod("llama-0", phase="Running")], current=FAILED_PULL, running=True, want=("True", "Running")),
    "True already: nothing to write": Row(
        [pod("llama-0", phase="Running")], current=Condition("PodsReady", "True", "Running", "x"), running=True),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_pods_ready(name: str) -> None:
    row = ROWS[name]
    got = condition(stuck(row.pods, NOW), row.running, row.current)
    assert (None if got is None else (got.status, got.reason)) == row.want, got
    for words in row.says:
        assert got is not None and words in got.message, (words, got)
    for words in row.not_says:
        assert got is not None and words not in got.message, (words, got)


@pytest.mark.parametrize("name", [n for n, r in ROWS.items() if r.want is not None])
def test_the_cache_keeps_what_the_condition_reads(name: str) -> None:
    """The operator decides on compact pods (views.compact_pod): they must carry the same answer."""
    row = ROWS[name]
    assert stuck([compact_pod(p) for p in row.pods], NOW) == stuck(row.pods, NOW)


def test_a_pod_waiting_for_a_node_is_looked_at_again_when_its_grace_runs_out() -> None:
    pods = [pod("llama-0", unschedulable_for=10), pod("llama-1", 1, unschedulable_for=25)]
    assert unschedulable_due(pods, NOW) == pytest.approx(UNSCHEDULABLE_GRACE_SECONDS - 25 + 1)
    assert unschedulable_due([pod("llama-0", unschedulable_for=40)], NOW) is None
    assert unschedulable_due([pod("llama-0", phase="Running")], NOW) is None


def _job(mode: str, status: dict[str, Any], conditions: list[dict[str, Any]] | None = None) -> Any:
    body = make_job(name="llama", namespace="ml", restartMode=mode)
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "train.py"]
    return body.with_status(**status, conditions=conditions or []).model()


PENDING = {"phase": "Pending", "attempt": 1, "attemptStartTime": rfc(NOW - timedelta(minutes=2)), "ready": "0/2",
           "replicas": 2, "selector": "reprieve.dev/job-name=llama", "startTime": rfc(NOW - timedelta(minutes=2))}


@pytest.mark.parametrize("mode", ["Recreate", "InPlace"])
def test_decide_writes_the_condition_and_one_warning_in_both_modes(mode: str) -> None:
    pods = [compact_pod(pod("llama-0", waiting="ErrImagePull", message=PULL_ERR)),
            compact_pod(pod("llama-1", 1, waiting="ErrImagePull", message=PULL_ERR, node="n2"))]
    status = {**PENDING, "restartMode": mode}
    view = View(job=_job(mode, status), pods=pods, now=NOW, known_nodes={"n1", "n2"}, placed=True, looked=True)
    out = decide(view)
    conds = {c["type"]: c for c in out.status.get("conditions", [])}
    assert conds["PodsReady"]["status"] == "False" and conds["PodsReady"]["reason"] == IMAGE_PULL
    assert "127.0.0.1:5000/lm:nope" in conds["PodsReady"]["message"]
    warnings = [e for e in out.status_events if e.type == "Warning"]
    assert [e.reason for e in warnings] == [IMAGE_PULL]
    # The next pass, the condition written: the same pods between pulls write nothing and post nothing.
    again = View(job=_job(mode, status, [conds["PodsReady"]]),
                 pods=[compact_pod(pod("llama-0", waiting=IMAGE_PULL, message="Back-off")),
                       compact_pod(pod("llama-1", 1, waiting=IMAGE_PULL, message="Back-off", node="n2"))],
                 now=NOW, known_nodes={"n1", "n2"}, placed=True, looked=True)
    out2 = decide(again)
    assert "conditions" not in out2.status and not out2.status_events


def test_decide_looks_again_when_a_pod_without_a_node_reaches_its_grace() -> None:
    pods = [compact_pod(pod("llama-0", unschedulable_for=20)), compact_pod(pod("llama-1", 1, unschedulable_for=20))]
    out = decide(View(job=_job("Recreate", {**PENDING, "restartMode": "Recreate"}), pods=pods, now=NOW,
                      known_nodes={"n1"}, placed=True, looked=True))
    assert out.requeue_after == pytest.approx(UNSCHEDULABLE_GRACE_SECONDS - 20 + 1)
    assert "conditions" not in out.status
