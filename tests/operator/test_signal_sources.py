"""Every built-in signal's default window is tied to a documented source, and what names or describes the built-in
signals agrees with their one table, ``BUILTIN_SIGNALS`` (``policy/signalkinds.py``).

Derived from the table, so not listed here: the CRD's enum (``models.BUILTIN_SIGNAL_NAMES``) and the names the
chart's ``signals.builtin`` accepts (``reprieve.builtinSignals`` in ``templates/crd.yaml``; both written by
``crdgen``, checked by ``test_crdgen.py``); the chart's ``values.yaml`` changes no default (``signals.builtin:
{}``). Checked against it here: the "Defaults and their sources" tables of ``docs/clouds/{gke,eks,aks}.md``, where
each row names the source of its number, and the kinds table of ``docs/operator.md`` ("Node signals": one row per
kind, naming the Node field it reads), which lists no signal, so a new signal touches four files: the table, its
cloud page and the two generated CRDs. Reading the files is kept apart from ``disagreements`` (pure: texts in,
problems out), which is table-tested on broken copies so the check is known to fail when it should.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from reprieve_operator.models import BUILTIN_SIGNAL_NAMES, TrainingJobSpec
from reprieve_operator.policy.signals import (
    BUILTIN_SIGNALS,
    KINDS,
    LABEL_EPOCH,
    UNSCHEDULABLE,
    Signal,
    signal_table,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CLOUDS = ("gke", "eks", "aks")
CLOUD_SECTION = "## Defaults and their sources"
OPERATOR_SECTION = "## Node signals"
URL = re.compile(r"\]\((https://[^)\s]+)\)")
SECONDS = re.compile(r"^(\d+) s$")


@dataclass(frozen=True)
class Row:
    """One row of a signal table in the docs: name, key cell, window in seconds, linked URLs, the line."""

    name: str
    key: str
    seconds: int | None
    urls: tuple[str, ...]
    line: str


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_rows(markdown: str, heading: str, window_column: int) -> list[Row]:
    """The rows of the first table under ``heading`` (a line equal to it, or it and more words) whose first
    cell is a backquoted signal name."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line == heading or line.startswith(heading + " ")), None)
    if start is None:
        return []
    rows, in_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = _cells(line)
        name = re.fullmatch(r"`([^`]+)`", cells[0])
        if name is None or len(cells) <= window_column:
            continue
        m = SECONDS.match(cells[window_column])
        rows.append(Row(name.group(1), cells[1], int(m.group(1)) if m else None, tuple(URL.findall(line)), line))
    return rows


def chart_windows(values: Mapping[str, Any]) -> dict[str, int]:
    builtin = (values.get("signals") or {}).get("builtin") or {}
    return {name: int(opts.get("noticeSeconds", -1)) for name, opts in builtin.items()}


def key_text(sig: Signal) -> str:
    """What a doc's key cell must contain for ``sig``."""
    return "spec.unschedulable" if sig.kind == UNSCHEDULABLE else sig.key


def kind_rows(markdown: str) -> dict[str, str]:
    """The kinds table under docs/operator.md's "Node signals": kind -> its Node field cell."""
    return {r.name: r.key for r in table_rows(markdown, OPERATOR_SECTION, 1)}


def disagreements(code: tuple[Signal, ...], chart: Mapping[str, int], chart_names: set[str],
                  operator_md: str, clouds: Mapping[str, str]) -> list[str]:
    """Every way the copies of the built-in signal table disagree, or a default lacks a source; [] if none."""
    out: list[str] = []
    names = {s.name for s in code}
    if chart:
        out.append(f"values.yaml signals.builtin: the defaults are the code's (empty), found {sorted(chart)}")
    if chart_names != names:
        out.append(f"templates/crd.yaml reprieve.builtinSignals: expected {sorted(names)}, found {sorted(chart_names)}")
    kinds = kind_rows(operator_md)
    if set(kinds) != set(KINDS):
        out.append(f"docs/operator.md Node signals: expected kinds {sorted(KINDS)}, found {sorted(kinds)}")
    for kind, cell in kinds.items():
        field = KINDS[kind].field if kind in KINDS else None
        if field is not None and f"`{field.section}.{field.key}`" not in cell:
            out.append(f"docs/operator.md Node signals: kind {kind} does not name `{field.section}.{field.key}`, "
                       f"found {cell!r}")
    documented: dict[str, list[tuple[str, Row]]] = {}
    for cloud, text in clouds.items():
        rows = table_rows(text, CLOUD_SECTION, 2)
        if not rows:
            out.append(f"docs/clouds/{cloud}.md: no '{CLOUD_SECTION}' table")
        for row in rows:
            if row.name not in names:
                out.append(f"docs/clouds/{cloud}.md: row {row.name!r} names no built-in signal")
            documented.setdefault(row.name, []).append((cloud, row))
    for sig in code:
        where = f"signal {sig.name}"
        if not documented.get(sig.name):
            out.append(f"{where}: no docs/clouds/*.md documents its default window and source")
        for cloud, row in documented.get(sig.name, []):
            if row.seconds != sig.notice_seconds:
                out.append(f"{where}: signalkinds.py says {sig.notice_seconds} s, docs/clouds/{cloud}.md {row.seconds}")
            if key_text(sig) not in row.key:
                out.append(f"{where}: docs/clouds/{cloud}.md key {row.key!r} does not name {key_text(sig)!r}")
            if not row.urls:
                out.append(f"{where}: docs/clouds/{cloud}.md gives no source URL")
    return out


def _read(path: str) -> str:
    return (ROOT / path).read_text()


def _chart_names() -> set[str]:
    """The names the chart's ``signals.builtin`` accepts: ``reprieve.builtinSignals`` in its CRD template."""
    m = re.search(r'\{\{- define "reprieve.builtinSignals" -\}\}\n(.*)\n', _read("charts/reprieve/templates/crd.yaml"))
    return set(m.group(1).split()) if m else set()


def _real() -> dict[str, Any]:
    return {"code": BUILTIN_SIGNALS,
            "chart": chart_windows(yaml.safe_load(_read("charts/reprieve/values.yaml"))),
            "chart_names": _chart_names(),
            "operator_md": _read("docs/operator.md"),
            "clouds": {c: _read(f"docs/clouds/{c}.md") for c in CLOUDS}}


def test_code_chart_kinds_and_cloud_docs_agree_and_every_default_has_a_source() -> None:
    assert disagreements(**_real()) == []


def test_the_chart_enables_every_builtin_signal_by_default() -> None:
    table = signal_table(yaml.safe_load(_read("charts/reprieve/values.yaml"))["signals"])
    assert [s.name for s in table] == list(BUILTIN_SIGNAL_NAMES)
    assert {s.name: s.notice_seconds for s in table} == {s.name: s.notice_seconds for s in BUILTIN_SIGNALS}


def test_no_default_promises_more_than_a_jobs_default_grace() -> None:
    """Every provider documented in docs/clouds drains or shuts the node down at the signal or soon after, and
    the pods then live at most their grace; so no window may exceed a TrainingJob's default grace. (The
    scheduled-maintenance label carries the deadline itself; its window is a margin before it.)"""
    grace = TrainingJobSpec.model_fields["termination_grace_period_seconds"].default
    too_long = {s.name: s.notice_seconds for s in BUILTIN_SIGNALS
                if s.kind != LABEL_EPOCH and s.notice_seconds > grace}
    assert too_long == {}, f"windows longer than the default {grace} s grace: {too_long}"


def _with(sig_name: str, **changes: Any) -> tuple[Signal, ...]:
    return tuple(replace(s, **changes) if s.name == sig_name else s for s in BUILTIN_SIGNALS)


def _unlink(text: str, name: str) -> str:
    """``text`` with the links of signal ``name``'s row reduced to their labels."""
    return "\n".join(re.sub(r"\[([^\]]+)\]\(https://[^)]+\)", r"\1", ln) if ln.startswith(f"| `{name}` |") else ln
                     for ln in text.splitlines())


def _drop_row(text: str, name: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(f"| `{name}` |"))


# (case, which text, old, new, the problem the check must report): one edit of the real file each.
TEXT_EDITS = [
    ("stale key", "aks",
     "| `aks-remediator` | taint `remediator.kubernetes.azure.com/unschedulable` |",
     "| `aks-remediator` | taint `remediator.aks.microsoft.com/unschedulable` |",
     "signal aks-remediator: docs/clouds/aks.md key"),
    ("cloud window", "eks",
     "| `aws-rebalance` | taint `aws-node-termination-handler/rebalance-recommendation` | 30 s |",
     "| `aws-rebalance` | taint `aws-node-termination-handler/rebalance-recommendation` | 120 s |",
     "signal aws-rebalance: signalkinds.py says 30 s, docs/clouds/eks.md 120"),
    ("unknown row", "aks", "| `cordon` |", "| `aks-spot` | taint `x` | 15 s | - | [x](https://example.com) |\n| `cordon` |",
     "docs/clouds/aks.md: row 'aks-spot' names no built-in signal"),
    ("kind's field", "operator_md", "| `Condition` | `status.conditions`:", "| `Condition` | `status.condition`:",
     "docs/operator.md Node signals: kind Condition does not name `status.conditions`"),
    ("kind missing", "operator_md", "| `LabelEpoch` |", "| LabelEpoch |",
     "docs/operator.md Node signals: expected kinds"),
]

# (case, how to break a copy of the real inputs, the problem the check must report)
OTHER_BREAKS: list[tuple[str, Any, str]] = [
    ("code window", lambda r: r.update(code=_with("gke-spot", notice_seconds=30)),
     "signal gke-spot: signalkinds.py says 30 s, docs/clouds/gke.md 15"),
    ("chart window", lambda r: r["chart"].update({"aws-spot-itn": 120}),
     "values.yaml signals.builtin: the defaults are the code's (empty), found ['aws-spot-itn']"),
    ("chart names", lambda r: r.update(chart_names=r["chart_names"] - {"out-of-service"}),
     "templates/crd.yaml reprieve.builtinSignals: expected"),
    ("no source URL", lambda r: r["clouds"].update(gke=_unlink(r["clouds"]["gke"], "gke-spot")),
     "signal gke-spot: docs/clouds/gke.md gives no source URL"),
    ("undocumented", lambda r: r["clouds"].update(gke=_drop_row(r["clouds"]["gke"], "gke-maintenance-window")),
     "signal gke-maintenance-window: no docs/clouds/*.md documents"),
]


def _copy(real: dict[str, Any]) -> dict[str, Any]:
    return dict(real, clouds=dict(real["clouds"]), chart=dict(real["chart"]))


@pytest.mark.parametrize("target,old,new,message", [e[1:] for e in TEXT_EDITS], ids=[e[0] for e in TEXT_EDITS])
def test_each_kind_of_drift_in_the_docs_is_reported(target: str, old: str, new: str, message: str) -> None:
    broken = _copy(_real())
    texts = broken["clouds"] if target in CLOUDS else broken
    assert old in texts[target], f"the test's edit no longer applies to {target}: {old!r}"
    texts[target] = texts[target].replace(old, new)
    problems = disagreements(**broken)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize("breaker,message", [b[1:] for b in OTHER_BREAKS], ids=[b[0] for b in OTHER_BREAKS])
def test_each_other_kind_of_drift_is_reported(breaker: Any, message: str) -> None:
    broken = _copy(_real())
    breaker(broken)
    problems = disagreements(**broken)
    assert any(message in p for p in problems), problems
