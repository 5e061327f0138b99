"""End to end, an elastic job through faults in its own resizes (#47, "Faults"): the operator (chart RBAC), the
example LM over virtual shards in canonical order under ``reprieve-supervisor``, the process-kubelet local cluster.

The plain shrink and grow are proven on real nodes (tests/e2e/test_realnodes_e2e.py); the decisions for each fault
are rows of tests/operator/test_elastic_policy.py. Here each fault lands in the window it is about, timed from what
the job says (its status and its assignment), on one job that must end with the parameters of the uninterrupted
run, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from localcluster.goodput import analyse, read_step_log
from localcluster.stack import reference_run
from localcluster.testing import label_node, taint_node, untaint_node, wait_for

from .conftest import SPOT_TAINT, e2e_job, make_elastic, pod_node, succeeded, wait_step, wait_tj, worker_logs
from .test_inplace_e2e import assignment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Enough steps to outlast the chain of faults (each takes 2-8 s of restarts; the job trains between them) and few
# enough for the uninterrupted one-process reference to finish beside it; the loss at LOSS_AT (the memory tier
# holds every step, so it costs at most a step or two).
STEPS, SLEEP, SHARDS, LOSS_AT = 150, 0.03, 4, 8
NO_ROOM = "test.reprieve.dev/no-room"  # a taint no signal reads: the node is out of room, not doomed
HOST = "test.reprieve.dev/host"  # one worker per node (required anti-affinity on this label)


def attempt_steps(ckpt: Path, attempt: int) -> list[int]:
    log = ckpt / "steps.jsonl"
    return [r.step for r in read_step_log(log) if r.attempt == attempt] if log.exists() else []


def events(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return list(json.loads(cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                           f"involvedObject.kind=TrainingJob,involvedObject.name={name}",
                                           "-o", "json").stdout)["items"])


def degraded(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})


def test_an_elastic_job_through_faults_in_its_shrinks_and_grows_ends_bit_identical(
        cluster: Any, namespace: str, operator: Any, pool: Any, api: Any, tmp_path: Path) -> None:
    """One elastic job (2 workers, ``minReplicas: 1``, 4 virtual shards in canonical order, the memory tier every
    step, no spare), one worker per node, the nodes given room one at a time (a taint no signal reads). In turn:

    1. worker 1's node lost without notice; its replacement is Unschedulable, the job shrinks onto worker 0;
       **capacity returns while that shrink is in flight** (room given as attempt 2 is assigned): the replacement,
       now running, joins at a grow (attempt 3: worker 0 kept in place, the replacement process 1), no second
       shrink;
    2. **a loss during the grow**: the newcomer's node lost as attempt 3 is assigned: the job shrinks again;
    3. **a notice during that shrink**: worker 0's node noticed as attempt 4 is assigned: no survivor is left, so
       the job waits below ``minReplicas`` (``Degraded=True/BelowMinReplicas``), the notice's save in storage;
       room for one pod: it trains on 1 (``Degraded=True/Shrunk``);
    4. **a notice during the grow's memory-only save**: the survivor's node noticed as soon as the grow (attempt 6)
       is assigned, the earliest the job says the grow began. The old trainer's save is one step of this small
       model (~0.1 s), so the notice reaches the pod during that save or just after it, as the grown attempt
       restores the step; either way the job restarts once more with worker 0 replaced and restores the agreed step
       from memory, nothing lost.

    Each window is opened from what the job says (its assignment, polled every 0.05 s, and its status); what the
    operator did is asserted from the assignments, status (sizes, ``Degraded``, ``restarts``, ``lastNotice``,
    ``lastRestore``) and Events. It ends with the uninterrupted one-process run's sha256.

    Why this long: seven attempts of a 2-process JAX job (~50 s of the job), four of them opened by a fault, two
    waits of ``unschedulableSeconds`` (2 s) for the scheduler's verdict; one job for the four faults (four jobs
    would pay four starts and four references)."""
    reference = reference_run(tmp_path, STEPS, SHARDS)
    pool_name, nodes = pool(6)
    for n in nodes:
        label_node(api, n, {HOST: n})
    for n in nodes[2:]:
        taint_node(api, n, NO_ROOM, "true", "NoSchedule")
    room = iter(nodes[2:])
    name = "elastic"
    ckpt = tmp_path / name
    body = e2e_job(cluster, name, replicas=2, steps=STEPS, step_sleep=SLEEP, interval=0, checkpoint_dir=ckpt,
                   node_selector={"reprieve.test/pool": pool_name}, extra_env={"TRAIN_STEP_LOG": "/ckpt/steps.jsonl"})
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
        return pod_node(cluster, namespace, next(p for p, i in assigned["processes"].items() if i == index))

    wait_step(ckpt, LOSS_AT, 300, cluster, namespace, name)
    first = assignment(cluster, namespace, name)

    # 1. worker 1's node lost: the shrink; capacity back while the shrink is in flight
    cluster.remove_node(worker_node(first, 1))
    shrink = assigned_when(2, "the shrink onto worker 0")
    untaint_node(api, next(room), NO_ROOM)  # the pending replacement schedules as attempt 2 starts
    assert shrink["processes"] == {f"{name}-0": 0} and "resize" not in shrink, shrink  # a shrink saves as today
    grow = assigned_when(3, "the grow back to 2 once the replacement runs")
    probe = next(p for p, i in grow["processes"].items() if i == 1)
    assert grow["resize"] == "grow" and grow["processes"] == {f"{name}-0": 0, probe: 1}, grow  # worker 0 kept

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
    wait_for(lambda: attempt_steps(ckpt, 5), 120, "attempt 5 to train on 1 worker", interval=0.3)

    # 4. a notice during the grow's memory-only save: worker 0's node, as soon as the grow is assigned
    survivor = worker_node(one, 0)
    untaint_node(api, next(room), NO_ROOM)  # the other pending pod schedules: the grow
    grow2 = assigned_when(6, "the second grow")
    taint_node(api, survivor, SPOT_TAINT, "true", "NoSchedule")
    untaint_node(api, next(room), NO_ROOM)  # room for worker 0's replacement
    assert grow2["resize"] == "grow" and len(grow2["processes"]) == 2, grow2
    final = status_when("Succeeded", succeeded, 600)
    # the grow's agreed step survived the notice: the next attempt restored it from memory, nothing lost
    assert final["attempt"] == 7 and final["lastNotice"]["attempt"] == 6, final
    assert final["lastRestore"]["tier"] == "memory" and final["lastRestore"]["attempt"] == 7, final["lastRestore"]
    assert final["restarts"] == {"preemption": 2, "failure": 0, "disruption": 2}, final["restarts"]
    assert (final["currentWorkers"], degraded(final)["status"]) == (2, "False"), final
    reasons = [e["reason"] for e in events(cluster, namespace, name)]
    assert (reasons.count("Shrinking"), reasons.count("Growing"), reasons.count("PreemptionNotice")) == (2, 2, 2), \
        reasons
    # every attempt's size, from the goodput history (a shrunk attempt grown at once lasts a fraction of a second:
    # docs/elastic-operator.md, "The decisions": in flight)
    history = final["goodput"]["accounting"]["history"]
    sizes = [(h["attempt"], h.get("workers")) for h in history]
    assert sizes == [(1, 2), (2, 1), (3, 2), (4, 1), (5, 1), (6, 2), (7, 2)], history
    # every step trained; the last interruption (the notice at the grow) lost none. The loss without notice may lose
    # more than the memory interval: on this fast step a copy still being sent skips the next ones (memtier)
    report = analyse(read_step_log(ckpt / "steps.jsonl"), start=0, end=1)
    assert report.steps == STEPS and report.interruptions[-1].lost_steps == 0, report.summary()
    assert reference.wait(600) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    result = json.loads((ckpt / "result.json").read_text())
    expected = json.loads((tmp_path / "reference.json").read_text())
    assert result["sha256"] == expected["sha256"], ("the parameters differ from the uninterrupted run's",
                                                    worker_logs(cluster, namespace, name, 2))
