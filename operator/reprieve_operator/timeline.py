"""A picture of a job: ``python -m reprieve_operator.timeline JOB [-n NAMESPACE] [-o DIR]``.

Draws the job's timeline from what the cluster holds (its status, ``status.goodput``'s attempt history, its
Events): one row per attempt (start-up, training with its first and last reported step, lost steps, the restart
gap), the notices with their deadlines, the agreed and periodic commits, the restarts and their causes, the end.
Writes ``<job>.svg`` and ``<job>.html`` (the SVG inline, with the goodput figures, the attempts and the Events)
and prints their paths. No plotting library: the SVG is written directly, so the operator image needs nothing
more. ``timeline``, ``svg`` and ``html`` are pure; ``collect`` reads the cluster.
"""

from __future__ import annotations

import argparse
import html as htmlmod
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .models import GROUP, PLURAL, VERSION
from .policy.times import parse_time


@dataclass(frozen=True)
class Row:
    """One attempt: times in seconds since the job's start."""

    attempt: int
    created: float
    end: float | None  # None: still running
    first_step: int | None = None
    first_step_at: float | None = None  # when its first step finished
    last_step: int | None = None
    last_step_at: float | None = None
    step_seconds: float = 0.0
    lost_steps: int = 0


@dataclass(frozen=True)
class Mark:
    t: float
    kind: str  # notice, deadline, restart, failure, commit, succeeded, restore
    label: str


@dataclass
class Timeline:
    name: str
    namespace: str
    phase: str
    start: float  # epoch seconds of t = 0
    end: float  # seconds since start: the right edge
    rows: list[Row] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    goodput: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[float, str, str, str]] = field(default_factory=list)  # (t, type, reason, message)


DEADLINE_RE = re.compile(r"\((?P<reason>[^)]*)\) by (?P<deadline>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def _ts(value: Any) -> float | None:
    t = parse_time(value)
    return t.timestamp() if t is not None else None


def _event_time(ev: dict[str, Any]) -> float | None:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        t = _ts(ev.get(key))
        if t is not None:
            return t
    return _ts((ev.get("metadata") or {}).get("creationTimestamp"))


def timeline(job: dict[str, Any], events: list[dict[str, Any]], now: float) -> Timeline:
    """Pure: the job (as read from the API) and its Events -> what to draw."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    gp = status.get("goodput") or {}
    acc = gp.get("accounting") or {}
    attempts: list[dict[str, Any]] = [*(acc.get("history") or []), *(acc.get("open") or [])]
    times = [float(a["created"]) for a in attempts if a.get("created") is not None]
    evs = sorted(((t, e) for e in events if (t := _event_time(e)) is not None), key=lambda p: p[0])
    start = min([*times, *(t for t, _ in evs)], default=_ts(status.get("startTime")) or now)
    completion = _ts(status.get("completionTime"))
    right = (completion if completion is not None else now) - start
    rows = []
    for a in attempts:
        rep = a.get("report") or a  # open attempts carry a report; closed ones the same keys flat
        ended = a.get("ended")
        if ended is None and completion is not None and a is attempts[-1]:
            ended = completion
        rows.append(Row(
            attempt=int(a["attempt"]), created=float(a["created"]) - start,
            end=None if ended is None else float(ended) - start,
            first_step=rep.get("firstStep"), first_step_at=_rel(rep.get("firstStepTime"), start),
            last_step=rep.get("step"), last_step_at=_rel(rep.get("time"), start),
            step_seconds=float(rep.get("stepSeconds") or 0.0), lost_steps=int(a.get("lostSteps") or 0)))
    marks, table = [], []
    for t, e in evs:
        reason, msg, type_ = str(e.get("reason")), str(e.get("message") or ""), str(e.get("type") or "Normal")
        table.append((t - start, type_, reason, msg))
        if reason == "PreemptionNotice":
            m = DEADLINE_RE.search(msg)
            marks.append(Mark(t - start, "notice", f"notice ({m.group('reason') if m else 'signal'})"))
            if m:
                deadline = _ts(m.group("deadline"))
                if deadline is not None:
                    marks.append(Mark(deadline - start, "deadline", "deadline"))
        elif reason == "GangRestart":
            cause = "preemption" if "preempt" in msg.lower() or type_ == "Normal" else "restart"
            marks.append(Mark(t - start, "restart", cause))
        elif reason == "CheckpointCommitted":
            step = re.search(r"step (\d+)", msg)
            marks.append(Mark(t - start, "commit", f"commit {step.group(1) if step else ''}".strip()))
        elif reason == "Succeeded":
            marks.append(Mark(t - start, "succeeded", "succeeded"))
        elif reason == "Restored":  # the memory tier: where the attempt's restore read
            tier = re.search(r"from (the memory tier|memory and storage|storage)", msg)
            marks.append(Mark(t - start, "restore", f"restored from {RESTORE_WORDS.get(tier.group(1), '?')}"
                              if tier else "restored"))
        elif type_ == "Warning" and reason not in ("FailedCreate", "MemoryPairingProblem"):  # TooManyFailures...
            marks.append(Mark(t - start, "failure", reason))
    right = max([right, *(m.t for m in marks), *(r.end or 0.0 for r in rows)], default=right)
    return Timeline(str(meta.get("name")), str(meta.get("namespace")), str(status.get("phase") or "Pending"), start,
                    max(right, 1.0), rows, marks, {k: v for k, v in gp.items() if k != "accounting"}, table)


RESTORE_WORDS = {"the memory tier": "memory", "memory and storage": "memory+storage", "storage": "storage"}


def _rel(value: Any, start: float) -> float | None:
    return None if value is None else float(value) - start


COLORS = {"startup": "#b0b0b0", "train": "#3a9d5d", "lost": "#d9534f", "gap": "#f0ad4e",
          "notice": "#c9302c", "deadline": "#7a1c1a", "restart": "#31708f", "failure": "#a94442",
          "commit": "#5b3a9d", "succeeded": "#2b7a3b", "restore": "#1f77b4"}


def svg(tl: Timeline, width: int = 1000) -> str:
    """Pure: the timeline as an SVG document."""
    left, right_pad, top, row_h = 90, 30, 60, 34
    plot_w = width - left - right_pad
    height = top + row_h * max(1, len(tl.rows)) + 110

    def x(t: float) -> float:
        return left + plot_w * max(0.0, min(t, tl.end)) / tl.end

    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'),
           f'<title>TrainingJob {_e(tl.namespace)}/{_e(tl.name)}</title>',
           '<rect width="100%" height="100%" fill="white"/>']
    g = tl.goodput.get("goodput")
    out.append(f'<text x="{left}" y="20" font-size="14" font-weight="bold">{_e(tl.namespace)}/{_e(tl.name)}: '
               f'{_e(tl.phase)}{"" if g is None else f", goodput {g:.1%}"}</text>')
    bad = tl.goodput.get("badputSeconds") or {}
    if bad:
        out.append(f'<text x="{left}" y="38">badput: ' + _e(", ".join(f"{k} {v:.1f}s" for k, v in bad.items()))
                   + f', lost steps {tl.goodput.get("lostSteps", 0)}</text>')
    for i, r in enumerate(tl.rows):
        y = top + i * row_h
        end = r.end if r.end is not None else tl.end
        out.append(f'<text x="{left - 8}" y="{y + 17}" text-anchor="end">attempt {r.attempt}</text>')
        loop_start = (r.first_step_at - r.step_seconds) if r.first_step_at is not None else None
        if loop_start is None or r.last_step_at is None:
            out.append(_bar(x(r.created), x(end), y, "startup", f"attempt {r.attempt}: start-up, no step reported"))
            continue
        loop_start = max(r.created, loop_start)
        out.append(_bar(x(r.created), x(loop_start), y, "startup", f"start-up and restore {loop_start - r.created:.1f}s"))
        last = min(end, max(loop_start, r.last_step_at))
        steps = (r.last_step or 0) - (r.first_step or 0) + 1
        lost_from = last - (last - loop_start) * min(1.0, r.lost_steps / steps) if steps > 0 else last
        out.append(_bar(x(loop_start), x(lost_from), y, "train",
                        f"steps {r.first_step}-{r.last_step} ({last - loop_start:.1f}s)"))
        if r.lost_steps:
            out.append(_bar(x(lost_from), x(last), y, "lost", f"{r.lost_steps} step(s) lost (computed again)"))
        if r.end is not None and end > last:
            out.append(_bar(x(last), x(end), y, "gap", f"restart gap {end - last:.1f}s"))
        out.append(f'<text x="{x(loop_start) + 2:.1f}" y="{y + 32}" font-size="9">{r.first_step}</text>')
        out.append(f'<text x="{x(last):.1f}" y="{y + 32}" font-size="9" text-anchor="end">{r.last_step}</text>')
    bottom = top + row_h * max(1, len(tl.rows))
    label_y = {k: bottom + 14 + 13 * i for i, k in enumerate(("notice", "deadline", "commit", "restart",
                                                              "failure", "succeeded", "restore"))}
    for m in tl.marks:
        dash = {"deadline": ' stroke-dasharray="2,2"', "commit": ' stroke-dasharray="1,3"'}.get(m.kind, "")
        out.append(f'<line class="mark {m.kind}" x1="{x(m.t):.1f}" x2="{x(m.t):.1f}" y1="{top - 6}" y2="{bottom}" '
                   f'stroke="{COLORS[m.kind]}" stroke-width="1.5"{dash}><title>{_e(m.label)} at '
                   f'{m.t:.1f}s</title></line>')
        out.append(f'<text x="{x(m.t) + 2:.1f}" y="{label_y[m.kind]}" fill="{COLORS[m.kind]}" '
                   f'font-size="9">{_e(m.label)}</text>')
    axis_y = bottom + 92
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{axis_y}" y2="{axis_y}" stroke="black"/>')
    for k in range(6):
        t = tl.end * k / 5
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 14}" text-anchor="middle">{t:.0f}s</text>')
    out.append("</svg>")
    return "\n".join(out)


def _bar(x0: float, x1: float, y: float, kind: str, title: str) -> str:
    return (f'<rect class="{kind}" x="{x0:.1f}" y="{y + 4}" width="{max(0.5, x1 - x0):.1f}" height="18" '
            f'fill="{COLORS[kind]}"><title>{_e(title)}</title></rect>')


def _e(text: Any) -> str:
    return htmlmod.escape(str(text))


def html(tl: Timeline, picture: str) -> str:
    """Pure: the HTML page (the SVG inline, the figures, the attempts, the Events)."""
    gp = tl.goodput
    rows = "".join(f"<tr><td>{r.attempt}</td><td>{r.created:.1f}</td><td>{_opt(r.end)}</td><td>{_opt(r.first_step)}"
                   f"</td><td>{_opt(r.last_step)}</td><td>{r.lost_steps}</td></tr>" for r in tl.rows)
    evs = "".join(f"<tr><td>{t:.1f}</td><td>{_e(ty)}</td><td>{_e(reason)}</td><td>{_e(msg)}</td></tr>"
                  for t, ty, reason, msg in tl.events)
    figures = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in gp.items())
    start = datetime.fromtimestamp(tl.start).astimezone().isoformat(timespec="seconds")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>TrainingJob {_e(tl.namespace)}/{_e(tl.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}}</style></head>
<body><h1>TrainingJob {_e(tl.namespace)}/{_e(tl.name)}: {_e(tl.phase)}</h1>
<p>Times are seconds since {_e(start)}. Green: training (first and last reported step); grey: start-up and
restore; red: steps computed again by a later attempt; orange: restart gap. Lines: notices, their deadlines,
commits, restarts, restores (and where they read), failures, the end. Definitions: docs/goodput.md.</p>
{picture}
<h2>Goodput</h2><table>{figures}</table>
<h2>Attempts</h2><table><tr><th>attempt</th><th>created (s)</th><th>ended (s)</th><th>first step</th>
<th>last step</th><th>lost steps</th></tr>{rows}</table>
<h2>Events</h2><table><tr><th>t (s)</th><th>type</th><th>reason</th><th>message</th></tr>{evs}</table>
</body></html>
"""


def _opt(v: Any) -> str:
    return "" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))


def collect(api: Any, namespace: str, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The TrainingJob and its Events, as plain dicts."""
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    job = dict(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))  # type: ignore[call-overload]
    listed = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=TrainingJob,involvedObject.name={name}")
    events = [api.sanitize_for_serialization(e) for e in listed.items]
    return job, events


def write(tl: Timeline, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    picture = svg(tl)
    svg_path, html_path = out_dir / f"{tl.name}.svg", out_dir / f"{tl.name}.html"
    svg_path.write_text(picture)
    html_path.write_text(html(tl, picture))
    return svg_path, html_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reprieve_operator.timeline", description=__doc__.splitlines()[0])
    p.add_argument("job", help="TrainingJob name")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("-o", "--output", default=".", help="directory for <job>.svg and <job>.html")
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, ~/.kube/config, or in-cluster")
    args = p.parse_args(argv)
    import time

    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    try:
        config.load_kube_config(config_file=args.kubeconfig)
    except config.ConfigException:
        config.load_incluster_config()
    with client.ApiClient() as api:
        try:
            job, events = collect(api, args.namespace, args.job)
        except ApiException as err:
            print(f"timeline: TrainingJob {args.namespace}/{args.job}: HTTP {err.status} {err.reason}", file=sys.stderr)
            return 1
    svg_path, html_path = write(timeline(job, events, time.time()), Path(args.output))
    print(svg_path)
    print(html_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
