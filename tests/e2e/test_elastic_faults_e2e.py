"""End to end, an elastic job through faults in its own resizes (#47, "Faults"): the operator (chart RBAC), the
example LM over virtual shards in canonical order under ``reprieve-supervisor``, the process-kubelet local cluster.

The plain shrink and grow are proven on real nodes (tests/e2e/test_realnodes_e2e.py); the decisions for each fault
are rows of tests/operator/test_elastic_policy.py. Here every fault of the issue's table lands in the window it is
about, timed from what the job says (its status, its assignment, its trainer's log), on one job that must end with
the parameters of the uninterrupted run, bit for bit; what the operator says of each (its conditions with the
scheduler's words, its Events) is asserted here too.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from localcluster.goodput import analyse, read_step_log
from localcluster.stack import reference_run
from localcluster.testing import label_node, taint_node, untaint_node, wait_for

from .conftest import (
    SPOT_TAINT,
    e2e_job,
    get_tj,
    make_elastic,
    pod_node,
    succeeded,
    wait_step,
    wait_tj,
    worker_logs,
)
from .test_inplace_e2e import assignment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Enough steps to outlast the chain of faults (each takes 2-8 s of restarts; the job trains between them; the loss of
# the last worker goes back to the last storage save) and few enough for the uninterrupted one-process reference to
# finish beside it; the first loss at LOSS_AT (the memory tier holds every step, so it costs at most a step or two).
STEPS, SLEEP, SHARDS, LOSS_AT = 150, 0.03, 4, 8
NO_ROOM = "test.reprieve.dev/no-room"  # a taint no signal reads: the node is out of room, not doomed
HOST = "test.reprieve.dev/host"  # one worker per node (required anti-affinity on this label)
# The notice of step 4: the node-termination handler's spot taint, 30 s (GKE spot's 15 s is most of what a grown
# attempt takes to start and restore on a slow CI machine, and an agreed save that near its deadline makes no memory
# copy beside its storage save: attempt 7 then reads storage; CI stop 66 and suite run G1)
LONG_NOTICE_TAINT = "aws-node-termination-handler/spot-itn"


def worker(assigned: dict[str, Any], index: int) -> str:
    """The pod that holds process ``index`` in an assignment."""
    return next(p for p, i in assigned["processes"].items() if i == index)


def attempt_steps(ckpt: Path, attempt: int) -> list[int]:
    log = ckpt / "steps.jsonl"
    return [r.step for r in read_step_log(log) if r.attempt == attempt] if log.exists() else []


def events(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return list(json.loads(cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                           f"involvedObject.kind=TrainingJob,involvedObject.name={name}",
                                           "-o", "json").stdout)["items"])


def degraded(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})


def refused(cluster: Any, namespace: str, prefix: str) -> str | None:
    """The live pod whose name starts with ``prefix`` once the scheduler said ``PodScheduled=False/Unschedulable``
    of it; None before."""
    for pod in cluster.read("pod", namespace=namespace)["items"]:
        meta = pod["metadata"]
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"), {})
        if meta["name"].startswith(prefix) and not meta.get("deletionTimestamp") and \
                (cond.get("status"), cond.get("reason")) == ("False", "Unschedulable"):
            return str(meta["name"])
    return None


def log_text(cluster: Any, namespace: str, pod: str) -> str:
    return "".join(p.read_text(errors="replace") for p in cluster.pod_logs(namespace, pod, "trainer"))


# The grow of step 4 (attempt 5 superseded by 6): attempt 5's trainer stops itself (SIGSTOP) inside that grow's save,
# right after its line "saving agreed step N (notice resize/...", until the test lets it go on (SIGCONT).
STOP_IN_GROW_SAVE = {"REPRIEVE_CKPT_TEST_STOP_IN_AGREED_SAVE": "resize/:5"}


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T`` in /proc: the process kubelet shares the test's pids)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def held_in_grow_save(cluster: Any, namespace: str, pod: str, attempt: int) -> tuple[int, int]:
    """Wait until attempt ``attempt``'s trainer in ``pod``, sent the grow's resize signal by the supervisor, has
    begun the grow's save and stopped itself there (:data:`STOP_IN_GROW_SAVE`), before ``agreed step N held in
    memory``, and the process the supervisor pre-warmed for the next attempt is parked in ``reprieve.init()``;
    returns (its pid, N). Parked first: a warm process not parked when the trainer exits is killed and the next
    attempt starts cold, ~7 s under the suite's load, most of a 15 s notice window (no memory copy beside the
    notice's save then)."""
    said = re.compile(rf"attempt {attempt} superseded by attempt \d+ \(a grow: save to the memory tier\): sending "
                      r"SIGUSR1 to pid (\d+)")
    began = re.compile(r"saving agreed step (\d+) \(notice resize/")
    found: list[tuple[int, int]] = []

    def check() -> bool:
        text = log_text(cluster, namespace, pod)
        sent = said.search(text)
        save = began.search(text, sent.end()) if sent else None
        if sent is None or save is None or "test fault injection: stopping in the agreed save" not in text[save.end():]:
            return False
        pid, step = int(sent.group(1)), int(save.group(1))
        if not stopped(pid):
            return False
        warm = re.findall(r"started warm pid (\d+)", text[:sent.start()])
        if warm and f"(pid {warm[-1]})" not in text and f"SIGKILL to pid {warm[-1]}" not in text:
            return False  # neither parked ("warm process (pid W) parked ..."), refused nor ended yet
        assert f"agreed step {step} held in memory" not in text, text[-3000:]
        found.append((pid, step))
        return True

    wait_for(check, 90, f"{namespace}/{pod}: attempt {attempt}'s trainer stopped in the grow's save",
             describe=lambda: log_text(cluster, namespace, pod)[-3000:])
    return found[-1]


def test_an_elastic_job_through_faults_in_its_shrinks_and_grows_ends_bit_identical(
        cluster: Any, namespace: str, operator: Any, pool: Any, api: Any, tmp_path: Path) -> None:
    """One elastic job (2 workers, ``minReplicas: 1``, 4 virtual shards in canonical order, the memory tier every
    step, no spare at first), one worker per node, the nodes given room one at a time (a taint no signal reads).
    In turn:

    1. worker 1's node lost without notice; its replacement is Unschedulable, the job shrinks onto worker 0
       (``Degraded=True/Shrunk`` with the scheduler's words); **capacity returns while that shrink is in flight**
       (room given as attempt 2 is assigned): the replacement, kept pending and now running, joins at a grow
       (attempt 3: worker 0 kept in place, the replacement process 1), no second shrink;
    2. **a loss during the grow**: the newcomer's node lost as attempt 3 is assigned: the job shrinks again;
    3. **a notice during that shrink**: worker 0's node noticed as attempt 4 is assigned: no survivor is left, so
       the job waits below ``minReplicas`` (``Degraded=True/BelowMinReplicas``), the notice's save in storage;
       room for one pod: it trains on 1 (``Degraded=True/Shrunk``);
    4. **a notice during the grow's memory-only save**: room for the second pod, the grow (attempt 6); the old
       trainer says it began the grow's save (its own log line) and is held there (SIGSTOP: a save as long as the
       notice's delivery) while its node is noticed (a 30 s notice) and the operator delivers it to attempt 6;
       released, the save stays memory-only, attempt 6 restores it and saves at the notice, attempt 7 (worker 0 replaced)
       restores that from memory: nothing lost;
    5. **a spare that cannot schedule, and the operator restarted between a loss and the shrink**: a spare asked
       for while no node has room (Unschedulable); the operator stopped, worker 1's node lost, the operator started:
       one shrink past the spare (``Degraded`` names it and the scheduler's words);
    6. **a second loss while degraded, below the minimum**: worker 0's node lost: the job waits
       (``BelowMinReplicas`` naming ``minReplicas`` and the unschedulable pods), no attempt starts;
    7. room for one pod: the job **resumes** on 1 (``Shrunk``), from storage (no copy of the lost worker survived);
       the pending pods are spares (the lost index went to the refused spare, and a new one was made for the spare
       taken), so **a spare ready after the shrink** resumes it;
    8. room for the other: the other spare grows the job back to 2, and it finishes.

    Each window is opened from what the job says (its assignment, polled every 0.05 s, its status, its trainer's
    log); what the operator did is asserted from the assignments, status (sizes, ``Degraded``, ``restarts``,
    ``lastNotice``, ``lastRestore``) and Events. It ends with the uninterrupted one-process run's sha256.

    Why this long: ten attempts of a 2-process JAX job, eight of them opened by a fault, four waits of
    ``unschedulableSeconds`` (2 s) for the scheduler's verdict; one job for the faults of the issue's table (a job
    each would pay a start and a reference each)."""
    reference = reference_run(tmp_path, STEPS, SHARDS)
    pool_name, nodes = pool(8)
    for n in nodes:
        label_node(api, n, {HOST: n})
    for n in nodes[2:]:
        taint_node(api, n, NO_ROOM, "true", "NoSchedule")
    room = iter(nodes[2:])
    name = "elastic"
    ckpt = tmp_path / name
    body = e2e_job(cluster, name, replicas=2, steps=STEPS, step_sleep=SLEEP, interval=0, checkpoint_dir=ckpt,
                   node_selector={"reprieve.test/pool": pool_name}, extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl", **STOP_IN_GROW_SAVE})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(make_elastic(body, SHARDS, HOST)))

    def status_when(what: str, predicate: Any, timeout: float = 180) -> dict[str, Any]:
        return dict(wait_tj(cluster, namespace, name, predicate, timeout, what, operator)["status"])

    def assigned_when(attempt: int, what: str) -> dict[str, Any]:
        """The assignment of ``attempt`` as soon as the operator writes it (before its status patch: the window
        a fault must hit is the attempt's start)."""
        return dict(wait_for(lambda: (a := assignment(cluster, namespace, name))["attempt"] == str(attempt) and a,
                             180, f"{namespace}/{name}: {what} (attempt {attempt} assigned)", interval=0.05,
                             describe=lambda: operator.tail(30)))

    def worker_node(assigned: dict[str, Any], index: int) -> str:
        return pod_node(cluster, namespace, worker(assigned, index))

    def trains(attempt: int) -> None:
        wait_for(lambda: attempt_steps(ckpt, attempt), 120, f"attempt {attempt} to train", interval=0.3,
                 describe=lambda: operator.tail(30))

    wait_step(ckpt, LOSS_AT, 300, cluster, namespace, name)
    first = assignment(cluster, namespace, name)
    full = get_tj(cluster, namespace, name)["status"]
    assert (full["desiredWorkers"], full["currentWorkers"], degraded(full)) == (2, 2, {}), full

    # 1. worker 1's node lost: the shrink; capacity back while the shrink is in flight
    cluster.remove_node(worker_node(first, 1))
    stuck = wait_for(lambda: refused(cluster, namespace, f"{name}-1-"), 60, "the replacement refused by the scheduler")
    shrink = assigned_when(2, "the shrink onto worker 0")
    untaint_node(api, next(room), NO_ROOM)  # the pending replacement schedules as attempt 2 starts
    assert shrink["processes"] == {f"{name}-0": 0} and "resize" not in shrink, shrink  # a shrink saves as today
    grow = assigned_when(3, "the grow back to 2 once the replacement runs")
    assert grow["resize"] == "grow" and grow["processes"] == {f"{name}-0": 0, stuck: 1}, grow  # kept, not re-made

    # 2. a loss during the grow: the newcomer's node, as the grow's attempt starts
    cluster.remove_node(worker_node(grow, 1))
    again = assigned_when(4, "the shrink after a loss during the grow")
    assert again["processes"] == {f"{name}-0": 0} and "resize" not in again, again

    # 3. a notice during that shrink: worker 0's node, as the shrunk attempt starts; no survivor is left
    noticed = worker_node(again, 0)
    taint_node(api, noticed, SPOT_TAINT, "true", "NoSchedule")
    waiting = status_when("waiting below minReplicas", lambda s: degraded(s).get("reason") == "BelowMinReplicas")
    assert waiting["phase"] == "Restarting" and (waiting.get("lastNotice") or {}).get("attempt") == 4, waiting
    assert waiting["restarts"] == {"preemption": 1, "failure": 0, "disruption": 2}, waiting["restarts"]
    assert "0 worker(s) could train" in degraded(waiting)["message"], waiting
    cluster.remove_node(noticed)  # the notice's node reclaimed (its save is in storage)
    untaint_node(api, next(room), NO_ROOM)  # room for one of the two pending pods
    one = assigned_when(5, "training on the one pod that got a node")
    assert len(one["processes"]) == 1, one
    resumed = status_when("Degraded saying it trains shrunk again", lambda s: degraded(s).get("reason") == "Shrunk")
    assert (resumed["attempt"], resumed["currentWorkers"]) == (5, 1), resumed
    trains(5)
    assert re.search(r"reprieve: process 0/1, attempt 5,", log_text(cluster, namespace, worker(one, 0)))  # 1 process

    # 4. a notice during the grow's memory-only save: held in its save while the notice is delivered
    survivor = worker(one, 0)
    survivor_node = worker_node(one, 0)
    # the other pending pod schedules: the grow (the survivor's trainer stops itself in its save: STOP_IN_GROW_SAVE)
    untaint_node(api, next(room), NO_ROOM)
    pid, step = held_in_grow_save(cluster, namespace, survivor, 5)
    grow2 = assigned_when(6, "the second grow")
    assert grow2["resize"] == "grow" and len(grow2["processes"]) == 2, grow2
    held = f"agreed step {step} held in memory"
    try:
        taint_node(api, survivor_node, LONG_NOTICE_TAINT, "true", "NoSchedule")
        # status.lastNotice is recorded once the notice is delivered (reprieve_operator.delivery)
        status_when("the notice delivered to the grown attempt", lambda s: (s.get("lastNotice") or {}).get("attempt")
                    == 6, 60)
    finally:
        os.kill(pid, signal.SIGCONT)
    untaint_node(api, next(room), NO_ROOM)  # room for worker 0's replacement
    wait_for(lambda: f"{held} by all 1 process(es): no storage save" in log_text(cluster, namespace, survivor), 30,
             "the grow's save to end memory-only")
    # the grow's agreed step survived the notice: attempt 6 restored it, attempt 7 the notice's step, from memory
    seventh = status_when("attempt 7 restored", lambda s: (s.get("lastRestore") or {}).get("attempt") == 7)
    assert seventh["lastNotice"]["attempt"] == 6 and seventh["lastRestore"]["tier"] == "memory", seventh
    assert seventh["restarts"] == {"preemption": 2, "failure": 0, "disruption": 2}, seventh["restarts"]
    trains(7)

    # 5. a spare the scheduler refuses; the operator restarted between a loss and the shrink: one shrink past it
    seven = assignment(cluster, namespace, name)
    cluster.kubectl("patch", "trainingjob", name, "-n", namespace, "--type", "merge", "-p",
                    json.dumps({"spec": {"spares": 1}}))
    spare = wait_for(lambda: refused(cluster, namespace, f"{name}-spare-"), 60, "the spare refused by the scheduler")
    operator.stop()
    cluster.remove_node(worker_node(seven, 1))
    operator.start()
    past = assigned_when(8, "the shrink past the refused spare")
    assert past["processes"] == {worker(seven, 0): 0}, past
    shrunk = status_when("the shrink's status", lambda s: s.get("attempt") == 8 and s.get("currentWorkers") == 1)
    cond = degraded(shrunk)
    assert (cond["status"], cond["reason"]) == ("True", "Shrunk"), cond
    assert f"pod {spare} (spare for a lost worker) unschedulable" in cond["message"], cond
    assert "nodes are available" in cond["message"], cond  # the scheduler's own words
    trains(8)

    # 6. a second loss while degraded: below minReplicas, the job waits and starts nothing
    cluster.remove_node(worker_node(past, 0))
    below = status_when("waiting below minReplicas after the second loss",
                        lambda s: s.get("attempt") == 8 and degraded(s).get("reason") == "BelowMinReplicas")
    cond = degraded(below)
    assert "0 worker(s) could train, fewer than spec.elastic.minReplicas 1" in cond["message"], cond
    assert "unschedulable" in cond["message"] and "nodes are available" in cond["message"], cond

    # 7. room for one pod: the job resumes on it
    untaint_node(api, next(room), NO_ROOM)
    resume = assigned_when(9, "the resume on the one pod that got a node")
    assert len(resume["processes"]) == 1, resume
    status_when("Degraded saying it trains shrunk", lambda s: s.get("attempt") == 9
                and degraded(s).get("reason") == "Shrunk")
    trains(9)

    # 8. room for the other: the spare (ready after the shrink) and the other pod: the grow back to 2
    untaint_node(api, next(room), NO_ROOM)
    last = assigned_when(10, "the grow back to 2")
    assert last["resize"] == "grow" and len(last["processes"]) == 2, last
    # the lost index goes to a spare still starting (the restart's order), so spares resume and grow the job
    assert worker(resume, 0).startswith(f"{name}-spare-") and worker(last, 1).startswith(f"{name}-spare-"), last
    assert spare in (worker(resume, 0), worker(last, 1)), (spare, resume, last)  # the refused one came back

    final = status_when("Succeeded", succeeded, 600)
    assert final["attempt"] == 10, final
    assert (final["currentWorkers"], degraded(final)["status"]) == (2, "False") and final["lastResizeTime"], final
    reasons = [e["reason"] for e in events(cluster, namespace, name)]
    assert (reasons.count("Shrinking"), reasons.count("Growing"), reasons.count("PreemptionNotice")) == (3, 3, 2), \
        reasons
    said = [(e["reason"], e["type"], e["message"]) for e in events(cluster, namespace, name)
            if e["reason"] in ("Shrinking", "Growing")]
    assert {(r, t) for r, t, _ in said} == {("Shrinking", "Warning"), ("Growing", "Normal")}, said
    assert any(f"shrinking from 2 to 1 workers: pod {stuck} (replacement for a lost worker) unschedulable" in m
               for _, _, m in said), said
    assert any(f"pod {stuck} (replacement) takes process 1" in m for _, _, m in said), said
    assert any("(spare) takes process 1" in m for _, _, m in said), said  # the grow of 8
    # every attempt's size, from the goodput history (a shrunk attempt grown at once lasts a fraction of a second:
    # docs/elastic-operator.md, "The decisions": in flight)
    history = final["goodput"]["accounting"]["history"]
    sizes = [(h["attempt"], h.get("workers"), h.get("desired")) for h in history]
    assert sizes == [(a, n, 2) for a, n in enumerate((2, 1, 2, 1, 1, 2, 2, 1, 1, 2), 1)], history
    # every step trained; the notice at the grow's save lost none. The loss without notice may lose more than the
    # memory interval: on this fast step a copy still being sent skips the next ones (memtier)
    report = analyse(read_step_log(ckpt / "steps.jsonl"), start=0, end=1)
    at_grow = next(i for i in report.interruptions if i.from_attempt == 6)
    assert report.steps == STEPS and at_grow.lost_steps == 0, report.summary()
    logged = "".join(f.read_text(errors="replace") for f in sorted((tmp_path / "operator").glob("operator-*.log")))
    assert not [ln for ln in logged.splitlines() if "Traceback" in ln or " ERROR " in ln], logged[-5000:]
    assert reference.wait(600) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    result = json.loads((ckpt / "result.json").read_text())
    expected = json.loads((tmp_path / "reference.json").read_text())
    assert result["sha256"] == expected["sha256"], ("the parameters differ from the uninterrupted run's",
                                                    worker_logs(cluster, namespace, name, 2))
