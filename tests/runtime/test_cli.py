"""The reprieve command from the source tree (its console script in this venv): ls, inspect and verify on real
checkpoints, their exit codes and --json, and `reprieve run`, the local restart loop, with real training scripts.
Object stores: test_storage_emulators.py; a fresh install of the built wheel: test_packaging.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPRIEVE = str(Path(sys.executable).parent / "reprieve")


def reprieve(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPRIEVE, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env=env)


def _save(root: Path, steps: list[int], **env: str) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import reprieve as rp

    with rp.init(env={"REPRIEVE_CHECKPOINT_URI": str(root), "REPRIEVE_CHECKPOINT_KEEP": "5", **env},
                 install_sigterm=False, watch_pod=False) as job:
        state, start = job.restore_or(lambda: {"w": jnp.zeros((64, 8)), "rng": np.arange(3), "epoch": 0,
                                               "key": jax.random.key(0)})
        for step in job.steps(start, max(steps) + 1):
            state = {**state, "w": state["w"] + 1, "epoch": step}
            job.save(step, state, force=step in steps, data={"pos": step})


def _corrupt_a_chunk(ckpt: Path) -> None:
    chunk = min(p for p in (ckpt / "arrays").rglob("*") if p.is_file() and "/c/" in str(p))
    data = bytearray(chunk.read_bytes())
    data[1] ^= 0x10
    chunk.write_bytes(bytes(data))


def test_ls_inspect_verify_on_real_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _save(root, [2, 5], REPRIEVE_RUN_ID="demo")
    ls = reprieve("ls", str(root))
    assert ls.returncode == 0, ls.stderr
    assert "a restore takes step 5 (step_0000000005_a1)" in ls.stdout and " demo" in ls.stdout, ls.stdout
    listed = json.loads(reprieve("ls", str(root), "--json").stdout)
    assert [(c["step"], c["state"], c["kind"]) for c in listed["checkpoints"]] == [(2, "complete", "forced"),
                                                                                   (5, "complete", "last")]
    assert listed["latest"] == "step_0000000005_a1" and listed["attempts"] == [1]

    inspect = reprieve("inspect", f"{root}@2")
    assert inspect.returncode == 0 and "step 2, attempt 1, kind forced" in inspect.stdout, inspect.stderr
    assert "run: demo" in inspect.stdout and "data position of process 0: {'pos': 2}" in inspect.stdout
    described = json.loads(reprieve("inspect", str(root / "step_0000000005_a1"), "--json").stdout)
    assert described["step"] == 5 and described["data_positions"] == [{"pos": 5}]
    assert {leaf["path"]: leaf["shape"] for leaf in described["leaves"]}["['w']"] == [64, 8]

    ok = reprieve("verify", str(root))
    assert ok.returncode == 0 and "step_0000000005_a1: OK" in ok.stdout, ok.stdout + ok.stderr
    _corrupt_a_chunk(root / "step_0000000005_a1")
    bad = reprieve("verify", str(root), "--json")
    report = json.loads(bad.stdout)
    assert bad.returncode == 1 and not report["ok"] and "DATA_LOSS" in report["problems"][0], bad.stdout
    assert reprieve("verify", f"{root}@2").returncode == 0  # the other one is intact


def test_what_is_not_there_exits_2_with_one_line(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", [1])
    for args, words in [(("ls", str(tmp_path / "nowhere")), "no checkpoint directory at"),
                        (("inspect", f"{tmp_path / 'ckpt'}@7"), "no complete checkpoint of step 7"),
                        (("verify", f"{tmp_path / 'ckpt'}@x"), "the step after '@' must be a non-negative integer"),
                        (("ls", f"{tmp_path / 'ckpt'}@1"), "lists a whole root")]:
        got = reprieve(*args)
        assert got.returncode == 2 and words in got.stderr and got.stdout == "", (args, got.stderr)
    assert not (tmp_path / "nowhere").exists()  # reading creates nothing
    orbax_root = tmp_path / "orbax"  # what OrbaxCheckpointer leaves beside Orbax's step directories
    (orbax_root / "reprieve_attempts").mkdir(parents=True)
    (orbax_root / "reprieve_attempts" / "attempt_0000000001.json").write_text('{"attempt": 1, "visible": []}')
    for command, words in (("inspect", "no complete checkpoint under"), ("verify", "Orbax's format")):
        got = reprieve(command, str(orbax_root))
        assert got.returncode == 2 and words in got.stderr, got.stderr


# -- reprieve run ----------------------------------------------------------------------------------------------

TRAIN = """
import os, signal, sys, time
import jax.numpy as jnp
import reprieve

job = reprieve.init()
attempt = int(os.environ["REPRIEVE_ATTEMPT"])
state, start = job.restore_or(lambda: {"x": jnp.zeros(2)})
for step in job.steps(start, int(os.environ.get("TOTAL", "30"))):
    state = {"x": state["x"] + 1}
    if os.environ.get("MODE") == "sigterm" and attempt == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGTERM)  # a laptop's `kill`: a notice
    if os.environ.get("MODE") == "user-exit" and step == 3:
        sys.exit(42)  # the program's own 'preemption' exit: nothing saved
    if step == start + 2:
        open(os.environ["MARK"], "w").close()
    if "AT" in os.environ:
        with open(os.environ["AT"], "w") as fh:
            fh.write(str(step))
    slow = "SLOW_FROM" in os.environ and step >= int(os.environ["SLOW_FROM"])
    time.sleep(60 if slow else float(os.environ.get("STEP_S", "0.01")))
    job.save(step, state)
print("DONE", attempt, float(state["x"][0]), flush=True)
"""


def _run_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    env.update({"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_TERMINATION_GRACE_SECONDS": "20",
                "REPRIEVE_SAVE_SECONDS_ESTIMATE": "20", "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
                "MARK": str(tmp_path / "running"), **extra})
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    return env


def test_run_restarts_after_a_saved_preemption_and_ends_with_the_script(tmp_path: Path) -> None:
    env = _run_env(tmp_path, MODE="sigterm")
    got = reprieve("run", "--", sys.executable, str(tmp_path / "train.py"), env=env)
    assert got.returncode == 0, got.stderr
    assert "DONE 2 30.0" in got.stdout, got.stdout + got.stderr  # attempt 2 resumed and counted every step once
    assert "attempt 1: the agreed checkpoint is committed: restart wanted; restarting" in got.stderr, got.stderr
    assert "attempt 2: starting process 0/1 cold" in got.stderr and "restored step" in got.stderr
    # issue 46: the agreed save of the notice said `final`, as if it were the run's last step
    listed = reprieve("ls", str(tmp_path / "ckpt"))
    agreed = [line for line in listed.stdout.splitlines() if line.split()[1:2] == ["1"]]  # attempt 1's save
    assert agreed and agreed[0].split()[2] == "preemption" and "final" not in listed.stdout, listed.stdout


def test_run_does_not_restart_an_exit_with_the_restart_code_that_saved_nothing(tmp_path: Path) -> None:
    got = reprieve("run", "--", sys.executable, str(tmp_path / "train.py"), env=_run_env(tmp_path, MODE="user-exit"))
    assert got.returncode == 42, got.stderr
    assert "ERROR attempt 1: exited with the restart code 42 WITHOUT an agreed save" in got.stderr, got.stderr
    assert "attempt 2" not in got.stderr


def test_run_stops_on_a_crash_with_its_code(tmp_path: Path) -> None:
    env = _run_env(tmp_path, TOTAL="not-a-number")
    got = reprieve("run", "--max-restarts", "3", "--", sys.executable, str(tmp_path / "train.py"), env=env)
    assert got.returncode == 1 and "failed with code 1; stopping, as the operator would" in got.stderr, got.stderr


@pytest.mark.parametrize("variable,value,words", [
    ("REPRIEVE_CHECKPOINT_INTERVAL_STEPS", "ten", "must be an integer >= 0, got 'ten'"),
    ("REPRIEVE_MEMORY_INTERVAL_STEPS", "x", "must be an integer >= 0, got 'x'"),
])
def test_a_bad_variable_is_one_line_and_exit_2_before_the_script_starts(tmp_path: Path, variable: str, value: str,
                                                                        words: str) -> None:
    """Each attempt's script ended in a ConfigError traceback and the loop exited 1 (issue 46)."""
    env = _run_env(tmp_path, **{variable: value, "REPRIEVE_MEMORY_DIR": str(tmp_path / "mem")})
    got = reprieve("run", "--", sys.executable, str(tmp_path / "train.py"), env=env)
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    errors = [line for line in got.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"{variable} {words}; nothing started" in errors[0], got.stderr
    assert "started trainer" not in got.stderr and not (tmp_path / "running").exists()


def _start_run(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([REPRIEVE, "run", "--", sys.executable, str(tmp_path / "train.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limit = time.monotonic() + 120
    while not (tmp_path / "running").exists():
        if proc.poll() is not None or time.monotonic() > limit:
            proc.kill()
            raise AssertionError(proc.communicate())
        time.sleep(0.05)
    return proc


def test_ctrl_c_saves_at_the_next_step_and_stops_with_130(tmp_path: Path) -> None:
    """Issue 46: with a save timed, Ctrl-C became a 30 s notice: a first save at once, then ~25 s more training
    before the final save and exit 42. Ctrl-C is a stop: the save is at the next step, the loop ends 130."""
    env = _run_env(tmp_path, TOTAL="100000", STEP_S="0.02", AT=str(tmp_path / "at"),
                   REPRIEVE_CHECKPOINT_INTERVAL_STEPS="25", REPRIEVE_CHECKPOINT_KEEP="1000")
    for name in ("REPRIEVE_TERMINATION_GRACE_SECONDS", "REPRIEVE_SAVE_SECONDS_ESTIMATE"):
        del env[name]  # the defaults: a 30 s grace, and the saves' own measured time
    proc = _start_run(tmp_path, env)
    try:
        limit = time.monotonic() + 60
        while len(_steps(tmp_path / "ckpt")) < 3:  # periodic saves are committed: the save time is measured
            assert proc.poll() is None and time.monotonic() < limit, proc.communicate()
            time.sleep(0.05)
        while not (text := (tmp_path / "at").read_text()):  # the worker rewrites it every step: caught mid-write
            time.sleep(0.01)
        at = int(text)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)  # the terminal's Ctrl-C reaches reprieve run (the trainer has its own group)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "SIGINT (Ctrl-C): stopping: the trainer saves at its next step" in err and "attempt 2" not in err, err
    assert "stopped by Ctrl-C: exiting with code 130" in err, err
    last = max(int(name.split("_")[1]) for name in _steps(tmp_path / "ckpt"))
    assert at <= last <= at + 25 and took < 10, (at, last, took, err)  # was ~25 s and ~1,200 steps later


def test_a_second_ctrl_c_kills_and_says_the_time_since_the_first(tmp_path: Path) -> None:
    env = _run_env(tmp_path, TOTAL="100000", SLOW_FROM="3")  # step 3 takes a minute: no save before the second
    proc = _start_run(tmp_path, env)
    try:
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    import re

    said = re.search(r"Ctrl-C: a second stop signal ([0-9.]+)s after the SIGINT: killing the trainer: sending "
                     r"SIGKILL", err)
    assert said is not None and 1.3 <= float(said.group(1)) <= 5, err  # it said "30s" 3 s after the first


def _steps(root: Path) -> list[Any]:
    return sorted(p.name for p in root.glob("step_*_a1"))


REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    """docs/runtime.md's quickstart script, its `reprieve run`, a SIGTERM to the pid `reprieve run` printed (its
    `kill -TERM`), the restart, and its three reading commands; the interrupted run ends with the same state as an
    uninterrupted one. Issue 46: its `pkill -xf 'python train.py'` signalled every such process of the user."""
    import threading

    import jax
    import jax.numpy as jnp
    import numpy as np
    from reprieve.checkpoint import CheckpointManager

    quick = (REPO / "docs/runtime.md").read_text().split("## Quickstart on a laptop", 1)[1].split("\n## ", 1)[0]
    script = re.search(r"```python\n(.*?)```", quick, re.DOTALL).group(1)  # type: ignore[union-attr]
    shell = "\n".join(re.findall(r"```bash\n(.*?)```", quick, re.DOTALL))
    assert "pkill" not in shell
    (said_pid,) = re.findall(r"^kill -TERM (\d+)", shell, re.MULTILINE)
    (printed,) = re.findall(r'"\.\.\. INFO (started trainer pid) ' + said_pid, shell)  # what stderr says
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    env.update({"JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"})
    for run in ("interrupted", "straight"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "train.py").write_text(script)
    straight = subprocess.Popen([sys.executable, "train.py"], cwd=tmp_path / "straight", env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.Popen([REPRIEVE, "run", "--", sys.executable, "train.py"], cwd=tmp_path / "interrupted",
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        limit = time.monotonic() + 120
        while not any("periodic saves are off" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < limit, "".join(lines)
            time.sleep(0.05)
        (line,) = [line for line in lines if printed in line]
        trainer = int(re.search(printed + r" (\d+):", line).group(1))  # type: ignore[union-attr]
        assert _children(proc.pid) == [trainer], line
        os.kill(trainer, signal.SIGTERM)  # the quickstart's `kill -TERM <that pid>`
        assert proc.wait(180) == 0, "".join(lines)
        assert straight.wait(180) == 0
    finally:
        for p in (proc, straight):
            if p.poll() is None:
                p.kill()
    reader.join(10)
    err = "".join(lines)
    assert "exiting with code 42" in err and "attempt 2: starting process 0/1 cold" in err, err
    assert re.search(r"restored step \d+ from .*checkpoints in [0-9.]+s: resuming at step \d+", err), err
    for command in ("ls", "inspect", "verify"):
        got = subprocess.run(
            [REPRIEVE, command, "./checkpoints"], cwd=tmp_path / "interrupted", env=env, capture_output=True,
            text=True, timeout=120, check=False)
        assert got.returncode == 0, (command, got.stdout, got.stderr)
    device = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    key = jax.eval_shape(lambda: jax.random.key(0))
    abstract = {"w": jax.ShapeDtypeStruct((8, 1), jnp.float32, sharding=sharding),
                "b": jax.ShapeDtypeStruct((1,), jnp.float32, sharding=sharding),
                "key": jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding)}
    finals = []
    for run in ("interrupted", "straight"):
        with CheckpointManager(str(tmp_path / run / "checkpoints"), attempt=99) as mgr:
            step, state, _ = mgr.restore(abstract)
        finals.append((step, np.asarray(state["w"]), np.asarray(state["b"]), np.asarray(jax.random.key_data(state["key"]))))
    assert finals[0][0] == finals[1][0] == 1999
    for a, b in zip(finals[0][1:], finals[1][1:], strict=True):
        np.testing.assert_array_equal(a, b)  # bit-identical to the uninterrupted run


def test_the_quickstart_installs_from_a_checkout() -> None:
    """Issue 46: the quickstart's first line, `pip install 'reprieve[runtime]'`, failed (not on the index). It clones
    the repository and installs that checkout, whose top-level pyproject is the `reprieve` distribution with the
    `runtime` extra (tests/test_packaging_integration.py builds and installs that wheel for real)."""
    import tomllib

    quick = (REPO / "docs/runtime.md").read_text().split("## Quickstart on a laptop", 1)[1].split("\n## ", 1)[0]
    shell = re.search(r"```bash\n(.*?)```", quick, re.DOTALL).group(1)  # type: ignore[union-attr]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (url,) = re.findall(r"^git clone (\S+)", shell, re.MULTILINE)
    assert url == project["urls"]["Homepage"]
    (target,) = re.findall(r"pip install '(\S+)'", shell)
    assert target == f"./{url.rsplit('/', 1)[1]}[runtime]", target  # the clone's directory, not the index
    assert project["name"] == "reprieve" and "runtime" in project["optional-dependencies"]


# -- issue 46: the reprieve command's words --------------------------------------------------------------------------


def _truncate_a_chunk(ckpt: Path) -> Path:
    chunk = min(p for p in (ckpt / "arrays").rglob("*") if p.is_file() and "/c/" in str(p))
    chunk.write_bytes(chunk.read_bytes()[:-9])
    return chunk


def test_ls_calls_a_truncated_checkpoint_damaged_and_verify_all_finds_it(tmp_path: Path) -> None:
    """`reprieve ls` called a checkpoint with a truncated chunk `complete` and said a restore takes it; `verify` had no
    --all."""
    root = tmp_path / "ckpt"
    _save(root, [2, 5])
    chunk = _truncate_a_chunk(root / "step_0000000005_a1")
    ls = reprieve("ls", str(root))
    assert ls.returncode == 0, ls.stderr
    row = next(line for line in ls.stdout.splitlines() if line.startswith("5 "))
    assert "damaged" in row and "complete" not in row, ls.stdout
    assert "a restore takes step 2 (step_0000000002_a1) unless a chunk fails its checksum" in ls.stdout
    key = f"step_0000000005_a1/{chunk.relative_to(root / 'step_0000000005_a1')}"
    assert re.search(rf"damaged step_0000000005_a1: leaf \S+: chunk {key} holds \d+ bytes, \d+ expected", ls.stdout), \
        ls.stdout
    listed = json.loads(reprieve("ls", str(root), "--json").stdout)
    assert listed["latest"] == "step_0000000002_a1" and listed["sizes_checked"] is True
    assert [c["state"] for c in listed["checkpoints"]] == ["complete", "damaged"]

    every = reprieve("verify", "--all", str(root))
    assert every.returncode == 1, every.stdout + every.stderr
    assert "step_0000000002_a1: OK" in every.stdout and "step_0000000005_a1: CORRUPT" in every.stdout
    assert "2 checkpoint(s) verified: 1 corrupt (step_0000000005_a1)" in every.stdout
    report = json.loads(reprieve("verify", "--all", "--json", str(root)).stdout)
    assert [(c["name"], c["ok"]) for c in report["checkpoints"]] == [("step_0000000002_a1", True),
                                                                     ("step_0000000005_a1", False)]
    both = reprieve("verify", "--all", f"{root}@2")
    assert both.returncode == 2 and "--all verifies every checkpoint under a root" in both.stderr


def test_ls_defaults_to_the_jobs_checkpoint_uri(tmp_path: Path) -> None:
    _save(tmp_path / "checkpoints", [1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    here = subprocess.run([REPRIEVE, "ls"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert here.returncode == 0 and here.stdout.startswith(f"{tmp_path / 'checkpoints'}:"), here.stdout + here.stderr
    elsewhere = subprocess.run([REPRIEVE, "ls"], cwd="/", capture_output=True, text=True, timeout=120, check=False,
                               env={**env, "REPRIEVE_CHECKPOINT_URI": str(tmp_path / "checkpoints")})
    assert elsewhere.returncode == 0 and "a restore takes step 1" in elsewhere.stdout, elsewhere.stderr
    assert subprocess.run([REPRIEVE, "verify"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False).returncode == 0


ORBAX_TRAIN = """
import jax.numpy as jnp
import reprieve
from reprieve.orbax import OrbaxCheckpointer

with reprieve.init(install_sigterm=False, checkpointer=lambda cfg, coord: OrbaxCheckpointer(
        cfg.checkpoint_uri, coordinator=coord, attempt=cfg.attempt)) as job:
    state, start = job.restore_or(lambda: {"w": jnp.zeros((4, 4))})
    for step in job.steps(start, 4):
        job.save(step, state, force=step == 1, data={"pos": step})
"""


def test_the_command_lists_and_inspects_orbax_format_roots(tmp_path: Path) -> None:
    """The directories reprieve.orbax writes were refused (exit 2, "use Orbax's tools": Orbax has none)."""
    pytest.importorskip("orbax.checkpoint")
    root = tmp_path / "ob"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    env.update({"REPRIEVE_CHECKPOINT_URI": str(root), "REPRIEVE_RUN_ID": "r1", "JAX_PLATFORMS": "cpu"})
    trained = subprocess.run([sys.executable, "-c", ORBAX_TRAIN], env=env, capture_output=True, text=True,
                             timeout=180, check=False)
    assert trained.returncode == 0, trained.stderr[-3000:]
    ls = reprieve("ls", str(root))
    assert ls.returncode == 0, ls.stderr
    assert ls.stdout.startswith(f"{root}: reprieve.orbax.OrbaxCheckpointer's checkpoints (Orbax's format)")
    steps = {line.split()[0]: line.split() for line in ls.stdout.splitlines()[2:4]}
    assert steps["1"][1:4] == ["1", "forced", "complete"] and steps["3"][1:5] == ["1", "last", "step", "complete"]
    assert " r1" in ls.stdout and "a restore takes step 3" in ls.stdout
    listed = json.loads(reprieve("ls", "--json", str(root)).stdout)
    assert listed["format"] == "orbax" and [c["step"] for c in listed["checkpoints"]] == [1, 3]
    inspect = reprieve("inspect", f"{root}@1")
    assert inspect.returncode == 0, inspect.stderr
    assert "step 1, attempt 1, kind forced" in inspect.stdout and "run: r1" in inspect.stdout
    assert "data position of process 0: {'pos': 1}" in inspect.stdout
    assert "items: reprieve (JsonCheckpointHandler), state (StandardCheckpointHandler)" in inspect.stdout
    assert json.loads(reprieve("inspect", "--json", str(root)).stdout)["step"] == 3
    verify = reprieve("verify", str(root))
    assert verify.returncode == 2 and "restore it with Orbax" in verify.stderr, verify.stderr
