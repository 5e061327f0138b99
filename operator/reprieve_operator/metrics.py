"""Prometheus metrics an on-call engineer would graph (served on ``--metrics-port``, path ``/metrics``).

Per-job series carry ``namespace`` and ``trainingjob`` labels (not ``job``: Prometheus gives every target a
``job`` label of its own; scrape with ``honor_labels: true`` so ``namespace`` stays the job's, as the chart's
monitors do). ``--no-metrics-job-label`` (chart value ``metrics.jobLabel: false``) leaves ``trainingjob`` empty for fleets with very many jobs: counters and
histograms then aggregate per namespace, and the per-job gauges (goodput, badput, step) are not exported at all
(kube-state-metrics' TrainingJob config in the chart has them from ``status``).
"""

from __future__ import annotations

import platform
import threading
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from . import __version__
from .policy import restores

JOB_LABELS = ["namespace", "trainingjob"]
LEAD_BUCKETS = (5.0, 10.0, 15.0, 30.0, 60.0, 90.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
SECONDS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)

BUILD_INFO = Gauge("reprieve_build_info", "Always 1; the operator's version and Python in labels.",
                   ["version", "python"])
BUILD_INFO.labels(__version__, platform.python_version()).set(1)
NOTICES = Counter("reprieve_notices_delivered_total",
                  "Notices delivered to a job (once per job per attempt), by signal.", [*JOB_LABELS, "reason"])
NOTICE_LATENCY = Histogram(
    "reprieve_notice_latency_seconds",
    "From the operator first seeing a node signal to the notice annotation on all pods of the job.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
NOTICE_LEAD = Histogram("reprieve_notice_lead_seconds",
                        "Notice lead time: deadline minus when the operator first saw the signal, at delivery.",
                        [*JOB_LABELS, "reason"], buckets=LEAD_BUCKETS)
NOTICE_TO_COMMIT = Histogram("reprieve_notice_to_commit_seconds",
                             "From the operator seeing a notice to the job's first checkpoint committed at or after "
                             "it (as reported by the runtime; 1 s resolution), once per notice.", JOB_LABELS,
                             buckets=SECONDS_BUCKETS)
RESTART_GAP = Histogram("reprieve_restart_gap_seconds",
                        "Last step of an attempt to the next attempt's creation (the restart-gap badput of one "
                        "interruption).", JOB_LABELS, buckets=SECONDS_BUCKETS)
RESTARTS = Counter("reprieve_gang_restarts_total", "Gang restarts decided, by cause.", [*JOB_LABELS, "cause"])
FAILED_JOBS = Counter("reprieve_jobs_failed_total", "TrainingJobs that reached Failed, by reason.",
                      [*JOB_LABELS, "reason"])
RECONCILE_ERRORS = Counter("reprieve_reconcile_errors_total", "Unexpected errors in handlers.", ["handler"])
RECONCILES = Counter("reprieve_reconciles_total", "TrainingJob reconciles finished (whatever their outcome): "
                     "everything a reconcile decides is applied by the time it counts.", JOB_LABELS)
NODE_EVENTS = Counter("reprieve_node_events_total", "Node events handled (and held notices looked at again): "
                      "the notices a Node event gives are delivered by the time it counts.", ["node"])
EVENTS_DROPPED = Counter("reprieve_events_dropped_total", "Pods' Events of a notice burst not posted: more than "
                         "1,000 were queued at once (the notices themselves are delivered; eventsink.py).")
NOTICE_NODES = Gauge("reprieve_nodes_with_notice", "Nodes currently carrying an active preemption signal.")
LEADER_TRIES = Counter("reprieve_leader_election_tries_total", "Reads of the leader-election Lease, one per try "
                       "to take it (a standby, every retry period) or to renew it (the leader).")
RESIZES = Counter("reprieve_job_resizes_total", "Elastic size changes of a job's attempts (status.currentWorkers "
                  "fell: shrink, rose: grow).", [*JOB_LABELS, "direction"])
LEADER = Gauge("reprieve_leader", "1 while this operator replica holds the leader-election Lease (or runs "
                                  "without leader election), 0 while it stands by.")

_serving: set[int] = set()
_job_label = True


def set_job_label(enabled: bool) -> None:
    global _job_label
    _job_label = enabled


def job(name: str) -> str:
    """The ``trainingjob`` label value ("" when the chart turned the job label off)."""
    return name if _job_label else ""


class JobCollector:
    """Per-job gauges and jobs by phase, from the watched TrainingJobs' status (``handlers.job_event``).

    Only what a graph needs is kept per job (a few floats), so 10,000 jobs cost a few MB."""

    BADPUT = ("startup", "restore", "checkpoint", "lost", "restartGap")
    TIERS = tuple(restores.TIERS)  # where a restore read

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], tuple[str, dict[str, float]]] = {}

    def update(self, namespace: str, name: str, status: dict[str, Any], replicas: int | None = None) -> None:
        """``status``: the job's status; ``replicas``: its ``spec.replicas``, the desired workers where the status
        does not say them (``desiredWorkers``); the current workers are the desired ones unless
        ``currentWorkers`` says otherwise (as ``policy.elastic`` reads them)."""
        gp = status.get("goodput") or {}
        values: dict[str, float] = {}
        if gp.get("goodput") is not None:
            values["goodput"] = float(gp["goodput"])
        for key in ("productiveSeconds", "wallSeconds"):
            if gp.get(key) is not None:
                values[key] = float(gp[key])
        if gp:  # a job that never trained degraded: 0 s
            degraded = gp.get("degraded") or {}
            values["degradedSeconds"] = float(degraded.get("seconds") or 0.0)
            values["degradedSteps"] = float(degraded.get("steps") or 0)
            if degraded.get("throughputRatio") is not None:
                values["degradedThroughputRatio"] = float(degraded["throughputRatio"])
        desired = status.get("desiredWorkers") or replicas
        if desired:
            values["desiredWorkers"] = float(desired)
            values["currentWorkers"] = float(status.get("currentWorkers") or desired)
        for bucket, v in (gp.get("badputSeconds") or {}).items():
            values[f"badput.{bucket}"] = float(v)
        for tier, tally in (gp.get("restores") or {}).items():
            if isinstance(tally, dict) and tier in self.TIERS:
                values[f"restores.{tier}"] = float(tally.get("count") or 0)
                values[f"restoreSeconds.{tier}"] = float(tally.get("seconds") or 0.0)
        for key in ("step", "memoryStep", "lastCheckpointStep"):
            if status.get(key) is not None:
                values[key] = float(status[key])
        with self._lock:
            self._jobs[(namespace, name)] = (str(status.get("phase") or "Pending"), values)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._jobs.pop((namespace, name), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            jobs = dict(self._jobs)
        phases = GaugeMetricFamily("reprieve_jobs", "TrainingJobs by namespace and phase.",
                                   labels=["namespace", "phase"])
        for (ns, phase), n in sorted(Tally((ns, p) for (ns, _), (p, _) in jobs.items()).items()):
            phases.add_metric([ns, phase], n)
        yield phases
        if not _job_label:
            return
        ratio = GaugeMetricFamily("reprieve_job_goodput_ratio", "Productive seconds / wall seconds of the job "
                                  "(status.goodput; provisional while it runs).", labels=JOB_LABELS)
        productive = GaugeMetricFamily("reprieve_job_productive_seconds", "Productive (kept) step time of the job.",
                                       labels=JOB_LABELS)
        wall = GaugeMetricFamily("reprieve_job_wall_seconds", "Wall time accounted for the job.", labels=JOB_LABELS)
        badput = GaugeMetricFamily("reprieve_job_badput_seconds", "Badput of the job by bucket (docs/goodput.md).",
                                   labels=[*JOB_LABELS, "bucket"])
        step = GaugeMetricFamily("reprieve_job_step", "Latest step reported by the job's process 0.",
                                 labels=JOB_LABELS)
        saved = GaugeMetricFamily("reprieve_job_saved_step", "Newest step the job holds, by tier: memory (every "
                                  "process has it in memory) or storage (committed checkpoint).",
                                  labels=[*JOB_LABELS, "tier"])
        restores = GaugeMetricFamily("reprieve_job_restores", "Restores of the job by where they read: memory, "
                                     "mixed (some processes from storage), storage.", labels=[*JOB_LABELS, "tier"])
        restore_s = GaugeMetricFamily("reprieve_job_restore_seconds", "Time the job's restores took, by where they "
                                      "read.", labels=[*JOB_LABELS, "tier"])
        degraded = GaugeMetricFamily("reprieve_job_degraded_seconds", "Productive seconds the job trained on fewer "
                                     "workers than desired (part of reprieve_job_productive_seconds; elastic).",
                                     labels=JOB_LABELS)
        degraded_steps = GaugeMetricFamily("reprieve_job_degraded_steps", "Kept steps the job trained on fewer "
                                           "workers than desired.", labels=JOB_LABELS)
        degraded_ratio = GaugeMetricFamily("reprieve_job_degraded_throughput_ratio", "Steps per second while "
                                           "degraded / steps per second at full size (status.goodput.degraded).",
                                           labels=JOB_LABELS)
        desired = GaugeMetricFamily("reprieve_job_desired_workers", "The workers the job asks for "
                                    "(status.desiredWorkers, else spec.replicas).", labels=JOB_LABELS)
        current = GaugeMetricFamily("reprieve_job_current_workers", "The workers the job's current attempt trains on "
                                    "(status.currentWorkers, else the desired workers).", labels=JOB_LABELS)
        for (ns, name), (_, v) in sorted(jobs.items()):
            for family, key in ((ratio, "goodput"), (productive, "productiveSeconds"), (wall, "wallSeconds"),
                                (step, "step"), (degraded, "degradedSeconds"), (degraded_steps, "degradedSteps"),
                                (degraded_ratio, "degradedThroughputRatio"), (desired, "desiredWorkers"),
                                (current, "currentWorkers")):
                if key in v:
                    family.add_metric([ns, name], v[key])
            for bucket in self.BADPUT:
                if f"badput.{bucket}" in v:
                    badput.add_metric([ns, name, bucket], v[f"badput.{bucket}"])
            for tier, key in (("memory", "memoryStep"), ("storage", "lastCheckpointStep")):
                if key in v:
                    saved.add_metric([ns, name, tier], v[key])
            for tier in self.TIERS:
                if f"restores.{tier}" in v:
                    restores.add_metric([ns, name, tier], v[f"restores.{tier}"])
                    restore_s.add_metric([ns, name, tier], v[f"restoreSeconds.{tier}"])
        yield from (ratio, productive, wall, badput, step, saved, restores, restore_s, degraded, degraded_steps,
                    degraded_ratio, desired, current)


JOBS = JobCollector()
REGISTRY.register(JOBS)  # type: ignore[arg-type]


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Start the metrics HTTP server in a daemon thread (port 0 disables it; a second call is a no-op)."""
    if port and port not in _serving:
        start_http_server(port, addr=addr)
        _serving.add(port)
