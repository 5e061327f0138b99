"""A worker ended because a peer went silent (JAX's coordination service, SIGABRT/134; its report says
``peerLost``): a disruption when a worker of the attempt is lost, a failure when every worker ended and none was
lost, else a bounded wait for the lost peer to show -- in both restart modes, in either order of the events."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy import views
from reprieve_operator.policy.decide import PROBE_EVERY_SECONDS, View, decide
from reprieve_operator.policy.inplace import Assignment, PodView, decide_inplace
from reprieve_operator.policy.restart import PEER_LOST_WAIT_SECONDS, RestartPlan, WorkerPod, decide_restart

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)
RUN = {"phase": "Running", "attempt": 1, "attemptStartTime": "2026-11-26T11:00:00Z"}
NOTICE = {"id": "gke-spot/n1/1", "node": "n1", "reason": "gke-spot", "deadline": "x", "observedAt": "x", "attempt": 1}
ASSIGNED = Assignment(1, {"llama-0": 0, "llama-1": 1, "llama-2": 2}, "10.0.0.1:8476")


def job(mode: str, status: dict[str, Any] | None = None) -> Any:
    body = make_job(name="llama", namespace="ml", replicas=3, restartMode=mode)
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "train.py"]
    return body.with_status(**{**RUN, **(status or {})}).model()


# Each worker: "run" (running, silent or not), "lost" (its node is gone), "notready" (running on a NotReady node),
# "cutoff" (running, its pod's address did not answer the operator's probe),
# ("peer", ago) (exited 134 naming process 1 as lost, ``ago`` seconds before NOW; ("peer", ago, k): naming process
# k), ("gone", ago) (the same, and its pulse found process 1 not answering: ``peerGone``), ("code", c, ago) (exited
# c on its own), "plain134" (134 without a report of a lost peer).
Worker = Any


def worker_changes(s: Worker) -> dict[str, Any]:
    """What a worker state says of its pod, in neutral words: node lost/not ready, unreachable, or an exit
    (``code``, ``peer``: the process it named lost, ``ago``: seconds before NOW)."""
    if s in ("lost", "notready", "cutoff"):
        return {"lost": {"node_lost": True}, "notready": {"node_ready": False}, "cutoff": {"reachable": False}}[s]
    if s == "plain134":
        return {"code": 134, "ago": 0.0}
    if isinstance(s, tuple) and s[0] in ("peer", "gone"):
        return {"code": 134, "peer": s[2] if len(s) > 2 else 1, "ago": s[1], "gone": s[0] == "gone"}
    if isinstance(s, tuple) and s[0] == "code":
        return {"code": s[1], "ago": s[2]}
    return {}


def pods(states: tuple[Worker, ...], make: Callable[[int, dict[str, Any]], Any],
         exited: Callable[[int, datetime, int | None, bool], dict[str, Any]]) -> list[Any]:
    """One pod per state, ``make(index, fields)``; an exit's fields are the view's own (``exited``)."""
    out = []
    for i, s in enumerate(states):
        c = worker_changes(s)
        fields = {k: v for k, v in c.items() if k not in ("code", "peer", "ago", "gone")}
        if "code" in c:
            fields |= exited(c["code"], NOW - timedelta(seconds=c["ago"]), c.get("peer"), c.get("gone", False))
        out.append(make(i, fields))
    return out


def recreate(states: tuple[Worker, ...]) -> list[WorkerPod]:
    return pods(states, lambda i, f: WorkerPod(name=f"llama-{i}", index=i, attempt=1, node=f"n{i}", **f),
                lambda code, at, peer, gone: {"phase": "Failed", "exit_code": code, "exit_time": at,
                                              **({"peer_lost": (peer,)} if peer is not None else {}),
                                              **({"peer_gone": (peer,)} if gone else {})})


def inplace(states: tuple[Worker, ...]) -> list[PodView]:
    return pods(states, lambda i, f: PodView(name=f"llama-{i}", role="worker", index=i, attempt=1, node=f"n{i}",
                                             ip=f"10.0.0.{i + 1}", **f),
                lambda code, at, peer, gone: {"exit_attempt": 1, "exit_code": code, "exit_time": at,
                                              **({"exit_peer_lost": (peer,)} if peer is not None else {}),
                                              **({"exit_peer_gone": (peer,)} if gone else {})})


def decided(mode: str, states: tuple[Worker, ...], status: dict[str, Any] | None = None) -> RestartPlan:
    """The decided restart (or failure), or the plan when nothing is decided."""
    j = job(mode, status)
    if mode == "Recreate":
        return decide_restart(j, recreate(states), (), NOW)
    plan, extra = decide_inplace(j, inplace(states), ASSIGNED, (), NOW)
    return extra.record or plan


PEER = ("peer", 5.0)
GONE = ("gone", 5.0)
LATE = ("peer", PEER_LOST_WAIT_SECONDS + 1)
# (case, workers, status, cause, words in the message)
ROWS: list[tuple[str, tuple[Worker, ...], dict[str, Any], str | None, str]] = [
    ("survivors ended by the lost peer, its node known lost: a disruption", (PEER, "lost", PEER), {},
     "disruption", "worker llama-1 lost its node n1 (2 other worker(s) ended as they lost it)"),
    ("the same after a notice in this attempt: a preemption", (PEER, "lost", PEER), {"lastNotice": NOTICE},
     "preemption", "lost its node"),
    ("the silent peer's node is NotReady: a disruption", (PEER, "notready", PEER), {}, "disruption",
     "lost it"),
    ("the silent peer's pod does not answer the probe (cut off): a disruption at once", (PEER, "cutoff", PEER), {},
     "disruption", "worker llama-1 went silent and its pod does not answer on the network (cut off)"),
    ("... the same after a notice in this attempt: a preemption", (PEER, "cutoff", PEER), {"lastNotice": NOTICE},
     "preemption", "cut off"),
    ("the survivors' pulse found the silent peer not answering (peerGone): a disruption at once, no probe",
     (GONE, "run", GONE), {}, "disruption",
     ("worker llama-1 went silent and did not answer the pulse of process(es) 0, 2 (its node gone or cut off the "
      "network) (2 other worker(s) ended as they lost it)")),
    ("... one survivor's pulse is enough (the other only heard it from process 0)", (GONE, "run", PEER), {},
     "disruption", "did not answer the pulse of process(es) 0 ("),
    ("... gone, after a notice in this attempt: a preemption", (GONE, "run", GONE), {"lastNotice": NOTICE},
     "preemption", "did not answer the pulse"),
    ("a pod that does not answer but nobody named silent: nothing to decide", ("run", "cutoff", "run"), {}, None,
     ""),
    ("the peer ended with its own error: a failure, named after it", (PEER, ("code", 1, 5.0), PEER), {}, "failure",
     "worker llama-1 exited with code 1"),
    ("every worker ended by a lost peer, none lost, no two naming each other: a failure (a deterministic abort)",
     (PEER, PEER, PEER), {}, "failure", "no worker of the attempt was lost"),
    ("worker 1 cut off: 0 and 2 name it, it names 0 (its coordinator), none lost: a partition, a disruption",
     (PEER, ("peer", 5.0, 0), PEER), {}, "disruption", "processes 0 and 1 each named the other"),
    ("... the same after a notice in this attempt: still the partition's (a disruption)",
     (PEER, ("peer", 5.0, 0), PEER), {"lastNotice": NOTICE}, "disruption", "a network partition"),
    ("0 and 2 name 1, 1 names 2 that names 1: the pair 1-2 lost each other", (PEER, ("peer", 5.0, 2), PEER), {},
     "disruption", "processes 1 and 2 each named the other"),
    ("134 without a peer-lost report beside a lost node: a failure, as before", ("plain134", "lost", "run"), {},
     "failure", "exited with code 134"),
    ("the lost peer not shown yet: wait", (PEER, "run", PEER), {}, None, ""),
    ("... not shown within the wait: a failure", (LATE, "run", LATE), {}, "failure",
     f"not shown lost within {PEER_LOST_WAIT_SECONDS:.0f} s"),
]


@pytest.mark.parametrize("mode", ["Recreate", "InPlace"])
@pytest.mark.parametrize(("case", "states", "status", "cause", "words"), ROWS, ids=[r[0] for r in ROWS])
def test_peer_lost_exits(mode: str, case: str, states: tuple[Worker, ...], status: dict[str, Any],
                         cause: str | None, words: str) -> None:
    plan = decided(mode, states, status)
    assert plan.cause == cause, (case, plan)
    assert words in plan.message, (case, plan.message)
    if cause == "failure":
        assert plan.phase == "Restarting" and plan.conditions[0].reason == "Failure", plan
    if cause is None and PEER in states:  # it says why it waits, and looks again when the wait runs out
        assert plan.probe == ("llama-1",), plan  # ... after probing the silent peer's pod
        cond = next(c for c in plan.conditions if c.reason == "WaitingForLostPeer")
        assert (cond.type, cond.status) == ("Restarting", "Unknown"), cond
        assert "llama-1" in cond.message and "2026-11-26T12:00:55Z" in cond.message, cond
        assert plan.requeue_after == pytest.approx(PEER_LOST_WAIT_SECONDS - 5.0), plan


@pytest.mark.parametrize("mode", ["Recreate", "InPlace"])
def test_the_134s_before_the_node_is_known_lost_spend_no_failure(mode: str) -> None:
    """The survivors' exits come first (the heartbeat timeout), the node's loss later (NotReady after ~40 s):
    the first pass waits, the second counts one disruption; the failure budget is untouched."""
    first = decided(mode, (PEER, "run", PEER))
    assert first.cause is None and first.phase in ("Running", "Pending"), first
    then = decided(mode, (PEER, "lost", PEER))
    assert then.cause == "disruption", then
    assert decided(mode, (PEER, "lost", PEER), {"restarts": {"failure": 3}}).phase == "Restarting"


def test_in_place_never_keeps_a_pod_its_peers_report_silent_or_on_a_notready_node() -> None:
    """After the wait ran out, the silent pod (no report of its own) is replaced, not restarted in place; the
    same for a pod on a NotReady node."""
    j = job("InPlace")
    spare = PodView(name="llama-spare-a", role="spare", index=None, attempt=1, node="n9", ip="10.0.0.9")
    _, extra = decide_inplace(j, [*inplace((LATE, "run", LATE)), spare], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "failure", extra.record
    assert extra.assign is not None and "llama-1" not in extra.assign.processes, extra
    assert extra.assign.processes["llama-spare-a"] == 1, extra.assign
    taken = "its peers lost it (process 1 went silent): spare llama-spare-a takes over"
    assert [r.reason for r in extra.replaced] == [taken], extra.replaced
    _, extra = decide_inplace(j, [*inplace((PEER, "notready", PEER)), spare], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "disruption", extra.record
    assert extra.assign is not None and "llama-1" not in extra.assign.processes, extra
    assert "its node n1 is not Ready" in extra.replaced[0].reason, extra.replaced
    _, extra = decide_inplace(j, [*inplace((GONE, "run", GONE)), spare], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "disruption", extra.record
    assert extra.assign is not None and extra.assign.processes["llama-spare-a"] == 1, extra
    assert "its peers lost it (process 1 went silent)" in extra.replaced[0].reason, extra.replaced
    _, extra = decide_inplace(j, [*inplace((PEER, "cutoff", PEER)), spare], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "disruption", extra.record
    assert extra.assign is not None and extra.assign.processes["llama-spare-a"] == 1, extra
    assert "its pod does not answer on the network (cut off)" in extra.replaced[0].reason, extra.replaced


def test_a_peer_that_reported_its_own_exit_is_kept_in_place() -> None:
    """Its peers named it, but it reported an exit itself: its supervisor lives, its pod restarts in place."""
    j = job("InPlace")
    _, extra = decide_inplace(j, inplace((PEER, ("code", 1, 5.0), PEER)), ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "failure", extra.record
    assert extra.assign is not None and sorted(extra.kept) == ["llama-0", "llama-1", "llama-2"], extra


def test_the_views_read_the_report_the_termination_message_and_node_readiness() -> None:
    exit_report = {"attempt": 1, "code": 134, "time": "2026-11-26T11:59:55Z", "peerLost": [2, 1, 1, "x", -1],
                   "peerGone": [2, "y"]}
    raw = {"metadata": {"name": "llama-0", "labels": {"reprieve.dev/replica-index": "0", "reprieve.dev/attempt": "1"},
                        "annotations": {"reprieve.dev/exit": json.dumps(exit_report)}},
           "spec": {"nodeName": "n0"}, "status": {"phase": "Running"}}
    view = views.pod_view(raw)
    assert view is not None and (view.exit_peer_lost, view.exit_peer_gone) == ((1, 2), (2,)), view
    assert views.worker_view(view, 1, 1, 42).peer_gone == (2,)
    term = {"exitCode": 134, "finishedAt": "2026-11-26T11:59:55Z", "message": json.dumps({"peerLost": [0, 2],
                                                                                           "peerGone": [2]})}
    pod = {**raw, "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": term}}]}}
    worker = views.worker_pod(pod)
    assert worker is not None and (worker.exit_code, worker.peer_lost, worker.peer_gone) == (134, (0, 2), (2,)), worker
    assert worker.exit_time == datetime(2026, 11, 26, 11, 59, 55, tzinfo=UTC)
    logs = {**term, "message": "Terminating process because ... another task died"}  # FallbackToLogsOnError
    other = views.worker_pod({**raw, "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated":
                                                                                                      logs}}]}})
    assert other is not None and other.peer_lost == (), other
    nodes = {"a": {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
             "b": {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}},
             "c": {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, "d": {}}
    assert views.not_ready_nodes(nodes) == {"b", "c"}


def test_decide_writes_why_it_waits_and_looks_again_when_the_wait_runs_out() -> None:
    """Through the whole decision (raw pods, status patch): the condition is in the status, nothing is recorded,
    and the job is looked at again when the wait runs out."""
    def raw(name: str, index: int, report: dict[str, Any] | None) -> dict[str, Any]:
        ann = {"reprieve.dev/exit": json.dumps(report)} if report else {}
        return {"metadata": {"name": name, "labels": {"reprieve.dev/replica-index": str(index),
                                                      "reprieve.dev/attempt": "1", "reprieve.dev/role": "worker"},
                             "annotations": ann},
                "spec": {"nodeName": f"n{index}"}, "status": {"phase": "Running", "podIP": f"10.0.0.{index + 1}"}}

    peer = {"attempt": 1, "code": 134, "time": "2026-11-26T11:59:55Z", "peerLost": [1]}
    pods = [raw("llama-0", 0, peer), raw("llama-1", 1, None), raw("llama-2", 2, peer)]
    base = View(job=job("InPlace"), pods=pods, now=NOW, assignment=ASSIGNED, known_nodes={"n0", "n1", "n2"},
                placed=True, looked=True, peer_lost_wait_s=30.0)
    asks = decide(base)  # first: probe the silent peer's pod (its address), nothing carried out yet
    assert asks.probe == frozenset({("llama-1", "10.0.0.2")}) and asks.record is None and not asks.status, asks
    out = decide(replace(base, probed=True))  # it answers: wait, and probe again within PROBE_EVERY_SECONDS
    assert out.probe == frozenset() and out.record is None and out.assign is None, out
    assert out.requeue_after == pytest.approx(PROBE_EVERY_SECONDS), out
    assert decide(replace(base, peer_lost_wait_s=60.0, probed=True, now=NOW + timedelta(seconds=53))).requeue_after \
        == pytest.approx(2.0)  # the wait ends before the next probe
    cut = decide(replace(base, probed=True, unreachable={"llama-1"}))  # no answer: cut off, lost now
    assert cut.counter is not None and (cut.counter.kind, cut.counter.label) == ("restart", "disruption"), cut
    assert len(cut.create) == 1 and "llama-1" in cut.delete, cut  # replaced, not restarted in its pod
    (cond,) = [c for c in out.status["conditions"] if c["type"] == "Restarting"]
    assert (cond["status"], cond["reason"]) == ("Unknown", "WaitingForLostPeer"), cond
    ready = {"type": "Ready", "status": "True"}
    nodes = {n: {"metadata": {"name": n}, "status": {"conditions": [
        {**ready, "status": "Unknown"} if n == "n1" else ready]}} for n in ("n0", "n1", "n2")}
    lost = decide(View(job=job("InPlace"), pods=pods, now=NOW, assignment=ASSIGNED, known_nodes=nodes, nodes=nodes,
                       placed=True, looked=True))
    assert lost.counter is not None and (lost.counter.kind, lost.counter.label) == ("restart", "disruption"), lost
