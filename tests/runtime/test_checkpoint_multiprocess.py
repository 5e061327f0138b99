"""Multi-process round trips on real jax.distributed (127.0.0.1, gloo, simulated CPU devices):
bit-exact save/restore with 2 and 4 processes, and restore onto other meshes and process counts."""

from __future__ import annotations

import pytest
from ckpt_workers.launch import run_gang

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _ok(results: list[tuple[int, str]]) -> str:
    out = "\n".join(f"--- process {i} rc={rc}\n{o[-3000:]}" for i, (rc, o) in enumerate(results))
    assert all(rc == 0 and "OK" in o for rc, o in results), out
    return out


def test_two_processes_save_then_restore_on_four_and_one(tmp_path) -> None:
    d = str(tmp_path)
    # 2 processes x 2 devices, mesh 2x2: save with sharding a, restore same gang with sharding b.
    out = _ok(run_gang(2, ["--dir", d, "--mesh", "2x2", "--save", "4", "--save-variant", "a",
                           "--restore", "4", "--restore-variant", "b", "--seed", "21"], devices=2))
    assert out.count("RESTORED 4 from nproc=2") == 2
    # 2 -> 4 processes (1 device each), another mesh shape.
    out = _ok(run_gang(4, ["--dir", d, "--mesh", "4x1", "--restore", "-1", "--restore-variant", "a",
                           "--attempt", "2"], devices=1))
    assert out.count("RESTORED 4 from nproc=2") == 4


def test_four_processes_save_then_restore_on_two_and_one(tmp_path) -> None:
    d = str(tmp_path)
    out = _ok(run_gang(4, ["--dir", d, "--mesh", "2x2", "--save", "9", "--save-variant", "b",
                           "--restore", "9", "--restore-variant", "a", "--seed", "33"], devices=1))
    assert out.count("SAVED 9") == 4
    out = _ok(run_gang(2, ["--dir", d, "--mesh", "1x4", "--restore", "-1", "--restore-variant", "b"], devices=2))
    assert out.count("RESTORED 9 from nproc=4") == 2
    out = _ok(run_gang(1, ["--dir", d, "--mesh", "2x1", "--restore", "9", "--restore-variant", "a"], devices=2))
    assert "RESTORED 9 from nproc=4" in out


def test_barrier_timeout_names_the_missing_process(tmp_path) -> None:
    d = str(tmp_path)
    results = run_gang(2, ["--dir", d, "--mesh", "2x1", "--save", "1", "--timeout", "8"], devices=1,
                       per_process_env={1: {"REPRIEVE_CKPT_TEST_CRASH_AT": "before_barrier:1"}})
    rc0, out0 = results[0]
    assert results[1][0] == 86, results[1][1]
    assert rc0 != 0 and "processes [1] did not arrive" in out0, out0[-3000:]
    assert not any(p.name.startswith("step_") and not p.name.endswith(".tmp") for p in tmp_path.iterdir())
