"""What a checkpoint root holds, in words and in JSON: the pure half of the ``reprieve`` command.

:mod:`.reader` reads a root (listing, metadata, every chunk); this module turns what it read into rows and
descriptions (plain dicts, what ``--json`` prints) and into text, and parses ``URI[@STEP]``. Nothing here touches
storage, so ``tests/runtime/test_catalog.py`` tables it.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from . import fencing, layout
from .layout import CheckpointName
from .metadata import CheckpointMeta

STATES = {
    "complete": "complete",
    "damaged": "damaged (a restore quarantines it and falls back)",
    "fenced": "fenced out (a stale attempt's: never restored)",
    "tmp": "being written (or left by a crash)",
    "deleting": "being deleted",
    "corrupt": "quarantined",
}

# What each recorded ``kind`` (``reprieve.json``'s ``reprieve`` record; the metric's label) is, in the words ``ls`` and
# ``inspect`` print. "final" is the agreement's word for the save a notice ends on, not the run's last step.
KINDS = {
    "periodic": "periodic",
    "interval": "interval",
    "forced": "forced",
    "final": "preemption",
    "early": "preemption (early)",
    "last": "last step",
}


def kind_label(kind: Any) -> str | None:
    """What a checkpoint of recorded ``kind`` is; an unknown kind as it was recorded, None when none was."""
    return None if kind is None else KINDS.get(str(kind), str(kind))


@dataclasses.dataclass(frozen=True)
class Target:
    """``URI[@STEP]``: a checkpoint root and, optionally, one step (and attempt) in it."""

    uri: str
    step: int | None = None
    attempt: int | None = None


def parse_target(text: str) -> Target:
    """``gs://b/run``, ``./ckpt@120``, or a checkpoint's own directory (``./ckpt/step_0000000120_a3``).

    Raises:
        ValueError: empty, or a step that is not a non-negative integer.
    """
    if not text or not text.strip():
        raise ValueError("a checkpoint URI is needed: a path, file://, gs:// or s3:// (optionally @STEP)")
    text = text.strip()
    step: int | None = None
    head, at, tail = text.rpartition("@")
    if at and "/" not in tail:
        if not re.fullmatch(r"\d+", tail):
            raise ValueError(f"{text!r}: the step after '@' must be a non-negative integer, got {tail!r}")
        text, step = head, int(tail)
    base = text.rstrip("/")
    name = layout.parse_name(posixpath.basename(base))
    if name is not None and name.state == "committed":
        if step is not None and step != name.step:
            raise ValueError(f"{text!r} is the checkpoint of step {name.step}, not of step {step}")
        return Target(posixpath.dirname(base) or ".", name.step, name.attempt)
    return Target(text, step)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _when(seconds: float | None) -> str:
    if not seconds:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + "Z"


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (what a record holds is not trusted)."""
    return value if isinstance(value, dict) else {}


def _record(meta: CheckpointMeta | None) -> dict[str, Any]:
    value = meta.extra.get("reprieve") if meta is not None else None
    return value if isinstance(value, dict) else {}


def rows(entries: Sequence[CheckpointName], fences: Mapping[int, frozenset[str]],
         metas: Mapping[str, CheckpointMeta | str], quarantine: Mapping[str, str],
         damage: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per checkpoint-like entry, oldest step first.

    Args:
        entries: what the root lists (committed, unfinished, being deleted, quarantined).
        fences: the attempts' fences (``fencing``).
        metas: ``reprieve.json`` of committed entries by name, or why it could not be read.
        quarantine: why each quarantined entry was quarantined, by its name (when known).
        damage: what is wrong with a committed entry's chunk files, by its name (``reader.chunk_size_problems``).
    """
    damage = damage or {}
    visible = set(fencing.visible([e for e in entries if e.state == "committed"], fences))
    out = []
    for e in sorted(entries, key=lambda e: (e.step, e.attempt, e.state, e.copy)):
        state = ("fenced" if e not in visible else "damaged" if str(e) in damage else "complete") \
            if e.state == "committed" else e.state
        meta = metas.get(e.committed) if e.state == "committed" else None
        rec = _record(meta if isinstance(meta, CheckpointMeta) else None)
        raw_run = rec.get("run")
        run: dict[str, Any] = raw_run if isinstance(raw_run, dict) else {}
        out.append({
            "name": str(e), "step": e.step, "attempt": e.attempt, "state": state,
            "kind": rec.get("kind"), "bytes": meta.array_bytes if isinstance(meta, CheckpointMeta) else None,
            "created": meta.created_unix if isinstance(meta, CheckpointMeta) else None,
            "processes": meta.num_processes if isinstance(meta, CheckpointMeta) else None,
            "run_id": run.get("id"), "problem": meta if isinstance(meta, str) else None,
            "reason": quarantine.get(str(e)), "damage": damage.get(str(e)) if e.state == "committed" else None,
        })
    return out


def orbax_rows(steps: Mapping[int, Mapping[str, Any] | str], fences: Mapping[int, frozenset[str]]) -> list[dict[str, Any]]:
    """The rows of a ``reprieve.orbax.OrbaxCheckpointer`` root (``reader.orbax_steps``): one per Orbax step directory,
    named by its step; size unknown (Orbax's format)."""
    out = []
    for step, item in sorted(steps.items()):
        record = _obj(item)
        attempt = record.get("attempt")
        rec = _obj(_obj(record.get("extra")).get("reprieve"))
        run = _obj(rec.get("run"))
        committed_ns = _obj(record.get("orbax")).get("commit_timestamp_nsecs")
        positions = record.get("process_extra")
        out.append({
            "name": str(step), "step": step, "attempt": attempt if isinstance(attempt, int) else None,
            "state": "complete" if not isinstance(attempt, int) or fencing.is_visible(str(step), attempt, fences)
            else "fenced",
            "kind": rec.get("kind"), "bytes": None,
            "created": committed_ns / 1e9 if isinstance(committed_ns, (int, float)) else None,
            "processes": len(positions) if isinstance(positions, list) else None, "run_id": run.get("id"),
            "problem": item if isinstance(item, str) else None, "reason": None, "damage": None,
        })
    return out


def latest(rows_: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The row a restore would take first (the newest complete one), or None."""
    complete = [r for r in rows_ if r["state"] == "complete" and r["problem"] is None]
    return complete[-1] if complete else None


def format_table(header: Sequence[str], table: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header], *[[("-" if c is None else str(c)) for c in row] for row in table]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def format_ls(uri: str, rows_: Sequence[Mapping[str, Any]], fences: Mapping[int, frozenset[str]], *,
              sizes_checked: bool = True, orbax: bool = False) -> str:
    """``reprieve ls``'s text. ``sizes_checked``: the chunk files' sizes were checked against ``reprieve.json``
    (filesystems); no chunk was read either way, so a checksum is only checked by ``reprieve verify``."""
    if not rows_:
        return f"{uri}: no checkpoints"
    table = [[r["step"], r["attempt"], kind_label(r["kind"]), STATES[r["state"]] if r["problem"] is None else
              f"unreadable: {r['problem']}", human_bytes(r["bytes"]), _when(r["created"]), r["run_id"]]
             for r in rows_]
    lines = [f"{uri}:" + (" reprieve.orbax.OrbaxCheckpointer's checkpoints (Orbax's format)" if orbax else ""),
             format_table(["STEP", "ATTEMPT", "KIND", "STATE", "SIZE", "WRITTEN", "RUN"], table)]
    newest = latest(rows_)
    if orbax:
        lines.append(f"a restore takes step {newest['step']} (its arrays are not read here: restore it with Orbax "
                     "to check them)" if newest else "nothing a restore can take")
    elif newest:
        checked = ("its chunk files have the sizes reprieve.json implies; " if sizes_checked else
                   "unverified: its chunks are not read here (an object store's sizes are not listed); ")
        lines.append(f"a restore takes step {newest['step']} ({newest['name']}) unless a chunk fails its checksum: "
                     f"{checked}`reprieve verify {uri}@{newest['step']}` reads every chunk")
    else:
        lines.append("nothing a restore can take")
    if fences:
        lines.append(f"attempts started here: {', '.join(map(str, sorted(fences)))}")
    for r in rows_:
        if r["state"] == "corrupt":
            lines.append(f"quarantined {r['name']}: {r['reason'] or 'reason not recorded'}")
        elif r["state"] == "damaged":
            lines.append(f"damaged {r['name']}: {r['damage']}")
    return "\n".join(lines)


def describe(uri: str, name: str, meta: CheckpointMeta) -> dict[str, Any]:
    """Everything ``reprieve inspect`` says about one checkpoint (JSON-ready)."""
    rec = _record(meta)
    return {
        "uri": uri, "name": name, "step": meta.step, "attempt": meta.attempt, "kind": rec.get("kind"),
        "created": meta.created_unix, "format_version": meta.format_version, "processes": meta.num_processes,
        "bytes": meta.array_bytes, "run": rec.get("run"), "notice": rec.get("notice"),
        "timings": {k: rec[k] for k in ("stepSeconds", "saveSeconds") if k in rec},
        "versions": meta.versions, "topology": meta.topology, "data_positions": meta.process_extra,
        "extra": {k: v for k, v in meta.extra.items() if k != "reprieve"},
        "leaves": [{"path": leaf.path, "kind": leaf.kind, "shape": leaf.shape, "dtype": leaf.dtype,
                    "stored_as": leaf.stored_as, "key_impl": leaf.key_impl, "sharding": leaf.sharding,
                    "bytes": leaf.nbytes, "chunk_shape": leaf.chunk_shape,
                    **({"value": leaf.value} if leaf.kind == "json" else {})} for leaf in meta.leaves],
    }


def describe_orbax(uri: str, step: int, item: Mapping[str, Any]) -> dict[str, Any]:
    """What ``reprieve inspect`` says about one ``reprieve.orbax`` step (its ``reprieve`` item; ``reader.orbax_steps``):
    the keys of :func:`describe`, with ``items`` (Orbax's items and their handlers) instead of ``leaves``."""
    extra = _obj(item.get("extra"))
    rec = _obj(extra.get("reprieve"))
    orbax = _obj(item.get("orbax"))
    handlers = _obj(orbax.get("item_handlers"))
    committed_ns = orbax.get("commit_timestamp_nsecs")
    positions = item.get("process_extra")
    return {
        "uri": uri, "name": str(step), "step": step, "attempt": item.get("attempt"), "kind": rec.get("kind"),
        "created": committed_ns / 1e9 if isinstance(committed_ns, (int, float)) else None, "format_version": "orbax",
        "processes": len(positions) if isinstance(positions, list) else None, "bytes": None, "run": rec.get("run"),
        "notice": rec.get("notice"), "timings": {k: rec[k] for k in ("stepSeconds", "saveSeconds") if k in rec},
        "versions": {}, "topology": None, "data_positions": positions,
        "extra": {k: v for k, v in extra.items() if k != "reprieve"},
        "items": {name: str(h).rsplit(".", 1)[-1] for name, h in handlers.items()}, "leaves": [],
    }


def _sharding(desc: Mapping[str, Any] | None) -> str:
    if not desc:
        return "-"
    mesh = desc.get("mesh")
    mesh_text = "x".join(f"{k}={v}" for k, v in mesh.items()) if isinstance(mesh, dict) else ""
    return " ".join(p for p in (str(desc.get("type", "")), mesh_text, str(desc.get("spec", ""))) if p)


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def format_inspect(d: Mapping[str, Any]) -> str:
    run = d.get("run") or {}
    lines = [
        f"{d['uri']}/{d['name']}",
        (f"  step {d['step']}, attempt {d['attempt']}, kind {kind_label(d['kind']) or '-'}, written "
         f"{_when(d['created'])}, {d['processes']} process(es), {human_bytes(d['bytes'])} of arrays"),
        f"  run: {run.get('id') or '(no REPRIEVE_RUN_ID)'}, state structure {run.get('tree', '-')}"
        f" ({run.get('leaves', len(d['leaves']))} leaves)" if run else "  run: not recorded (an older reprieve)",
    ]
    if d.get("notice"):
        lines.append(f"  the agreed save of notice {d['notice']}")
    if d.get("timings"):
        lines.append("  measured by its attempt: " + ", ".join(f"{k} {v}" for k, v in d["timings"].items()))
    if d.get("topology"):
        t = d["topology"]
        lines.append(f"  written on {t.get('device_count')} {t.get('platform')} device(s) ({t.get('device_kind')}) "
                     f"of {t.get('num_processes')} process(es)")
    if d["versions"]:
        lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(d["versions"].items())))
    if d.get("extra"):
        lines.append(f"  extra: {_short(d['extra'], 100)}")
    if d.get("data_positions") is not None:
        for p, pos in enumerate(d["data_positions"]):
            lines.append(f"  data position of process {p}: {_short(pos, 100)}")
    if d.get("items") is not None:  # a reprieve.orbax step: Orbax's format, its items instead of leaves
        lines.append("  Orbax's format (reprieve.orbax.OrbaxCheckpointer), items: " +
                     (", ".join(f"{k} ({v})" for k, v in sorted(d["items"].items())) or "not recorded"))
        return "\n".join(lines)
    table = [[leaf["path"], leaf["kind"], _leaf_shape(leaf), _leaf_dtype(leaf), _sharding(leaf["sharding"]),
              human_bytes(leaf["bytes"]) if leaf["kind"] != "json" else _short(leaf.get("value"), 30)]
             for leaf in d["leaves"]]
    lines.append(format_table(["LEAF", "KIND", "SHAPE", "DTYPE", "SHARDING", "SIZE/VALUE"], table))
    return "\n".join(lines)


def _leaf_shape(leaf: Mapping[str, Any]) -> str:
    """As the program sees it: a typed key array without its key-data dimension."""
    if leaf["kind"] == "json" or leaf["shape"] is None:
        return "-"
    shape = leaf["shape"][:-1] if leaf["key_impl"] else leaf["shape"]
    return "x".join(map(str, shape)) if shape else "()"


def _leaf_dtype(leaf: Mapping[str, Any]) -> str:
    if leaf["key_impl"]:
        return f"key<{leaf['key_impl']}>"
    if leaf["stored_as"]:
        return f"{leaf['dtype']} (stored as {leaf['stored_as']})"
    return str(leaf["dtype"] or "-")


def format_verify(report: Mapping[str, Any]) -> str:
    verdict = report.get("verdict") or ("OK" if report["ok"] else "CORRUPT")
    checked = "every checksum checked" if report.get("unreachable") is None else "checked up to there"
    lines = [f"{report['uri']}/{report['name']}: {verdict} ({report['chunks']} chunk(s), "
             + f"{human_bytes(report['bytes'])} read, {checked})"]
    lines += [f"  {p}" for p in report["problems"]]
    if report.get("unreachable") is not None:
        lines.append(f"  the storage stopped answering: {report['unreachable']}; nothing is said of what was not read "
                     "(not corrupt: run verify again once the storage answers)")
    return "\n".join(lines)
