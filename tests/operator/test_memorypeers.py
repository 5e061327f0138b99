"""policy.memorypeers: the memory tier's pairing of each attempt (first attempt by stable names, later ones by
pod IPs with nodes and zones) and the check of the pairing in force (the MemoryPaired condition and its Events)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy import memorypeers
from reprieve_operator.policy.decide import View, decide
from reprieve_operator.policy.events import Event, for_status_change
from reprieve_operator.policy.inplace import Assignment, PodView
from reprieve_operator.policy.views import compact_pod, zones

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC)
MEMORY = {"checkpoint": {"uri": "/ckpt", "memory": {"sizeLimit": "1Gi"}}}


def job(replicas: int = 3, memory: bool = True, status: dict[str, Any] | None = None) -> Any:
    body = make_job(replicas=replicas, restartMode="InPlace", **(MEMORY if memory else {}))
    body.with_command("python", "train.py")
    return body.with_status(**(status or {})).model()


def view(name: str, node: str | None, ip: str | None = None, zone: str | None = None, role: str = "worker",
         phase: str = "Running") -> PodView:
    index = int(name.rsplit("-", 1)[1]) if role == "worker" and name[-1].isdigit() else None
    return PodView(name=name, role=role, index=index, attempt=1, phase=phase, node=node,
                   ip=ip if ip is not None else f"10.0.0.{index if index is not None else 9}", zone=zone)


def stable(i: int) -> str:
    return f"llama-{i}.llama.default.svc:8477"


def test_the_first_attempt_is_a_ring_of_stable_names() -> None:
    assert memorypeers.first_peers(job(3)) == {0: stable(1), 1: stable(2), 2: stable(0)}
    assert memorypeers.first_peers(job(1)) == {0: None}
    assert memorypeers.first_peers(job(3, memory=False)) == {}


def test_a_stable_name_of_the_previous_attempt_counts_as_its_pods_address() -> None:
    """The first attempt's ring (stable names) is kept by the first restart where still valid: the zone
    preference alone would move process 0's replica to process 2's pod."""
    pods = [view("llama-0", "a", zone="z1"), view("llama-1", "b", zone="z1"), view("llama-2", "c", zone="z2")]
    processes = {p.name: i for i, p in enumerate(pods)}
    peers = memorypeers.memory_peers(job(3), processes, pods, memorypeers.first_peers(job(3)))
    assert peers == {0: "10.0.0.1:8477", 1: "10.0.0.2:8477", 2: "10.0.0.0:8477"}
    fresh = memorypeers.memory_peers(job(3), processes, pods, None)
    assert fresh[0] == "10.0.0.2:8477"  # without a previous pairing: another zone first
    assert memorypeers.peer_nodes(job(3), peers, pods) == {0: "b", 1: "c", 2: "a"}


CONDITION_ROWS: list[tuple[str, int, list[PodView], dict[int, str | None], str | None, list[str]]] = [
    # (what, replicas, pods, peers in force, condition status (None: nothing to say yet), texts in the message)
    ("the ring over three nodes", 3, [view("llama-0", "a"), view("llama-1", "b"), view("llama-2", "c")],
     {0: stable(1), 1: stable(2), 2: stable(0)}, "True", ["each of the 3 process(es)"]),
    ("the ring's neighbour scheduled on the same node", 2, [view("llama-0", "a"), view("llama-1", "a")],
     {0: stable(1), 1: stable(0)}, "False",
     ["memoryPeers[0]=10.0.0.1:8477 (pod llama-1) runs on node a, as process 0 does",
      "memoryPeers[1]=10.0.0.0:8477 (pod llama-0) runs on node a, as process 1 does"]),
    ("a one-process job's first attempt", 1, [view("llama-0", "a")], {0: None}, "False",
     ["process 0 (pod llama-0 on node a) has no memory-tier peer", "first attempt is paired before any spare",
      "add a spare (spec.spares)"]),
    ("a job shrunk to one of its two workers", 2, [view("llama-0", "a")], {0: None}, "False",
     ["process 0 (pod llama-0 on node a) has no memory-tier peer", "the job shrank to 1 of its 2 workers"]),
    ("a later attempt paired by IP with a spare", 1, [view("llama-0", "a"), view("llama-spare-x", "s", role="spare")],
     {0: "10.0.0.9:8477"}, "True", ["each of the 1 process(es)"]),
    ("a pod not scheduled yet: nothing to say", 2, [view("llama-0", "a"), view("llama-1", None)],
     {0: stable(1), 1: stable(0)}, None, []),
    ("a pod still pending: nothing to say", 2, [view("llama-0", "a"), view("llama-1", "b", phase="Pending")],
     {0: stable(1), 1: stable(0)}, None, []),
]


@pytest.mark.parametrize(("what", "replicas", "pods", "peers", "status", "texts"), CONDITION_ROWS,
                         ids=[r[0] for r in CONDITION_ROWS])
def test_pairing_condition(what: str, replicas: int, pods: list[PodView], peers: dict[int, str | None],
                           status: str | None, texts: list[str]) -> None:
    processes = {p.name: p.index for p in pods if p.index is not None}
    got = memorypeers.pairing_condition(job(replicas), processes, peers, pods)
    if status is None:
        assert got is None
        return
    assert got is not None and got.type == "MemoryPaired" and got.status == status
    for text in texts:
        assert text in got.message


def test_no_memory_tier_no_condition() -> None:
    pods = [view("llama-0", "a"), view("llama-1", "a")]
    assert memorypeers.pairing_condition(job(2, memory=False), {"llama-0": 0, "llama-1": 1}, {}, pods) is None


def _raw(name: str, index: int, node: str, ip: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return compact_pod({"metadata": {"name": name, "namespace": "default", "annotations": annotations or {}, "labels": {
        "reprieve.dev/job-name": "llama", "reprieve.dev/attempt": "1", "reprieve.dev/replica-index": str(index),
        "reprieve.dev/role": "worker"}}, "spec": {"nodeName": node}, "status": {"phase": "Running", "podIP": ip}})


RUNNING = {"phase": "Running", "attempt": 1, "ready": "2/2", "replicas": 2, "restartMode": "InPlace",
           "selector": "reprieve.dev/job-name=llama", "startTime": "2026-11-24T05:00:00Z",
           "attemptStartTime": "2026-11-24T05:00:00Z"}


def test_decide_reports_a_same_node_pairing_once_as_a_condition_and_a_warning_event() -> None:
    """The first attempt's ring put both processes on node n1: condition MemoryPaired=False naming both and one
    Warning Event; the next pass with the condition in status posts nothing more."""
    raw = [_raw("llama-0", 0, "n1", "10.0.0.1"), _raw("llama-1", 1, "n1", "10.0.0.2")]
    j = job(2, status=RUNNING)
    first = Assignment(1, {"llama-0": 0, "llama-1": 1}, "llama-0.llama.default.svc:8476", memorypeers.first_peers(j))
    out = decide(View(job=j, pods=raw, now=NOW, assignment=first, known_nodes={"n1"}))
    (cond,) = [c for c in out.status["conditions"] if c["type"] == "MemoryPaired"]
    assert cond["status"] == "False" and "runs on node n1, as process 0 does" in cond["message"]
    assert [e for e in out.status_events if e.reason == "MemoryPairingProblem"] == [
        Event("MemoryPairingProblem", cond["message"], "Warning")]
    again = decide(View(job=job(2, status={**RUNNING, "conditions": out.status["conditions"]}), pods=raw, now=NOW,
                        assignment=first, known_nodes={"n1"}))
    assert "conditions" not in again.status and not again.status_events


def test_a_fixed_pairing_says_so_once() -> None:
    j = job(2, status={"conditions": [{"type": "MemoryPaired", "status": "False", "reason": "PairingProblem",
                                       "message": "x"}]})
    patch = {"conditions": [{"type": "MemoryPaired", "status": "True", "reason": "Paired", "message": "ok"}]}
    assert for_status_change(j, patch, 0.0, None) == [Event("MemoryPaired", "ok")]
    assert for_status_change(job(2), patch, 0.0, None) == []  # paired from the start: no Event


OFF = ("this process's shards take 1.0 MiB (1048576 bytes), so its pod's memory directory must hold 3.0 MiB "
       "(3145728 bytes) (its own copy, its peer's copy and one in flight), but REPRIEVE_MEMORY_LIMIT_BYTES is 0.0 "
       "MiB (200 bytes): raise the limit (spec.checkpoint.memory) to at least 3.0 MiB (3145728 bytes), or spread the "
       "state over more processes")


@pytest.mark.parametrize(("what", "off_attempt", "status", "reason"), [
    ("the runtime switched the tier off in this attempt", 1, "False", "MemoryTierOff"),
    ("a report of an earlier attempt on a kept pod says nothing of this one", 0, "True", "Paired"),
])
def test_a_tier_the_runtime_switched_off_is_not_paired(what: str, off_attempt: int, status: str,
                                                       reason: str) -> None:
    """Issue #46, 8: a limit below the state turned the tier off (process 0's progress report says memoryOff) while
    the job kept MemoryPaired=True/Paired: the condition said the job was protected when it was not."""
    pods = [dataclasses.replace(view("llama-0", "a"), memory_off=(off_attempt, OFF)), view("llama-1", "b"),
            view("llama-2", "c")]
    processes = {p.name: i for i, p in enumerate(pods)}
    got = memorypeers.pairing_condition(job(3, status={"attempt": 1}), processes,
                                        {0: stable(1), 1: stable(2), 2: stable(0)}, pods)
    assert got is not None and (got.type, got.status, got.reason) == ("MemoryPaired", status, reason), what
    if status == "False":
        assert "the memory tier is off in attempt 1" in got.message and "raise the limit" in got.message


def test_decide_says_the_tier_is_off_as_a_condition_and_a_warning_event() -> None:
    """From process 0's progress annotation to the condition and one Warning Event MemoryTierOff with the runtime's
    why and what to change; the next pass with the condition in status posts nothing more."""
    progress = json.dumps({"attempt": 1, "step": 7, "committedStep": -1, "time": "2026-11-24T05:59:00Z",
                           "memoryOff": OFF})
    raw = [_raw("llama-0", 0, "n1", "10.0.0.1", {"reprieve.dev/progress": progress}),
           _raw("llama-1", 1, "n2", "10.0.0.2")]
    j = job(2, status=RUNNING)
    first = Assignment(1, {"llama-0": 0, "llama-1": 1}, "llama-0.llama.default.svc:8476", memorypeers.first_peers(j))
    out = decide(View(job=j, pods=raw, now=NOW, assignment=first, known_nodes={"n1", "n2"}))
    (cond,) = [c for c in out.status["conditions"] if c["type"] == "MemoryPaired"]
    assert (cond["status"], cond["reason"]) == ("False", "MemoryTierOff") and OFF in cond["message"]
    assert [e for e in out.status_events if e.type == "Warning"] == [Event("MemoryTierOff", cond["message"], "Warning")]
    again = decide(View(job=job(2, status={**RUNNING, "conditions": out.status["conditions"]}), pods=raw, now=NOW,
                        assignment=first, known_nodes={"n1", "n2"}))
    assert "conditions" not in again.status and not again.status_events


def test_zones_come_from_the_nodes_the_pods_run_on() -> None:
    raw = [_raw("llama-0", 0, "n1", "10.0.0.1"), _raw("llama-1", 1, "n2", "10.0.0.2")]
    nodes = {"n1": {"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}}},
             "n2": {"metadata": {"name": "n2", "labels": {}}}}
    assert zones(raw, nodes) == {"n1": "z1"}


def test_a_restart_pairs_across_zones_with_the_zones_of_the_cached_nodes() -> None:
    """Process 0's peer in the new attempt is in another zone (z2, its node's label as cached), not the ring's next
    pod (z1); the assignment carries the peers' nodes."""
    code = {"reprieve.dev/exit": '{"attempt": 1, "code": 42, "time": "2026-11-24T05:59:59Z"}'}
    raw = [_raw(f"llama-{i}", i, f"n{i}", f"10.0.0.{i}") for i in range(3)]
    for r in raw:
        r["metadata"]["annotations"] = dict(code)
    j = job(3, status={**RUNNING, "ready": "3/3", "replicas": 3})
    first = Assignment(1, {f"llama-{i}": i for i in range(3)}, "x:1", {})
    nodes = {n: {"metadata": {"name": n, "labels": {"topology.kubernetes.io/zone": z}}}
             for n, z in (("n0", "z1"), ("n1", "z1"), ("n2", "z2"))}
    out = decide(View(job=j, pods=raw, now=NOW, assignment=first, known_nodes=nodes, nodes=nodes, looked=True,
                      placed=True))
    assert out.assign is not None and out.assign.memory_peers[0] == "10.0.0.2:8477"
    assert dict(out.assign.memory_peer_nodes)[0] == "n2"


LOSSES = [
    # (what, memory spec, status, lossEverySeconds of the next assignment)
    ("no loss without notice yet", {}, {"restarts": {"preemption": 3}, "goodput": {"wallSeconds": 900}}, None),
    ("two losses in 10 minutes", {}, {"restarts": {"disruption": 2}, "goodput": {"wallSeconds": 600.4}}, 300),
    ("no goodput accounting yet", {}, {"restarts": {"disruption": 1}}, None),
    ("many losses early: at least a second", {}, {"restarts": {"disruption": 9}, "goodput": {"wallSeconds": 3}}, 1),
    ("the spec's own rate stands (the pods' environment)", {"lossEverySeconds": 3600},
     {"restarts": {"disruption": 2}, "goodput": {"wallSeconds": 600}}, None),
    ("an interval given: no rate", {"intervalSteps": 10}, {"restarts": {"disruption": 2},
                                                          "goodput": {"wallSeconds": 600}}, None),
    ("the tier off", {"enabled": False}, {"restarts": {"disruption": 2}, "goodput": {"wallSeconds": 600}}, None),
]


@pytest.mark.parametrize(("what", "memory", "status", "want"), LOSSES, ids=[r[0] for r in LOSSES])
def test_the_loss_rate_the_job_has_met(what: str, memory: dict[str, Any], status: dict[str, Any],
                                       want: int | None) -> None:
    body = make_job(replicas=2, restartMode="InPlace",
                    checkpoint={"uri": "/ckpt", "memory": {"sizeLimit": "1Gi", **memory}})
    body.with_command("python", "train.py")
    assert memorypeers.loss_every(body.with_status(**status).model()) == want


def test_a_restart_after_losses_without_notice_passes_their_rate_to_the_next_attempt() -> None:
    """The assignment decide writes carries the rate (wall seconds over restarts.disruption), through the ConfigMap
    and reprieve-supervisor's parser to the trainer's environment and the warm process's line."""
    from reprieve.supervisor import contract
    from reprieve_operator.assignment import parse_assignment
    from reprieve_operator.policy.builders import build_assignment

    code = {"reprieve.dev/exit": '{"attempt": 1, "code": 42, "time": "2026-11-24T05:59:59Z"}'}
    raw = [_raw(f"llama-{i}", i, f"n{i}", f"10.0.0.{i}", code) for i in range(2)]
    first = Assignment(1, {"llama-0": 0, "llama-1": 1}, "x:1", {})
    for restarts, want in (({}, None), ({"disruption": 3}, 400)):
        j = job(2, status={**RUNNING, "restarts": restarts, "goodput": {"wallSeconds": 1200}})
        out = decide(View(job=j, pods=raw, now=NOW, assignment=first, known_nodes={"n0", "n1"}, looked=True,
                          placed=True))
        assert out.assign is not None and out.assign.attempt == 2 and out.assign.loss_every == want, out.assign
        cm = build_assignment(j, 2, dict(out.assign.processes), out.assign.coordinator,
                              loss_every=out.assign.loss_every)
        a = contract.parse_assignment(cm["data"], "llama-0", configmap="default/llama-assignment")
        env = a.env()
        assert env.get("REPRIEVE_MEMORY_LOSS_EVERY_SECONDS") == (None if want is None else str(want)), env
        assert contract.parse_assignment_line(a.line()) == env
        back = parse_assignment(cm)  # what a restarted operator reads back
        assert back is not None and back.loss_every == want, back
