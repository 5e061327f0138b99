"""reprieve.console: the lifecycle lines reach a program that configured no logging, and only such a program.

Real processes (logging is process-wide state; pytest's own handlers sit on the root logger here): a small
training script run with ``python -c``, a SIGTERM it sends itself, the exit with the restart code and a resume.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from reprieve.console import logging_is_default

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# A user's script: nothing about logging unless PRELUDE says so. SIGTERM at step 3 (a laptop's `kill`).
SCRIPT = """
import os, signal, sys, time
{prelude}
import jax.numpy as jnp
import reprieve
{after_import}
job = reprieve.init()
{after_init}
state, start = job.restore_or(lambda: {{"w": jnp.zeros(4)}}, None)
for step in job.steps(start, 2000 if start == 0 else start + 3):
    state = {{"w": state["w"] + 1}}
    if step == 3 and start == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)
    job.save(step, state)
"""


def _run(tmp_path: Path, *, prelude: str = "", after_import: str = "", after_init: str = "",
         **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    env.update({"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_TERMINATION_GRACE_SECONDS": "20",
                "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", **extra})
    code = textwrap.dedent(SCRIPT).format(prelude=prelude, after_import=after_import, after_init=after_init)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False, cwd=str(tmp_path))


LIFECYCLE = [r"reprieve: notice sigterm/local/0 via sigterm", r"reprieve: saving agreed step (\d+) ",
             r"reprieve: checkpoint step (\d+) committed",
             r"reprieve: exiting with code 42: the agreed checkpoint of step (\d+) is committed, restart wanted"]


CONSOLE = re.compile(r"^\d\d:\d\d:\d\d reprieve", re.MULTILINE)  # a line in reprieve.console's format


def _lifecycle(stderr: str) -> set[str]:
    """The steps the lifecycle lines name (one: the agreed step); fails when one of the lines is missing."""
    steps = set()
    for line in LIFECYCLE:
        found = re.search(line, stderr)
        assert found, f"{line!r} not in:\n{stderr}"
        steps.update(found.groups())
    return steps


def test_a_script_without_logging_set_up_shows_the_lifecycle_and_the_resume(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert first.returncode == 42, first.stderr
    (step,) = _lifecycle(first.stderr)
    assert "reprieve: no checkpoint under" in first.stderr and "reprieve: reprieve:" not in first.stderr
    again = _run(tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"reprieve: restored step {step} from" in again.stderr, again.stderr
    assert f"resuming at step {int(step) + 1}" in again.stderr, again.stderr


def test_orbax_imported_first_does_not_silence_it(tmp_path: Path) -> None:
    """absl's first log call runs logging.basicConfig() by itself (Orbax's import makes it): still the default."""
    run = _run(tmp_path, prelude="import orbax.checkpoint")
    assert run.returncode == 42, run.stderr
    assert len(_lifecycle(run.stderr)) == 1


@pytest.mark.parametrize("where", ["prelude", "after_init"])
def test_a_program_that_configured_logging_sees_what_it_configured(tmp_path: Path, where: str) -> None:
    """WARNING and a format of its own, before reprieve.init() or after it: no INFO line, none in reprieve's
    format; a WARNING passes, in the program's format."""
    setup = "import logging; logging.basicConfig(level=logging.WARNING, format='APP %(name)s %(message)s')"
    warn = "logging.getLogger('reprieve.job').warning('a warning of the runtime')"
    if where == "prelude":
        run = _run(tmp_path, prelude=setup, after_init=warn)
    else:
        run = _run(tmp_path, after_init=f"{setup}\n{warn}")
    assert run.returncode == 42, run.stderr
    configured = run.stderr[run.stderr.index("APP "):]  # init()'s own line came before a later configuration
    assert "notice sigterm" not in run.stderr and not CONSOLE.search(configured), run.stderr
    assert run.stderr.count("APP reprieve.job a warning of the runtime") == 1, run.stderr


def test_a_level_the_program_set_below_reprieve_decides_for_that_logger(tmp_path: Path) -> None:
    """Root at WARNING, ``reprieve.job`` at INFO: reprieve.job's INFO lines pass (once, in the program's format), as
    they would with no reprieve handler; other reprieve loggers' INFO lines do not. (The console handler had
    dropped them below the root's level: a test's ``caplog.at_level(INFO, logger="reprieve.job")`` saw nothing
    once an earlier test in its process had installed the handler.)"""
    setup = ("import logging; logging.basicConfig(level=logging.WARNING, format='APP %(name)s %(message)s'); "
             "logging.getLogger('reprieve.job').setLevel(logging.INFO)")
    run = _run(tmp_path, prelude=setup)
    assert run.returncode == 42, run.stderr
    assert run.stderr.count("APP reprieve.job exiting with code 42") == 1, run.stderr
    others = re.findall(r"^APP (reprieve\.(?!job )\S+)", run.stderr, re.MULTILINE)  # e.g. the notice, the commit
    assert others == [] and "via sigterm" not in run.stderr and not CONSOLE.search(run.stderr), run.stderr


def test_a_program_at_info_gets_each_line_once_in_its_own_format(tmp_path: Path) -> None:
    run = _run(tmp_path, prelude="import logging; logging.basicConfig(level=logging.INFO, format='APP %(message)s')")
    assert run.returncode == 42, run.stderr
    assert run.stderr.count("APP exiting with code 42") == 1 and not CONSOLE.search(run.stderr), run.stderr


def test_the_reprieve_logger_set_by_the_program_is_left_alone(tmp_path: Path) -> None:
    run = _run(tmp_path, prelude="import logging; logging.getLogger('reprieve').setLevel(logging.WARNING)")
    assert run.returncode == 42 and "notice sigterm" not in run.stderr and "exiting with code" not in run.stderr, \
        run.stderr


def _root(level: int, *handlers: logging.Handler) -> logging.Logger:
    root = logging.Logger("root-like", level)  # noqa: LOG001 - a stand-in for the root logger, never registered
    for h in handlers:
        root.addHandler(h)
    return root


def _basic() -> logging.Handler:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    return h


def _formatted() -> logging.Handler:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(message)s"))
    return h


@pytest.mark.parametrize("root,default", [
    (_root(logging.WARNING), True),  # nothing configured
    (_root(logging.WARNING, _basic()), True),  # a bare basicConfig() (absl's own)
    (_root(logging.INFO, _basic()), False),  # basicConfig(level=INFO)
    (_root(logging.WARNING, _formatted()), False),  # a format of the program's
    (_root(logging.WARNING, logging.FileHandler(os.devnull)), False),  # a log file
    (_root(logging.WARNING, logging.StreamHandler(sys.stdout)), False),
    (_root(logging.DEBUG), False),
])
def test_logging_is_default(root: logging.Logger, default: bool) -> None:
    assert logging_is_default(root) is default


def test_a_misspelt_variable_is_warned_about_with_the_closest_name(tmp_path: Path) -> None:
    """REPRIEVE_CHECKPOINT_INTERVAL=5 was ignored in silence: periodic saves stayed off."""
    run = _run(tmp_path, REPRIEVE_CHECKPOINT_INTERVL_STEPS="5")
    assert run.returncode == 42, run.stderr
    assert ("reprieve WARNING: REPRIEVE_CHECKPOINT_INTERVL_STEPS is set, but reprieve reads no variable of that "
            "name; it is ignored: did you mean REPRIEVE_CHECKPOINT_INTERVAL_STEPS?") in run.stderr, run.stderr
