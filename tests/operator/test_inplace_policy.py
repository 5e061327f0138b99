"""decide_inplace: keep the pods on healthy nodes, replace the others (spares first), assign the next attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.inplace import Assignment, PodView, decide_inplace

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)
ASSIGNED = Assignment(1, {"llama-0": 0, "llama-1": 1}, "llama-0.llama.ml.svc:8476")


def job(status: dict[str, Any] | None = None, replicas: int = 2, **spec: Any) -> Any:
    body = make_job(name="llama", namespace="ml", replicas=replicas, restartMode="InPlace", **spec)
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "train.py"]
    return body.with_status(**(status or {})).model()


def pod(name: str, index: int | None = None, attempt: int = 1, role: str = "worker", **kw: Any) -> PodView:
    kw.setdefault("ip", f"10.0.0.{abs(hash(name)) % 250 + 1}")
    kw.setdefault("node", f"node-{name}")
    return PodView(name=name, role=role, index=index, attempt=attempt, **kw)


def exited(p: PodView, code: int, attempt: int = 1, ago: float = 1.0) -> PodView:
    from dataclasses import replace

    return replace(p, exit_attempt=attempt, exit_code=code, exit_time=NOW - timedelta(seconds=ago))


W0, W1 = pod("llama-0", 0), pod("llama-1", 1)
SPARE = pod("llama-spare-abcde", role="spare", ip="10.0.9.9", node="node-s")
RUN = {"phase": "Running", "attempt": 1, "attemptStartTime": "2026-11-22T02:00:00Z"}


def test_new_job_creates_the_gang_spares_and_the_first_assignment() -> None:
    plan, extra = decide_inplace(job({}, spares=1), [], None, ["n9"], NOW)
    assert (plan.phase, plan.attempt, plan.create, plan.new_attempt, plan.exclude_nodes) == \
        ("Pending", 1, (0, 1), True, ("n9",))
    assert extra.assign == Assignment(1, {"llama-0": 0, "llama-1": 1}, "llama-0.llama.ml.svc:8476")
    assert extra.create_spares == 1


def test_a_crash_after_creating_some_pods_creates_the_rest() -> None:
    plan, extra = decide_inplace(job({}), [W0], None, (), NOW)
    assert plan.create == (1,) and extra.assign is not None and extra.assign.attempt == 1


def test_training_keeps_its_spares_and_replaces_one_on_a_doomed_node() -> None:
    doomed_spare = pod("llama-spare-xyz12", role="spare", node="n-doomed")
    plan, extra = decide_inplace(job(RUN, spares=2), [W0, W1, SPARE, doomed_spare], ASSIGNED, (), NOW,
                                 doomed_nodes={"n-doomed"})
    assert (plan.phase, plan.ready, plan.cause) == ("Running", 2, None)
    assert plan.delete == ("llama-spare-xyz12",) and extra.create_spares == 1 and extra.assign is None


def test_a_gang_whose_pod_waits_for_its_image_or_a_node_is_pending_not_running() -> None:
    """The restart view counts a Pending pod as alive (no restart for it); the job's phase counts what runs."""
    waiting = pod("llama-1", 1, phase="Pending")
    plan, _ = decide_inplace(job(RUN), [W0, waiting], ASSIGNED, (), NOW)
    assert (plan.phase, plan.ready, plan.cause, plan.new_attempt) == ("Pending", 1, None, False)
    plan, _ = decide_inplace(job(RUN), [W0, W1], ASSIGNED, (), NOW)
    assert (plan.phase, plan.ready) == ("Running", 2)


def test_a_gang_whose_first_worker_finished_while_the_other_ends_stays_running() -> None:
    """#46: the phase read Pending for ~1 s at the end of a finished in-place job (one worker exited 0 first)."""
    plan, _ = decide_inplace(job(RUN), [exited(W0, 0), W1], ASSIGNED, (), NOW)
    assert (plan.phase, plan.ready, plan.cause) == ("Running", 1, None)
    waiting = pod("llama-1", 1, phase="Pending")
    plan, _ = decide_inplace(job(RUN), [exited(W0, 0), waiting], ASSIGNED, (), NOW)
    assert plan.phase == "Pending"


def test_a_spare_that_ended_is_replaced() -> None:
    failed = pod("llama-spare-xyz12", role="spare", phase="Failed", node="n3")
    plan, extra = decide_inplace(job(RUN, spares=1), [W0, W1, failed], ASSIGNED, (), NOW)
    assert plan.delete == ("llama-spare-xyz12",) and extra.create_spares == 1


def test_everyone_saved_and_exited_42_restarts_in_place_at_once() -> None:
    plan, extra = decide_inplace(job(RUN), [exited(W0, 42), exited(W1, 42)], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "preemption"
    assert (plan.phase, plan.attempt, plan.new_attempt, plan.delete, plan.create) == ("Running", 2, True, (), ())
    assert extra.assign == Assignment(2, {"llama-0": 0, "llama-1": 1}, f"{W0.ip}:8476")
    assert extra.kept == ("llama-0", "llama-1") and not extra.replaced


def test_a_worker_on_a_doomed_node_is_replaced_by_a_ready_spare() -> None:
    plan, extra = decide_inplace(job(RUN, spares=1), [exited(W0, 42), exited(W1, 42), SPARE], ASSIGNED, (), NOW,
                                 doomed_nodes={W1.node})
    assert extra.assign is not None and extra.assign.processes == {"llama-0": 0, SPARE.name: 1}
    assert plan.delete == ("llama-1",) and extra.create_spares == 1  # the used spare is replaced
    (r,) = extra.replaced
    assert (r.index, r.old, r.new) == (1, "llama-1", SPARE.name) and "doomed" in r.reason
    assert "1 worker(s) restarted in place" in plan.message and SPARE.name in plan.message


def test_process_0_replaced_by_a_spare_moves_the_coordinator_to_its_ip() -> None:
    _, extra = decide_inplace(job(RUN, spares=1), [exited(W0, 42), exited(W1, 42), SPARE], ASSIGNED, (), NOW,
                                 doomed_nodes={W0.node})
    assert extra.assign is not None and extra.assign.coordinator == "10.0.9.9:8476"


def test_without_a_spare_a_new_pod_is_made_and_waited_for() -> None:
    st = {**RUN, "lastNotice": {"id": "x", "node": W1.node, "reason": "gke-spot", "deadline": "x",
                                 "observedAt": "x", "attempt": 1}}
    lost = PodView("llama-1", "worker", 1, 1, phase="Running", node=W1.node, node_lost=True)
    plan, extra = decide_inplace(job(st), [exited(W0, 42), lost], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "preemption"
    assert (plan.phase, plan.attempt, extra.create_workers, extra.assign) == ("Restarting", 1, (1,), None)
    assert plan.delete == ("llama-1",)
    # next pass: the replacement runs
    made = pod("llama-1-q7x2k", 1, attempt=2)
    restarting = {**st, "phase": "Restarting", "restartingFrom": 1}
    plan, extra = decide_inplace(job(restarting), [exited(W0, 42), made], ASSIGNED, (), NOW)
    assert extra.assign is not None and extra.assign.processes == {"llama-0": 0, "llama-1-q7x2k": 1}
    assert plan.attempt == 2 and extra.record is None


def test_a_replacement_that_does_not_run_yet_is_waited_for() -> None:
    made = pod("llama-1-q7x2k", 1, attempt=2, phase="Pending", ip=None)
    restarting = {**RUN, "phase": "Restarting", "restartingFrom": 1}
    _, extra = decide_inplace(job(restarting), [exited(W0, 42), made], ASSIGNED, (), NOW)
    assert extra.assign is None and extra.waiting_for == ("llama-1-q7x2k",) and extra.create_workers == ()


def test_a_failure_restarts_everyone_in_place_the_supervisors_stop_the_rest() -> None:
    _, extra = decide_inplace(job(RUN), [exited(W0, 1), W1], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "failure"
    assert extra.assign is not None and extra.assign.attempt == 2 and extra.kept == ("llama-0", "llama-1")


def test_a_deleted_worker_is_a_disruption_and_is_replaced() -> None:
    deleted = PodView("llama-1", "worker", 1, 1, phase="Running", deleting=True, ip="10.0.0.3", node="n1")
    plan, extra = decide_inplace(job(RUN), [W0, deleted], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "disruption"
    assert extra.create_workers == (1,) and plan.phase == "Restarting"


def test_a_worker_lost_without_notice_counts_in_the_loss_rate_its_next_attempt_gets() -> None:
    """The memory tier's ``lossEverySeconds`` for the attempt a spare takes over: the wall seconds over the losses
    without notice, this one included (status counts it only once the restart is recorded)."""
    from dataclasses import replace

    deleted = PodView("llama-1", "worker", 1, 1, phase="Running", deleting=True, ip="10.0.0.3", node="n1")
    memory = {"uri": "/ckpt", "memory": {"sizeLimit": "1Gi"}}
    status = {**RUN, "restarts": {"disruption": 1}, "goodput": {"wallSeconds": 600}}
    _, extra = decide_inplace(job(status, spares=1, checkpoint=memory), [W0, deleted, replace(SPARE, phase="Running")],
                              ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "disruption"
    assert extra.assign is not None and extra.assign.attempt == 2 and extra.assign.loss_every == 300, extra.assign


def test_a_hung_straggler_does_not_stall_the_gang() -> None:
    waiting = decide_inplace(job(RUN), [exited(W0, 42, ago=10), W1], ASSIGNED, (), NOW)
    assert waiting[0].cause is None and waiting[1].record is None  # within the 30 s grace: wait
    _, extra = decide_inplace(job(RUN), [exited(W0, 42, ago=40), W1], ASSIGNED, (), NOW)
    assert extra.record is not None and "llama-1 did not within 30 s" in extra.record.message
    assert extra.assign is not None and extra.assign.attempt == 2


def test_all_exit_0_succeeds_and_spares_go() -> None:
    plan, _ = decide_inplace(job(RUN, spares=1), [exited(W0, 0), exited(W1, 0), SPARE], ASSIGNED, (), NOW)
    assert plan.phase == "Succeeded" and plan.delete == (SPARE.name,)


def test_a_supervisor_of_another_contract_fails_the_job_with_the_fix() -> None:
    from dataclasses import replace

    plan, _ = decide_inplace(job(RUN), [replace(W0, contract=2), W1], ASSIGNED, (), NOW)
    assert plan.phase == "Failed" and plan.conditions[0].reason == "ContractMismatch"
    assert "restartMode: Recreate" in plan.message


NOT_FOUND = ('failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create '
             'failed: unable to start container process: exec: "reprieve-supervisor": executable file not found in $PATH: '
             'unknown')


@pytest.mark.parametrize("who", ["worker", "spare"])
def test_an_image_without_the_supervisor_fails_the_job_at_once_with_the_fix(who: str) -> None:
    """An image without reprieve-supervisor: the container cannot start (StartError, exit 128). Not a failure to retry
    up to maxFailures: the job fails at once, naming the pod, the kubelet's message and both fixes."""
    from dataclasses import replace

    broken = replace(W1 if who == "worker" else SPARE, phase="Failed", container_code=128, start_error=NOT_FOUND)
    pods = [W0, broken] if who == "worker" else [W0, W1, broken]
    plan, extra = decide_inplace(job(RUN, spares=1), pods, ASSIGNED, (), NOW)
    assert plan.phase == "Failed" and plan.conditions[0].reason == "SupervisorNotFound" and extra.assign is None
    assert broken.name in plan.message and "executable file not found" in plan.message
    assert "pip install reprieve" in plan.message and "restartMode: Recreate" in plan.message
    assert set(plan.delete) == {p.name for p in pods if p is not broken} | {broken.name}


def test_another_start_error_is_a_failure_the_budget_counts() -> None:
    from dataclasses import replace

    broken = replace(W1, phase="Failed", container_code=128, start_error="mount /ckpt: permission denied")
    plan, extra = decide_inplace(job(RUN), [W0, broken], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == "failure" and plan.phase != "Failed"


def test_pod_view_carries_the_kubelets_start_error() -> None:
    from reprieve_operator.policy.views import compact_pod, pod_view

    raw = {"metadata": {"name": "llama-1", "namespace": "ml", "labels": {
        "reprieve.dev/job-name": "llama", "reprieve.dev/role": "worker", "reprieve.dev/replica-index": "1",
        "reprieve.dev/attempt": "1"}}, "spec": {"nodeName": "n1"},
        "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
            "exitCode": 128, "reason": "StartError", "message": NOT_FOUND}}}]}}
    view = pod_view(compact_pod(raw), {"n1"})
    assert view is not None and view.start_error == NOT_FOUND and view.container_code == 128
    raw["status"]["containerStatuses"][0]["state"]["terminated"] = {"exitCode": 1, "reason": "Error"}
    assert pod_view(compact_pod(raw), {"n1"}).start_error is None  # type: ignore[union-attr]


def test_the_failure_budget_still_ends_the_job() -> None:
    plan, extra = decide_inplace(job({**RUN, "restarts": {"failure": 3}}), [exited(W0, 1), W1], ASSIGNED, (), NOW)
    assert plan.phase == "Failed" and plan.conditions[0].reason == "TooManyFailures" and extra.assign is None


def test_a_rapid_restart_backs_off_before_the_assignment() -> None:
    young = {**RUN, "attemptStartTime": "2026-11-22T02:59:50Z"}
    plan, extra = decide_inplace(job(young), [exited(W0, 42), exited(W1, 42)], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.rapid_restarts == 1
    assert extra.assign is None and plan.phase == "Restarting" and plan.requeue_after == pytest.approx(10.0)


def test_suspend_deletes_workers_and_spares() -> None:
    plan, _ = decide_inplace(job(RUN, suspend=True), [W0, W1, SPARE], ASSIGNED, (), NOW)
    assert plan.phase == "Suspended" and set(plan.delete) == {"llama-0", "llama-1", SPARE.name}


# --- faults: each converges and counts nothing twice ----------------------------------------------------------

RESTARTING = {**RUN, "phase": "Restarting", "restartingFrom": 1, "restarts": {"preemption": 1}}


def test_an_operator_restarted_between_exits_reported_and_the_assignment_writes_it_without_counting_again() -> None:
    """The restart of attempt 1 was recorded (status), then the operator died before writing attempt 2: the new
    operator sees the same exits and writes attempt 2, with no second record."""
    plan, extra = decide_inplace(job(RESTARTING), [exited(W0, 42), exited(W1, 42)], ASSIGNED, (), NOW)
    assert extra.record is None and plan.cause is None
    assert extra.assign is not None and extra.assign.attempt == 2 and extra.kept == ("llama-0", "llama-1")
    # and once attempt 2 is written, the old exit reports (attempt 1) are history: training, nothing decided
    second = Assignment(2, {"llama-0": 0, "llama-1": 1}, "10.0.0.1:8476")
    running2 = {**RUN, "attempt": 2, "restarts": {"preemption": 1}}
    plan, extra = decide_inplace(job(running2), [exited(W0, 42), exited(W1, 42)], second, (), NOW)
    assert extra.record is None and plan.cause is None and extra.assign is None and plan.phase == "Running"


def test_a_notice_during_a_restart_replaces_the_pod_it_dooms_instead_of_keeping_it() -> None:
    plan, extra = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), SPARE], ASSIGNED, (),
                                 NOW, doomed_nodes={W0.node})
    assert extra.record is None and plan.cause is None  # the restart under way is not counted again
    assert extra.assign is not None and extra.assign.processes == {SPARE.name: 0, "llama-1": 1}
    assert plan.delete == ("llama-0",) and extra.create_spares == 1


def test_a_node_lost_during_a_restart_is_replaced_before_the_assignment() -> None:
    lost = PodView("llama-0", "worker", 0, 1, phase="Running", node=W0.node, node_lost=True, ip="10.0.0.7",
                   exit_attempt=1, exit_code=42, exit_time=NOW)
    plan, extra = decide_inplace(job(RESTARTING), [lost, exited(W1, 42)], ASSIGNED, (), NOW)
    assert extra.record is None and extra.assign is None and extra.create_workers == (0,)
    assert plan.phase == "Restarting" and plan.delete == ("llama-0",)


def test_two_doomed_workers_one_spare_the_other_gets_a_new_pod() -> None:
    doomed = {W0.node, W1.node}
    plan, extra = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), SPARE], ASSIGNED, (),
                                 NOW, doomed_nodes=doomed)
    assert extra.assign is None and extra.create_workers == (1,) and extra.create_spares == 1
    assert [r.new for r in extra.replaced] == [SPARE.name, None]
    assert set(plan.delete) == {"llama-0", "llama-1"}


def test_the_spare_chosen_while_a_replacement_schedules_is_still_chosen_once_it_runs() -> None:
    """Pass 1 picks the old spare for index 0 and makes a pod for index 1 and a new spare; pass 2 (both made
    pods now run) must not switch index 0 to the new spare, though its random name sorts first (a CI failure)."""
    from dataclasses import replace

    doomed = {W0.node, W1.node}
    old = replace(SPARE, name="llama-spare-wvqpv", created=NOW - timedelta(minutes=5), contract=1)
    _, first = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), old], ASSIGNED, (), NOW,
                              doomed_nodes=doomed)
    assert [r.new for r in first.replaced] == [old.name, None] and first.create_spares == 1
    made = pod("llama-1-knj2s", 1, attempt=2, created=NOW)
    for new in (pod("llama-spare-94g6c", role="spare", created=NOW), pod("llama-spare-94g6c", role="spare",
                                                                        created=NOW, contract=1)):
        _, second = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42, ago=0), exited(W1, 42, ago=0), old,
                                                                made, new], ASSIGNED, (), NOW, doomed_nodes=doomed)
        assert second.assign is not None and second.assign.processes == {old.name: 0, made.name: 1}, second
        assert second.create_spares == 0


def test_a_warm_spare_takes_over_before_an_older_cold_one() -> None:
    from dataclasses import replace

    cold = replace(SPARE, name="llama-spare-aaaaa", created=NOW - timedelta(minutes=5))
    warm = replace(SPARE, name="llama-spare-zzzzz", created=NOW - timedelta(minutes=1), contract=1)
    _, extra = decide_inplace(job(RESTARTING, spares=2), [exited(W0, 42), exited(W1, 42), cold, warm], ASSIGNED,
                              (), NOW, doomed_nodes={W1.node})
    assert extra.assign is not None and extra.assign.processes == {"llama-0": 0, warm.name: 1}


def test_a_spare_still_starting_takes_over_instead_of_a_new_pod() -> None:
    """The spare that replaced a used one is still pulling when the next notice comes: it started before any new
    pod could, so the restart waits for it instead of making a new pod (the benchmark's 4th restart: 27.8 s)."""
    starting = pod("llama-spare-zzzzz", role="spare", phase="Pending", ip=None, node="node-s2", created=NOW)
    plan, extra = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), starting], ASSIGNED,
                                 (), NOW, doomed_nodes={W1.node})
    assert extra.assign is None and extra.create_workers == () and extra.waiting_for == (starting.name,)
    assert [r.new for r in extra.replaced] == [starting.name] and extra.create_spares == 1
    assert plan.phase == "Restarting" and plan.delete == ("llama-1",)
    # once it runs, it is assigned
    from dataclasses import replace

    running = replace(starting, phase="Running", ip="10.0.3.3")
    _, extra = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), running], ASSIGNED, (),
                              NOW, doomed_nodes={W1.node})
    assert extra.assign is not None and extra.assign.processes == {"llama-0": 0, running.name: 1}


def test_a_starting_spare_on_a_doomed_node_or_failed_is_not_waited_for() -> None:
    for bad in (pod("llama-spare-zzzzz", role="spare", phase="Pending", ip=None, node=W1.node),
                pod("llama-spare-zzzzz", role="spare", phase="Failed", ip=None, node="node-s2")):
        _, extra = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), bad], ASSIGNED, (),
                                  NOW, doomed_nodes={W1.node})
        assert extra.create_workers == (1,), bad


def test_a_spare_on_a_doomed_node_never_takes_over() -> None:
    plan, extra = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), SPARE], ASSIGNED, (),
                                 NOW, doomed_nodes={W1.node, SPARE.node})
    assert extra.assign is None and extra.create_workers == (1,)
    assert SPARE.name in plan.delete and extra.create_spares == 1


def test_status_spares_does_not_count_a_spare_that_took_an_index() -> None:
    """A used spare is a worker: ready/desired must not read 2/1 after a takeover (seen in make demo)."""
    from reprieve_operator.policy.decide import _inplace_status
    from reprieve_operator.policy.inplace import InPlace
    from reprieve_operator.policy.restart import RestartPlan

    used = pod("llama-spare-used1", role="spare", node="node-s")
    fresh = pod("llama-spare-new22", role="spare", node="node-t")
    current = Assignment(2, {"llama-0": 0, used.name: 1}, "10.0.0.1:8476")
    out = _inplace_status(job(RUN, spares=1), [W0, used, fresh], InPlace(), RestartPlan("Running", 2), current)
    assert out["spares"] == "1/1", out


def test_pod_view_parses_a_cached_pod_once_and_checks_its_node_every_time() -> None:
    """The cache's compact pods keep their parse (a 5,000-pod reconcile parsed 15,000 annotations a pass);
    whether the node is known is still decided per call; an API object passed in is never written to."""
    import json as _json

    from reprieve_operator.policy.views import compact_pod, pod_view

    raw = {"metadata": {"name": "llama-0", "namespace": "ml", "labels": {"reprieve.dev/job-name": "llama",
                                                                        "reprieve.dev/role": "worker",
                                                                        "reprieve.dev/replica-index": "0",
                                                                        "reprieve.dev/attempt": "1"},
                        "annotations": {"reprieve.dev/exit": _json.dumps({"attempt": 1, "code": 42})}},
           "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.0.0.1"}}
    compact = compact_pod(raw)
    first = pod_view(compact, {"n1"})
    assert first is not None and first.exit_code == 42 and first.index == 0 and not first.node_lost
    assert pod_view(compact, {"n1"}) is first  # parsed once
    assert pod_view(compact, {"n2"}).node_lost  # type: ignore[union-attr]  # the node check is per call
    assert pod_view(compact, None) is first
    before = _json.dumps(raw, sort_keys=True)
    assert pod_view(raw, {"n1"}) == first
    assert _json.dumps(raw, sort_keys=True) == before  # not a compact pod: nothing stored in it


def test_a_pod_annotated_through_the_cache_is_parsed_again() -> None:
    """Delivery writes a notice into the cache at once (before the watch event): it upserts a new compact pod, so
    the parse kept in the old one is not served stale (an in-place job would not see its notice)."""
    import json as _json

    from reprieve_operator.cache import Cache
    from reprieve_operator.policy.views import compact_pod, pod_view

    cache = Cache()
    cache.upsert_pod(compact_pod({"metadata": {"name": "llama-0", "namespace": "ml", "labels": {
        "reprieve.dev/job-name": "llama", "reprieve.dev/role": "worker", "reprieve.dev/replica-index": "0",
        "reprieve.dev/attempt": "1"}}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}))
    (cached,) = cache.pods_of("ml", "llama")
    assert pod_view(cached).notice_attempt is None  # type: ignore[union-attr]  # parsed and kept
    annotated = {**cached["metadata"], "annotations": {"reprieve.dev/notice": _json.dumps({"attempt": 1})}}
    cache.upsert_pod({**cached, "metadata": annotated})  # what delivery does
    (fresh,) = cache.pods_of("ml", "llama")
    assert pod_view(fresh).notice_attempt == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(("agreed", "cause"), [(True, "preemption"), (None, "preemption"), (False, "failure")])
def test_the_restart_code_without_an_agreed_save_is_a_failure(agreed: bool | None, cause: str) -> None:
    """The supervisor reports ``"agreed": false`` when the program exited with the restart code itself (nothing
    was saved for it): that is the application's failure, counted against maxFailures, not a preemption.
    (None: a supervisor from before the field.)"""
    from dataclasses import replace

    w1 = replace(exited(W1, 42), exit_agreed=agreed)
    _, extra = decide_inplace(job(RUN), [exited(W0, 42), w1], ASSIGNED, (), NOW)
    assert extra.record is not None and extra.record.cause == cause, extra.record
    if cause == "failure":
        assert "llama-1 exited with the restart code 42 without an agreed save" in extra.record.message


def test_pod_view_reads_whether_the_restart_code_was_agreed() -> None:
    import json

    from reprieve_operator.policy.views import compact_pod, pod_view

    def view(report: dict[str, Any]) -> PodView:
        raw = {"metadata": {"name": "llama-1", "namespace": "ml", "labels": {
            "reprieve.dev/job-name": "llama", "reprieve.dev/role": "worker", "reprieve.dev/replica-index": "1",
            "reprieve.dev/attempt": "1"}, "annotations": {"reprieve.dev/exit": json.dumps(report)}},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
        got = pod_view(compact_pod(raw), {"n1"})
        assert got is not None
        return got

    base = {"attempt": 1, "code": 42, "time": "2026-11-22T03:00:00Z"}
    assert view({**base, "agreed": False}).exit_agreed is False
    assert view({**base, "agreed": True}).exit_agreed is True
    assert view(base).exit_agreed is None and view({**base, "agreed": "no"}).exit_agreed is None


MEMORY = {"checkpoint": {"uri": "/ckpt", "memory": {"sizeLimit": "1Gi"}}}


def test_a_restart_with_the_memory_tier_pairs_every_process_with_a_pod_on_another_node() -> None:
    _, extra = decide_inplace(job(RUN, **MEMORY), [exited(W0, 42), exited(W1, 42)], ASSIGNED, (), NOW)
    assert extra.assign is not None and extra.assign.memory_peers == {0: f"{W1.ip}:8477", 1: f"{W0.ip}:8477"}


def test_a_spare_taking_over_is_paired_and_keeps_the_valid_pairing_of_the_other_process() -> None:
    """Process 1's node is doomed; the spare takes over index 1. Process 0's old peer (pod llama-1) is gone, so it
    pairs with the spare; the spare (now process 1) pairs with process 0's pod."""
    before = Assignment(1, {"llama-0": 0, "llama-1": 1}, "x", {0: f"{W1.ip}:8477", 1: f"{W0.ip}:8477"})
    _, extra = decide_inplace(job(RUN, spares=1, **MEMORY), [exited(W0, 42), exited(W1, 42), SPARE], before, (),
                              NOW, doomed_nodes={W1.node})
    assert extra.assign is not None and extra.assign.memory_peers == {0: "10.0.9.9:8477", 1: f"{W0.ip}:8477"}


def test_two_workers_on_one_node_pair_with_a_ready_spare_not_with_each_other() -> None:
    w0, w1 = pod("llama-0", 0, node="shared"), pod("llama-1", 1, node="shared")
    _, extra = decide_inplace(job(RUN, spares=1, **MEMORY), [exited(w0, 42), exited(w1, 42), SPARE], ASSIGNED, (),
                              NOW)
    assert extra.assign is not None and extra.assign.memory_peers == {0: "10.0.9.9:8477", 1: "10.0.9.9:8477"}


def test_without_the_memory_tier_an_assignment_has_no_peers() -> None:
    _, extra = decide_inplace(job(RUN), [exited(W0, 42), exited(W1, 42)], ASSIGNED, (), NOW)
    assert extra.assign is not None and extra.assign.memory_peers == {}


# Elastic (spec.elastic, docs/elastic-operator.md): a restart whose replacement the scheduler refused long enough
# starts the next attempt on the survivors; below the minimum it waits; capacity back grows the job.

FOUR = Assignment(1, {f"llama-{i}": i for i in range(4)}, "llama-0.llama.ml.svc:8476")
RESTARTING = {**RUN, "phase": "Restarting", "restartingFrom": 1}
PROBE = "llama-1-xk2p9"  # the lost worker 1's replacement, made for attempt 2


def elastic_job(status: dict[str, Any], **elastic: Any) -> Any:
    return job(status, replicas=4, elastic={"minReplicas": 2, "unschedulableSeconds": 5,
                                            "minResizeIntervalSeconds": 60, **elastic})


def lost_one(waited: float, ready: bool = False) -> tuple[list[PodView], dict[str, Any]]:
    """Worker 1 is gone; its replacement is Pending, refused by the scheduler ``waited`` seconds ago."""
    from reprieve_operator.policy.podsready import SchedulerVerdict

    survivors = [pod(f"llama-{i}", i) for i in (0, 2, 3)]
    probe = pod(PROBE, 1, attempt=2, phase="Running" if ready else "Pending", ip="10.0.1.1" if ready else None,
                node="n-new" if ready else None)
    stuck = {} if ready else {PROBE: SchedulerVerdict("0/3 nodes are available: 3 Insufficient cpu.",
                                                      NOW - timedelta(seconds=waited))}
    return [*survivors, probe], stuck


@pytest.mark.parametrize("elastic", [None, {}])
def test_a_replacement_the_scheduler_refused_for_less_than_unschedulable_seconds_is_waited_for(
        elastic: dict[str, Any] | None) -> None:
    pods, stuck = lost_one(waited=2)
    j = elastic_job(RESTARTING) if elastic is not None else job(RESTARTING, replicas=4)
    plan, extra = decide_inplace(j, pods, FOUR, (), NOW, stuck=stuck)
    assert (plan.phase, plan.attempt, extra.assign, extra.resize, extra.create_workers) == \
        ("Restarting", 1, None, None, ())
    assert extra.waiting_for == (PROBE,) and not [c for c in plan.conditions if c.type == "Degraded"]
    # the elastic job looks again when the 5 s are up, with no event to wake it; without the block nothing changes
    assert plan.requeue_after == (pytest.approx(3.0) if elastic is not None else None)


def test_a_job_without_the_block_waits_for_its_full_size_however_long_the_scheduler_refuses() -> None:
    pods, stuck = lost_one(waited=3600)
    plan, extra = decide_inplace(job(RESTARTING, replicas=4), pods, FOUR, (), NOW, stuck=stuck)
    assert (plan.phase, extra.assign, extra.resize, plan.requeue_after) == ("Restarting", None, None, None)
    assert not [c for c in plan.conditions if c.type == "Degraded"]


def test_shrink_starts_the_next_attempt_on_the_survivors_renumbered_and_keeps_the_replacement_as_a_probe() -> None:
    pods, stuck = lost_one(waited=6)
    plan, extra = decide_inplace(elastic_job(RESTARTING), pods, FOUR, (), NOW, stuck=stuck)
    assert extra.assign is not None and extra.resize is not None
    assert (plan.phase, plan.attempt, plan.new_attempt, extra.assign.attempt) == ("Running", 2, True, 2)
    assert dict(extra.assign.processes) == {"llama-0": 0, "llama-2": 1, "llama-3": 2}  # contiguous, 0 stays 0
    assert extra.assign.resize is None  # a shrink follows a loss: a node is gone, the runtime saves as today
    assert extra.assign.coordinator.endswith(":8476") and PROBE not in plan.delete and extra.create_workers == ()
    assert (extra.resize.direction.value, extra.resize.size_from, extra.resize.size) == ("Shrink", 4, 3)
    assert extra.resize.event.reason == "Shrinking" and "process 2 -> 1" in extra.resize.event.message
    degraded = next(c for c in plan.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "Shrunk") and PROBE in degraded.message
    assert [r.new for r in extra.replaced] == [None] and "shrinks to 3" in extra.replaced[0].reason


def test_a_lost_worker_whose_stand_in_is_a_spare_the_scheduler_refuses_shrinks_too() -> None:
    """make demo's stockout: the spare made after the last restart is still Pending (no node has room) when worker 1
    is lost; today's restart picks it for the lost index and makes no replacement, so the job waited for it however
    long the scheduler refused it. Elastic: the refused spare counts as the replacement that cannot schedule."""
    from reprieve_operator.policy.podsready import SchedulerVerdict

    survivors = [pod(f"llama-{i}", i) for i in (0, 2, 3)]
    spare = pod("llama-spare-pend1", role="spare", phase="Pending", ip=None, node=None, created=NOW)
    refused = {"llama-spare-pend1": SchedulerVerdict("0/3 nodes are available: 3 Insufficient cpu.",
                                                     NOW - timedelta(seconds=6))}
    plan, extra = decide_inplace(elastic_job(RESTARTING), [*survivors, spare], FOUR, (), NOW, stuck=refused)
    assert extra.resize is not None and extra.assign is not None, (plan, extra)
    assert (extra.resize.direction.value, extra.resize.size) == ("Shrink", 3)
    assert dict(extra.assign.processes) == {"llama-0": 0, "llama-2": 1, "llama-3": 2}
    assert "llama-spare-pend1 (spare for a lost worker) unschedulable" in extra.resize.event.message
    plan, extra = decide_inplace(job(RESTARTING, replicas=4), [*survivors, spare], FOUR, (), NOW, stuck=refused)
    assert extra.resize is None and extra.assign is None  # without the block: waits for it, as before


def test_below_the_minimum_the_job_waits_as_today_with_the_condition_saying_why() -> None:
    pods, stuck = lost_one(waited=60)
    plan, extra = decide_inplace(elastic_job(RESTARTING, minReplicas=4), pods, FOUR, (), NOW, stuck=stuck)
    assert (plan.phase, extra.assign, extra.resize, extra.waiting_for) == ("Restarting", None, None, (PROBE,))
    degraded = next(c for c in plan.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "BelowMinReplicas")
    assert "3 worker(s) could train, fewer than spec.elastic.minReplicas 4" in degraded.message


SHRUNK = Assignment(2, {"llama-0": 0, "llama-2": 1, "llama-3": 2}, "10.0.0.1:8476")
DEGRADED = {"type": "Degraded", "status": "True", "reason": "Shrunk", "message": "training on 3 of 4 workers",
            "lastTransitionTime": "2026-11-22T02:50:00Z"}


def shrunk(resized_ago: float) -> dict[str, Any]:
    return {**RUN, "attempt": 2, "currentWorkers": 3, "desiredWorkers": 4, "conditions": [DEGRADED],
            "lastResizeTime": (NOW - timedelta(seconds=resized_ago)).isoformat().replace("+00:00", "Z")}


def test_training_shrunk_keeps_the_pending_probe_and_does_not_grow_while_it_cannot_schedule() -> None:
    pods, stuck = lost_one(waited=600)
    plan, extra = decide_inplace(elastic_job(shrunk(600)), pods, SHRUNK, (), NOW, stuck=stuck)
    assert (plan.phase, plan.ready, extra.assign, plan.delete) == ("Running", 3, None, ())


def test_capacity_back_grows_the_job_in_place_with_the_new_worker_after_the_others() -> None:
    pods, _ = lost_one(waited=0, ready=True)
    plan, extra = decide_inplace(elastic_job(shrunk(120)), pods, SHRUNK, (), NOW)
    assert extra.assign is not None and extra.resize is not None
    assert (plan.attempt, plan.new_attempt, extra.assign.attempt) == (3, True, 3)
    assert dict(extra.assign.processes) == {"llama-0": 0, "llama-2": 1, "llama-3": 2, PROBE: 3}
    # a grow: the supervisors stop the running trainers with the resize signal (the step saved to memory)
    assert extra.assign.resize == "grow"
    assert extra.resize.event.reason == "Growing" and f"pod {PROBE} (replacement) takes process 3" in \
        extra.resize.event.message
    degraded = next(c for c in plan.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("False", "FullSize")


def test_no_flapping_capacity_back_within_the_interval_waits_for_it_to_end() -> None:
    pods, _ = lost_one(waited=0, ready=True)
    plan, extra = decide_inplace(elastic_job(shrunk(20)), pods, SHRUNK, (), NOW)
    assert (plan.attempt, extra.assign, extra.resize, plan.delete) == (2, None, None, ())
    assert plan.requeue_after == pytest.approx(40.0)  # minResizeIntervalSeconds 60, resized 20 s ago
    plan, extra = decide_inplace(elastic_job(shrunk(20), growBack=False), pods, SHRUNK, (), NOW)
    assert (extra.assign, plan.requeue_after) == (None, None)


def test_a_wait_below_the_minimum_that_ended_clears_degraded() -> None:
    below = {**RUN, "conditions": [{**DEGRADED, "reason": "BelowMinReplicas"}]}
    plan, extra = decide_inplace(elastic_job(below), [pod(f"llama-{i}", i) for i in range(4)], FOUR, (), NOW)
    degraded = next(c for c in plan.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason, extra.assign) == ("False", "FullSize", None)


def test_a_second_loss_while_shrunk_is_filled_by_the_probe_that_runs_now() -> None:
    pods, _ = lost_one(waited=0, ready=True)
    pods = [p for p in pods if p.name != "llama-3"]  # llama-3 (process 2 of the shrunk attempt) is gone too
    plan, extra = decide_inplace(elastic_job({**shrunk(10), "phase": "Restarting", "restartingFrom": 2}), pods,
                                 SHRUNK, (), NOW)
    assert extra.assign is not None and dict(extra.assign.processes) == {"llama-0": 0, "llama-2": 1, PROBE: 2}
    assert extra.create_workers == () and extra.resize is None and "standby " + PROBE in extra.replaced[0].reason
    assert extra.assign.resize is None
    assert (plan.attempt, plan.new_attempt) == (3, True)


def test_a_spare_that_joins_at_a_grow_is_made_again() -> None:
    spare = pod("llama-spare-q1w2e", role="spare", ip="10.0.9.8", node="node-s2")
    survivors = [pod(f"llama-{i}", i) for i in (0, 2, 3)]
    j = job(shrunk(120), replicas=4, spares=1, elastic={"minReplicas": 2, "minResizeIntervalSeconds": 60})
    plan, extra = decide_inplace(j, [*survivors, spare], SHRUNK, (), NOW)
    assert extra.assign is not None and dict(extra.assign.processes)["llama-spare-q1w2e"] == 3
    assert plan.attempt == 3 and extra.create_spares == 1  # spec.spares 1: the spare that joined is made again


def test_a_probe_that_runs_now_fills_a_lost_index_whose_own_replacement_the_scheduler_refuses() -> None:
    """A second loss while shrunk: the restart made a replacement for the lost index (no ready pod then), the
    scheduler refuses it, and meanwhile the first loss's probe got a node. The probe takes the index (it runs now;
    the refused pod stays the capacity probe); before, the restart kept waiting for its own refused pod while the
    decision counted the ready probe as covering the loss, so neither shrank nor restarted: stuck until capacity."""
    from reprieve_operator.policy.podsready import SchedulerVerdict

    made = pod("llama-2-m4de9", 2, attempt=3, phase="Pending", ip=None, node=None)
    probe = pod(PROBE, 1, attempt=2)  # running now
    refused = {made.name: SchedulerVerdict("0/3 nodes are available: 3 Insufficient cpu.",
                                           NOW - timedelta(seconds=30))}
    pods = [pod("llama-0", 0), pod("llama-2", 2), probe, made]  # llama-3 (process 2 of attempt 2) is gone
    restarting = {**shrunk(60), "phase": "Restarting", "restartingFrom": 2}
    plan, extra = decide_inplace(elastic_job(restarting), pods, SHRUNK, (), NOW, stuck=refused)
    assert extra.assign is not None, (plan, extra)
    assert dict(extra.assign.processes) == {"llama-0": 0, "llama-2": 1, PROBE: 2}
    assert made.name not in plan.delete and extra.create_workers == ()  # it stays, a capacity probe
    # a pod made for the index that is merely on its way (not refused) is still waited for, as before
    plan, extra = decide_inplace(elastic_job(restarting), pods, SHRUNK, (), NOW, stuck={})
    assert (extra.assign, extra.waiting_for) == (None, (made.name,))


def _noticed(*nodes: str) -> dict[str, Any]:
    return {**RUN, "lastNotice": {"id": "x", "node": nodes[0], "reason": "gke-spot", "deadline": "x",
                                  "observedAt": "x", "attempt": 1}}


def test_a_notice_dooming_more_workers_than_spares_makes_a_spare_ahead_for_each() -> None:
    """Two workers doomed, one spare: a second spare is made when the notice comes (the job trains on until its
    final save), so the restart moves both workers to spares whose warm processes parked, none to a cold pod."""
    from dataclasses import replace

    doomed = {W0.node, W1.node}
    plan, extra = decide_inplace(job(_noticed(W0.node), spares=1), [W0, W1, SPARE], ASSIGNED, (), NOW,
                                 doomed_nodes=doomed)
    assert (plan.phase, plan.cause, plan.delete, extra.create_spares) == ("Preempting", None, (), 1)
    # without a spare at all (spec.spares 0), one for each doomed worker
    plan, extra = decide_inplace(job(_noticed(W1.node)), [W0, W1], ASSIGNED, (), NOW, doomed_nodes={W1.node})
    assert (plan.delete, extra.create_spares) == ((), 1)
    # the spare made ahead is there: nothing more, nothing deleted while the notice is open
    ahead = replace(SPARE, name="llama-spare-zzzzz", created=NOW, contract=1)
    plan, extra = decide_inplace(job(_noticed(W0.node), spares=1), [W0, W1, SPARE, ahead], ASSIGNED, (), NOW,
                                 doomed_nodes=doomed)
    assert (plan.delete, extra.create_spares) == ((), 0)
    # the restart takes both spares and makes no worker pod; spec.spares is refilled in the background
    plan, extra = decide_inplace(job(RESTARTING, spares=1), [exited(W0, 42), exited(W1, 42), SPARE, ahead],
                                 ASSIGNED, (), NOW, doomed_nodes=doomed)
    assert extra.assign is not None and set(extra.assign.processes) == {SPARE.name, ahead.name}
    assert extra.create_workers == () and extra.create_spares == 1 and set(plan.delete) == {"llama-0", "llama-1"}


def test_no_spare_is_made_ahead_of_a_notice_for_a_job_kueue_admitted() -> None:
    """Its Workload's spares pod set reserved spec.spares: a pod beyond it would hold what the quota did not."""
    plan, extra = decide_inplace(job(_noticed(W0.node), spares=1), [W0, W1, SPARE], ASSIGNED, (), NOW,
                                 doomed_nodes={W0.node, W1.node}, ahead=False)
    assert (plan.delete, extra.create_spares) == ((), 0)


def test_spares_beyond_spec_go_once_no_notice_is_open_a_starting_one_first() -> None:
    """A notice withdrawn before its restart (or spec.spares lowered): the spares beyond spec.spares are deleted,
    the last in the order a restart takes spares (a starting one before a warm one, a young before an old)."""
    from dataclasses import replace

    warm_old = replace(SPARE, name="llama-spare-aaaaa", created=NOW - timedelta(minutes=5), contract=1)
    warm_young = replace(SPARE, name="llama-spare-bbbbb", created=NOW - timedelta(minutes=1), contract=1)
    starting = pod("llama-spare-ccccc", role="spare", phase="Pending", ip=None, node="node-s2", created=NOW)
    plan, extra = decide_inplace(job(RUN, spares=1), [W0, W1, starting, warm_young, warm_old], ASSIGNED, (), NOW)
    assert set(plan.delete) == {starting.name, warm_young.name} and extra.create_spares == 0
    plan, extra = decide_inplace(job(RUN, spares=2), [W0, W1, starting, warm_young, warm_old], ASSIGNED, (), NOW)
    assert plan.delete == (starting.name,) and extra.create_spares == 0


def test_no_spare_is_made_ahead_for_an_elastic_job() -> None:
    elastic = job(_noticed(W0.node), spares=1, elastic={"minReplicas": 1})
    plan, extra = decide_inplace(elastic, [W0, W1, SPARE], ASSIGNED, (), NOW, doomed_nodes={W0.node, W1.node})
    assert (plan.delete, extra.create_spares) == ((), 0)
