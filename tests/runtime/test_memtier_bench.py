"""benchmarks/memtier.py's cost A/B at a tiny scale: the benchmark keeps working against the tier it measures
(it broke once when the tier's schedule attribute was renamed) and reports what it claims to."""

from __future__ import annotations

import importlib.util
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
                          "1", "--blocks", "2", "--warmup-seconds", "2", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=170, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    line = re.search(r"tier cost \(cpu\), 1 MiB state, step [\d.]+ ms, a save every (\d+) steps \(at the end: \d+\), "
                     r"blocks of (\d+) steps, \[\d+, \d+\] saves per block:\n  around the saves: [-+][\d.]+ %",
                     out.stdout)
    assert line and int(line.group(1)) >= 1, out.stdout
    assert int(line.group(2)) == max(int(line.group(1)), 50), out.stdout  # a block: one save interval
    assert "whole blocks A/B" in out.stdout and "placebo" not in out.stdout and "noise" in out.stdout, out.stdout
    result = json.loads((tmp_path / "r.json").read_text())["cost"]
    assert result["saves"] >= 1, result  # the tier saved in its "on" blocks
    assert result["step_off_s"] > 0 and result["step_on_s"] > 0, result
    assert len(result["pairs"]) == 2 and len(result["trace"]) >= 4 * result["block_steps"], result["pairs"]
    length = result["block_steps"]
    modes = [on for _, on, *_ in result["trace"]]
    assert modes[:length] == [0] * length and modes[length:2 * length] == [1] * length, "ABBA: off, on, on, off"
    assert result["far"]["borders"] == 2 and not result["control"], result["far"]  # off|on and on|off


def test_the_control_run_leaves_the_tier_alone_in_its_on_blocks(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memtier.py"), "--parts", "cost", "--cost-mib",
                          "1", "--blocks", "1", "--warmup-seconds", "2", "--control", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=170, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert out.stdout.startswith("CONTROL (A/A)"), out.stdout
    result = json.loads((tmp_path / "r.json").read_text())["cost"]
    trace = result["trace"]
    assert result["control"] and result["saves"] == 0 and result["saves_per_block"] == [0], result["saves_per_block"]
    assert any(on for _, on, *_ in trace) and not any(busy or due for _, _, _, busy, due in trace), "the tier ran"
    assert result["every"] >= 1 and result["memory_copy_s"] > 0  # it settled a schedule before the blocks
    pooled = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memtier.py"), "--pool",
                             str(tmp_path / "r.json")], capture_output=True, text=True, timeout=60, check=False)
    assert pooled.returncode == 0 and "CONTROL (A/A) tier cost over 1 runs" in pooled.stdout, pooled.stdout


def test_every_restore_source_is_printed_beside_its_floor_measured_in_the_same_run(tmp_path: Path) -> None:
    s3 = [] if _has_moto() else ["--no-s3"]
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memtier.py"), "--parts", "restore", "--sizes",
                          "0.01", "--leaves", "2", "--repeats", "1", "--floor-gib", "0.02", *s3, "--json",
                          str(tmp_path / "r.json")], capture_output=True, text=True, timeout=170, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    floors = {"own": "memcpy", "peer": "loopback TCP", "peer-warm": "loopback TCP", "disk": "memcpy",
              "disk-warm": "memcpy", "disk-cold": "cold read", "s3": "raw GET", "gcs": "raw GCS GET"}
    for source in ["own", "peer", "peer-warm", "disk", "disk-warm", "disk-cold", "gcs"] + ([] if s3 else ["s3"]):
        row = re.search(rf"\| {re.escape(source)} +\| +[\d.]+ s \( *[\d.]+\) \| +[\d.]+ GiB/s \| {floors[source]} +"
                        r"([\d.]+) GiB/s +\| +(\d+) % \| fresh +\d+ % \| worst/median [\d.]+", out.stdout)
        assert row and float(row.group(1)) > 0, f"{source}: {out.stdout}"
    result = json.loads((tmp_path / "r.json").read_text())
    fl, (r,) = result["floors"], result["restore"]
    assert fl["memcpy_gib_s"] > 0 and fl["memcpy_fresh_gib_s"] > 0 and fl["loopback_tcp_streams"] >= 1, fl
    # the warm sources' restores ran in processes that populated their landing memory first (the child asserts it)
    assert set(r["populated_ahead"]) == {"peer-warm", "disk-warm"}, r["populated_ahead"]
    assert re.search(r"disk-warm: its landing memory populated ahead, off the clock .*: [\d.]+ s", out.stdout)
    # from the page cache a storage restore maps its chunk files; cold, it reads them
    assert set(r["mapped_bytes"]) == {"disk", "disk-warm"}, r["mapped_bytes"]
    # wholly where the files stay wholly cached: under a loaded suite the kernel dropped some of one restore's pages
    # between the bench's read and the restore (run H3: 75 % mapped, the rest read into place), so one of the two
    # page-cache rows must show it, and both mapped some
    assert re.search(r"disk(-warm)?: its chunk files mapped from the page cache as the arrays' buffers .*: 100 % of "
                     r"the state", out.stdout), out.stdout
    assert all(sum(r["mapped_bytes"][s]) > 0 for s in ("disk", "disk-warm")), r["mapped_bytes"]
    (round_fl,) = r["floors"]  # the floors of the checkpoint's own files, measured in the round of its restores
    assert round_fl["read_bytes"] >= r["bytes"] and round_fl["read_warm_s"] > 0 and round_fl["read_cold_s"] > 0
    assert round_fl["populate_bytes"] >= r["bytes"] * 0.99 and round_fl["populate_s"] > 0, round_fl  # a fresh process's
    assert "landing buffers made in a fresh process as a restore makes them: " in out.stdout, out.stdout
    assert round_fl["read_direct_bytes"] == round_fl["read_bytes"] and round_fl["read_direct_s"] > 0, round_fl
    # the peer rows' floor: the peer's copy itself over loopback TCP on the restore's streams, in the round
    assert round_fl["tcp_bytes"] >= r["bytes"] and round_fl["tcp_s"] > 0, round_fl
    assert re.search(r"the peer's copy over loopback TCP on the restore's \d+ streams .*: [\d.]+ GiB/s", out.stdout)
    # the own copy's checksum on a fresh mapping and on mapped pages, and its page faults alone, in a fresh process
    assert round_fl["own_bytes"] >= r["bytes"] and round_fl["own_threads"] >= 1, round_fl
    assert all(round_fl[k] > 0 for k in ("own_check_fresh_s", "own_check_mapped_s", "own_fault_s")), round_fl
    assert re.search(r"own: \d+ % of its checksum on a fresh mapping \([\d.]+ GiB/s", out.stdout), out.stdout
    assert re.search(r"disk-cold: \d+ % of the device's O_DIRECT read \([\d.]+ GiB/s, \d+ files at once\)", out.stdout)
    assert round_fl["read_cold_cached_bytes"] in (0, -1) or round_fl["read_cold_cached_bytes"] < round_fl["read_bytes"]
    for store in ["gcs"] + ([] if s3 else ["s3"]):  # each emulator's raw GET of the same objects, in the round
        assert round_fl[f"{store}_get_bytes"] >= r["bytes"] and round_fl[f"{store}_get_s"] > 0, round_fl
        assert re.search(rf"the {store} emulator's raw GET, \d+ in flight: [\d.]+ GiB/s", out.stdout), out.stdout
    assert r["prepare"]["gcs_save_s"] > 0, r["prepare"]


def _has_moto() -> bool:
    spec = importlib.util.spec_from_file_location("memtier_bench_floors", REPO / "benchmarks" / "memtier.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.moto_python() is not None
