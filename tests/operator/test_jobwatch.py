"""jobwatch: what a TrainingJob status change means for the metrics (pure), and the per-job gauges."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from reprieve_operator import handlers, jobwatch, metrics
from reprieve_operator.cache import Cache
from reprieve_operator.jobwatch import NoticeCommit, NoticeCommits, Transitions, notice_to_commit, transitions

pytestmark = pytest.mark.unit


def acc(*attempts: dict) -> dict:
    return {"goodput": {"accounting": {"closed": {}, "lostSteps": 0, "open": list(attempts)}}}


REPORT = {"step": 49, "time": 54.0, "firstStep": 0, "firstStepTime": 5.0, "stepSeconds": 1.0}
NOTICE = {"lastNotice": {"id": "n", "node": "a", "reason": "gke-spot", "deadline": "2026-11-22T03:01:00Z",
                         "observedAt": "2026-11-22T03:00:00Z", "attempt": 1}}

CASES = [
    ("nothing", {}, {}, Transitions()),
    ("an attempt closes once its successor reports: one restart gap",
     acc({"attempt": 1, "created": 0.0, "ended": 60.0, "report": REPORT}, {"attempt": 2, "created": 60.0}),
     acc({"attempt": 2, "created": 60.0, "report": {**REPORT, "step": 60}}), Transitions((6.0,))),
    ("the job ends: the last attempt closes without a successor, no gap",
     acc({"attempt": 1, "created": 0.0, "report": REPORT}), acc(), Transitions()),
    ("an elastic shrink: currentWorkers fell", {"currentWorkers": 4}, {"currentWorkers": 3},
     Transitions(resize="shrink")),
    ("a grow back: currentWorkers rose", {"currentWorkers": 3}, {"currentWorkers": 4}, Transitions(resize="grow")),
    ("the first size written is no resize", {}, {"currentWorkers": 4}, Transitions()),
    ("the same size again: no resize", {"currentWorkers": 3}, {"currentWorkers": 3}, Transitions()),
]


@pytest.mark.parametrize("old,new,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_transitions(old: dict, new: dict, expected: Transitions) -> None:
    assert transitions(old, new) == expected


def committed(at: str) -> dict:
    return {"lastCheckpointTime": f"2026-11-22T{at}Z"}


def noticed(at: str, observed: str = "03:00:00", notice_id: str = "n") -> dict:
    return {"lastNotice": {**NOTICE["lastNotice"], "id": notice_id, "observedAt": f"2026-11-22T{observed}Z"},
            **committed(at)}


# (statuses as the watch sees them, one after another; the notice -> commit seconds each one completes)
NOTICE_CASES = [
    ("the first commit after the notice: notice -> commit", [noticed("02:59:00"), noticed("03:00:07")],
     [None, 7.0]),
    ("a later commit of the same notice is not counted again", [noticed("03:00:07"), noticed("03:00:09")],
     [7.0, None]),
    ("a commit before the notice is not its commit", [noticed("02:59:59")], [None]),
    ("the commit reached status before the notice did: counted when the notice arrives",
     [committed("03:00:07"), noticed("03:00:07")], [None, 7.0]),
    ("two commits reached status before the notice: the first at or after it counts",
     [committed("02:59:58"), committed("03:00:03"), committed("03:00:07"), noticed("03:00:07")],
     [None, None, None, 3.0]),
    ("the same status again: not counted again", [noticed("03:00:07"), noticed("03:00:07")], [7.0, None]),
    ("a new notice after a commit of the previous one: counted at its own first commit",
     [noticed("03:00:07"), noticed("03:10:02", observed="03:10:00", notice_id="m")], [7.0, 2.0]),
    ("a new notice before any commit after it: counted at that commit",
     [noticed("03:00:07"), noticed("03:00:07", observed="03:10:00", notice_id="m"),
      noticed("03:10:04", observed="03:10:00", notice_id="m")], [7.0, None, 4.0]),
    ("a status without a notice or a commit", [{}, {"phase": "Running"}], [None, None]),
]


@pytest.mark.parametrize("statuses,expected", [c[1:] for c in NOTICE_CASES], ids=[c[0] for c in NOTICE_CASES])
def test_notice_to_commit(statuses: list[dict], expected: list[float | None]) -> None:
    seen, out = NoticeCommit(), []
    for status in statuses:
        seen, seconds = notice_to_commit(seen, status)
        out.append(seconds)
    assert out == expected


def test_a_notice_and_commit_already_in_the_status_at_start_are_not_counted_again() -> None:
    """The first event of a job in this process: its cached status (the LIST at start) is what an operator before
    this one watched."""
    owner, both = NoticeCommits(), noticed("03:00:07")
    assert owner.see(("ml", "counted"), both, both) is None
    assert owner.see(("ml", "counted"), both, noticed("03:00:09")) is None
    assert owner.see(("ml", "waiting"), noticed("02:59:00"), both) == 7.0  # its commit came after the restart
    assert owner.see(("ml", "new"), None, both) == 7.0  # created while this operator watched
    owner.forget(("ml", "counted"))
    assert owner.see(("ml", "counted"), None, both) == 7.0


def test_the_notice_merged_into_the_cache_after_its_commit_was_watched_is_counted_once() -> None:
    """The race of the dashboard e2e: the reconcile's status with a commit after the notice is watched first, the
    delivery then writes lastNotice and merges it into the cache (Cache.merge_job_status) before its own watch
    event, so the cached status before that event already holds both."""
    cache = Cache()
    memo = SimpleNamespace(state=SimpleNamespace(cache=cache))
    ns = "notice-merge"
    labels = {"namespace": ns, "trainingjob": "llama"}

    def watched(status: dict[str, Any]) -> None:
        body = {"metadata": {"namespace": ns, "name": "llama", "uid": "u1"}, "spec": {"replicas": 2},
                "status": status}
        asyncio.run(handlers.job_event(event={"type": "MODIFIED"}, body=body, memo=memo))

    def count() -> float:
        return REGISTRY.get_sample_value("reprieve_notice_to_commit_seconds_count", labels) or 0.0

    try:
        watched(committed("02:59:00"))
        watched(committed("03:00:07"))  # the agreed save, reported before the notice was recorded
        notice = noticed("03:00:07")
        cache.merge_job_status(ns, "llama", {"lastNotice": notice["lastNotice"]})  # delivery._record
        watched(notice)
        watched(noticed("03:00:09"))
        assert count() == 1.0
        assert REGISTRY.get_sample_value("reprieve_notice_to_commit_seconds_sum", labels) == 7.0
    finally:
        jobwatch.forget(ns, "llama")


# What the collector below exposes, one sample a line.
GAUGE_SAMPLES = [
    'reprieve_jobs{namespace="team-a",phase="Running"} 2.0',
    'reprieve_jobs{namespace="team-b",phase="Failed"} 1.0',
    'reprieve_job_goodput_ratio{namespace="team-a",trainingjob="llama"} 0.9',
    'reprieve_job_badput_seconds{bucket="restartGap",namespace="team-a",trainingjob="llama"} 3.0',
    'reprieve_job_step{namespace="team-a",trainingjob="llama"} 120.0',
    # the memory tier: the newest step per tier, restores from memory apart from storage
    'reprieve_job_saved_step{namespace="team-a",tier="memory",trainingjob="llama"} 118.0',
    'reprieve_job_saved_step{namespace="team-a",tier="storage",trainingjob="llama"} 100.0',
    'reprieve_job_restores{namespace="team-a",tier="memory",trainingjob="llama"} 2.0',
    'reprieve_job_restore_seconds{namespace="team-a",tier="storage",trainingjob="llama"} 0.6',
    # elastic (docs/goodput.md, "Degraded"): degraded time, its throughput against full size, the workers
    'reprieve_job_degraded_seconds{namespace="team-a",trainingjob="llama"} 30.0',
    'reprieve_job_degraded_steps{namespace="team-a",trainingjob="llama"} 24.0',
    'reprieve_job_degraded_throughput_ratio{namespace="team-a",trainingjob="llama"} 0.74',
    'reprieve_job_desired_workers{namespace="team-a",trainingjob="llama"} 4.0',
    'reprieve_job_current_workers{namespace="team-a",trainingjob="llama"} 3.0',
    # a job that never shrank: 0 s degraded, all of its workers (spec.replicas where the status does not say)
    'reprieve_job_degraded_seconds{namespace="team-a",trainingjob="gpt"} 0.0',
    'reprieve_job_desired_workers{namespace="team-a",trainingjob="gpt"} 2.0',
    'reprieve_job_current_workers{namespace="team-a",trainingjob="gpt"} 2.0',
]


def test_job_gauges_and_phases_with_and_without_the_job_label() -> None:
    collector = metrics.JobCollector()
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    collector.update("team-a", "llama", {"phase": "Running", "step": 120, "memoryStep": 118,
                                         "lastCheckpointStep": 100, "goodput": {
        "goodput": 0.9, "wallSeconds": 100.0, "productiveSeconds": 90.0,
        "badputSeconds": {"startup": 5.0, "restore": 1.0, "checkpoint": 1.0, "lost": 0.0, "restartGap": 3.0},
        "restores": {"memory": {"count": 2, "seconds": 0.4}, "storage": {"count": 1, "seconds": 0.6}},
        "degraded": {"seconds": 30.0, "steps": 24, "throughputRatio": 0.74}}, "desiredWorkers": 4,
        "currentWorkers": 3})
    collector.update("team-a", "gpt", {"phase": "Running", "goodput": {"goodput": 1.0}}, replicas=2)
    collector.update("team-b", "bert", {"phase": "Failed"})
    text = generate_latest(registry).decode()
    missing = [sample for sample in GAUGE_SAMPLES if sample not in text.splitlines()]
    assert not missing, f"samples missing from the exposition: {missing}"
    # no figure invented: no ratio without one in status, no workers without a size, no degraded time without goodput
    assert 'reprieve_job_degraded_throughput_ratio{namespace="team-a",trainingjob="gpt"}' not in text
    assert 'trainingjob="bert"' not in text
    collector.forget("team-a", "llama")
    assert 'trainingjob="llama"' not in generate_latest(registry).decode()
    metrics.set_job_label(False)
    try:
        text = generate_latest(registry).decode()
        assert "reprieve_job_goodput_ratio{" not in text and 'reprieve_jobs{namespace="team-a"' in text
        assert metrics.job("llama") == ""
    finally:
        metrics.set_job_label(True)


def test_job_label_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from reprieve_operator.__main__ import parse_args

    monkeypatch.delenv("REPRIEVE_METRICS_JOB_LABEL", raising=False)
    assert parse_args([]).metrics_job_label is True
    assert parse_args(["--no-metrics-job-label"]).metrics_job_label is False
    monkeypatch.setenv("REPRIEVE_METRICS_JOB_LABEL", "false")  # what the chart sets from metrics.jobLabel
    assert parse_args([]).metrics_job_label is False
    assert parse_args(["--metrics-job-label"]).metrics_job_label is True
