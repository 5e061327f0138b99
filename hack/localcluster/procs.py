"""The local cluster's processes: how one is started (its log under the cluster's ``logs/``), waited for and
stopped, and the few helpers every tier shares (the cache directory, a free port, the error).

The control plane (:mod:`.cluster`), the real-node tier (:mod:`.realnodes`) and the registry (:mod:`.registry`)
each start processes with :func:`spawn` and stop them with :func:`terminate`; none of them imports another to do
so, which keeps the arrows one way: ``cluster -> realnodes -> registry -> procs``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("localcluster")

REPO = Path(__file__).resolve().parents[2]


class ClusterError(RuntimeError):
    """The local cluster could not be built, started or reached. The message says what to do."""


def cache_dir() -> Path:
    base = os.environ.get("REPRIEVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "reprieve")
    return Path(base)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str, *, interval: float = 0.1,
               on_timeout: Callable[[], str] | None = None) -> None:
    """Poll ``check`` until true; ClusterError naming ``what`` (and extra context) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except ClusterError:
            raise
        except Exception as err:  # noqa: BLE001 - a probe that errors is a probe that is not ready yet
            log.debug("%s: %s", what, err)
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


@dataclass
class Proc:
    """A process the cluster started: its name, handle and log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n".join(text)


def spawn(log_dir: Path, name: str, args: list[str], env: dict[str, str] | None = None,
          pass_fds: tuple[int, ...] = ()) -> Proc:
    """Start ``args`` in a session of its own (so :func:`terminate` reaches its children), its output appended to
    ``<log_dir>/<name>.log``."""
    log_path = log_dir / f"{name}.log"
    out = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
    popen = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env, pass_fds=pass_fds)
    out.close()
    return Proc(name, popen, log_path)


def killpg(popen: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        pass


def terminate(popen: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the process's group, SIGKILL after ``grace`` seconds."""
    if popen.poll() is not None:
        return
    killpg(popen, signal.SIGTERM)
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        killpg(popen, signal.SIGKILL)
        popen.wait(10)


def hack_env() -> dict[str, str]:
    """This environment with ``hack/`` on PYTHONPATH (for ``python -m localcluster.<module>`` children)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "hack"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
