"""Condition ``PodsReady``: whether a pod of the job is stuck before it can run, and why (pure).

A worker whose image cannot be pulled, whose container cannot be created, or that no node can take leaves the
job Pending (or an in-place restart waiting) for as long as it lasts: the kubelet's and the scheduler's reasons
are on the pod, not the job. This module lifts them onto the job:

- ``False`` with the kubelet's reason (``ImagePullBackOff`` for a pull that fails, retried: the kubelet turns
  ``ErrImagePull`` into ``ImagePullBackOff`` and back at each retry, one reason here so the condition does not
  flap; ``InvalidImageName``, ``ErrImageNeverPull``, ``CreateContainerConfigError``, ``CreateContainerError``)
  or ``Unschedulable`` (the scheduler's ``PodScheduled=False`` for at least ``UNSCHEDULABLE_GRACE_SECONDS``: a
  gang briefly waits for nodes during every restart), naming up to three pods with the component's own message;
- ``Unknown``/``Starting`` once no pod is stuck but not all of them run yet, and ``True``/``Running`` once every
  pod of the job runs — both only after the condition was ``False`` (a job that never had a stuck pod carries no
  ``PodsReady``).

The job is not failed for it (as a Job or JobSet, the pods keep waiting for the image, the secret or the node);
the condition and one Warning Event (``events.for_status_change``) say what to fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import LABEL_INDEX, LABEL_ROLE
from .restart import Condition
from .times import parse_time

PODS_READY = "PodsReady"
UNSCHEDULABLE = "Unschedulable"
UNSCHEDULABLE_GRACE_SECONDS = 30.0
IMAGE_PULL = "ImagePullBackOff"
# The kubelet's waiting reasons that do not pass by themselves, in the order a message names them first; the
# value is the condition's reason.
STUCK_REASONS = {
    "InvalidImageName": "InvalidImageName",
    "ErrImageNeverPull": "ErrImageNeverPull",
    "ErrImagePull": IMAGE_PULL,
    IMAGE_PULL: IMAGE_PULL,
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerError",
}
_ORDER = (*dict.fromkeys(STUCK_REASONS.values()), UNSCHEDULABLE)
MAX_NAMED = 3


@dataclass(frozen=True)
class Stuck:
    """One pod that cannot run, and why."""

    pod: str
    what: str  # "worker 1", "spare"
    node: str | None
    reason: str  # the condition's reason (STUCK_REASONS' values, or Unschedulable)
    detail: str  # the kubelet's or the scheduler's message, with the kubelet's own reason before it
    back_off: bool = False  # only the kubelet's "Back-off pulling image": the detail of the failed pull is older


def stuck(pods: Iterable[Mapping[str, Any]], now: datetime) -> tuple[Stuck, ...]:
    """The job's pods (API objects or the cache's compact pods) stuck now, in ``_ORDER`` of their reasons."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        role = labels.get(LABEL_ROLE) or "worker"
        what = role if labels.get(LABEL_INDEX) in (None, "", "-1") else f"{role} {labels.get(LABEL_INDEX)}"
        status = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        found = _waiting(status)
        if found is not None:
            kubelet_reason, container, message = found
            detail = f"container {container}: {kubelet_reason}" + (f": {message}" if message else "")
            out.append(Stuck(str(meta.get("name")), what, node, STUCK_REASONS[kubelet_reason], detail,
                             back_off=kubelet_reason == IMAGE_PULL))
            continue
        unscheduled = _unschedulable(pod, now)
        if unscheduled is not None and unscheduled[0] <= 0:
            out.append(Stuck(str(meta.get("name")), what, None, UNSCHEDULABLE, unscheduled[1]))
    return tuple(sorted(out, key=lambda s: (_ORDER.index(s.reason), s.pod)))


def _waiting(status: Mapping[str, Any]) -> tuple[str, str, str] | None:
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in STUCK_REASONS:
            return str(reason), str(cs.get("name") or "?"), str(waiting.get("message") or "").strip()
    return None


@dataclass(frozen=True)
class SchedulerVerdict:
    """The scheduler's own word that it could not place a pod: its ``PodScheduled=False/Unschedulable``."""

    message: str  # the scheduler's message, e.g. "0/4 nodes are available: 4 Insufficient cpu."
    since: datetime | None  # the condition's lastTransitionTime (None: the scheduler gave none)


def unschedulable(pod: Mapping[str, Any]) -> SchedulerVerdict | None:
    """A pod without a node (Pending, not deleting) that the scheduler failed to place; None for any other pod."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or (pod.get("spec") or {}).get("nodeName") \
            or status.get("phase", "Pending") != "Pending":
        return None
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == UNSCHEDULABLE:
            return SchedulerVerdict(str(c.get("message") or "no node can take it"),
                                    parse_time(c.get("lastTransitionTime")))
    return None


def _unschedulable(pod: Mapping[str, Any], now: datetime) -> tuple[float, str] | None:
    """A pod without a node that the scheduler failed to place: (seconds of its grace left, ``<= 0``: stuck; the
    scheduler's words); None for any other pod."""
    verdict = unschedulable(pod)
    if verdict is None:
        return None
    left = 0.0 if verdict.since is None else UNSCHEDULABLE_GRACE_SECONDS - (now - verdict.since).total_seconds()
    return left, f"{UNSCHEDULABLE}: {verdict.message}"


def unschedulable_due(pods: Iterable[Mapping[str, Any]], now: datetime) -> float | None:
    """Seconds until the earliest pod waiting for a node has waited ``UNSCHEDULABLE_GRACE_SECONDS`` (when to look
    again: the scheduler writes nothing more while it keeps failing); None when no pod is within its grace."""
    due = [u[0] for u in (_unschedulable(p, now) for p in pods) if u is not None and u[0] > 0]
    return min(due) + 1.0 if due else None


def condition(found: tuple[Stuck, ...], all_running: bool, current: Condition | None) -> Condition | None:
    """``PodsReady`` for the pods found stuck (``stuck``), given whether every pod of the job runs and the
    condition the job carries now; None: nothing to write (no stuck pod ever, or no change worth a write)."""
    if not found:
        if current is None or current.status == "True":
            return None
        if all_running:
            return Condition(PODS_READY, "True", "Running", "every pod of the job runs")
        return Condition(PODS_READY, "Unknown", "Starting", "no pod is stuck now; waiting for the pods to run")
    reason = found[0].reason
    if current is not None and current.status == "False" and current.reason == reason \
            and all(s.back_off for s in found if s.reason == IMAGE_PULL) \
            and all(f"pod {s.pod} " in current.message for s in found):
        return None  # the same pods between two pulls: keep the failed pull's own words, not "Back-off pulling"
    named = "; ".join(f"pod {s.pod} ({s.what}{f' on node {s.node}' if s.node else ''}) {s.detail}"
                      for s in found[:MAX_NAMED])
    more = f"; and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
    return Condition(PODS_READY, "False", reason, f"{len(found)} pod(s) cannot run: {named}{more}"[:2000])
