"""benchmarks/checkpoint.py's floors, measured beside its restores: memcpy into reused and into fresh buffers, the
page-cached and the cold sequential read of the same bytes (the eviction checked with ``fincore``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_every_floor_is_measured_and_the_cold_read_found_its_file_evicted(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # as when run as a script: memtier.py beside it
    spec = importlib.util.spec_from_file_location("checkpoint_bench", BENCH / "checkpoint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "checkpoint_bench", module)
    spec.loader.exec_module(module)
    fl = module.floors(32 << 20, str(tmp_path))
    for key in ("memcpy_s", "memcpy_fresh_s", "read_s", "read_cold_s", "write_fsync_s", "alloc_touch_s"):
        assert fl[key] > 0, (key, fl)
    assert fl["read_cold_cached_bytes"] in (0, -1) or fl["read_cold_cached_bytes"] < 32 << 20, fl
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the floors' files are left behind"
