"""benchmarks/memtier.py's cost statistics (pure): the excess around each save against the same moment's step
time, and the whole blocks' A/B with its interval. Fed with traces whose answer is known."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("memtier_bench", REPO / "benchmarks" / "memtier.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["memtier_bench"] = module  # the dataclass looks its module up
    spec.loader.exec_module(module)
    return module


bench = _bench()
Step = bench.Step


def drifting_trace(seed: int, *, saves_at: list[int], excess: float, busy_steps: int = 6, n: int = 2000) -> list:
    """Steps of 25 ms +- 3 ms noise on a slow drift of +-15 % (this VM's), the tier on throughout; each save
    adds ``excess`` seconds spread over the ``busy_steps`` steps after it."""
    rng = random.Random(seed)
    steps, extra = [], {}
    for i in saves_at:
        for j in range(1, busy_steps + 1):
            extra[i + j] = excess / busy_steps
    level = 0.025
    for i in range(n):
        level = min(0.029, max(0.021, level + rng.gauss(0, 0.0001)))
        busy = any(i < s + busy_steps and i >= s for s in saves_at)
        steps.append(Step(level + rng.gauss(0, 0.003) + extra.get(i, 0.0), True, i in saves_at, busy))
    return steps


def test_the_excess_around_each_save_is_found_through_the_drift() -> None:
    saves = [300, 700, 1100, 1500, 1900]
    windows = bench.save_windows(drifting_trace(1, saves_at=saves, excess=0.09))
    assert [w["index"] for w in windows] == saves
    assert all(w["steps"] == 6 + 1 + 5 for w in windows)  # the busy steps, the one after and 5 more
    got = [w["excess_s"] for w in windows]
    assert sum(got) / len(got) == pytest.approx(0.09, abs=0.015), got


def test_no_excess_no_cost() -> None:
    saves = [300 + 400 * k for k in range(12)]
    windows = bench.save_windows(drifting_trace(2, saves_at=saves, excess=0.0, n=5000))
    stats = bench.window_stats(windows, on_s=5000 * 0.025, saves=len(saves))
    assert abs(stats["share"]) < 0.0005 and stats["low"] <= 0 <= stats["high"], stats


def test_the_share_counts_every_save_made_and_its_interval_holds_the_truth() -> None:
    saves = [300 + 400 * k for k in range(5)]
    trace = drifting_trace(3, saves_at=saves, excess=0.1)
    on_s = sum(s.seconds for s in trace)
    stats = bench.window_stats(bench.save_windows(trace), on_s, saves=len(saves))
    truth = 0.1 * len(saves) / on_s
    assert stats["low"] <= truth <= stats["high"] and stats["share"] == pytest.approx(truth, rel=0.2), stats
    # a save left out (too few steps before it) still counts at the mean excess of the measured ones
    half = bench.window_stats(bench.save_windows(trace)[:3], on_s, saves=len(saves))
    assert half["share"] == pytest.approx(truth, rel=0.3) and half["measured"] == 3


def test_a_save_too_early_to_compare_is_left_out_and_windows_stop_at_the_next_save() -> None:
    trace = [Step(0.02, True, i in (3, 40, 44), i in (3, 4, 40, 41, 42, 43, 44, 45)) for i in range(80)]
    windows = bench.save_windows(trace)
    assert [(w["index"], w["steps"]) for w in windows] == [(40, 4), (44, 8)]  # 3: only 3 steps before it


def test_the_ab_interval_covers_its_mean() -> None:
    stats = bench.pair_stats([(1.0, 1.01), (1.0, 0.98), (1.0, 1.05), (1.0, 1.02)])
    assert stats["mean"] == pytest.approx(0.015) and stats["low"] < 0.015 < stats["high"], stats
    assert bench.pair_stats([(2.0, 2.02)]) == pytest.approx({"mean": 0.01, "low": 0.01, "high": 0.01})


def test_the_placebo_moves_each_save_to_its_pairs_off_block() -> None:
    """ABBA blocks of 20 steps: off 0-19, on 20-39 (a save at 25, busy 25-27), on 40-59 (a save at 45), off 60-79."""
    blocks = [("off", 0, 20), ("on", 20, 40), ("on", 40, 60), ("off", 60, 80)]
    trace = [Step(0.02, 20 <= i < 60, i in (25, 45), i in (25, 26, 27, 45, 46)) for i in range(80)]
    fake = bench.placebo(trace, blocks)
    assert [i for i, s in enumerate(fake) if s.saved] == [5, 65]
    assert [i for i, s in enumerate(fake) if s.busy] == [5, 6, 7, 65, 66]
    assert not any(s.on for s in fake)
