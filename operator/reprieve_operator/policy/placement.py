"""Pure decision: which doomed nodes a new worker pod must be told to avoid (``avoid_nodes``).

A node is avoided when, for this job, it carries a notice that is *open* (its deadline within the operator's
notice horizon, see ``policy.notice``) and the scheduler would otherwise be free to place the pod there. Nodes
the scheduler already keeps the pod off are left out, so the list stays short and the pod spec small:

* the node is cordoned, or has a NoSchedule/NoExecute taint the pod does not tolerate (a spot taint, a
  cordon during an upgrade: the common cases need no affinity at all). The taints the node lifecycle controller
  sets for a node's condition (``not-ready``, ``unreachable``, a pressure) do not count: they are lifted as soon
  as the node recovers (a fresh node carries ``not-ready`` until its first Ready is seen), and a pod built while
  one was set would then be free to land on the doomed node;
* the node does not match the pod's ``nodeSelector`` or required node affinity (another pool).

Scoped to the job: a job that opted out of notices avoids nothing, and a job's own signal choice and custom
signals decide which nodes are doomed for it. The API server accepts exactly one value per ``matchFields``
requirement on ``metadata.name``, so the builder adds one ``NotIn`` requirement per node (``builders``); at
most ``MAX_AVOIDED`` nodes, earliest deadline first, keep the scheduler's per-node filter cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ..models import TrainingJob
from .signals import NodeField, Signal, node_notice, signals_for_job

MAX_AVOIDED = 100
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
# Taints that follow a node's condition and go when it recovers: they do not keep a pod off a doomed node for good.
TRANSIENT_TAINTS = frozenset({
    "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure", "node.kubernetes.io/pid-pressure", "node.kubernetes.io/network-unavailable",
    "node.cloudprovider.kubernetes.io/uninitialized"})
# What ``could_schedule`` reads of a Node (besides its name): the operator keeps these (``views.compact_node``).
NODE_FIELDS = (NodeField("spec", "unschedulable"), NodeField("spec", "taints"), NodeField("metadata", "labels"))


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether any toleration matches ``taint`` (the scheduler's rules: key/Exists/Equal/value/effect)."""
    for t in tolerations:
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_matches(expr: Mapping[str, Any], values_of: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or [])
    present = key in values_of
    value = values_of.get(str(key))
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            a, b = int(str(value)), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no node (the scheduler's rule)
    return all(_expression_matches(e, labels) for e in exprs) and \
        all(_expression_matches(f, {"metadata.name": name}) for f in fields)


def could_schedule(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the scheduler could place a pod with ``pod_spec`` on ``node`` (ignoring resources)."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels = meta.get("labels") or {}
    name = str(meta.get("name") or "")
    tolerations = pod_spec.get("tolerations") or []
    if spec.get("unschedulable") and not tolerates(tolerations, UNSCHEDULABLE_TAINT):
        return False
    for taint in spec.get("taints") or []:
        if taint.get("key") in TRANSIENT_TAINTS:
            continue
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerates(tolerations, taint):
            return False
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    return not terms or any(_term_matches(t, labels, name) for t in terms if isinstance(t, Mapping))


def avoid_nodes(job: TrainingJob, nodes: Iterable[Mapping[str, Any]], table: Iterable[Signal], now: datetime,
                horizon_seconds: float, first_seen: Mapping[str, Mapping[str, datetime]] | None = None,
                limit: int = MAX_AVOIDED) -> tuple[str, ...]:
    """Names of the nodes a new pod of ``job`` must be kept off (sorted by deadline, then name; at most
    ``limit``). ``nodes`` are (compact) Node objects; ``first_seen`` maps node -> signal -> first sight."""
    sigs = signals_for_job(table, job.spec.preemption)
    if not sigs:
        return ()
    pod_spec = job.spec.template.get("spec") or {}
    doomed: list[tuple[datetime, str]] = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name") or "")
        notice = node_notice(node, now, sigs, (first_seen or {}).get(name))
        if notice is None or (notice.deadline - now).total_seconds() > horizon_seconds:
            continue
        if could_schedule(pod_spec, node):
            doomed.append((notice.deadline, name))
    return tuple(name for _, name in sorted(doomed)[:limit])
