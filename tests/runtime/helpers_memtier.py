"""Launching real gangs of ``workers/memtier_worker.py`` with the memory tier: pods (a memory directory on tmpfs and
a replica server port each, as a pod's emptyDir and pod IP would be), pairings, attempts, and the checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.runtime.helpers_agreement import REPO, Gang, free_port
from tests.runtime.workers.memtier_worker import expected

WORKER = Path(__file__).resolve().parent / "workers" / "memtier_worker.py"
LAUNCHED: list[Gang] = []  # every gang launch() started: the tests' fixture kills what a failed test left behind


@dataclass
class Pod:
    """What outlives a trainer process in a pod: its memory directory and the port its replica server uses."""

    name: str
    mem: Path
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def lose(self) -> None:
        """The node is gone: so is the pod's memory."""
        shutil.rmtree(self.mem, ignore_errors=True)


def storage_steps(workdir: Path) -> list[int]:
    """The steps of the storage checkpoints under ``workdir/ckpt`` (``step_<step>_a<attempt>``)."""
    ckpt = workdir / "ckpt"
    names = [p.name for p in ckpt.iterdir()] if ckpt.exists() else []
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"step_(\d+)_a\d+", n)))


def shm_base(tmp_path: Path) -> Path:
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else tmp_path
    d = base / f"reprieve-memtier-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    return d


def new_pod(base: Path, name: str) -> Pod:
    mem = base / name
    mem.mkdir()
    return Pod(name, mem, free_port())


def launch(workdir: Path, pods: list[Pod], peers: dict[int, Pod | None], *, attempt: int, steps: int = 30,
           stop_at: int = -1, hold_at: int = -1, mem_every: int = 5, ckpt_every: int = 10,
           extra: dict[int, dict[str, str]] | None = None, worker: Path = WORKER) -> Gang:
    """Process ``i`` runs in ``pods[i]`` and sends its copies to ``peers[i]``; ``worker``: the script (default
    workers/memtier_worker.py)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs, logs = [], []
    for i, pod in enumerate(pods):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "KUBERNETES_", "WORKER_"))}
        env.update({
            "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
            "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
            "REPRIEVE_NUM_PROCESSES": str(len(pods)), "REPRIEVE_PROCESS_ID": str(i),
            "REPRIEVE_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "REPRIEVE_POD_IP": "127.0.0.1",
            "REPRIEVE_ATTEMPT": str(attempt), "REPRIEVE_CHECKPOINT_URI": str(workdir / "ckpt"),
            "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": str(ckpt_every), "REPRIEVE_HEARTBEAT_TIMEOUT_SECONDS": "3",
            "REPRIEVE_SHUTDOWN_TIMEOUT_SECONDS": "10", "REPRIEVE_AGREEMENT_TIMEOUT_SECONDS": "30",
            "REPRIEVE_NOTICE_POLL_SECONDS": "0.2", "REPRIEVE_SAVE_SECONDS_ESTIMATE": "1",
            "REPRIEVE_MEMORY_DIR": str(pod.mem), "REPRIEVE_MEMORY_PORT": str(pod.port),
            "REPRIEVE_MEMORY_INTERVAL_STEPS": str(mem_every),
            "WORKER_DIR": str(workdir), "WORKER_STEPS": str(steps), "WORKER_STOP_AT": str(stop_at),
            "WORKER_HOLD_AT": str(hold_at),
        })
        peer = peers.get(i)
        if peer is not None:
            env["REPRIEVE_MEMORY_PEER"] = peer.address
        env.update((extra or {}).get(i, {}))
        log_path = workdir / f"a{attempt}-worker-{i}.log"
        logs.append(log_path)
        with open(log_path, "wb") as out:
            procs.append(subprocess.Popen([sys.executable, str(worker)], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=str(workdir)))
    gang = Gang(workdir, procs, logs)
    LAUNCHED.append(gang)
    return gang


def kill_launched() -> None:
    """Kill every gang still running (a test that failed half-way leaves hanging workers otherwise)."""
    while LAUNCHED:
        LAUNCHED.pop().kill()


def run_until_stopped(gang: Gang, n: int, *, die: int = -1, timeout_s: float = 120) -> None:
    """Wait until every process stopped at its step, SIGKILL process ``die`` (its node lost without notice: only
    now, so that no survivor is aborted by the coordination service before it stopped), then kill the gang: the
    operator's restart after the loss."""
    limit = time.monotonic() + timeout_s
    for i in range(n):
        marker = gang.workdir / f"stopped-{i}"
        while not marker.exists():
            if time.monotonic() > limit or gang.procs[i].poll() is not None:
                gang.kill()
                raise AssertionError(f"process {i} never stopped\n{gang.tail(40)}")
            time.sleep(0.05)
    if die >= 0:
        gang.procs[die].kill()
        assert gang.procs[die].wait(30) == -9, gang.tail(40)
    gang.kill()
    for i in range(n):
        (gang.workdir / f"stopped-{i}").unlink()


def finish(gang: Gang, n: int, total: int, timeout_s: float = 180) -> list[dict[str, Any]]:
    """Every process ends 0 with the uninterrupted run's parameters and data position; their reports."""
    codes = gang.wait(timeout_s)
    assert codes == [0] * n, gang.tail(40)
    want = expected(total, n)
    out = []
    for i in range(n):
        final = json.loads((gang.workdir / f"final-{i}.json").read_text())
        lo, hi = final["rows"]
        assert final["w"] == want["w"][lo:hi], f"process {i}: parameters differ from an uninterrupted run"
        assert (final["b"], final["n"], final["taken"]) == (want["b"], want["n"], total), final
        out.append(final)
    return out


class FakeTier:
    """A memory tier (``reprieve.targets.Tier``) without memory: its schedule says ``due_at``, a copy is ``busy``
    (still in the background) or ``broken`` (a full /dev/shm); it records the copies asked of it (``saves``:
    ``(step, kind)``) and the waits, and restores from storage (nothing in memory)."""

    restored_from = None
    off = None  # the tier never switches itself off

    def __init__(self, *, due_at: frozenset[int] = frozenset(), busy: bool = False, broken: bool = False,
                 node: str | None = None, peer_node: str | None = None) -> None:
        from reprieve.memtier import MemoryConfig

        self.cfg = MemoryConfig(directory="/nonexistent/fake-tier", node=node)
        self.due_at, self._busy, self.broken = due_at, busy, broken
        self.saves: list[tuple[int, str]] = []
        self.notices: dict[int, str | None] = {}  # step -> the notice its copy records (None: none)
        self.peer_node = peer_node
        self.kept_here: int | None = None  # keep_here(): the agreed step not sent to the noticed peer
        self.waits: list[float | None] = []
        self.capped_by: tuple[int, float] | None = None
        self.left: tuple[int, set[str | None]] | None = None  # leaving(): the agreed step and the noticed nodes

    def begin(self, start: int, *, storage_steps: int = 0, storage_seconds: float = 0.0) -> None:
        self.capped_by = (storage_steps, storage_seconds)

    def due(self, step: int, step_seconds: float | None) -> bool:
        return step in self.due_at

    def save(self, step: int, state: Any, *, extra: dict[str, Any], process_extra: Any = None) -> bool:
        assert extra["reprieve"]["step"] == step
        if self.broken:
            raise OSError(28, "No space left on device")
        self.saves.append((step, extra["reprieve"]["kind"]))
        self.notices[step] = extra["reprieve"].get("notice")  # only an agreed step's copy marks its notice
        return True

    def wait(self, timeout_s: float | None = None) -> None:
        self.waits.append(timeout_s)

    def busy(self) -> bool:
        return self._busy

    def restore(self, storage: Any, abstract: Any, check: Any) -> Any:
        return storage.restore(abstract, step=None)

    def gang_step(self) -> int | None:
        return None

    def holds(self, step: int) -> bool:
        return not self._busy and any(s == step for s, _ in self.saves)

    def outlives(self, doomed: Any) -> str | None:
        from reprieve.memtier.decide import outlives_notice

        return outlives_notice(node=self.cfg.node, peer_node=self.peer_node, doomed=doomed, here=True, at_peer=True)

    def keep_here(self, step: int) -> None:
        self.kept_here = step

    def wait_here(self, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        return True

    def committed_here(self, step: int) -> bool:
        return any(s == step for s, _ in self.saves)

    def join_watcher(self, timeout_s: float) -> None:
        pass

    def leaving(self, step: int, doomed: Any) -> None:
        self.left = (step, set(doomed))

    def wait_exit(self, timeout_s: float) -> tuple[str, bool]:
        self.waits.append(timeout_s)
        return "everywhere", not self._busy

    def close(self, *, finished: bool = False) -> None:
        pass
