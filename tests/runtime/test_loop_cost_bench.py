"""benchmarks/loop_cost.py at a tiny scale: it keeps working, measures every shape beside its bare loop, saves
nothing, and its target verdict is the exit code (timings themselves are the benchmark's, not a test's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]


def run(target_us: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "loop_cost.py"), "--steps", "50", "--blocks", "2",
                           "--target-us", target_us], capture_output=True, text=True, timeout=170, check=False)


@pytest.mark.parametrize(("target_us", "code", "verdict"), [("1e9", 0, "met"), ("0", 1, "MISSED (no step ")])
def test_the_loop_cost_benchmark_reports_every_shape_and_fails_over_its_target(target_us: str, code: int,
                                                                              verdict: str) -> None:
    out = run(target_us)
    assert out.returncode == code and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-3000:]
    assert "(saves started: 0)" in out.stdout, out.stdout  # nothing to save: the loop's own cost alone
    for shape in ("no step", "synced step", "async step", "no step, probed", "synced, probed", "async, probed",
                  "finished-step probe per save"):
        assert f"\n{shape} " in out.stdout, out.stdout
    assert out.stdout.strip().splitlines()[-1].split(": ", 1)[1].startswith(verdict), out.stdout
