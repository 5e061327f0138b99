"""Launch N worker processes with a free port and a hard timeout (helper for the tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).resolve().parent
REPO = WORKERS.parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e["JAX_PLATFORMS"] = "cpu"
    e["PYTHONPATH"] = os.pathsep.join([str(REPO / "runtime"), str(WORKERS), e.get("PYTHONPATH", "")])
    e.pop("XLA_FLAGS", None)
    e.update(extra or {})
    return e


def run_gang(nproc: int, args: list[str], *, devices: int | None = 1, timeout: float = 120.0,
             per_process_env: dict[int, dict[str, str]] | None = None,
             worker: str = "mp_worker.py") -> list[tuple[int, str]]:
    """Run ``worker`` (``mp_worker.py``) as an ``nproc`` gang; returns ``[(returncode, output)]`` per process.
    ``devices``: passed as ``--devices`` (None: not passed)."""
    port = free_port()
    procs = []
    for pid in range(nproc):
        cmd = [sys.executable, str(WORKERS / worker), "--port", str(port), "--nproc", str(nproc),
               "--pid", str(pid), *([] if devices is None else ["--devices", str(devices)]), *args]
        procs.append(subprocess.Popen(cmd, env=env((per_process_env or {}).get(pid)), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    out = []
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            stdout, _ = p.communicate()
            stdout += "\n<killed: timeout>"
        out.append((p.returncode, stdout))
    return out
