"""API object -> WorkerPod and RestartPlan -> status patch translations."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.restart import decide_restart
from reprieve_operator.policy.status import status_patch
from reprieve_operator.policy.views import progress, worker_pod

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)


def pod(name: str = "llama-0", phase: str = "Running", exit_code: int | None = None, node: str = "n0",
        **meta: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "t", "state": {"terminated": {"exitCode": exit_code}}}]
    return {"metadata": {"name": name, "labels": {"reprieve.dev/replica-index": name[-1],
                                                  "reprieve.dev/attempt": "3"}, **meta},
            "spec": {"nodeName": node}, "status": status}


ROWS = [
    ("running", pod(), None, {"phase": "Running", "exit_code": None, "node_lost": False, "attempt": 3}),
    ("exit 42", pod(phase="Failed", exit_code=42), None, {"exit_code": 42}),
    ("succeeded without status", pod(phase="Succeeded"), None, {"exit_code": 0}),
    ("node gone", pod(node="gone"), {"n0"}, {"node_lost": True}),
    ("evicted", {**pod(phase="Failed"), "status": {"phase": "Failed", "reason": "Evicted"}}, None,
     {"node_lost": True, "exit_code": None}),
    ("being deleted", pod(deletionTimestamp="2026-11-22T03:00:00Z"), None, {"deleting": True}),
]


@pytest.mark.parametrize("body,nodes,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_worker_pod(body: dict[str, Any], nodes: set[str] | None, expected: dict[str, Any]) -> None:
    w = worker_pod(body, nodes)
    assert w is not None
    assert {k: getattr(w, k) for k in expected} == expected


def test_non_worker_pod_is_ignored() -> None:
    assert worker_pod({"metadata": {"name": "x", "labels": {"reprieve.dev/job-name": "j"}}}) is None


def test_progress_takes_the_newest_and_skips_garbage() -> None:
    def with_progress(v: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "annotations": {"reprieve.dev/progress": v}}}

    good = json.dumps({"step": 120, "committedStep": 100, "attempt": 1, "time": "2026-11-22T03:00:00Z"})
    older = json.dumps({"step": 60, "committedStep": 50})
    assert progress([with_progress("not json"), with_progress(older), with_progress(good), {}]) == json.loads(good)
    assert progress([]) is None


def test_status_patch_counts_a_restart_once_and_is_empty_when_nothing_changes() -> None:
    from reprieve_operator.policy.restart import WorkerPod

    job = make_job(replicas=2).with_status(phase="Running", attempt=1, ready="2/2").model()
    crashed = [WorkerPod("llama-0", 0, 1, "Failed", 1), WorkerPod("llama-1", 1, 1)]
    plan = decide_restart(job, crashed)
    patch = status_patch(job, plan, NOW)
    assert patch["phase"] == "Restarting" and patch["restartingFrom"] == 1
    assert patch["restarts"] == {"preemption": 0, "failure": 1, "disruption": 0} and patch["restartCount"] == 1
    assert patch["conditions"][0]["reason"] == "Failure"
    steady = make_job(replicas=2).with_status(phase="Running", attempt=1, ready="2/2", replicas=2,
                                              selector="reprieve.dev/job-name=llama",
                                              restartMode="Recreate").model()
    running = [WorkerPod("llama-0", 0, 1), WorkerPod("llama-1", 1, 1)]
    assert status_patch(steady, decide_restart(steady, running), NOW) == {}
    fresh = make_job(replicas=2).with_status(phase="Running", attempt=1, ready="2/2").model()
    assert status_patch(fresh, decide_restart(fresh, running), NOW) == {
        "replicas": 2, "selector": "reprieve.dev/job-name=llama",  # the scale subresource's fields
        "restartMode": "Recreate"}  # the mode in effect (no command: the image's entrypoint cannot be wrapped)


def test_status_patch_records_a_new_attempt_and_progress() -> None:
    job = make_job(replicas=2).with_status(phase="Restarting", attempt=1, restartingFrom=1,
                                           startTime="t0").model()
    plan = decide_restart(job, [])
    patch = status_patch(job, plan, NOW, {"step": 7, "committedStep": 5, "time": "t1"})
    assert patch["attempt"] == 2 and patch["attemptStartTime"] == "2026-11-22T03:00:00Z"
    assert "startTime" not in patch and patch["restartingFrom"] is None and patch["replicas"] == 2
    assert (patch["step"], patch["lastCheckpointStep"], patch["lastCheckpointTime"]) == (7, 5, "t1")


def test_compact_pod_keeps_what_the_policy_reads() -> None:
    from reprieve_operator.policy.views import compact_pod

    full = pod(phase="Failed", exit_code=42, deletionTimestamp="t", managedFields=[{"big": "x" * 1000}],
               annotations={"reprieve.dev/notice": "{}", "other": "y"})
    small = compact_pod(full)
    assert worker_pod(small) == worker_pod(full)
    assert "managedFields" not in small["metadata"] and small["metadata"]["annotations"] == {"reprieve.dev/notice": "{}"}


def live(attempt: int, step: int, at: float, first: int, first_at: float, **extra: Any) -> dict[str, Any]:
    return {"attempt": attempt, "step": step, "committedStep": -1, "time": "t", "stepAt": at, "firstStep": first,
            "firstStepAt": first_at, "stepSeconds": 1.0, **extra}


def test_progress_prefers_the_newest_attempt_then_step() -> None:
    def with_progress(v: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "p", "annotations": {"reprieve.dev/progress": json.dumps(v)}}}

    old = {"attempt": 1, "step": 500, "committedStep": 500}
    new = {"attempt": 2, "step": 3, "committedStep": -1}
    assert progress([with_progress(old), with_progress(new)]) == new


def test_status_goodput_follows_attempts_reports_and_the_end() -> None:
    """Through status_patch, as reconcile calls it: attempt 1 created, reports, preempted, attempt 2 resumes
    where attempt 1's agreed save left it, the job succeeds; the status figures add up."""
    from datetime import timedelta

    from reprieve_operator.models import TrainingJobStatus

    t0 = NOW.timestamp()
    job = make_job(replicas=2).model()

    def step(job: Any, pods: list[Any], at: float, prog: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        plan = decide_restart(job, pods, (), NOW + timedelta(seconds=at))
        patch = status_patch(job, plan, NOW + timedelta(seconds=at), prog)
        merged = {**job.status.model_dump(by_alias=True), **patch}
        return job.model_copy(update={"status": TrainingJobStatus.model_validate(merged)}), patch

    from reprieve_operator.policy.restart import WorkerPod

    job, patch = step(job, [], 0, None)
    assert patch["attempt"] == 1 and patch["goodput"]["accounting"]["open"][0]["created"] == t0
    running = [WorkerPod("llama-0", 0, 1, "Running"), WorkerPod("llama-1", 1, 1, "Running")]
    job, patch = step(job, running, 60, live(1, 49, t0 + 54, 0, t0 + 5))
    assert patch["step"] == 49 and patch["goodput"]["productiveSeconds"] == 50.0
    assert patch["goodput"]["wallSeconds"] == 54.0  # up to the report, not to the moment the operator looked
    job, patch = step(job, running, 61, live(1, 49, t0 + 54, 0, t0 + 5))
    assert "goodput" not in patch  # the same report again: nothing to write
    saved = [WorkerPod("llama-0", 0, 1, "Succeeded", 42), WorkerPod("llama-1", 1, 1, "Succeeded", 42)]
    job, patch = step(job, saved, 62, None)  # the gang restarts: attempt 2
    job, patch = step(job, [], 64, None)
    assert job.status.attempt == 2
    second = [WorkerPod("llama-0", 0, 2, "Running"), WorkerPod("llama-1", 1, 2, "Running")]
    job, patch = step(job, second, 80, live(2, 60, t0 + 79, 50, t0 + 70, restoreSeconds=2.0))
    done = [WorkerPod("llama-0", 0, 2, "Succeeded", 0), WorkerPod("llama-1", 1, 2, "Succeeded", 0)]
    job, patch = step(job, done, 120, live(2, 99, t0 + 119, 50, t0 + 70, restoreSeconds=2.0))
    gp = job.status.goodput
    assert job.status.phase == "Succeeded" and gp is not None and gp.accounting["open"] == []
    b = gp.badput_seconds
    assert gp.wall_seconds == pytest.approx(120.0) and gp.lost_steps == 0
    assert gp.productive_seconds + b.startup + b.restore + b.checkpoint + b.lost + b.restart_gap == \
        pytest.approx(120.0, abs=0.2)
    assert gp.productive_seconds == pytest.approx(50 + 50) and b.restore == 2.0
    assert b.restart_gap == pytest.approx(64 - 54 + 1)  # last step -> attempt 2 created, + the end's 1 s
    assert gp.goodput == pytest.approx(100 / 120, abs=1e-3)


def test_a_job_failed_outside_a_plan_closes_its_goodput() -> None:
    """_fail (an invalid spec, a refused pod) works on the raw status: the open attempt ends, figures are final."""
    from datetime import timedelta

    from reprieve_operator.policy import goodput
    from reprieve_operator.policy.status import closing_goodput

    t0 = NOW.timestamp()
    acc = goodput.fold(None, now=t0, new_attempt=1, created_at=t0)
    assert acc is not None and acc.open
    raw = {"goodput": {"accounting": acc.to_status()}}
    closed = closing_goodput(raw, NOW + timedelta(seconds=30))
    assert closed is not None and closed["accounting"]["open"] == []
    assert closed["wallSeconds"] == pytest.approx(30.0)
    assert closing_goodput({}, NOW) is None  # nothing to close: no figures invented
    assert closing_goodput({"goodput": {"accounting": closed["accounting"]}}, NOW + timedelta(seconds=40)) is None


def test_last_steps_come_from_exit_reports_and_termination_messages_highest_per_attempt() -> None:
    """A process that outlived a lost peer said the gang's last step (docs/contract.md): in its supervisor's exit
    report (in place) or its termination message (Recreate). Per attempt the highest; malformed ones skipped."""
    from reprieve_operator.policy.views import last_steps

    def with_exit(v: Any) -> dict[str, Any]:
        return {"metadata": {"name": "p", "annotations": {"reprieve.dev/exit": v if isinstance(v, str) else
                                                          json.dumps(v)}}}

    def with_message(v: Any) -> dict[str, Any]:
        message = v if isinstance(v, str) else json.dumps(v)
        return {"metadata": {"name": "p"}, "status": {"containerStatuses": [
            {"name": "t", "state": {"terminated": {"exitCode": 134, "message": message}}}]}}

    pods = [
        with_exit({"attempt": 2, "code": 134, "peerLost": [0], "lastStep": 41, "lastStepAt": 100.5}),
        with_exit({"attempt": 2, "code": 134, "peerLost": [0], "lastStep": 42, "lastStepAt": 101.0}),
        with_message({"peerLost": [0], "attempt": 1, "lastStep": 9, "lastStepAt": 50}),
        with_message({"peerLost": [0], "attempt": 1, "lastStep": 8, "lastStepAt": 60.0}),  # lower: not it
        with_exit({"attempt": 3, "code": 134, "peerLost": [0]}),  # no last step (a runtime before it)
        with_exit({"attempt": 3, "lastStep": "99", "lastStepAt": 1.0}),  # malformed
        with_exit({"attempt": 3, "lastStep": 99, "lastStepAt": True}),
        with_exit({"attempt": -1, "lastStep": 99, "lastStepAt": 1.0}),
        with_message({"peerLost": [0], "lastStep": 99, "lastStepAt": 1.0}),  # no attempt: whose?
        with_exit('{"lastStep": not json'), with_message("Terminating: lastStep"), {},
    ]
    assert last_steps(pods) == ((1, 9, 50.0), (2, 42, 101.0))
    assert last_steps([]) == ()
    assert last_steps([compact_pod_of(p) for p in pods[:3]]) == ((1, 9, 50.0), (2, 42, 101.0))  # the cache's


def compact_pod_of(p: dict[str, Any]) -> dict[str, Any]:
    from reprieve_operator.policy.views import compact_pod

    return compact_pod(p)


def test_status_goodput_folds_a_survivors_last_step_into_its_attempt() -> None:
    """Process 0 was killed after reporting step 30; a survivor said the gang finished 49: status counts steps
    40-49 as lost once attempt 2 reports it resumed at 40 (not 19 s of restart gap), as the step log does."""
    from datetime import timedelta

    from reprieve_operator.models import TrainingJobStatus
    from reprieve_operator.policy.restart import WorkerPod

    t0 = NOW.timestamp()
    job = make_job(replicas=2).model()

    def step(job: Any, pods: list[Any], at: float, prog: dict[str, Any] | None,
             said: tuple[tuple[int, int, float], ...] = ()) -> tuple[Any, dict[str, Any]]:
        plan = decide_restart(job, pods, (), NOW + timedelta(seconds=at))
        patch = status_patch(job, plan, NOW + timedelta(seconds=at), prog, said)
        merged = {**job.status.model_dump(by_alias=True), **patch}
        return job.model_copy(update={"status": TrainingJobStatus.model_validate(merged)}), patch

    job, _ = step(job, [], 0, None)
    running = [WorkerPod("llama-0", 0, 1, "Running"), WorkerPod("llama-1", 1, 1, "Running")]
    job, _ = step(job, running, 40, live(1, 30, t0 + 35, 0, t0 + 5))
    job, patch = step(job, running, 58, live(1, 30, t0 + 35, 0, t0 + 5), ((1, 49, t0 + 54),))
    assert patch["goodput"]["accounting"]["open"][0]["report"]["step"] == 49
    dead = [WorkerPod("llama-0", 0, 1, "Failed", 137), WorkerPod("llama-1", 1, 1, "Failed", 134)]
    job, _ = step(job, dead, 60, None, ((1, 49, t0 + 54),))
    job, _ = step(job, [], 62, None, ((1, 49, t0 + 54),))
    assert job.status.attempt == 2
    second = [WorkerPod("llama-0", 0, 2, "Running"), WorkerPod("llama-1", 1, 2, "Running")]
    job, _ = step(job, second, 80, live(2, 41, t0 + 71, 40, t0 + 70), ((1, 49, t0 + 54),))  # attempt 1 closes
    job, patch = step(job, second, 81, live(2, 41, t0 + 71, 40, t0 + 70), ((1, 55, t0 + 58),))
    assert "goodput" not in patch  # a last step of a closed attempt: ignored, not counted twice
    gp = job.status.goodput
    assert gp is not None and gp.lost_steps == 10 and gp.badput_seconds.lost == pytest.approx(10.0)
    assert gp.badput_seconds.restart_gap == pytest.approx(62 - 54)


# (case, status before, the patch's size fields, the new attempt's recorded (workers, desired))
ATTEMPT_SIZES = [
    ("no size anywhere (before the elastic wiring): none recorded", {}, {}, (None, None)),
    ("the patch that creates the attempt says its size", {}, {"currentWorkers": 3, "desiredWorkers": 4}, (3, 4)),
    ("a size the status already has (unchanged, so not in the minimal patch)",
     {"currentWorkers": 3, "desiredWorkers": 4}, {}, (3, 4)),
    ("a grow in the patch wins over the status", {"currentWorkers": 3, "desiredWorkers": 4},
     {"currentWorkers": 4}, (4, 4)),
    ("no desiredWorkers: spec.replicas", {"currentWorkers": 1}, {}, (1, 2)),
]


@pytest.mark.parametrize("before,sizes,expected", [r[1:] for r in ATTEMPT_SIZES], ids=[r[0] for r in ATTEMPT_SIZES])
def test_a_new_attempt_records_its_size_for_the_degraded_goodput(
        before: dict[str, Any], sizes: dict[str, Any], expected: tuple[int | None, int | None]) -> None:
    """docs/goodput.md, "Degraded": the accounting learns an attempt's size from currentWorkers/desiredWorkers."""
    from reprieve_operator.policy.status import goodput_patch

    job = make_job(replicas=2).with_status(attempt=1, **before).model()
    gp = goodput_patch(job, "Running", {"attempt": 2, **sizes}, None, NOW)
    assert gp is not None
    (opened,) = gp["accounting"]["open"]
    assert (opened.get("workers"), opened.get("desired")) == expected
