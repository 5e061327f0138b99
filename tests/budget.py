"""The test suite's time budget: what each tier cost in this run, the slowest tests, and what grew past its share.

Loaded from tests/conftest.py. At the end of every run it prints one table (tests and test-seconds per tier against
the tier's share in ``tests/budget.toml``, the whole run's wall time against its budget) and the slowest tests, and
writes the same as JSON to ``$REPRIEVE_TEST_TIMES`` (default ``.pytest_cache/test-times.json``) for
``benchmarks/RESULTS.md``. A tier over its share, a run over its budget and a test over ``long_test_seconds`` whose
docstring has no ``Why this long:`` line are named in a ``TEST BUDGET`` block; they do not fail the run (timings
differ between machines), the numbers are for the people who keep the suite inside CI's limit.

With pytest-xdist the tier sums are test-seconds (the sum over workers), so they can exceed the wall time; the
per-test rows are what each test took on its worker. The pure part (:func:`summarise`) is unit-tested.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BUDGET_FILE = Path(__file__).with_name("budget.toml")
TIERS = ("unit", "integration", "e2e", "realnodes")  # realnodes wins over the tier mark it is paired with
WHY_LONG = "why this long:"
# Modules whose tests share one real-node cluster per run: one pytest-xdist work unit (tests/conftest.py)
REAL_NODE_MODULES = ("tests/e2e/test_realnodes_e2e.py", "tests/localcluster/test_realnode_integration.py",
                     "tests/e2e/test_release_e2e.py", "tests/e2e/test_soak_smoke_e2e.py")


# Modules whose tests share a module-scoped fixture that is too costly to make twice: each one work unit
SHARED_FIXTURE_MODULES = ("tests/runtime/test_data_position.py", "tests/runtime/test_virtual_step.py")


def scope_of(nodeid: str) -> str | None:
    """The pytest-xdist work unit a test must share ("realnodes", or its module's path for the modules that share
    a costly fixture), or None (any worker)."""
    module = nodeid.split("::", 1)[0]
    if module in REAL_NODE_MODULES:
        return "realnodes"
    return module if module in SHARED_FIXTURE_MODULES else None


def tier_of(marks: Iterable[str]) -> str:
    """The budget tier of a test from its marker names: ``realnodes`` first, then e2e, integration, unit."""
    names = set(marks)
    for tier in ("realnodes", "e2e", "integration", "unit"):
        if tier in names:
            return tier
    return "unmarked"


@dataclass(frozen=True)
class Budget:
    """``tests/budget.toml``: the whole run's wall-time budget and each tier's share of test-seconds."""

    run_seconds: float
    long_test_seconds: float
    tier_seconds: Mapping[str, float]

    @classmethod
    def load(cls, path: Path = BUDGET_FILE) -> Budget:
        data = tomllib.loads(path.read_text())
        try:
            tiers = {str(k): float(v) for k, v in data["tiers"].items()}
            return cls(float(data["run_seconds"]), float(data["long_test_seconds"]), tiers)
        except (KeyError, TypeError, ValueError) as err:
            raise pytest.UsageError(f"{path}: needs run_seconds, long_test_seconds and a [tiers] table of "
                                    f"seconds ({err!r})") from err


@dataclass(frozen=True)
class TimedTest:
    nodeid: str
    tier: str
    seconds: float
    why_long: bool = False


@dataclass
class Summary:
    wall_seconds: float
    tiers: dict[str, tuple[int, float]]  # tier -> (tests, test-seconds)
    slowest: list[TimedTest]
    warnings: list[str] = field(default_factory=list)
    modules: list[tuple[str, int, float]] = field(default_factory=list)  # the costliest modules: (path, tests, s)

    def as_json(self) -> dict[str, Any]:
        return {"wall_seconds": round(self.wall_seconds, 1),
                "tiers": {t: {"tests": n, "seconds": round(s, 1)} for t, (n, s) in self.tiers.items()},
                "slowest": [{"test": t.nodeid, "tier": t.tier, "seconds": round(t.seconds, 1)} for t in self.slowest],
                "modules": [{"module": m, "tests": n, "seconds": round(s, 1)} for m, n, s in self.modules],
                "warnings": self.warnings}


def summarise(times: Iterable[TimedTest], wall_seconds: float, budget: Budget, *, top: int = 15,
              complete: bool = True) -> Summary:
    """Per-tier totals, the ``top`` slowest tests and what is over budget. ``complete`` is False for a run of a
    subset (``-m``, ``-k``, paths): tier shares are checked only for tiers it ran, the run budget not at all."""
    rows = list(times)
    tiers: dict[str, tuple[int, float]] = {}
    for row in rows:
        n, s = tiers.get(row.tier, (0, 0.0))
        tiers[row.tier] = (n + 1, s + row.seconds)
    warnings = []
    for tier, (_, spent) in sorted(tiers.items()):
        share = budget.tier_seconds.get(tier)
        if share is None:
            warnings.append(f"tier {tier!r} has no share in {BUDGET_FILE.name}")
        elif spent > share:
            warnings.append(f"tier {tier} took {spent:.0f} test-seconds, over its share of {share:.0f}")
    if complete and wall_seconds > budget.run_seconds:
        warnings.append(f"the run took {wall_seconds / 60:.1f} min, over its budget of {budget.run_seconds / 60:.0f} min")
    for row in rows:
        if row.seconds > budget.long_test_seconds and not row.why_long:
            warnings.append(f"{row.nodeid} took {row.seconds:.0f} s (> {budget.long_test_seconds:.0f} s) and its "
                            f"docstring has no '{WHY_LONG[:-1].capitalize()}:' line")
    slowest = sorted(rows, key=lambda r: r.seconds, reverse=True)[:top]
    per_module: dict[str, tuple[int, float]] = {}
    for row in rows:
        n, s = per_module.get(row.nodeid.split("::", 1)[0], (0, 0.0))
        per_module[row.nodeid.split("::", 1)[0]] = (n + 1, s + row.seconds)
    modules = sorted(((m, n, s) for m, (n, s) in per_module.items()), key=lambda r: r[2], reverse=True)[:top]
    return Summary(wall_seconds, tiers, slowest, warnings, modules)


def render(summary: Summary, budget: Budget) -> list[str]:
    lines = [f"{'tier':<12} {'tests':>6} {'test-s':>8} {'share-s':>8}"]
    for tier in (*TIERS, *sorted(set(summary.tiers) - set(TIERS))):
        if tier in summary.tiers:
            n, s = summary.tiers[tier]
            share = budget.tier_seconds.get(tier)
            lines.append(f"{tier:<12} {n:>6} {s:>8.0f} {share if share is not None else '-':>8}")
    lines.append(f"wall time {summary.wall_seconds / 60:.1f} min (budget {budget.run_seconds / 60:.0f} min)")
    lines.append("slowest:")
    lines += [f"  {t.seconds:7.1f} s  {t.tier:<11} {t.nodeid}" for t in summary.slowest]
    lines.append("costliest modules:")
    lines += [f"  {s:7.1f} s  {n:>4} tests  {m}" for m, n, s in summary.modules]
    return lines


class BudgetPlugin:
    """Collects each test's setup + call + teardown time (on the xdist controller too) and reports at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.monotonic()
        self.seconds: dict[str, float] = {}
        self.tiers: dict[str, str] = {}
        self.why_long: dict[str, bool] = {}
        self.spans: dict[str, list[Any]] = {}  # nodeid -> [worker, first start, last stop] (epoch seconds)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        node = getattr(report, "node", None)  # the xdist worker that ran it (None in a plain run)
        worker = getattr(getattr(node, "gateway", None), "id", "main")
        span = self.spans.setdefault(report.nodeid, [worker, report.start, report.stop])
        span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)
        if report.when == "setup":
            self.tiers[report.nodeid] = tier_of(k for k, v in report.keywords.items() if v)
            self.why_long[report.nodeid] = dict(report.user_properties).get("why_long", False)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        budget = Budget.load()
        times = [TimedTest(n, self.tiers.get(n, "unmarked"), s, self.why_long.get(n, False))
                 for n, s in self.seconds.items()]
        opt = self.config.option
        tests_dir = Path(__file__).parent.resolve()
        complete = not opt.markexpr and not opt.keyword and all(
            Path(self.config.invocation_params.dir, a).resolve() == tests_dir for a in self.config.args)
        summary = summarise(times, time.monotonic() - self.started, budget, complete=complete)
        terminalreporter.section("test time by tier", sep="-")
        for line in render(summary, budget):
            terminalreporter.line(line)
        if summary.warnings:
            terminalreporter.section("TEST BUDGET", sep="!", yellow=True, bold=True)
            for line in summary.warnings:
                terminalreporter.line(line)
        out = Path(os.environ.get("REPRIEVE_TEST_TIMES") or Path(self.config.rootpath, ".pytest_cache",
                                                                 "test-times.json"))
        out.parent.mkdir(parents=True, exist_ok=True)
        # "timeline": when each test ran and on which worker (seconds from the run's start), to see where the
        # workers waited on each other (benchmarks/suite_cpu.py says where the CPU went)
        t0 = min((s[1] for s in self.spans.values()), default=0.0)
        timeline = {n: [w, round(a - t0, 1), round(b - t0, 1)] for n, (w, a, b) in self.spans.items()}
        out.write_text(json.dumps(summary.as_json() | {"all": {n: round(s, 2) for n, s in self.seconds.items()},
                                                        "timeline": timeline}, indent=1))


def why_long(item: pytest.Item) -> bool:
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    return any(line.strip().lower().startswith(WHY_LONG) for line in doc.splitlines())


def check_tiers(items: Iterable[pytest.Item]) -> None:
    """Every test carries exactly one of unit, integration, e2e (``realnodes`` goes beside one of them)."""
    bad = []
    for item in items:
        tiers = sorted({m.name for m in item.iter_markers()} & {"unit", "integration", "e2e"})
        if len(tiers) != 1:
            bad.append(f"{item.nodeid}: {' + '.join(tiers) or 'no tier mark'}")
    if bad:
        raise pytest.UsageError("each test needs exactly one tier mark (unit, integration or e2e):\n  "
                                + "\n  ".join(bad))
