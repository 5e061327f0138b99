"""The wheels, built for real with pip (tests/test_packaging.py checks the pyprojects without building)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

from releaseio import build_wheels


def test_wheels_hold_what_they_promise(tmp_path: Path) -> None:
    """Built for real: the runtime wheel has its version and py.typed and no operator or console script; the
    operator wheel has the command, py.typed and the PodSpec schema crdgen embeds."""
    import zipfile

    build_wheels([REPO, REPO / "operator"], tmp_path)
    runtime = zipfile.ZipFile(next(tmp_path.glob("reprieve-*.whl")))
    operator = zipfile.ZipFile(next(tmp_path.glob("reprieve_operator-*.whl")))
    rnames, onames = runtime.namelist(), operator.namelist()
    assert "reprieve/py.typed" in rnames and "reprieve/checkpoint/manager.py" in rnames
    assert not any(n.startswith("reprieve_operator/") for n in rnames)
    rentry = runtime.read(next(n for n in rnames if n.endswith("entry_points.txt"))).decode()
    assert "reprieve-supervisor = reprieve.supervisor:main" in rentry and "reprieve-operator" not in rentry
    assert "reprieve = reprieve.cli:main" in rentry
    assert {"reprieve_operator/py.typed", "reprieve_operator/podspec_schema.json",
            "reprieve_operator/policy/restart.py"} <= set(onames)
    entry = operator.read(next(n for n in onames if n.endswith("entry_points.txt"))).decode()
    assert "reprieve-operator = reprieve_operator.__main__:main" in entry
    assert not any(n.startswith("reprieve/") for n in onames)


@pytest.mark.timeout(600)
def test_a_fresh_install_of_the_wheel_runs_the_reprieve_command(tmp_path: Path) -> None:
    """The wheel as a user gets it, in a virtualenv of its own (not the source tree): its `reprieve` reads a
    checkpoint and runs a script through a preemption and a restart, its `reprieve-supervisor` answers. The packages the
    runtime needs (jax, tensorstore, numpy) come from this venv through a .pth path, offline; reprieve itself
    from the wheel only (the source tree's editable hook is not on that path)."""
    import os
    import signal
    import subprocess
    import sys
    import sysconfig
    import textwrap

    build_wheels([REPO], tmp_path / "dist")
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True, capture_output=True)
    py, bin_ = str(fresh / "bin" / "python"), fresh / "bin"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(next((tmp_path / "dist").glob("reprieve-*.whl")))], check=True, capture_output=True)
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    Path(site, "dependencies-from-the-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "PYTHONPATH"))}
    env.update({"JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"})
    where = subprocess.run([py, "-c", "import reprieve; print(reprieve.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(fresh)), where

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env={**env, **extra}, cwd=tmp_path, capture_output=True, text=True,
                              timeout=240, check=False)

    assert run(str(bin_ / "reprieve"), "--version").stdout.strip() == "reprieve 0.1.0"
    assert "contract 1" in run(str(bin_ / "reprieve-supervisor"), "--version").stdout
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import os, signal, time
        import jax.numpy as jnp
        import reprieve

        job = reprieve.init()
        state, start = job.restore_or(lambda: {"x": jnp.zeros(2)})
        for step in job.steps(start, 20):
            state = {"x": state["x"] + 1}
            if os.environ["REPRIEVE_ATTEMPT"] == "1" and step == 4:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            job.save(step, state)
        print("DONE", os.environ["REPRIEVE_ATTEMPT"], float(state["x"][0]))
    '''))
    ckpt = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_SAVE_SECONDS_ESTIMATE": "20"}
    loop = run(str(bin_ / "reprieve"), "run", "--", py, "train.py", **ckpt)
    assert loop.returncode == 0 and "DONE 2 20.0" in loop.stdout, loop.stdout + loop.stderr
    listed = run(str(bin_ / "reprieve"), "ls", "ckpt")
    assert listed.returncode == 0 and "a restore takes step 19" in listed.stdout, listed.stdout + listed.stderr
    assert run(str(bin_ / "reprieve"), "verify", "ckpt").returncode == 0
    assert signal.SIGTERM  # the script's notice came from signal.SIGTERM, as a laptop's `kill` sends
