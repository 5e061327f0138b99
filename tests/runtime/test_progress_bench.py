"""benchmarks/progress.py at a tiny scale: the benchmark keeps working and reports what it claims to."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]


def test_progress_benchmark_runs_and_reports_both_variants() -> None:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "progress.py"), "--steps", "30", "--blocks", "2",
                          "--step-ms", "2", "--interval", "0.01"],
                         capture_output=True, text=True, timeout=110, check=False)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-3000:]
    patches = int(re.search(r"\((\d+) patches sent", out.stdout).group(1))  # type: ignore[union-attr]
    assert patches > 0, out.stdout  # the reporter really patched the loopback server
    for line in ("no reporting (peer)", "live reporting", "difference", "reporter thread CPU per patch",
                 "training-thread statements"):
        assert line in out.stdout, out.stdout
