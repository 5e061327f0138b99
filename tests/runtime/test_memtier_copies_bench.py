"""benchmarks/memtier_copies.py end to end at a small size: both processes' CPU per copy is measured (the server's
too, which runs in its own process), a baseline tree's rows run beside this tree's, and bad input is refused with
the numbers before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "memtier_copies.py"


def test_each_copy_is_timed_on_both_sides_with_a_baseline_tree_beside(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "runtime").symlink_to(ROOT / "runtime")  # this tree as its own baseline: both rows must run
    out = subprocess.run([sys.executable, str(BENCH), "--gib", "0.01", "--copies", "2", "--warmup", "1",
                          "--repeats", "2", "--baseline", str(base), "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=150, check=True)
    assert "baseline / this, median: CPU" in out.stdout
    got = json.loads((tmp_path / "r.json").read_text())
    for label in ("this", "baseline"):
        rows = got["results"][label]
        assert len(rows) == 4  # 2 copies x 2 rounds
        assert all(r["server_cpu_s"] >= 0 and r["wall_s"] > 0 and r["writer_cpu_s"] >= r["write_cpu_s"] >= 0
                   for r in rows)
        assert got["summary"][label]["wall_s"][0] > 0


@pytest.mark.parametrize(("argv", "says"), [
    (["--gib", "0"], "--gib must be at least"),
    (["--gib", "100000"], "on /dev/shm, which has"),
    (["--baseline", "/nonexistent"], "no runtime/reprieve under it"),
])
def test_bad_input_is_refused_before_anything_starts(argv: list[str], says: str) -> None:
    out = subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 2 and says in out.stderr
