"""benchmarks/memtier.py's cost A/B at a tiny scale: the benchmark keeps working against the tier it measures
(it broke once when the tier's schedule attribute was renamed) and reports what it claims to."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]


def test_the_cost_ab_runs_both_modes_and_reports_the_schedule_it_chose(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memtier.py"), "--parts", "cost", "--cost-mib",
                          "8", "--blocks", "1", "--block-steps", "150", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=170, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    line = re.search(r"tier cost \(cpu\), 8 MiB state, step [\d.]+ ms: overhead [-+][\d.]+ % .*a save every (\d+) "
                     r"steps, \[\d+\] saves per block", out.stdout)
    assert line and int(line.group(1)) >= 1, out.stdout
    result = json.loads((tmp_path / "r.json").read_text())["cost"]
    assert result["saves"] >= 1, result  # the tier saved in its "on" blocks (the first one's bootstrap save at least)
    assert result["step_off_s"] > 0 and result["step_on_s"] > 0, result
