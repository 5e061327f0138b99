"""Where a noticed restart's gap goes, read from the pods' trainer logs (the runtime's and the supervisor's lines).

``python -m localcluster.gapphases DIR`` (``DIR``: a ``benchmarks/goodput.py`` run's log directory, the one its
last line names) prints one line per agreed exit, each phase in seconds:

- ``save``: the first process's "saving agreed step" -> "committed on all" (the agreed storage save and the memory
  copy beside it, and the commit's barrier);
- ``close``: "committed on all" -> the last process's "exiting with code" (the runtime closing its parts:
  progress report, notice sources, peer watch, checkpointer, the distributed shutdown);
- ``exit``: that line -> the last old trainer reaped by its supervisor (unwinding, atexit, the flush, the
  kernel's teardown of the process);
- ``takeover``: reaped -> the last warm process took over (below zero when the pod that goes away is reaped after
  the staying pod's warm process took over: nothing waits on it);
- ``restore``: that -> the last process's "restored step" (``jax.distributed``, the restore round, the reads,
  beside the compile-ahead);
- ``first_step``: that -> the last supervisor's "first step done" (the wait for the compile-ahead and the first
  step itself, ~0.5 s of which is the example's step);
- ``total``: "saving agreed step" -> "first step done".

The phases are parsed from lines, not measured here: they are only as exact as the log's milliseconds. Pure but
for :func:`read_dir`.
"""

from __future__ import annotations

import datetime
import re
import sys
from collections.abc import Iterable
from pathlib import Path

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
PHASES = ("save", "close", "exit", "takeover", "restore", "first_step", "total")
_WINDOW_S = 10.0  # how far after a commit the restart's lines are looked for


def stamped(lines: Iterable[str]) -> list[tuple[float, str]]:
    """``(unix seconds, line)`` for every line that starts with a log timestamp (UTC), sorted."""
    out = []
    for line in lines:
        m = _STAMP.match(line)
        if m:
            when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=datetime.UTC)
            out.append((when.timestamp(), line.rstrip("\n")))
    return sorted(out)


def phases(lines: list[tuple[float, str]]) -> list[dict[str, float | None]]:
    """One dict of :data:`PHASES` per agreed exit in ``lines`` (from :func:`stamped`); None where a line is
    missing (a phase that did not happen, or a log that ended)."""
    commits: list[float] = []
    for t, line in lines:
        if "committed on all" in line and (not commits or t - commits[-1] > _WINDOW_S / 2):
            commits.append(t)

    def last(after: float, pattern: str) -> float | None:
        hits = [t for t, line in lines if after <= t <= after + _WINDOW_S and re.search(pattern, line)]
        return max(hits) if hits else None

    out = []
    for commit in commits:
        saving = [t for t, line in lines if commit - 3.0 <= t <= commit and "saving agreed step" in line]
        start = min(saving) if saving else None
        exiting = last(commit, r"reprieve\.job: exiting with code")
        reaped = last(commit, r"trainer \(pid \d+\) exited with code")
        took = last(commit, r"the warm process \(pid \d+\) took over")
        restored = last(commit, r"restored step \d+ ")
        first = last(commit, r"first step done")

        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(b - a, 3)

        out.append({"save": span(start, commit), "close": span(commit, exiting), "exit": span(exiting, reaped),
                    "takeover": span(reaped, took), "restore": span(took, restored),
                    "first_step": span(restored, first), "total": span(start, first)})
    return out


def cri_lines(lines: Iterable[str]) -> list[str]:
    """The container's own lines of a log in the CRI format the kubelet keeps (``<time> <stream> <P|F> <text>``: a
    line split into partial records ``P`` and ended by ``F`` is joined again; pure)."""
    out: list[str] = []
    partial: dict[str, str] = {}
    for line in lines:
        parts = line.rstrip("\n").split(" ", 3)
        if len(parts) < 3 or parts[2] not in ("P", "F"):
            continue
        stream, text = parts[1], parts[3] if len(parts) == 4 else ""
        if parts[2] == "P":
            partial[stream] = partial.get(stream, "") + text
        else:
            out.append(partial.pop(stream, "") + text)
    return out


def read_dir(directory: Path) -> list[tuple[float, str]]:
    """The stamped lines of every trainer log of a goodput run or a soak: ``DIR/cluster/nodes`` (process nodes) and
    ``DIR/cluster/kept-pod-logs`` (real nodes: the kubelet's CRI-format container logs, kept when a pod goes; a
    goodput run keeps them under the job's namespace, the soak under the node alone)."""
    lines: list[str] = []
    for log in sorted(directory.glob("cluster/nodes/*/pods/*/*/logs/trainer.log")):
        lines.extend(log.read_text(errors="replace").splitlines())
    for log in sorted({*directory.glob("cluster/kept-pod-logs/*/*/*/trainer/*.log"),
                       *directory.glob("cluster/kept-pod-logs/*/*/trainer/*.log")}):
        lines.extend(cri_lines(log.read_text(errors="replace").splitlines()))
    return stamped(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m localcluster.gapphases DIR  (a benchmarks/goodput.py run's log directory)",
              file=sys.stderr)
        return 2
    rows = phases(read_dir(Path(argv[0])))
    if not rows:
        print(f"no agreed exit in the trainer logs under {argv[0]}/cluster (nodes, kept-pod-logs)", file=sys.stderr)
        return 1
    for row in rows:
        print(" ".join(f"{k}={'?' if v is None else f'{v:.2f}'}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
