"""jobwatch: what a TrainingJob status change means for the metrics (pure), and the per-job gauges."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from reprieve_operator import metrics
from reprieve_operator.jobwatch import Transitions, transitions

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
    ("first commit after the notice: notice -> commit",
     {**NOTICE, "lastCheckpointTime": "2026-11-22T02:59:00Z"},
     {**NOTICE, "lastCheckpointTime": "2026-11-22T03:00:07Z"}, Transitions((), 7.0)),
    ("a later commit of the same notice is not counted again",
     {**NOTICE, "lastCheckpointTime": "2026-11-22T03:00:07Z"},
     {**NOTICE, "lastCheckpointTime": "2026-11-22T03:00:09Z"}, Transitions()),
    ("a commit before the notice is not its commit", {}, {**NOTICE, "lastCheckpointTime": "2026-11-22T02:59:59Z"},
     Transitions()),
    ("the commit reached status before the notice did: counted when the notice arrives",
     {"lastCheckpointTime": "2026-11-22T03:00:07Z"}, {**NOTICE, "lastCheckpointTime": "2026-11-22T03:00:07Z"},
     Transitions((), 7.0)),
    ("the same notice again with the same commit: not counted again",
     {**NOTICE, "lastCheckpointTime": "2026-11-22T03:00:07Z"},
     {**NOTICE, "lastCheckpointTime": "2026-11-22T03:00:07Z"}, Transitions()),
    ("a new notice after a commit of the previous one: counted at its own first commit",
     {**NOTICE, "lastCheckpointTime": "2026-11-22T03:00:07Z"},
     {"lastNotice": {**NOTICE["lastNotice"], "observedAt": "2026-11-22T03:10:00Z"},
      "lastCheckpointTime": "2026-11-22T03:10:02Z"}, Transitions((), 2.0)),
    ("an elastic shrink: currentWorkers fell", {"currentWorkers": 4}, {"currentWorkers": 3},
     Transitions(resize="shrink")),
    ("a grow back: currentWorkers rose", {"currentWorkers": 3}, {"currentWorkers": 4}, Transitions(resize="grow")),
    ("the first size written is no resize", {}, {"currentWorkers": 4}, Transitions()),
    ("the same size again: no resize", {"currentWorkers": 3}, {"currentWorkers": 3}, Transitions()),
]


@pytest.mark.parametrize("old,new,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_transitions(old: dict, new: dict, expected: Transitions) -> None:
    assert transitions(old, new) == expected


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
