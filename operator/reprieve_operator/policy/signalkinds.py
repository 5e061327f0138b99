"""Node signal kinds and the built-in signals: two tables, the single source for the rest (pure).

``KINDS``: one :class:`Kind` per kind of signal -- the Node field it reads (and nothing else: the operator keeps
exactly those fields of every Node, ``views.compact_node``) and how a signal of it matches a Node (its ``rule``,
which reads a list entry's keys through :meth:`Kind.entry`, refusing an undeclared one, so no rule can read a
field the cache dropped: it would never match, in silence). ``custom``: a site's own signal (the chart's
``signals.custom``, a job's ``preemption.custom``; the CRD's enum of ``type``) may be of this kind.

``BUILTIN_SIGNALS``: the built-in signals, their names (the CRD's and the chart schema's enums,
``models.BUILTIN_SIGNAL_NAMES``) and default windows (the chart passes only overrides);
``tests/operator/test_signal_sources.py`` checks the docs against it.

Adding a built-in signal: its ``Signal`` in ``BUILTIN_SIGNALS`` (with where its window comes from), its row with the
source in the cloud page's "Defaults and their sources" (``docs/clouds/*.md``), then ``python -m
reprieve_operator.crdgen`` (the names in ``crds/`` and the chart's ``templates/crd.yaml``, generated). Adding a
kind: its entry in ``KINDS`` (field and rule), a row in docs/operator.md's kinds table and one in
``tests/operator/test_signals.py`` (``KIND_ROWS``).

Nothing here imports the rest of the operator: ``models`` derives its enums from these tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .times import parse_time

log = logging.getLogger(__name__)

TAINT = "Taint"
LABEL = "Label"
LABEL_EPOCH = "LabelEpoch"  # the label's value is the deadline, in epoch seconds
CONDITION = "Condition"
UNSCHEDULABLE = "Unschedulable"


@dataclass(frozen=True)
class NodeField:
    """Where on a Node a kind of signal looks: ``<section>.<key>``; of a list of objects, only ``keys`` of each
    are read (and kept), of anything else all of it."""

    section: str
    key: str
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Signal:
    """One node signal: where to look (``kind``/``key``/``value``) and how long the node has left."""

    name: str
    kind: str
    key: str = ""
    value: str | None = None
    notice_seconds: int = 30

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"signal {self.name!r}: kind must be one of {tuple(KINDS)}, got {self.kind!r}")
        if KINDS[self.kind].keyed and not self.key:
            raise ValueError(f"signal {self.name!r}: key must be set for kind {self.kind}")
        if self.notice_seconds < 0:
            raise ValueError(f"signal {self.name!r}: noticeSeconds must be >= 0, got {self.notice_seconds}")


# (observed_at, deadline, estimated): when the signal was seen (or stamped), when the node goes, and whether the
# node gave no time for it (the deadline then counts from the operator's first sight)
Hit = tuple[datetime, datetime, bool]


class UndeclaredNodeField(LookupError):
    """A signal kind read a key of a list entry that its ``Kind.field`` does not declare: the operator's compact
    Node (``views.compact_node``) would not have it. A programming error, raised on the first read."""


@dataclass(frozen=True)
class Kind:
    """One kind of node signal: the Node field it reads and its rule, ``rule(kind, node, signal, seen)`` -> a
    :data:`Hit` if the signal is on the node (``seen``: when the operator first saw it, for a node that gives no
    time)."""

    name: str
    field: NodeField
    rule: Callable[[Kind, Mapping[str, Any], Signal, datetime], Hit | None]
    custom: bool = False  # a site's own signal may be of this kind
    keyed: bool = True  # a signal of this kind names a key (a taint key, a label, a condition type)

    def read(self, node: Mapping[str, Any]) -> Any:
        """The Node field this kind reads (None when absent or not where a Node has it)."""
        section = node.get(self.field.section)
        return section.get(self.field.key) if isinstance(section, Mapping) else None

    def entry(self, item: Mapping[str, Any], key: str) -> Any:
        """``key`` of one entry of the list this kind reads (a taint, a condition): only a declared one, so a rule
        that reads more than the operator keeps fails at once instead of never matching on a compact Node."""
        kept = self.field.keys
        if kept and key not in kept:
            f = self.field
            raise UndeclaredNodeField(f"signal kind {self.name} reads {f.section}.{f.key}[].{key}, which its "
                                      f"Kind.field does not keep (keeps {list(kept)}): add it there")
        return item.get(key)

    def match(self, sig: Signal, node: Mapping[str, Any], seen: datetime) -> Hit | None:
        return self.rule(self, node, sig, seen)


def _window(sig: Signal) -> timedelta:
    return timedelta(seconds=sig.notice_seconds)


def _stamped_entry(type_key: str, value_key: str, time_key: str, default: str | None) -> Callable[
        [Kind, Mapping[str, Any], Signal, datetime], Hit | None]:
    """The rule of a kind that reads a list of entries (taints, conditions): the first entry whose ``type_key`` is
    the signal's key and whose ``value_key`` its value (``default`` when the signal names none; None: any); its
    ``time_key`` (a NoExecute taint's timeAdded, a condition's lastTransitionTime) dates it when present."""
    def rule(kind: Kind, node: Mapping[str, Any], sig: Signal, seen: datetime) -> Hit | None:
        want = sig.value if default is None else (sig.value or default)
        for item in kind.read(node) or []:
            if kind.entry(item, type_key) == sig.key and (want is None or kind.entry(item, value_key) == want):
                stamped = parse_time(kind.entry(item, time_key))
                observed = stamped or seen
                return observed, observed + _window(sig), stamped is None
        return None
    return rule


def _label(kind: Kind, node: Mapping[str, Any], sig: Signal, seen: datetime) -> Hit | None:
    labels = kind.read(node) or {}
    if sig.key in labels and (sig.value is None or labels[sig.key] == sig.value):
        return seen, seen + _window(sig), True
    return None


def _label_epoch(kind: Kind, node: Mapping[str, Any], sig: Signal, seen: datetime) -> Hit | None:
    raw = (kind.read(node) or {}).get(sig.key)
    if raw is None:
        return None
    try:
        deadline = datetime.fromtimestamp(int(raw), tz=UTC)
    except (ValueError, OverflowError, OSError):
        log.warning("node %s: label %s=%r is not epoch seconds; signal %s ignored",
                    (node.get("metadata") or {}).get("name"), sig.key, raw, sig.name)
        return None
    return seen, deadline - _window(sig) if sig.notice_seconds else deadline, False


def _unschedulable(kind: Kind, node: Mapping[str, Any], sig: Signal, seen: datetime) -> Hit | None:
    return (seen, seen + _window(sig), True) if kind.read(node) else None


KINDS: dict[str, Kind] = {k.name: k for k in (
    # key, value; timeAdded (NoExecute taints only)
    Kind(TAINT, NodeField("spec", "taints"), _stamped_entry("key", "value", "timeAdded", None), custom=True),
    Kind(LABEL, NodeField("metadata", "labels"), _label, custom=True),
    Kind(LABEL_EPOCH, NodeField("metadata", "labels"), _label_epoch),
    Kind(CONDITION, NodeField("status", "conditions", ("type", "status", "lastTransitionTime")),
         _stamped_entry("type", "status", "lastTransitionTime", "True"), custom=True),
    Kind(UNSCHEDULABLE, NodeField("spec", "unschedulable"), _unschedulable, keyed=False),
)}
CUSTOM_KINDS = tuple(name for name, k in KINDS.items() if k.custom)  # the CRD's enum of a custom signal's type

AWS = "aws-node-termination-handler"
# Each default window is the time the worker pods really get from the signal to SIGKILL or node loss, whichever
# comes first, under the provider's defaults and the TrainingJob's default 30 s SIGTERM grace. Where the provider
# drains at the signal, the pods' own grace bounds it; where the provider documents no number, the shorter,
# conservative choice. docs/clouds/{gke,eks,aks}.md give the source of every number;
# tests/operator/test_signal_sources.py fails when this table, the chart, docs/operator.md and those disagree.
BUILTIN_SIGNALS: tuple[Signal, ...] = (
    # GKE graceful node shutdown: non-system pods get 15 s of the 30 s spot notice, then system pods 15 s.
    Signal("gke-spot", TAINT, "cloud.google.com/impending-node-termination", notice_seconds=15),
    Signal("gke-maintenance-ongoing", LABEL, "cloud.google.com/active-node-maintenance", "ONGOING", 30),
    Signal("gke-scheduled-maintenance", LABEL_EPOCH, "cloud.google.com/scheduled-maintenance-time", None, 0),
    Signal("gke-maintenance-window", TAINT, "cloud.google.com/maintenance-window-started", notice_seconds=30),
    # NTH taints just before it drains (at once, not 2 min later): the pods' own grace bounds the window.
    Signal("aws-spot-itn", TAINT, f"{AWS}/spot-itn", notice_seconds=30),
    Signal("aws-scheduled-maintenance", TAINT, f"{AWS}/scheduled-maintenance", notice_seconds=30),
    Signal("aws-asg-lifecycle", TAINT, f"{AWS}/asg-lifecycle-termination", notice_seconds=30),
    Signal("aws-rebalance", TAINT, f"{AWS}/rebalance-recommendation", notice_seconds=30),
    Signal("karpenter-disrupted", TAINT, "karpenter.sh/disrupted", notice_seconds=30),
    Signal("cluster-autoscaler", TAINT, "ToBeDeletedByClusterAutoscaler", notice_seconds=30),
    # Azure Preempt: at least 30 s from the event's publication, less an undocumented detection lag.
    Signal("aks-scheduled-event", CONDITION, "VMEventScheduled", "True", 15),
    # The key AKS uses since its 2023-09-03 release (before: remediator.aks.microsoft.com/unschedulable).
    Signal("aks-remediator", TAINT, "remediator.kubernetes.azure.com/unschedulable", notice_seconds=15),
    Signal("cordon", UNSCHEDULABLE, notice_seconds=30),
    Signal("out-of-service", TAINT, "node.kubernetes.io/out-of-service", notice_seconds=0),
)
BUILTIN_SIGNAL_NAMES = tuple(s.name for s in BUILTIN_SIGNALS)
