"""Node signals that announce a node's loss, and the pure ``node_notice(node, now, signals)`` decision.

A signal is a taint key, a label (optionally with a value, or carrying the deadline as epoch seconds), a node
condition, or the cordon bit (``spec.unschedulable``). Each has a notice window: the expected time from the
signal to the node going away. The operator-wide table comes from the chart values
(``REPRIEVE_SIGNALS_JSON``); each TrainingJob may narrow it and override windows (``spec.preemption``).

Two tables here are the single source for the rest. ``BUILTIN_SIGNALS``: the built-in signals, their names (the
CRD's and the chart schema's enums, ``models.BUILTIN_SIGNAL_NAMES``) and default windows (the chart passes only
overrides); ``tests/operator/test_signal_sources.py`` checks the docs against it. ``KIND_FIELDS``: the Node
field each kind of signal reads, and nothing else; the operator keeps exactly those fields of every Node
(``views.compact_node``), and a kind reads a list entry's keys through ``_entry``, which refuses an undeclared
one, so no rule can read a field the cache dropped (it would never match, in silence).

Adding a built-in signal: its ``Signal`` in ``BUILTIN_SIGNALS`` (with where its window comes from), its row with
the source in the cloud page's "Defaults and their sources" (``docs/clouds/*.md``), then ``python -m
reprieve_operator.crdgen`` (the names in ``crds/`` and the chart's ``templates/crd.yaml``): four files, checked by
``tests/operator/test_signal_sources.py``. A new kind also needs its ``KIND_FIELDS`` entry, its rule in
``_match``, a row in docs/operator.md's kinds table and one in ``tests/operator/test_signals.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from .times import parse_time, rfc3339

if TYPE_CHECKING:  # models derives its enum of signal names from the table below
    from ..models import PreemptionSpec

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


KIND_FIELDS: dict[str, NodeField] = {
    TAINT: NodeField("spec", "taints"),  # key, value; timeAdded (NoExecute taints only)
    LABEL: NodeField("metadata", "labels"),
    LABEL_EPOCH: NodeField("metadata", "labels"),
    CONDITION: NodeField("status", "conditions", ("type", "status", "lastTransitionTime")),
    UNSCHEDULABLE: NodeField("spec", "unschedulable"),
}
KINDS = tuple(KIND_FIELDS)


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
            raise ValueError(f"signal {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind != UNSCHEDULABLE and not self.key:
            raise ValueError(f"signal {self.name!r}: key must be set for kind {self.kind}")
        if self.notice_seconds < 0:
            raise ValueError(f"signal {self.name!r}: noticeSeconds must be >= 0, got {self.notice_seconds}")


@dataclass(frozen=True)
class Notice:
    """What the workers are told: stable ``id`` per node event, reason, node and deadline."""

    id: str
    reason: str
    node: str
    deadline: datetime
    observed_at: datetime
    # True when the node gives no time for the signal (a taint without timeAdded, a label, a cordon): the
    # deadline then counts from the operator's first sight, which is late by any operator outage.
    estimated: bool = False

    def annotation(self, attempt: int | None = None) -> str:
        """The ``reprieve.dev/notice`` annotation value (contract: JSON, RFC 3339 UTC times; ``attempt``: the
        attempt it is delivered to, which the runtime checks against its own)."""
        value: dict[str, object] = {"id": self.id, "reason": self.reason, "node": self.node,
                                    "deadline": rfc3339(self.deadline), "observedAt": rfc3339(self.observed_at)}
        if attempt is not None:
            value["attempt"] = attempt
        return json.dumps(value, separators=(",", ":"))


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


def signal_table(config: Mapping[str, Any] | None) -> tuple[Signal, ...]:
    """The operator-wide table from the chart's ``signals`` value.

    ``{"builtin": {"gke-spot": {"enabled": true, "noticeSeconds": 30}, ...},
    "custom": [{"name", "type", "key", "value", "noticeSeconds"}]}``; missing entries keep the defaults.
    """
    config = config or {}
    builtin = config.get("builtin") or {}
    unknown = sorted(set(builtin) - set(BUILTIN_SIGNAL_NAMES))
    if unknown:
        raise ValueError(f"signals.builtin: unknown signal(s) {unknown}; expected some of {list(BUILTIN_SIGNAL_NAMES)}")
    table = []
    for sig in BUILTIN_SIGNALS:
        opts = builtin.get(sig.name) or {}
        if not opts.get("enabled", True):
            continue
        table.append(replace(sig, notice_seconds=int(opts.get("noticeSeconds", sig.notice_seconds))))
    for i, c in enumerate(config.get("custom") or []):
        kind = c.get("type")
        if kind not in (TAINT, LABEL, CONDITION):
            raise ValueError(f"signals.custom[{i}].type must be Taint, Label or Condition, got {kind!r}")
        value = c.get("value", "True" if kind == CONDITION else None)
        table.append(Signal(str(c.get("name") or ""), kind, str(c.get("key") or ""), value,
                            int(c.get("noticeSeconds", 30))))
    return tuple(table)


def signals_for_job(table: Iterable[Signal], preemption: PreemptionSpec) -> tuple[Signal, ...]:
    """Narrow the operator table to the job's choice and apply its notice-window overrides and custom signals."""
    if not preemption.enabled:
        return ()
    wanted = set(preemption.signals) if preemption.signals is not None else None
    out = []
    for sig in table:
        if wanted is not None and sig.name in BUILTIN_SIGNAL_NAMES and sig.name not in wanted:
            continue
        seconds = preemption.notice_seconds.get(sig.name, sig.notice_seconds)
        out.append(replace(sig, notice_seconds=seconds))
    for c in preemption.custom:
        value = c.value if c.value is not None else ("True" if c.type.value == CONDITION else None)
        seconds = c.notice_seconds if c.notice_seconds is not None else preemption.default_notice_seconds
        out.append(Signal(c.name, c.type.value, c.key, value, seconds))
    return tuple(out)


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)  # type: ignore[assignment]
    return obj


def _read(node: Mapping[str, Any], kind: str) -> Any:
    """The Node field a signal of ``kind`` reads: through ``KIND_FIELDS`` only."""
    field = KIND_FIELDS[kind]
    return _get(node, field.section, field.key)


class UndeclaredNodeField(LookupError):
    """A signal kind read a key of a list entry that ``KIND_FIELDS`` does not declare: the operator's compact
    Node (``views.compact_node``) would not have it. A programming error, raised on the first read."""


def _entry(item: Mapping[str, Any], kind: str, key: str) -> Any:
    """``key`` of one entry of the list a ``kind`` reads (a taint, a condition): only a declared one, so a rule
    that reads more than the operator keeps fails at once instead of never matching on a compact Node."""
    kept = KIND_FIELDS[kind].keys
    if kept and key not in kept:
        field = KIND_FIELDS[kind]
        raise UndeclaredNodeField(f"signal kind {kind} reads {field.section}.{field.key}[].{key}, which "
                                  f"KIND_FIELDS does not keep (keeps {list(kept)}): add it there")
    return item.get(key)


def _match(sig: Signal, node: Mapping[str, Any], now: datetime,
           first_seen: Mapping[str, datetime]) -> tuple[datetime, datetime, bool] | None:
    """(observed_at, deadline, estimated) if ``sig`` is present on ``node``; ``estimated``: no time on the node."""
    seen = first_seen.get(sig.name, now)
    window = timedelta(seconds=sig.notice_seconds)
    if sig.kind == TAINT:
        for t in _read(node, TAINT) or []:
            if _entry(t, TAINT, "key") == sig.key and (sig.value is None or _entry(t, TAINT, "value") == sig.value):
                # Only NoExecute taints carry timeAdded; otherwise we use our first observation.
                stamped = parse_time(_entry(t, TAINT, "timeAdded"))
                observed = stamped or seen
                return observed, observed + window, stamped is None
        return None
    if sig.kind == LABEL:
        labels = _read(node, LABEL) or {}
        if sig.key in labels and (sig.value is None or labels[sig.key] == sig.value):
            return seen, seen + window, True
        return None
    if sig.kind == LABEL_EPOCH:
        raw = (_read(node, LABEL_EPOCH) or {}).get(sig.key)
        if raw is None:
            return None
        try:
            deadline = datetime.fromtimestamp(int(raw), tz=UTC)
        except (ValueError, OverflowError, OSError):
            log.warning("node %s: label %s=%r is not epoch seconds; signal %s ignored",
                        _get(node, "metadata", "name"), sig.key, raw, sig.name)
            return None
        return seen, deadline - window if sig.notice_seconds else deadline, False
    if sig.kind == CONDITION:
        for c in _read(node, CONDITION) or []:
            if _entry(c, CONDITION, "type") == sig.key and _entry(c, CONDITION, "status") == (sig.value or "True"):
                stamped = parse_time(_entry(c, CONDITION, "lastTransitionTime"))
                observed = stamped or seen
                return observed, observed + window, stamped is None
        return None
    if sig.kind == UNSCHEDULABLE:
        if _read(node, UNSCHEDULABLE):
            return seen, seen + window, True
        return None
    return None


def node_notice(node: Mapping[str, Any], now: datetime, signals: Iterable[Signal],
                first_seen: Mapping[str, datetime] | None = None) -> Notice | None:
    """The notice a node gives, or None.

    Of several signals present, the one with the earliest deadline wins. ``first_seen`` maps signal names
    to when the operator first saw them (for signals that carry no timestamp); missing entries mean ``now``.
    Malformed values are logged and ignored; this never raises on node content.
    """
    name = str(_get(node, "metadata", "name") or "")
    best: Notice | None = None
    for sig in signals:
        try:
            hit = _match(sig, node, now, first_seen or {})
        except (AttributeError, TypeError) as err:  # malformed node content: never crash the operator
            log.warning("node %s: cannot read signal %s: %s", name, sig.name, err)
            continue
        if hit is None:
            continue
        observed, deadline, estimated = hit
        deadline = deadline.replace(microsecond=0)  # the annotation carries whole seconds; compare like it
        if best is None or deadline < best.deadline:
            key = int(observed.timestamp()) if sig.kind != LABEL_EPOCH else int(deadline.timestamp())
            best = Notice(id=f"{sig.name}/{name}/{key}", reason=sig.name, node=name,
                          deadline=deadline, observed_at=observed, estimated=estimated)
    return best


_ANY_TIME = datetime(2000, 1, 1, tzinfo=UTC)


def present_signals(node: Mapping[str, Any], signals: Iterable[Signal]) -> set[str]:
    """Names of the signals present on ``node`` (to remember when each was first seen)."""
    out = set()
    for sig in signals:
        try:
            if _match(sig, node, _ANY_TIME, {}) is not None:  # presence does not depend on the time
                out.add(sig.name)
        except (AttributeError, TypeError):
            continue
    return out
