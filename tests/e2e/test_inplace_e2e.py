"""End to end, in place (``restartMode: InPlace``): the operator (chart RBAC), the real runtime under
``reprieve-supervisor`` in 2-process JAX jobs, the process-kubelet local cluster.

A noticed preemption restarts the gang in place: the survivor keeps its pod (same UID) and its supervisor starts
attempt 2's process in it; the pod on the doomed node is replaced (by the warm spare when ``spares: 1``). The plain
case -- one doomed node, a spare takes over, the survivor's container kept -- is proven on real nodes
(tests/e2e/test_realnodes_e2e.py); this file covers the harder ones: faults that are not notices, two doomed nodes
for one spare, a fault while a restart waits for its replacement, and an image without ``reprieve-supervisor``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from localcluster.goodput import analyse, read_step_log
from localcluster.testing import label_node, taint_node, wait_for

from .conftest import SPOT_TAINT, assert_goodput_agrees, e2e_job, pod_node, succeeded, wait_step, wait_tj

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Faults come at step 20-50; the steps after them must outlast the notice's delivery under CI's load (at 120 a
# job once reached its last step inside the notice window and never restarted) and show the resume.
STEPS, SLEEP = 200, 0.03


def submit_inplace(cluster: Any, namespace: str, name: str, root: Path, pool: str, *, spares: int = 0,
                   interval: int = 0, extra_env: dict[str, str] | None = None, steps: int = STEPS,
                   memory: str | None = None, grace: int | None = None) -> Path:
    """``memory``: the memory tier's volume size (``spec.checkpoint.memory.sizeLimit``; None: no memory tier);
    ``grace``: ``spec.terminationGracePeriodSeconds`` (None: the default 30 s)."""
    ckpt = root / name
    body = e2e_job(cluster, name, replicas=2, steps=steps, step_sleep=SLEEP, interval=interval, checkpoint_dir=ckpt,
                       node_selector={"reprieve.test/pool": pool},
                       extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl", **(extra_env or {})})
    body["spec"]["restartMode"] = "InPlace"
    body["spec"]["spares"] = spares
    if grace is not None:
        body["spec"]["terminationGracePeriodSeconds"] = grace
    if memory is not None:
        body["spec"]["checkpoint"]["memory"] = {"sizeLimit": memory}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    return ckpt


def job_pods(cluster: Any, namespace: str, job: str) -> dict[str, dict[str, Any]]:
    pods = cluster.read("pods", namespace=namespace, selector=f"reprieve.dev/job-name={job}")["items"]
    return {p["metadata"]["name"]: p for p in pods}


def assignment(cluster: Any, namespace: str, job: str) -> dict[str, Any]:
    data = cluster.read("configmap", f"{job}-assignment", namespace)["data"]
    return {**data, "processes": json.loads(data["processes"])}


def supervisor_pid(cluster: Any, namespace: str, pod: str) -> int:
    """The host pid of the pod's reprieve-supervisor (a process node runs it as a host process), from its log."""
    for path in cluster.pod_logs(namespace, pod, "trainer"):
        found = re.findall(r"reprieve-supervisor\[(\d+)\]", path.read_text(errors="replace"))
        if found:
            return int(found[-1])
    raise AssertionError(f"no reprieve-supervisor line in the log of {namespace}/{pod}")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return out


def committed_attempts(ckpt: Path) -> list[tuple[int, int]]:
    """(step, attempt) of every committed checkpoint directory (step_<step>_a<attempt>)."""
    out = []
    for d in (ckpt / "checkpoints").glob("step_*_a*"):
        step, attempt = d.name.removeprefix("step_").split("_a")
        out.append((int(step), int(attempt)))
    return sorted(out)


def test_faults_a_deleted_pod_a_killed_supervisor_and_an_unwarned_node_loss_each_restart_the_gang_once(
        cluster: Any, namespace: str, operator: Any, pool: Any, tmp_path: Path) -> None:
    """A user deletes worker 1's pod mid-attempt (a disruption: the spare takes over its index), then worker 0's
    supervisor is SIGKILLed (the container fails: a failure; worker 0 is replaced by a new pod, as no spare is
    ready yet or by the replacement spare), then worker 1's node vanishes without a word (its Node object stays):
    JAX ends the survivor (SIGABRT) before the operator can know, its exit report names the silent peer, the
    operator waits for the loss to show (condition WaitingForLostPeer) instead of spending a failure, and once
    the Node is gone counts one disruption. Each is counted once, the gang converges, and every checkpoint of an
    attempt was committed while that attempt was the newest.

    Why this long: Three faults in one job (four attempts) so every restart is counted in one status;
    splitting it would pay a job's start three times more."""
    pool_a, _ = pool(5)
    name, steps = "faults", 2 * STEPS  # still training when the third fault comes
    # A 10 s grace: the superseded attempt's SIGTERM is a notice with that window, and the gang trains through it to
    # the agreed step; with the default 30 s a fast machine finishes the whole job inside the first fault's window.
    ckpt = submit_inplace(cluster, namespace, name, tmp_path, pool_a, spares=1, interval=20, steps=steps, grace=10)
    wait_step(ckpt, 30, 240, cluster, namespace, name)
    cluster.kubectl("delete", "pod", f"{name}-1", "-n", namespace, "--wait=false")
    status = wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 2 and s.get("phase") == "Running",
                     180, "attempt 2 running after the pod deletion", operator)["status"]
    assert status["restarts"] == {"preemption": 0, "failure": 0, "disruption": 1}, status
    second = assignment(cluster, namespace, name)
    assert second["processes"][f"{name}-0"] == 0 and f"{name}-1" not in second["processes"], second
    steps_before = max(r.step for r in read_step_log(ckpt / "steps.jsonl"))
    wait_for(lambda: max(r.step for r in read_step_log(ckpt / "steps.jsonl")) >= steps_before + 20
             and any(r.attempt == 2 for r in read_step_log(ckpt / "steps.jsonl")), 240, "attempt 2 training",
             interval=0.5)

    os.kill(supervisor_pid(cluster, namespace, f"{name}-0"), signal.SIGKILL)
    status = wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 3 and s.get("phase") == "Running",
                     180, "attempt 3 running after the supervisor was killed", operator)["status"]
    assert status["restarts"] == {"preemption": 0, "failure": 1, "disruption": 1}, status
    third = assignment(cluster, namespace, name)
    assert f"{name}-0" not in third["processes"], third  # its pod failed: replaced

    by_index = {i: p for p, i in third["processes"].items()}
    steps_before = max(r.step for r in read_step_log(ckpt / "steps.jsonl"))
    wait_for(lambda: max(r.step for r in read_step_log(ckpt / "steps.jsonl")) >= steps_before + 10
             and any(r.attempt == 3 for r in read_step_log(ckpt / "steps.jsonl")), 240, "attempt 3 training",
             interval=0.5)
    lost_node, survivor = pod_node(cluster, namespace, by_index[1]), by_index[0]
    assert pod_node(cluster, namespace, survivor) != lost_node, third  # a survivor to be ended by JAX
    # The machine vanishes: every process on it at once (a process kubelet's pods die with it, but the trainer a
    # supervisor started would outlive it: killed here with everything else of the pod).
    doomed = descendants(supervisor_pid(cluster, namespace, by_index[1]))
    cluster.kill_node(lost_node)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def reported() -> dict[str, Any] | None:
        raw = job_pods(cluster, namespace, name)[survivor]["metadata"].get("annotations", {}).get("reprieve.dev/exit")
        report = json.loads(raw) if raw else {}
        return report if report.get("attempt") == 3 else None

    report = wait_for(reported, 120, "the survivor's exit report of attempt 3", interval=0.5)
    logs = "\n".join(p.read_text(errors="replace")[-6000:] for p in cluster.pod_logs(namespace, survivor, "trainer"))
    assert report["code"] != 0 and report.get("peerLost") == [1], f"{report}\n{logs}"
    status = wait_tj(cluster, namespace, name, lambda s: any(c.get("reason") == "WaitingForLostPeer"
                                                             for c in s.get("conditions") or []),
                     60, "the operator waiting for the lost peer", operator)["status"]
    assert status["attempt"] == 3 and status["restarts"]["failure"] == 1, status  # no failure spent
    cluster.remove_node(lost_node)  # the loss shows (a real node turns NotReady ~40 s after it died)
    status = wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 4 and s.get("phase") == "Running",
                     180, "attempt 4 running after the unwarned node loss", operator)["status"]
    assert status["restarts"] == {"preemption": 0, "failure": 1, "disruption": 2}, status
    fourth = assignment(cluster, namespace, name)
    assert fourth["processes"].get(survivor) == 0 and by_index[1] not in fourth["processes"], fourth

    final = wait_tj(cluster, namespace, name, succeeded, 420, "Succeeded", operator)["status"]
    assert final["restarts"] == {"preemption": 0, "failure": 1, "disruption": 2}, final
    assert final["attempt"] == 4 and final["lastCheckpointStep"] == steps - 1, final
    # No stale commit: attempt numbers of committed checkpoints never decrease with the step.
    commits = committed_attempts(ckpt)
    assert commits and [a for _, a in commits] == sorted(a for _, a in commits), commits


def test_two_doomed_nodes_with_one_spare_then_two_nodes_lost_at_once(
        cluster: Any, namespace: str, operator: Any, pool: Any, api: Any, tmp_path: Path) -> None:
    """With the memory tier on. Both workers' nodes get a notice at once, one spare: it takes one index, a spare
    made ahead of the restart the other; one preemption, resumed without a lost step. Then a double fault (issue #46, 6 and 7): worker 1's
    node and the node of the pod holding its memory-tier replica (the spare, where the pairing put it there; else
    the spare's node anyway) vanish together; once the survivor's exit report names the silent peer, both Node
    objects are deleted in one call. One decision for the event: one disruption, both pods replaced in one
    attempt (a decision that still saw the second node kept its pod, and that node's deletion restarted the gang
    again); and the operator's lost steps equal the step log's (an attempt replaced before its first step hid the
    steps the one before it lost).

    Why this long: a spare, a new pod and an agreed save across two attempts of a 2-process job, then a node
    loss's wait for JAX to end the survivor and a third attempt."""
    pool_a, _ = pool(7)
    name, steps = "twodoomed", 2 * STEPS  # still training when the double fault comes
    ckpt = submit_inplace(cluster, namespace, name, tmp_path, pool_a, spares=1, steps=steps, memory="256Mi")
    wait_step(ckpt, 20, 240, cluster, namespace, name)
    spare = wait_for(lambda: [n for n, p in job_pods(cluster, namespace, name).items()
                              if n.startswith(f"{name}-spare-") and p["status"].get("phase") == "Running"],
                     60, "a running spare")[0]
    spare_node = pod_node(cluster, namespace, spare)
    doomed = {pod_node(cluster, namespace, f"{name}-{i}") for i in range(2)}
    for node in doomed:
        taint_node(api, node, SPOT_TAINT, "true", "NoSchedule")
    status = wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 2
                     and s.get("phase") in ("Running", "Succeeded"), 180, "attempt 2 running", operator)["status"]
    second = assignment(cluster, namespace, name)["processes"]
    assert not {f"{name}-0", f"{name}-1"} & set(second), second
    # Spares take both indices, no worker pod is made at the restart: the one that was running (unless it shared
    # a doomed node: then it is replaced by a new spare), and the one made ahead when the notice doomed more
    # workers than there were spares (policy.inplace.spares_wanted).
    assert len([p for p in second if p.startswith(f"{name}-spare-")]) == 2, second
    assert (spare in second) == (spare_node not in doomed), (spare, spare_node, doomed, second)
    assert all(pod_node(cluster, namespace, p) not in doomed for p in second), second
    assert status["restarts"]["preemption"] == 1 and status["lastRestart"]["inPlace"] == 0, status

    # The double fault, once attempt 2 trains beside a new running spare.
    wait_for(lambda: sum(r.attempt == 2 for r in read_step_log(ckpt / "steps.jsonl")) >= 20, 240,
             "attempt 2 training", interval=0.5)
    new_spare = wait_for(lambda: [n for n, p in job_pods(cluster, namespace, name).items()
                                  if n.startswith(f"{name}-spare-") and n not in second
                                  and p["status"].get("phase") == "Running" and p["status"].get("podIP")],
                         120, "a running spare beside attempt 2")[0]
    two = assignment(cluster, namespace, name)
    by_index = {i: p for p, i in two["processes"].items()}
    holder = json.loads(two.get("memoryPeerNodes") or "{}").get("1")
    lost_node = pod_node(cluster, namespace, by_index[1])
    second_node = holder if holder and holder != pod_node(cluster, namespace, by_index[0]) \
        else pod_node(cluster, namespace, new_spare)
    lost_nodes = {lost_node, second_node}
    assert len(lost_nodes) == 2 and pod_node(cluster, namespace, by_index[0]) not in lost_nodes, (two, lost_nodes)
    on_lost = [p for p, body in job_pods(cluster, namespace, name).items()
               if body["spec"].get("nodeName") in lost_nodes and not body["metadata"].get("deletionTimestamp")]
    doomed_pids: list[int] = []
    for p in on_lost:  # a spare's supervisor may not have logged its pid yet: its kubelet's kill takes it then
        with contextlib.suppress(AssertionError):
            doomed_pids += descendants(supervisor_pid(cluster, namespace, p))
    gone = {"test.reprieve.dev/lost": namespace}
    for node in lost_nodes:
        label_node(api, node, gone)  # to delete both Node objects in one request below
        cluster.kill_node(node)
    for pid in doomed_pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def reported() -> dict[str, Any] | None:
        raw = job_pods(cluster, namespace, name)[by_index[0]]["metadata"].get("annotations", {}).get(
            "reprieve.dev/exit")
        report = json.loads(raw) if raw else {}
        return report if report.get("attempt") == 2 else None

    report = wait_for(reported, 120, "the survivor's exit report of attempt 2", interval=0.5)
    assert report["peerLost"] == [1] and report.get("lastStep") is not None, report
    # Both gone at the same moment: one DELETE of the collection (kubectl deletes one node per request; under load
    # the operator decided between the two and restarted twice, the second node's pod kept by the first decision)
    client.CoreV1Api(api).delete_collection_node(label_selector=f"test.reprieve.dev/lost={namespace}")
    status = wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 3 and s.get("phase") == "Running",
                     180, "attempt 3 running after the two nodes were lost", operator)["status"]
    assert status["restarts"] == {"preemption": 1, "failure": 0, "disruption": 1}, status
    third = assignment(cluster, namespace, name)
    assert third["attempt"] == "3" and not set(on_lost) & set(third["processes"]), (on_lost, third)
    assert third["processes"].get(by_index[0]) == 0, third  # the survivor restarted in place

    final = wait_tj(cluster, namespace, name, succeeded, 420, "Succeeded", operator)["status"]
    assert final["restarts"] == {"preemption": 1, "failure": 0, "disruption": 1}, final
    assert final["attempt"] == 3 and final["lastCheckpointStep"] == steps - 1, final
    steplog = analyse(read_step_log(ckpt / "steps.jsonl"), start=0, end=1)
    assert len(steplog.interruptions) == 2 and steplog.interruptions[0].lost_steps == 0, steplog.summary()
    assert final["goodput"]["lostSteps"] == steplog.lost_steps, (final["goodput"], steplog.summary())
    assert_goodput_agrees(final, ckpt / "steps.jsonl")


# A fault in the window while an in-place restart waits for worker 1's replacement, in the order one job meets
# them: the operator restarted (worker 0 stays in place), a notice for worker 0's node, worker 0's node lost.
WINDOW_FAULTS = ("operator-restart", "notice", "node-lost")


def test_faults_while_an_in_place_restart_waits_for_its_replacement(
        cluster: Any, namespace: str, operator: Any, pool: Any, api: Any, tmp_path: Path) -> None:
    """Three times in one job, worker 1's node gets a notice (no spare): the gang saves and exits, worker 0 is to be
    kept, worker 1's replacement (a spare made when the notice came) pays an emulated 20 s image pull on a fresh
    node, most of it after the gang's final save. In that window, in turn: the
    operator killed and started again (exits reported, assignment not yet written), a notice for worker 0's node,
    worker 0's node lost without notice. Each time the gang converges on one new attempt; each restart is counted
    once (one preemption each, one AttemptStarted Event each); no step is lost; no stale process commits.

    (One job for the three faults: it was three jobs, one a fault, which paid a job's start and its nodes three
    times for the same proof. Each window is its own attempt here, asserted as each of those tests did.)

    Why this long: each fault must land while its attempt waits for a replacement pod (an emulated 20 s pull),
    then the next attempt trains before the next window opens; four attempts of a 2-process job."""
    from localcluster.costs import EmulatedCosts

    # 2 nodes to start; each window takes worker 1's node, and two of them worker 0's too: 7 nodes
    pool_a, _ = pool(7, costs=EmulatedCosts(pull_seconds=20.0))
    name, steps = "window", 3 * STEPS
    ckpt = submit_inplace(cluster, namespace, name, tmp_path, pool_a, steps=steps)
    wait_step(ckpt, 30, 240, cluster, namespace, name)
    for attempt, fault in enumerate(WINDOW_FAULTS, start=1):
        by_index = {i: p for p, i in assignment(cluster, namespace, name)["processes"].items()}
        node0, node1 = pod_node(cluster, namespace, by_index[0]), pod_node(cluster, namespace, by_index[1])
        taint_node(api, node1, SPOT_TAINT, "true", "NoSchedule")
        wait_tj(cluster, namespace, name, lambda s, a=attempt: s.get("phase") == "Restarting"
                and s.get("restartingFrom") == a, 120, f"{fault}: restarting, waiting for worker 1's replacement",
                operator)
        assert assignment(cluster, namespace, name)["attempt"] == str(attempt), fault  # the window: not assigned
        if fault == "notice":
            taint_node(api, node0, SPOT_TAINT, "true", "NoSchedule")
        elif fault == "node-lost":
            cluster.remove_node(node0)
        else:
            operator.kill()
            operator.start()

        status = wait_tj(cluster, namespace, name, lambda s, a=attempt: (s.get("attempt") or 0) > a
                         and s.get("phase") in ("Running", "Succeeded"), 180, f"{fault}: the next attempt running",
                         operator)["status"]
        new = assignment(cluster, namespace, name)
        assert new["attempt"] == str(attempt + 1), (fault, new)
        processes = new["processes"]
        assert sorted(processes.values()) == [0, 1] and by_index[1] not in processes, (fault, new)
        if fault == "operator-restart":
            assert processes.get(by_index[0]) == 0, (fault, new)  # still kept in place
        else:  # worker 0's node is doomed or gone: it was replaced too, before the assignment
            assert by_index[0] not in processes, (fault, new)
            assert all(pod_node(cluster, namespace, p) not in (node0, node1) for p in processes), (fault, new)
        assert status["restarts"] == {"preemption": attempt, "failure": 0, "disruption": 0}, (fault, status)
        if attempt < len(WINDOW_FAULTS):  # the next window opens on a gang that trains
            wait_for(lambda a=attempt: any(r.attempt == a + 1 for r in read_step_log(ckpt / "steps.jsonl")), 240,
                     f"attempt {attempt + 1} training after {fault}", interval=0.5)

    final = wait_tj(cluster, namespace, name, succeeded, 300, "Succeeded", operator)["status"]
    assert final["restarts"] == {"preemption": 3, "failure": 0, "disruption": 0}, final
    assert final["attempt"] == 4 and final["lastCheckpointStep"] == steps - 1, final
    report = analyse(read_step_log(ckpt / "steps.jsonl"), start=0, end=1)
    assert len(report.interruptions) == 3, report.summary()
    assert [i.lost_steps for i in report.interruptions] == [0, 0, 0], report.summary()
    commits = committed_attempts(ckpt)
    assert commits and [a for _, a in commits] == sorted(a for _, a in commits), commits
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                        f"involvedObject.kind=TrainingJob,involvedObject.name={name}",
                                        "-o", "json").stdout)["items"]
    for attempt in (2, 3, 4):
        started = [e for e in events if e["reason"] == "AttemptStarted" and e["message"].startswith(f"attempt {attempt}:")]
        assert len(started) == 1 and started[0].get("count", 1) == 1, (attempt, started)


def test_an_image_without_reprieve_run_fails_the_job_with_the_fix_and_leaves_nothing_running(
        cluster: Any, namespace: str, operator: Any, pool: Any, tmp_path: Path) -> None:
    """Bad input: an in-place job on an image without reprieve-supervisor (here: a PATH without it). The kubelet cannot
    start the container (StartError, exit 128); the job fails at once -- not after maxFailures restarts -- with a
    condition and an Event naming the pod, the kubelet's message and the fix, and no pod of it keeps running."""
    pool_a, _ = pool(3)
    name = "norun"
    submit_inplace(cluster, namespace, name, tmp_path, pool_a, spares=1, extra_env={"PATH": "/usr/bin:/bin"})
    status = wait_tj(cluster, namespace, name, lambda s: s.get("phase") == "Failed", 120, "Failed", operator)["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "SupervisorNotFound", status
    assert "reprieve-supervisor" in failed["message"] and "executable file not found" in failed["message"], failed
    assert "pip install reprieve" in failed["message"] and "restartMode: Recreate" in failed["message"], failed
    assert status.get("attempt") == 1 and status["restarts"]["failure"] <= 1, status  # no retries

    def events() -> list[Any]:
        return json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                                          "--field-selector", f"involvedObject.name={name}").stdout)["items"]

    # the Event is posted beside the status write, not before it
    wait_for(lambda: any(e["reason"] == "SupervisorNotFound" and "pip install reprieve" in e["message"]
                         for e in events()), 30, "the SupervisorNotFound Event with the fix",
             describe=lambda: str([(e["reason"], e["message"]) for e in events()]))
    wait_for(lambda: all(p["status"].get("phase") in ("Failed", "Succeeded") or p["metadata"].get("deletionTimestamp")
                         for p in job_pods(cluster, namespace, name).values()), 60, "no pod of the job running")
