"""The policy's views of API objects (pure): a pod as ``WorkerPod`` or ``PodView`` (an in-place job's pod, defined
here so ``inplace`` and ``memorypeers`` both take it from below them), the compact pod and node the cache keeps, the
newest progress report."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from .. import (
    ANNOTATION_EXIT,
    ANNOTATION_NOTICE,
    ANNOTATION_NOTICE_WATCH,
    ANNOTATION_PROGRESS,
    ANNOTATION_SUPERVISOR,
    LABEL_ATTEMPT,
    LABEL_INDEX,
    LABEL_ROLE,
)
from ..models import TrainingJob
from .pairing import ZONE_LABEL
from .placement import NODE_FIELDS as PLACEMENT_FIELDS
from .restart import TERMINAL_PHASES, WorkerPod
from .signalkinds import KINDS, NodeField
from .times import parse_time
from .workload import ANNOTATION_CHECKPOINT

log = logging.getLogger(__name__)
LOST_REASONS = ("NodeLost", "Evicted", "Preempting", "Terminated", "Shutdown", "NodeShutdown")


@dataclass(frozen=True, slots=True)
class PodView:
    """One pod of an in-place job as the policy sees it (``views.pod_view`` builds it from the API object)."""

    name: str
    role: str  # "worker" or "spare"
    index: int | None  # the index it was created for (workers)
    attempt: int  # the attempt it was created for
    phase: str = "Running"
    deleting: bool = False
    node: str | None = None
    node_lost: bool = False
    ip: str | None = None
    exit_attempt: int | None = None  # the supervisor's last exit report
    exit_code: int | None = None
    exit_agreed: bool | None = None  # with the restart code: whether the runtime announced it (an agreed save)
    exit_time: datetime | None = None
    exit_peer_lost: tuple[int, ...] = ()  # the report's ``peerLost``: the trainer ended as these processes went silent
    exit_peer_gone: tuple[int, ...] = ()  # ... ``peerGone``: of them, those whose pulse did not answer
    container_code: int | None = None  # the container (the supervisor) ended with this code
    container_finished: datetime | None = None  # ... at this time (its terminated state's finishedAt)
    notice_attempt: int | None = None  # the attempt of the notice it carries, if any
    contract: int | None = None  # the supervisor's contract version, once it announced itself
    start_error: str | None = None  # the container could not start (the kubelet's StartError message)
    created: datetime | None = None  # metadata.creationTimestamp
    zone: str | None = None  # its node's topology.kubernetes.io/zone (``decide`` adds it: the memory tier's pairing)
    node_ready: bool = True  # its node's Ready condition is not False/Unknown (``decide`` sets it)
    reachable: bool = True  # False: its address went unanswered when probed (``decide`` sets it)
    # process 0's progress report: the memory tier switched itself off in this attempt, and why (``memoryOff``)
    memory_off: tuple[int, str] | None = None

    @property
    def ready(self) -> bool:
        """Running with an IP, not being deleted: an assignment may list it."""
        return self.phase == "Running" and bool(self.ip) and not self.deleting and not self.node_lost



def worker_view(p: PodView, attempt: int, index: int, restart_code: int) -> WorkerPod:
    """The worker ``p`` as ``policy.restart`` sees it: its exit report for ``attempt`` is its exit."""
    phase, code = ("Running" if p.phase in ("Running", "Pending") else p.phase), None
    peer_lost: tuple[int, ...] = ()
    peer_gone: tuple[int, ...] = ()
    if p.exit_attempt == attempt and p.exit_code is not None:
        phase, code = ("Succeeded" if p.exit_code == 0 else "Failed"), p.exit_code
        peer_lost = p.exit_peer_lost if code != 0 else ()
        peer_gone = p.exit_peer_gone if code != 0 else ()
    elif p.phase in TERMINAL_PHASES:  # the supervisor ended without a report for this attempt
        code = p.container_code if p.container_code is not None else (0 if p.phase == "Succeeded" else None)
    exit_time = p.exit_time if p.exit_attempt == attempt else \
        (p.container_finished if p.phase in TERMINAL_PHASES else None)
    return WorkerPod(name=p.name, index=index, attempt=attempt, phase=phase, exit_code=code, deleting=p.deleting,
                     node=p.node, node_lost=p.node_lost, noticed=p.notice_attempt == attempt,
                     unsaved=code == restart_code and p.exit_attempt == attempt and p.exit_agreed is False,
                     peer_lost=peer_lost, peer_gone=peer_gone, exit_time=exit_time, node_ready=p.node_ready,
                     reachable=p.reachable)


@dataclass(frozen=True)
class GonePod:
    """A worker pod the watch saw deleted (gone from the API): where it ran, for a decision that finds it missing.

    A NoExecute taint evicts at once and the pod can be gone before a reconcile sees it deleting: only its node
    (read fresh, ``look_at_nodes``) can then say whether it was preempted (an open notice there) or lost."""

    name: str
    node: str
    index: int | None
    attempt: int | None


def gone_pod(pod: Mapping[str, Any]) -> GonePod | None:
    """What to remember of a deleted pod (None: it was never placed on a node)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    return GonePod(str(meta.get("name")), str(node), to_int(labels.get(LABEL_INDEX)),
                   to_int(labels.get(LABEL_ATTEMPT)))


def to_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def worker_pod(pod: Mapping[str, Any], known_nodes: Container[str] | None = None) -> WorkerPod | None:
    """The policy's view of a worker pod; None if its labels are not a worker's."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    index, attempt = to_int(labels.get(LABEL_INDEX)), to_int(labels.get(LABEL_ATTEMPT))
    if index is None or attempt is None:
        return None
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    phase = status.get("phase") or "Pending"
    exit_code, exit_time = None, None
    peer_lost: tuple[int, ...] = ()
    peer_gone: tuple[int, ...] = ()
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None and term.get("exitCode") is not None:
            code = int(term["exitCode"])
            if exit_code in (None, 0) and code != 0:
                message = _json(term.get("message"))
                peer_lost, peer_gone = peers_lost(message.get("peerLost")), peers_lost(message.get("peerGone"))
                exit_time = parse_time(term.get("finishedAt"))
            exit_code = code if exit_code in (None, 0) else exit_code  # the first non-zero wins
    if phase == "Succeeded" and exit_code is None:
        exit_code = 0
    node_lost = bool(node) and known_nodes is not None and node not in known_nodes
    if phase == "Failed" and status.get("reason") in LOST_REASONS:
        node_lost, exit_code = True, None
    return WorkerPod(name=str(meta.get("name")), index=index, attempt=attempt, phase=phase,
                     exit_code=exit_code, deleting=bool(meta.get("deletionTimestamp")), node=node,
                     node_lost=node_lost, noticed=bool((meta.get("annotations") or {}).get(ANNOTATION_NOTICE)),
                     peer_lost=peer_lost, peer_gone=peer_gone, exit_time=exit_time)


def peers_lost(value: Any) -> tuple[int, ...]:
    """An exit report's or termination message's ``peerLost`` or ``peerGone`` (process indices; anything else:
    none)."""
    if not isinstance(value, list):
        return ()
    return tuple(sorted({v for v in value if type(v) is int and v >= 0}))


def not_ready_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """The nodes (compact nodes) whose Ready condition is False or Unknown: the node controller's word that their
    kubelet stopped reporting (about 40 s after a machine died)."""
    out = set()
    for name, node in nodes.items():
        for c in (node.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") in ("False", "Unknown"):
                out.add(name)
    return frozenset(out)


def compact_pod(pod: Mapping[str, Any], intern: Callable[[str], str] = str) -> dict[str, Any]:
    """The few fields of a pod that the operator's decisions read, kept in memory for every worker pod (the cache
    holds it as JSON text, ``cache.CachedPod``): a field the pod does not have is left out (readers ``.get`` every
    one), and the strings the cache's indices key on (namespace, name, labels, node) go through ``intern`` (the
    cache's: ``sys.intern``). ``VIEW_KEY`` holds a fresh ``ViewMemo``."""

    def _intern(value: Any) -> Any:
        return intern(value) if type(value) is str else value

    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    out_meta: dict[str, Any] = {k: _intern(meta.get(k)) for k in ("name", "namespace")}
    out_meta["uid"] = meta.get("uid")
    out_meta["labels"] = {_intern(k): _intern(v) for k, v in labels.items() if k.startswith("reprieve.dev/")}
    kept = {k: annotations[k] for k in _COMPACT_ANNOTATIONS if annotations.get(k)}
    if kept:
        out_meta["annotations"] = kept
    for k in ("deletionTimestamp", "creationTimestamp"):
        if meta.get(k):
            out_meta[k] = meta[k]
    out_status: dict[str, Any] = {k: _intern(status.get(k)) for k in ("phase", "reason", "podIP") if status.get(k)}
    containers = [{"name": _intern(cs.get("name")), "state": _compact_state(cs.get("state"), _intern)}
                  for cs in status.get("containerStatuses") or []]
    if containers:
        out_status["containerStatuses"] = containers
    # what condition PodsReady reads (policy.podsready): a waiting init container, no node yet
    waiting = [{"name": cs.get("name"), "state": cs.get("state")} for cs in status.get("initContainerStatuses") or []
               if (cs.get("state") or {}).get("waiting")]
    if waiting:
        out_status["initContainerStatuses"] = waiting
    unscheduled = [c for c in status.get("conditions") or []
                   if c.get("type") == "PodScheduled" and c.get("status") == "False"]
    if unscheduled:
        out_status["conditions"] = unscheduled
    node = (pod.get("spec") or {}).get("nodeName")
    return {"metadata": out_meta, "spec": {"nodeName": _intern(node)} if node else {}, "status": out_status,
            VIEW_KEY: ViewMemo()}


_COMPACT_ANNOTATIONS = (ANNOTATION_NOTICE, ANNOTATION_NOTICE_WATCH, ANNOTATION_PROGRESS, ANNOTATION_EXIT,
                        ANNOTATION_SUPERVISOR, ANNOTATION_CHECKPOINT)


_STATE_FIELDS = {"running": ("startedAt",), "waiting": ("reason", "message"),
                 "terminated": ("exitCode", "reason", "message", "startedAt", "finishedAt")}


def _compact_state(state: Any, _intern: Callable[[Any], Any]) -> dict[str, Any]:
    """A container's state with the fields the decisions read, in dicts of their own (not the decoded body's, whose
    every key is a string of its own per pod)."""
    out: dict[str, Any] = {}
    for kind, fields in _STATE_FIELDS.items():
        part = state.get(kind) if isinstance(state, Mapping) else None
        if isinstance(part, Mapping):
            out[kind] = {k: _intern(part[k]) for k in fields if part.get(k) is not None}
    return out


def _json(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def pod_view(pod: Mapping[str, Any], known_nodes: Container[str] | None = None) -> PodView | None:
    """An in-place job's pod as ``policy.inplace`` sees it; None if it is not one of the job's pods.

    A compact pod (``compact_pod``, or one the cache decoded for a read) keeps its parsed view in its
    ``ViewMemo``, which the cache holds beside the pod's text for as long as the pod is unchanged: a reconcile of a
    5,000-pod job parsed 15,000 JSON annotations otherwise, 0.18 s a pass. Only whether the node is known is decided
    per call."""
    slot = pod.get(VIEW_KEY)  # None: not a compact pod (an API object: nothing is stored in it)
    memo = slot.view if isinstance(slot, ViewMemo) else None
    if memo is None:
        memo = _parse_pod_view(pod) or False
        if isinstance(slot, ViewMemo):
            slot.view = memo
    if not isinstance(memo, PodView):
        return None
    view = memo
    node_lost = view.node_lost or (bool(view.node) and known_nodes is not None and view.node not in known_nodes)
    return view if node_lost == view.node_lost else replace(view, node_lost=node_lost)


# A container's terminated reason when its command could not be run: containerd/CRI-O and the local process
# kubelet say StartError, dockershim said ContainerCannotRun.
START_ERRORS = ("StartError", "ContainerCannotRun")
VIEW_KEY = "_view"  # compact pods only: their ViewMemo


class ViewMemo:
    """A compact pod's slot for ``pod_view``'s parse: None until first asked, False when the pod is not one of the
    job's pods. The cache keeps one per pod beside the pod's text (``cache.CachedPod``), so the parse outlives the
    dict decoded for one read; a changed pod gets a new one."""

    __slots__ = ("view",)

    def __init__(self) -> None:
        self.view: PodView | Literal[False] | None = None


def _parse_pod_view(pod: Mapping[str, Any]) -> PodView | None:
    """pod_view without the known-nodes check (``node_lost`` here: only a lost-node reason on a failed pod)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    role = labels.get(LABEL_ROLE) or ("worker" if LABEL_INDEX in labels else None)
    attempt = to_int(labels.get(LABEL_ATTEMPT))
    if role not in ("worker", "spare") or attempt is None:
        return None
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    phase = status.get("phase") or "Pending"
    container_code, start_error, finished = None, None, None
    for cs in (status.get("containerStatuses") or [])[:1]:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None and term.get("exitCode") is not None:
            container_code = int(term["exitCode"])
            finished = parse_time(term.get("finishedAt"))
        if term is not None and term.get("reason") in START_ERRORS:
            start_error = str(term.get("message") or term.get("reason"))
    node_lost = phase == "Failed" and status.get("reason") in LOST_REASONS
    report = _json(annotations.get(ANNOTATION_EXIT))
    notice = _json(annotations.get(ANNOTATION_NOTICE))
    supervisor = _json(annotations.get(ANNOTATION_SUPERVISOR))
    return PodView(memory_off=memory_off(_json(annotations.get(ANNOTATION_PROGRESS))), name=str(meta.get("name")), role=role, index=to_int(labels.get(LABEL_INDEX)), attempt=attempt,
                   phase=phase, deleting=bool(meta.get("deletionTimestamp")), node=node, node_lost=node_lost,
                   ip=status.get("podIP"), exit_attempt=to_int(report.get("attempt")), exit_code=to_int(report.get("code")),
                   exit_agreed=report.get("agreed") if isinstance(report.get("agreed"), bool) else None,
                   exit_time=parse_time(report.get("time")), container_code=container_code,
                   container_finished=finished,
                   exit_peer_lost=peers_lost(report.get("peerLost")),
                   exit_peer_gone=peers_lost(report.get("peerGone")),
                   notice_attempt=to_int(notice.get("attempt")) if notice else None,
                   contract=to_int(supervisor.get("contract")), created=parse_time(meta.get("creationTimestamp")),
                   start_error=start_error)


def memory_off(report: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(attempt, why)`` when a progress report says the memory tier switched itself off (``memoryOff``), else
    None (pure)."""
    why, attempt = report.get("memoryOff"), to_int(report.get("attempt"))
    return (attempt, why[:1000]) if isinstance(why, str) and why and attempt is not None else None


def workers(job: TrainingJob, raw_pods: Iterable[Mapping[str, Any]], assignment: Any = None,
            known_nodes: Container[str] | None = None) -> list[WorkerPod]:
    """The job's workers as ``policy.restart``/``policy.notice`` see them: by their labels (Recreate), or, in
    place, the pods the current assignment lists, each at the assignment's attempt and index."""
    if assignment is None or job.spec.mode != "InPlace":
        return [p for p in (worker_pod(r, known_nodes) for r in raw_pods) if p is not None]
    listed = assignment.processes
    views = [v for v in (pod_view(r, known_nodes) for r in raw_pods) if v is not None and v.name in listed]
    code = job.spec.restart_policy.restart_exit_code
    return [worker_view(v, assignment.attempt, listed[v.name], code) for v in views]


def node_fields() -> tuple[NodeField, ...]:
    """The Node fields the operator keeps: each one a signal kind reads (``signalkinds.KINDS``) or placement
    does (``placement.NODE_FIELDS``); one entry per field, every key any reader names."""
    merged: dict[tuple[str, str], NodeField] = {}
    for f in (*(k.field for k in KINDS.values()), *PLACEMENT_FIELDS):
        old = merged.get((f.section, f.key))
        if old is not None and (not old.keys or not f.keys):
            f = NodeField(f.section, f.key)  # one reader takes the whole value: keep all of it
        elif old is not None:
            f = NodeField(f.section, f.key, tuple(dict.fromkeys((*old.keys, *f.keys))))
        merged[(f.section, f.key)] = f
    return tuple(merged.values())


NODE_FIELDS = node_fields()


def compact_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a Node that signals and placement read (``NODE_FIELDS``; kept in memory for every node)."""
    out: dict[str, Any] = {"metadata": {"name": (node.get("metadata") or {}).get("name")}, "spec": {}, "status": {}}
    for f in NODE_FIELDS:
        value = (node.get(f.section) or {}).get(f.key)
        if not value:
            continue
        if isinstance(value, list):
            value = [{k: v.get(k) for k in f.keys} if f.keys else dict(v) for v in value if isinstance(v, Mapping)]
        elif isinstance(value, Mapping):
            value = dict(value)
        out[f.section][f.key] = value
    return out


def zones(pods: Iterable[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """node -> its ``topology.kubernetes.io/zone`` label, for the nodes ``pods`` run on (compact nodes)."""
    out: dict[str, str] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        zone = ((nodes.get(node) or {}).get("metadata") or {}).get("labels", {}).get(ZONE_LABEL) if node else None
        if node and zone:
            out[node] = str(zone)
    return out


def notice_annotation(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NOTICE)


def progress(pods: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The newest progress report of the job's pods (contract: written by process 0): the highest (attempt, step,
    committedStep) of the ``reprieve.dev/progress`` annotations and of the ``progress`` a container left in its
    termination message (a job that ended while the API server was down); malformed ones skipped."""
    best: dict[str, Any] | None = None
    best_key = (-1, -1, -1)
    for pod in pods:
        for raw, where in _progress_reports(pod):
            try:
                value = json.loads(raw) if isinstance(raw, str) else raw
                key = (int(value.get("attempt", 0)), int(value.get("step", -1)), int(value.get("committedStep", -1)))
            except (ValueError, TypeError, AttributeError):
                log.warning("pod %s: malformed %s %r ignored", (pod.get("metadata") or {}).get("name"), where,
                            str(raw)[:200])
                continue
            if best is None or key > best_key:
                best, best_key = value, key
    return best


def _progress_reports(pod: Mapping[str, Any]) -> Iterable[tuple[Any, str]]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PROGRESS)
    if raw:
        yield raw, f"{ANNOTATION_PROGRESS} annotation"
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        left = _json(term.get("message")).get("progress") if term.get("message") else None
        if left is not None:
            yield left, "progress in the termination message"


def last_steps(pods: Iterable[Mapping[str, Any]],
               said: Iterable[tuple[int, int, float]] = ()) -> tuple[tuple[int, int, float], ...]:
    """Per attempt, the highest last finished step a process of it said, and when: (attempt, step, unix seconds),
    sorted. From the supervisors' exit reports (``reprieve.dev/exit``) and the containers' termination messages
    (Recreate), each with its ``attempt``, ``lastStep`` and ``lastStepAt`` (``docs/contract.md``): what a process
    that outlived a lost peer knew of the gang's last step. Malformed or partial ones are skipped. ``said``: those
    of pods already deleted (``Cache.said_of``: a Recreate restart deletes the survivor's pod, often before a
    reconcile reads its termination message, and the next attempt's pod takes its name)."""
    best: dict[int, tuple[int, float]] = {}
    for attempt, step, at in said:
        if attempt not in best or (step, at) > best[attempt]:
            best[attempt] = (step, at)
    for pod in pods:
        for value in _last_step_reports(pod):
            if not (_count(value.get("attempt")) and _count(value.get("lastStep")) and
                    _count(value.get("lastStepAt"), float)):
                continue
            attempt, step, at = value["attempt"], value["lastStep"], float(value["lastStepAt"])
            if attempt not in best or (step, at) > best[attempt]:
                best[attempt] = (step, at)
    return tuple((a, step, at) for a, (step, at) in sorted(best.items()))


def _last_step_reports(pod: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    # parsed only where the text names a last step: every reconcile reads every pod, most have none
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_EXIT)
    if isinstance(raw, str) and "lastStep" in raw:
        yield _json(raw)
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
        if isinstance(message, str) and "lastStep" in message:
            yield _json(message)


def _count(value: Any, kind: type = int) -> bool:
    """A JSON number of ``kind`` (int: not a bool, not a float; float: either) and not negative."""
    ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
    return ok and not isinstance(value, bool) and value >= 0
