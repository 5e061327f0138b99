"""Node signals that announce a node's loss, and the pure ``node_notice(node, now, signals)`` decision.

A signal is a taint key, a label (optionally with a value, or carrying the deadline as epoch seconds), a node
condition, or the cordon bit (``spec.unschedulable``): its kind, one entry of ``signalkinds.KINDS`` (the Node field
it reads and how it matches). Each has a notice window: the expected time from the signal to the node going away.
The operator-wide table comes from the chart values (``REPRIEVE_SIGNALS_JSON``) over the built-in signals
(``signalkinds.BUILTIN_SIGNALS``); each TrainingJob may narrow it and override windows (``spec.preemption``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from ..models import PreemptionSpec
from .signalkinds import (
    BUILTIN_SIGNAL_NAMES,
    BUILTIN_SIGNALS,
    CONDITION,
    CUSTOM_KINDS,
    KINDS,
    LABEL,
    LABEL_EPOCH,
    TAINT,
    UNSCHEDULABLE,
    NodeField,
    Signal,
    UndeclaredNodeField,
)
from .times import rfc3339

# Re-exported: the kinds' and the built-in signals' tables are signalkinds'; callers that need a notice come here.
__all__ = ["BUILTIN_SIGNALS", "BUILTIN_SIGNAL_NAMES", "CONDITION", "KINDS", "LABEL", "LABEL_EPOCH", "TAINT",
           "UNSCHEDULABLE", "NodeField", "Notice", "Signal", "UndeclaredNodeField", "node_notice",
           "present_signals", "signal_table", "signals_for_job"]

log = logging.getLogger(__name__)


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
        if kind not in CUSTOM_KINDS:
            raise ValueError(f"signals.custom[{i}].type must be one of {', '.join(CUSTOM_KINDS)}, got {kind!r}")
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
        value = c.value if c.value is not None else ("True" if c.type == CONDITION else None)
        seconds = c.notice_seconds if c.notice_seconds is not None else preemption.default_notice_seconds
        out.append(Signal(c.name, c.type, c.key, value, seconds))
    return tuple(out)


def _match(sig: Signal, node: Mapping[str, Any], now: datetime,
           first_seen: Mapping[str, datetime]) -> tuple[datetime, datetime, bool] | None:
    """(observed_at, deadline, estimated) if ``sig`` is present on ``node`` (its kind's rule, ``KINDS``)."""
    return KINDS[sig.kind].match(sig, node, first_seen.get(sig.name, now))


def node_notice(node: Mapping[str, Any], now: datetime, signals: Iterable[Signal],
                first_seen: Mapping[str, datetime] | None = None) -> Notice | None:
    """The notice a node gives, or None.

    Of several signals present, the one with the earliest deadline wins. ``first_seen`` maps signal names
    to when the operator first saw them (for signals that carry no timestamp); missing entries mean ``now``.
    Malformed values are logged and ignored; this never raises on node content.
    """
    meta = node.get("metadata")
    name = str((meta.get("name") if isinstance(meta, Mapping) else None) or "")
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
