"""benchmarks/memtier.py's cost statistics (pure): the excess around each save against the same moment's step
time, and the whole blocks' A/B with its interval. Fed with traces whose answer is known."""

from __future__ import annotations

import importlib.util
import random
import statistics
import subprocess
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


def abba_trace(seed: int, *, per_step: float, excess: float, pairs: int = 8, length: int = 400) -> tuple[list, list]:
    """ABBA blocks on a drifting step time (as :func:`drifting_trace`); the "on" steps cost ``per_step`` more
    (a share) and each "on" block saves a quarter in, adding ``excess`` seconds over the 6 steps after it."""
    rng = random.Random(seed)
    trace, blocks, level = [], [], 0.025
    for b in range(2 * pairs):
        on = (b % 4) in (1, 2)
        first = len(trace)
        for i in range(length):
            level = min(0.029, max(0.021, level + rng.gauss(0, 0.0001)))
            busy = on and length // 4 <= i < length // 4 + 6
            extra = excess / 6 if on and length // 4 < i <= length // 4 + 6 else 0.0
            seconds = level * (1 + (per_step if on else 0.0)) + rng.gauss(0, 0.003) + extra
            trace.append(Step(seconds, on, on and i == length // 4, busy))
        blocks.append(("on" if on else "off", first, len(trace)))
    return trace, blocks


def test_far_from_the_saves_finds_a_cost_spread_over_every_step_and_not_the_saves() -> None:
    """Unbiased on average over ten drifting runs (one run's spread here is ~0.9 %, as on the VM's traces)."""
    costs = [bench.far_from_saves(*abba_trace(seed, per_step=0.04, excess=0.0, pairs=16)) for seed in range(10)]
    assert all(far["borders"] == 16 for far in costs), costs  # every border where the mode changes
    assert statistics.mean(far["mean"] for far in costs) == pytest.approx(0.04, abs=0.006), costs
    assert sum(far["low"] <= 0.04 <= far["high"] for far in costs) >= 7, costs
    # a save's excess (its window) is not a cost far from the saves: 0.3 s each (~3 % of a block) reads as nothing
    runs = [abba_trace(seed, per_step=0.0, excess=0.3, pairs=16) for seed in range(10)]
    nothing = [bench.far_from_saves(trace, blocks) for trace, blocks in runs]
    assert abs(statistics.mean(far["mean"] for far in nothing)) < 0.006, nothing


def test_far_from_the_saves_skips_borders_of_blocks_alike_and_without_steps_outside_the_windows() -> None:
    blocks = [("off", 0, 30), ("off", 30, 60), ("on", 60, 90)]
    trace = [Step(0.02 if i < 60 else 0.03, i >= 60, i == 60, 60 <= i < 85) for i in range(90)]
    assert bench.far_from_saves(trace, blocks)["borders"] == 0  # the "on" block's steps all lie in its window
    trace = [Step(0.02 if i < 60 else 0.03, i >= 60, False, False) for i in range(90)]
    assert bench.far_from_saves(trace, blocks) == pytest.approx({"mean": 0.5, "low": 0.5, "high": 0.5, "borders": 1})


def _run(pairs: list[tuple[float, float]], share: float, on_s: float, *, control: bool = False) -> dict:
    return {"pairs": pairs, "trace": [[on_s, 1, 0, 0, 0.0], [1.0, 0, 0, 0, 0.0]], "due_share": 0.001,
            "around_saves": {"share": share, "measured": 2}, "control": control}


def test_pooled_runs_weigh_each_runs_windows_by_its_time_and_pool_every_pair() -> None:
    pooled = bench.pool_cost([_run([(1.0, 1.01), (1.0, 1.0)], 0.006, 10.0), _run([(1.0, 1.02)], 0.009, 20.0)])
    assert pooled["pairs"] == 3 and pooled["ab"]["mean"] == pytest.approx(0.01), pooled
    assert pooled["windows"] == pytest.approx((0.006 * 10 + 0.009 * 20) / 30), pooled
    assert pooled["around_saves"] == pytest.approx(pooled["windows"] + 0.001) and pooled["saves"] == 4
    with pytest.raises(ValueError, match="mixed"):
        bench.pool_cost([_run([(1.0, 1.0)], 0.0, 1.0), _run([(1.0, 1.0)], 0.0, 1.0, control=True)])


def test_pool_refuses_a_file_without_a_cost_run_by_name(tmp_path: Path) -> None:
    restore_only = tmp_path / "restore.json"
    restore_only.write_text('{"restore": [], "cost": null, "floors": null}')
    for path, says in [(restore_only, "holds no cost run"), (tmp_path / "absent.json", "cannot read")]:
        out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memtier.py"), "--pool", str(path)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 2 and says in out.stderr and str(path) in out.stderr, out.stderr


def test_each_source_is_held_against_its_own_floor_with_median_worst_and_share() -> None:
    gib = 1 << 30
    run = {"size_gib": 1.0, "bytes": gib, "seconds": {"own": [0.2, 0.1, 0.4], "disk-cold": [2.0, 2.0, 2.0],
                                                       "s3": [1.0, 1.0, 1.0], "peer": [0.5], "disk": [1.0]},
           "floors": [{"read_cold_s": 1.0, "read_bytes": gib, "s3_get_s": 0.5, "s3_get_bytes": gib},
                      {"read_cold_s": 3.0, "read_bytes": gib, "s3_get_s": 0.5, "s3_get_bytes": gib},
                      {"read_cold_s": 1.0, "read_bytes": gib, "s3_get_s": 0.5, "s3_get_bytes": gib}]}
    fl = {"memcpy_gib_s": 10.0, "memcpy_fresh_gib_s": 2.5, "loopback_tcp_streams_gib_s": 4.0}
    rows = {r["source"]: r for r in bench.floor_rows(run, fl)}
    own = rows["own"]
    assert (own["median_s"], own["worst_s"], own["floor"]) == (0.2, 0.4, "memcpy") and own["spread"] == 2.0
    assert own["share"] == pytest.approx(0.5) and own["fresh"] == pytest.approx(2.0)  # 5 GiB/s of 10, of 2.5
    assert rows["disk-cold"]["floor_gib_s"] == 1.0 and rows["disk-cold"]["share"] == pytest.approx(0.5)  # the median
    assert rows["s3"]["floor"] == "raw GET" and rows["s3"]["share"] == pytest.approx(0.5)
    assert rows["peer"]["share"] == pytest.approx(0.5) and rows["disk"]["share"] == pytest.approx(0.1)
    del run["floors"]  # a run without the per-round floors: those rows say so instead of a share
    assert bench.floor_rows(run, fl)[1]["share"] is None


def test_each_restore_sits_beside_its_baseline_twin_and_the_two_take_turns_to_go_first() -> None:
    sources = ["own", "peer", "disk", "own@base", "disk@base"]
    assert bench.restore_order(sources, 0) == ["own", "own@base", "peer", "disk", "disk@base"]
    assert bench.restore_order(sources, 1) == ["own@base", "own", "peer", "disk@base", "disk"]
    assert bench.restore_order(["own", "peer"], 1) == ["own", "peer"]  # no baseline: the sources in their order
