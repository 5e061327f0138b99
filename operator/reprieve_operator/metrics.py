"""Prometheus metrics an on-call engineer would graph (served on ``--metrics-port``, path ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

NOTICES = Counter("reprieve_notices_delivered_total",
                  "Notices delivered to a job (once per job per attempt), by signal.", ["reason"])
NOTICE_LATENCY = Histogram(
    "reprieve_notice_latency_seconds",
    "From the operator first seeing a node signal to the notice annotation on all pods of the job.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
RESTARTS = Counter("reprieve_gang_restarts_total", "Gang restarts decided, by cause.", ["cause"])
FAILED_JOBS = Counter("reprieve_jobs_failed_total", "TrainingJobs that reached Failed, by reason.", ["reason"])
RECONCILE_ERRORS = Counter("reprieve_reconcile_errors_total", "Unexpected errors in handlers.", ["handler"])
NOTICE_NODES = Gauge("reprieve_nodes_with_notice", "Nodes currently carrying an active preemption signal.")


LEADER = Gauge("reprieve_leader", "1 while this operator replica holds the leader-election Lease (or runs "
                                  "without leader election), 0 while it stands by.")
_serving: set[int] = set()


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Start the metrics HTTP server in a daemon thread (port 0 disables it; a second call is a no-op)."""
    if port and port not in _serving:
        start_http_server(port, addr=addr)
        _serving.add(port)
