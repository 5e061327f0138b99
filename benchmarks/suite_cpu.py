"""Where a command's CPU goes, by kind of process: ``python benchmarks/suite_cpu.py -- make test``.

The test suite on 2 cores is CPU-bound (its tests wait on clusters and processes, three pytest-xdist workers share
the cores), so what makes it slow is the CPU its processes burn, not its sleeps. This samples every process on the
machine once a second (``/proc/<pid>/stat``: user + system time), sorts each into a kind by its command line (the
control plane's binaries, the kubelets, containerd, JAX trainers, the operator, pytest's workers, pip, ...) and
prints the CPU-seconds per kind at the end, beside the machine's busy time from ``/proc/stat`` (what the sampler
missed: processes that lived less than a second, counted as ``unsampled``). JSON with ``--out``.

Each process is also charged to the test that started it: ``PYTEST_CURRENT_TEST`` in its environment (pytest
sets it in its workers, and a test's subprocesses inherit it), else its parent's. A cluster a fixture started
(``... (setup)``) is charged to the setup of the test that first needed it, with every pod its process kubelet
starts; real nodes' containers have neither and count as ``(no test)``. The slowest tests by CPU follow the kinds.

Measures the whole machine: run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
TOP_TESTS = 25
# (kind, pattern over the command line), first match wins
KINDS: list[tuple[str, re.Pattern[str]]] = [(k, re.compile(p)) for k, p in [
    ("kube-apiserver", r"localkube kube-apiserver|/kube-apiserver "),
    ("etcd", r"localkube etcd|/etcd "),
    ("kube-controller-manager", r"kube-controller-manager"),
    ("kube-scheduler", r"kube-scheduler"),
    ("kueue", r"kueue"),
    ("kubelet (real node)", r"/kubelet |/kubelet$"),
    ("containerd", r"containerd-shim|containerd"),
    ("runc", r"\brunc\b"),
    ("process kubelet", r"localcluster\.kubelet"),
    ("operator", r"reprieve_operator|kopf"),
    ("trainer (JAX)", (r"train_lm\.py|reprieve-supervisor|reprieve\.supervisor|ckpt_workers|/workers/|crash_worker|"
                       r"first_step|-m reprieve|examples/")),
    ("prometheus", r"prometheus"),
    ("registry / index", r"docker-registry|registry serve|pypi-server|pypiserver"),
    ("image tools", r"\bpodman\b|\bbuildah\b|\bskopeo\b|\bgzip\b|\bpigz\b|\btar\b"),
    ("pip / venv", r"-m pip|\bpip\b|-m venv|ensurepip"),
    ("helm / kubectl", r"\bhelm\b|\bkubectl\b"),
    ("lint (ruff, mypy)", r"\bruff\b|\bmypy\b"),
    ("pytest", r"pytest|execnet|sys\.stdin\.readline"),
    ("go", r"\bgo\b|/go/"),
]]


def kind_of(cmdline: str) -> str:
    """The kind of a process from its command line (NUL-separated as in /proc, or spaced)."""
    text = cmdline.replace("\0", " ").strip()
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return "other"


def test_of(environ: bytes) -> str | None:
    """The test a process works for, from its ``/proc/<pid>/environ`` (NUL-separated): ``PYTEST_CURRENT_TEST``
    less pytest's `` (call)`` suffix (`` (setup)`` and `` (teardown)`` stay: a fixture's processes); None without."""
    for item in environ.split(b"\0"):
        if item.startswith(b"PYTEST_CURRENT_TEST="):
            value = item.split(b"=", 1)[1].decode(errors="replace").strip()
            return value.removesuffix(" (call)") or None
    return None


def _busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / TICK


class Sampler:
    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.last: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, start time) -> (kind, cpu seconds)
        self.base: dict[tuple[int, int], float] = {}  # what processes alive at the start had already used
        self.tests: dict[tuple[int, int], str] = {}  # (pid, start time) -> the test it is charged to
        self._live: dict[int, str] = {}  # pid -> its test, for children whose environment has none
        self.busy: list[tuple[float, float]] = []  # (seconds since the start, machine busy CPU-s so far)
        self.stop = threading.Event()

    def sample(self) -> None:
        # by pid: a parent (almost always an older, lower pid) is seen before its new children
        for entry in sorted((e for e in os.scandir("/proc") if e.name.isdigit()), key=lambda e: int(e.name)):
            try:
                stat = Path(entry.path, "stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / TICK
                key = (int(entry.name), int(fields[19]))
                if key not in self.last:
                    cmd = Path(entry.path, "cmdline").read_bytes().decode(errors="replace")
                    self.last[key] = (kind_of(cmd) if cmd else "kernel/other", cpu)
                    try:
                        test = test_of(Path(entry.path, "environ").read_bytes())
                    except OSError:
                        test = None
                    test = test or self._live.get(int(fields[1]))  # fields[1]: the parent's pid
                    if test:
                        self.tests[key] = self._live[key[0]] = test
                else:
                    self.last[key] = (self.last[key][0], cpu)
            except (OSError, IndexError, ValueError):
                continue

    def run(self) -> None:
        t0, busy0 = time.monotonic(), _busy_seconds()
        self.sample()
        self.base = {k: cpu for k, (_, cpu) in self.last.items()}
        while not self.stop.wait(self.interval):
            self.sample()
            self.busy.append((time.monotonic() - t0, _busy_seconds() - busy0))
        self.sample()

    def utilisation(self, window: float = 30.0) -> list[list[float]]:
        """``[start, cores busy]`` per ``window`` seconds of the run: where the machine had CPU left over."""
        out, last_t, last_b = [], 0.0, 0.0
        for t, b in self.busy:
            if t - last_t >= window:
                out.append([round(last_t), round((b - last_b) / (t - last_t), 2)])
                last_t, last_b = t, b
        return out

    def totals(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for key, (kind, cpu) in self.last.items():
            out[kind] += cpu - self.base.get(key, 0.0)
        return out

    def by_test(self) -> dict[str, Counter[str]]:
        """Test -> kind -> CPU-seconds; processes charged to no test under ``(no test)``."""
        out: dict[str, Counter[str]] = {}
        for key, (kind, cpu) in self.last.items():
            out.setdefault(self.tests.get(key, "(no test)"), Counter())[kind] += cpu - self.base.get(key, 0.0)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the totals as JSON here")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("no command: python benchmarks/suite_cpu.py -- make test")
    sampler = Sampler(args.interval)
    thread = threading.Thread(target=sampler.run, daemon=True)
    busy0, t0 = _busy_seconds(), time.monotonic()
    thread.start()
    rc = subprocess.call(cmd)
    sampler.stop.set()
    thread.join()
    wall, busy = time.monotonic() - t0, _busy_seconds() - busy0
    totals = sampler.totals()
    sampled = sum(totals.values())
    rows = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)
    print(f"\nCPU by kind of process ({' '.join(cmd)}; exit {rc}): wall {wall:.0f} s, machine busy {busy:.0f} "
          f"CPU-s ({busy / wall:.2f} cores of {os.cpu_count()})", file=sys.stderr)
    for kind, seconds in rows:
        print(f"  {seconds:8.0f} CPU-s  {seconds / busy:6.1%}  {kind}", file=sys.stderr)
    print(f"  {busy - sampled:8.0f} CPU-s  {(busy - sampled) / busy:6.1%}  unsampled (processes under "
          f"{args.interval:g} s, the kernel)", file=sys.stderr)
    tests = sorted(((t, sum(c.values()), c) for t, c in sampler.by_test().items()), key=lambda r: r[1], reverse=True)
    print(f"CPU by test (the {min(TOP_TESTS, len(tests))} costliest; a fixture's processes under its test's setup):",
          file=sys.stderr)
    for test, seconds, kinds in tests[:TOP_TESTS]:
        top = ", ".join(f"{k} {v:.0f}" for k, v in kinds.most_common(3))
        print(f"  {seconds:8.0f} CPU-s  {test}  ({top})", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps({"command": cmd, "exit": rc, "wall_s": round(wall, 1),
                                        "busy_cpu_s": round(busy, 1), "by_kind": {k: round(v, 1) for k, v in rows},
                                        "unsampled_cpu_s": round(busy - sampled, 1),
                                        "cores_busy_per_30s": sampler.utilisation(),
                                        "by_test": {t: {"cpu_s": round(sec, 1),
                                                        "by_kind": {k: round(v, 1) for k, v in kinds.most_common()}}
                                                    for t, sec, kinds in tests}}, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
