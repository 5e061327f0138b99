"""What a TrainingJob's status change means for the metrics: a pure reading of (old, new) status, and the one
function that records it (called from every watched TrainingJob event, so no reconcile path has to).

* every event: the job's goodput, badput, step and phase gauges (``metrics.JOBS``);
* an attempt closed by the accounting with a successor: its restart gap (last reported step -> the next
  attempt's creation) into ``reprieve_restart_gap_seconds``;
* each notice's first checkpoint committed at or after it: notice -> commit into
  ``reprieve_notice_to_commit_seconds``, once per notice, whichever of the two reached status first;
* an elastic size change (``currentWorkers`` fell or rose): ``reprieve_job_resizes_total{direction}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from . import metrics
from .policy.times import parse_time


@dataclass(frozen=True)
class Transitions:
    restart_gaps: tuple[float, ...] = ()
    resize: str | None = None  # "shrink" or "grow"


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Transitions:
    """Pure: the restart gaps and the resize that ``old`` -> ``new`` status implies."""
    old = old or {}
    gaps = []
    new_open = {a.get("attempt") for a in ((new.get("goodput") or {}).get("accounting") or {}).get("open") or []}
    for a in ((old.get("goodput") or {}).get("accounting") or {}).get("open") or []:
        report = a.get("report")
        if a.get("attempt") not in new_open and a.get("ended") is not None and report:
            gaps.append(max(0.0, float(a["ended"]) - float(report["time"])))
    before, after = old.get("currentWorkers"), new.get("currentWorkers")
    resize = None
    if isinstance(before, int) and isinstance(after, int) and before != after:  # the first size is no change
        resize = "shrink" if after < before else "grow"
    return Transitions(tuple(gaps), resize)


# Commit times remembered while no notice waits for one: a notice reaches status about a second after its
# observedAt (the delivery's patch), and the times are whole seconds, so its first commit is among the last few.
COMMITS_KEPT = 8


@dataclass(frozen=True)
class NoticeCommit:
    """What one job's watched statuses said towards notice -> commit: the last notice counted (its id) and the
    commit times (``lastCheckpointTime``) seen since, oldest first."""

    counted: str | None = None
    commits: tuple[datetime, ...] = ()


def notice_to_commit(seen: NoticeCommit, status: Mapping[str, Any]) -> tuple[NoticeCommit, float | None]:
    """Pure: ``seen`` after one more watched ``status``, and the seconds from the notice in ``status.lastNotice``
    to the first commit at or after its ``observedAt`` once the watch has seen both, whichever came first (the
    reconcile can write a commit's report before the delivery records the notice); once per notice.

    It reads the watched statuses one after another, never the cached status before one: the delivery merges
    the notice into the cache (``Cache.merge_job_status``) before its watch event, so the cached status can
    already hold a notice and its commit when the watch first sees them together."""
    committed = parse_time(status.get("lastCheckpointTime"))
    if committed is not None and committed not in seen.commits:
        seen = replace(seen, commits=(*seen.commits, committed)[-COMMITS_KEPT:])
    notice = status.get("lastNotice") or {}
    key, observed = notice.get("id"), parse_time(notice.get("observedAt"))
    if not key or observed is None or str(key) == seen.counted:
        return seen, None
    after = [t for t in seen.commits if t >= observed]
    if not after:
        return seen, None
    return NoticeCommit(str(key), seen.commits), (min(after) - observed).total_seconds()


class NoticeCommits:
    """The owner of each watched job's :class:`NoticeCommit` (``record`` and ``forget`` are its only callers)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], NoticeCommit] = {}

    def see(self, key: tuple[str, str], before: Mapping[str, Any] | None, status: Mapping[str, Any]) -> float | None:
        """Notice -> commit seconds that ``status`` completes for job ``key``, if any. ``before``: the cached status
        at this process's first event of the job (the LIST at start), whose complete pair an operator before this
        one counted already."""
        seen = self._seen.get(key)
        if seen is None:
            seen = notice_to_commit(NoticeCommit(), before)[0] if before else NoticeCommit()
        self._seen[key], seconds = notice_to_commit(seen, status)
        return seconds

    def forget(self, key: tuple[str, str]) -> None:
        self._seen.pop(key, None)


NOTICES = NoticeCommits()


def record(namespace: str, name: str, old: Mapping[str, Any] | None, new: Mapping[str, Any],
           replicas: int | None = None) -> None:
    """Update the metrics for one watched TrainingJob event (``old``: the cached status before it; ``replicas``:
    the job's ``spec.replicas``, its desired workers where the status does not say them)."""
    metrics.JOBS.update(namespace, name, dict(new), replicas)
    t = transitions(old, new)
    to_commit = NOTICES.see((namespace, name), old, new)
    job = metrics.job(name)
    for gap in t.restart_gaps:
        metrics.RESTART_GAP.labels(namespace, job).observe(gap)
    if to_commit is not None:
        metrics.NOTICE_TO_COMMIT.labels(namespace, job).observe(to_commit)
    if t.resize is not None:
        metrics.RESIZES.labels(namespace, job, t.resize).inc()


def forget(namespace: str, name: str) -> None:
    metrics.JOBS.forget(namespace, name)
    NOTICES.forget((namespace, name))
