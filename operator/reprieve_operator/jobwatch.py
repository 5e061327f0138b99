"""What a TrainingJob's status change means for the metrics: a pure reading of (old, new) status, and the one
function that records it (called from every watched TrainingJob event, so no reconcile path has to).

* every event: the job's goodput, badput, step and phase gauges (``metrics.JOBS``);
* an attempt closed by the accounting with a successor: its restart gap (last reported step -> the next
  attempt's creation) into ``reprieve_restart_gap_seconds``;
* the first checkpoint committed after a notice: notice -> commit into ``reprieve_notice_to_commit_seconds``;
* an elastic size change (``currentWorkers`` fell or rose): ``reprieve_job_resizes_total{direction}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import metrics
from .policy.times import parse_time


@dataclass(frozen=True)
class Transitions:
    restart_gaps: tuple[float, ...] = ()
    notice_to_commit: float | None = None
    resize: str | None = None  # "shrink" or "grow"


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Transitions:
    """Pure: the histogram observations that ``old`` -> ``new`` status implies."""
    old = old or {}
    gaps = []
    new_open = {a.get("attempt") for a in ((new.get("goodput") or {}).get("accounting") or {}).get("open") or []}
    for a in ((old.get("goodput") or {}).get("accounting") or {}).get("open") or []:
        report = a.get("report")
        if a.get("attempt") not in new_open and a.get("ended") is not None and report:
            gaps.append(max(0.0, float(a["ended"]) - float(report["time"])))
    now, then = _committed_after_notice(new), _committed_after_notice(old)
    # Observed once per notice, whichever status field arrives first: the commit's report can reach status
    # before the notice itself is recorded there.
    to_commit = now[1] if now is not None and (then is None or then[0] != now[0]) else None
    before, after = old.get("currentWorkers"), new.get("currentWorkers")
    resize = None
    if isinstance(before, int) and isinstance(after, int) and before != after:  # the first size is no change
        resize = "shrink" if after < before else "grow"
    return Transitions(tuple(gaps), to_commit, resize)


def _committed_after_notice(status: Mapping[str, Any]) -> tuple[str, float] | None:
    """(the notice's observedAt, notice -> the last commit in seconds) when that commit came after the notice."""
    observed = (status.get("lastNotice") or {}).get("observedAt")
    seen, committed = parse_time(observed), parse_time(status.get("lastCheckpointTime"))
    if seen is None or committed is None or committed < seen:
        return None
    return str(observed), (committed - seen).total_seconds()


def record(namespace: str, name: str, old: Mapping[str, Any] | None, new: Mapping[str, Any],
           replicas: int | None = None) -> None:
    """Update the metrics for one watched TrainingJob event (``old``: the cached status before it; ``replicas``:
    the job's ``spec.replicas``, its desired workers where the status does not say them)."""
    metrics.JOBS.update(namespace, name, dict(new), replicas)
    t = transitions(old, new)
    job = metrics.job(name)
    for gap in t.restart_gaps:
        metrics.RESTART_GAP.labels(namespace, job).observe(gap)
    if t.notice_to_commit is not None:
        metrics.NOTICE_TO_COMMIT.labels(namespace, job).observe(t.notice_to_commit)
    if t.resize is not None:
        metrics.RESIZES.labels(namespace, job, t.resize).inc()


def forget(namespace: str, name: str) -> None:
    metrics.JOBS.forget(namespace, name)
