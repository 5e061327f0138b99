"""The suite's time report (tests/budget.py): tiers from marks, per-tier totals, what is over budget."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.budget import (
    BUDGET_FILE,
    REAL_NODE_MODULES,
    Budget,
    TimedTest,
    render,
    scope_of,
    summarise,
    tier_of,
)

pytestmark = pytest.mark.unit

BUDGET = Budget(run_seconds=600, long_test_seconds=90, tier_seconds={"unit": 10, "integration": 100, "e2e": 300,
                                                                      "realnodes": 200})


@pytest.mark.parametrize(("marks", "tier"), [
    ({"unit"}, "unit"),
    ({"integration", "timeout"}, "integration"),
    ({"e2e", "realnodes"}, "realnodes"),
    ({"integration", "realnodes"}, "realnodes"),
    ({"e2e"}, "e2e"),
    (set(), "unmarked"),
])
def test_tier_of(marks: set[str], tier: str) -> None:
    assert tier_of(marks) == tier


def test_totals_per_tier_and_the_slowest_first() -> None:
    times = [TimedTest("a", "unit", 1.0), TimedTest("b", "unit", 2.0), TimedTest("c", "e2e", 50.0),
             TimedTest("d", "integration", 7.5)]
    s = summarise(times, 70.0, BUDGET, top=2)
    assert s.tiers == {"unit": (2, 3.0), "e2e": (1, 50.0), "integration": (1, 7.5)}
    assert [t.nodeid for t in s.slowest] == ["c", "d"]
    assert s.warnings == []
    text = "\n".join(render(s, BUDGET))
    assert "unit" in text and "1.2 min (budget 10 min)" in text


def test_the_costliest_modules_sum_their_tests() -> None:
    times = [TimedTest("m1.py::a", "unit", 1.0), TimedTest("m1.py::b[x]", "unit", 2.0),
             TimedTest("m2.py::c", "e2e", 2.5), TimedTest("m3.py::d", "unit", 0.5)]
    s = summarise(times, 7.0, BUDGET, top=2)
    assert s.modules == [("m1.py", 2, 3.0), ("m2.py", 1, 2.5)]
    assert "     3.0 s     2 tests  m1.py" in "\n".join(render(s, BUDGET))


def test_a_tier_past_its_share_and_a_run_past_its_budget_are_named() -> None:
    s = summarise([TimedTest("x", "unit", 11.0), TimedTest("y", "e2e", 10.0)], 601.0, BUDGET)
    assert any("tier unit took 11 test-seconds, over its share of 10" in w for w in s.warnings), s.warnings
    assert any("over its budget of 10 min" in w for w in s.warnings), s.warnings
    assert not any("e2e" in w for w in s.warnings)


def test_a_partial_run_is_not_held_to_the_whole_runs_budget() -> None:
    s = summarise([TimedTest("x", "unit", 1.0)], 601.0, BUDGET, complete=False)
    assert s.warnings == []


def test_a_long_test_needs_its_reason_in_the_docstring() -> None:
    s = summarise([TimedTest("slow", "e2e", 91.0), TimedTest("slow-but-said", "e2e", 120.0, why_long=True)],
                  200.0, BUDGET)
    assert len(s.warnings) == 1 and s.warnings[0].startswith("slow took 91 s"), s.warnings


def test_a_tier_without_a_share_is_named() -> None:
    assert summarise([TimedTest("u", "unmarked", 1.0)], 1.0, BUDGET).warnings == [
        "tier 'unmarked' has no share in budget.toml"]


def test_the_budget_file_loads_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    budget = Budget.load(BUDGET_FILE)
    assert set(budget.tier_seconds) == {"unit", "integration", "e2e", "realnodes"}
    broken = tmp_path / "budget.toml"
    broken.write_text("run_seconds = 5\n")
    with pytest.raises(pytest.UsageError, match="long_test_seconds"):
        Budget.load(broken)


def test_every_module_that_uses_the_real_node_cluster_is_one_xdist_work_unit() -> None:
    """A module using ``real_cluster`` (or starting real nodes of its own, or running the soak, which does)
    outside REAL_NODE_MODULES would start a second real-node cluster on another worker (two at once on 2 cores: a
    node not Ready within its timeout)."""
    root = Path(__file__).resolve().parents[1]
    users = sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                   if p.name != "test_budget.py" and ("real_cluster" in p.read_text() or '"soak.py"' in p.read_text()
                                                      or re.search(r'(?<!\w)kind="real"', p.read_text()) is not None))
    assert users == sorted(REAL_NODE_MODULES)
    assert scope_of("tests/e2e/test_realnodes_e2e.py::test_x[1]") == "realnodes"
    assert scope_of("tests/e2e/test_preemption_e2e.py::test_x") is None
    assert scope_of("tests/runtime/test_data_position.py::test_x[global]") == "tests/runtime/test_data_position.py"
