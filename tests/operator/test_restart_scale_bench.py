"""benchmarks/restart_scale.py at a tiny scale: both modes run, and the operator never fails a reconcile on the way
(a failed in-place reconcile, retried by the resync, once hid in its numbers as 27 s of restart)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]


def test_restart_scale_benchmark_runs_both_modes_without_a_failed_reconcile() -> None:
    """Why this long: the benchmark's smoke run: an 8-replica gang restarted in both modes on a local control plane."""
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "restart_scale.py"), "--replicas", "8"],
                         capture_output=True, text=True, timeout=380, check=False)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-3000:]
    report = json.loads(out.stdout[out.stdout.index("{\n"):out.stdout.rindex("}") + 1])
    assert set(report) == {"inplace", "recreate"} and all(report[m]["8"] > 0 for m in report), report
