"""Helpers for the runtime's multi-process tests: a real file checkpointer and a process launcher.

:class:`FileCheckpointer` writes real files (one fsynced ``.npz`` per process and step) and commits through a
real coordination-service barrier, with the same interface as ``reprieve.checkpoint.CheckpointManager``; it
lets the agreement tests run before (and independently of) the checkpoint module.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "workers" / "train_worker.py"
Knob = TypeVar("Knob", int, float, bool)


class FileCheckpointer:
    """``save`` copies to host and returns; a thread writes ``step_<S>/proc_<p>.npz``, waits at a barrier
    of all processes, and process 0 writes ``step_<S>/COMMITTED``. One save in flight at a time."""

    def __init__(self, root: str, coordinator: Any, *, attempt: int = 1, save_delay_s: float = 0.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.coordinator = coordinator
        self.attempt = attempt
        self.save_delay_s = save_delay_s
        self.last_save_seconds: float | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None:
        import jax

        self.wait()
        start = time.monotonic()
        leaves, _ = jax.tree_util.tree_flatten_with_path(state)
        arrays = {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf)) for path, leaf in leaves}
        if self.save_delay_s:  # a slow device-to-host copy: the window in which a notice lands mid-save
            (self.root / f"saving-{self.coordinator.process_id}-{step}").touch()
            time.sleep(self.save_delay_s)
        self._thread = threading.Thread(target=self._commit, args=(step, arrays, extra or {}, start),
                                        daemon=True)
        self._thread.start()

    def _commit(self, step: int, arrays: dict[str, np.ndarray], extra: dict[str, Any], start: float) -> None:
        try:
            pid = self.coordinator.process_id
            directory = self.root / f"step_{step}"
            directory.mkdir(exist_ok=True)
            tmp = directory / f".proc_{pid}.npz.tmp"
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, directory / f"proc_{pid}.npz")
            _fsync_dir(directory)
            self.coordinator.barrier(f"test-ckpt/{self.attempt}/{step}", 60.0)
            if pid == 0:
                marker = directory / "COMMITTED"
                with open(marker, "w") as fh:
                    json.dump({"step": step, "time": time.time(), "extra": extra}, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                _fsync_dir(directory)
            # every process leaves only once the marker exists: "committed on all processes"
            self.coordinator.barrier(f"test-ckpt-done/{self.attempt}/{step}", 60.0)
            self.last_save_seconds = time.monotonic() - start
        except BaseException as err:  # noqa: BLE001 - surfaced by wait()
            self._error = err

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"checkpoint commit failed: {err}") from err

    def latest_step(self) -> int | None:
        steps = [int(p.parent.name[5:]) for p in self.root.glob("step_*/COMMITTED")]
        return max(steps) if steps else None

    def restore(self, abstract_state: Any, *, step: int | None = None) -> tuple[int, Any, dict[str, Any]]:
        import jax

        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no committed checkpoint under {self.root}")
        directory = self.root / f"step_{step}"
        with np.load(directory / f"proc_{self.coordinator.process_id}.npz") as data:
            leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
            values = [data[jax.tree_util.keystr(path)] for path, _ in leaves]
        extra = json.loads((directory / "COMMITTED").read_text())["extra"]
        return step, jax.tree_util.tree_unflatten(treedef, values), extra

    def close(self) -> None:
        self.wait()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- launching real processes -----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gang:
    """N worker processes of one job, with their logs and checkpoint directory."""

    workdir: Path
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    started: float = field(default_factory=time.monotonic)
    supervisor_ends: list[socket.socket] = field(default_factory=list)  # launch(supervised=True)

    def supervisor_events(self, index: int) -> list[dict[str, Any]]:
        """Every event line process ``index`` sent its supervisor (what ``reprieve-supervisor`` reads); call after it
        ended (the stand-in supervisor's end of the socket is read to its close)."""
        end, data = self.supervisor_ends[index], b""
        end.settimeout(5.0)
        while chunk := end.recv(65536):
            data += chunk
        return [json.loads(line) for line in data.splitlines()]

    @property
    def ckpt(self) -> Path:
        return self.workdir / "ckpt"

    def wait(self, timeout_s: float) -> list[int]:
        """Exit codes of all processes; kills the stragglers and fails loudly after ``timeout_s``."""
        limit = time.monotonic() + timeout_s
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, limit - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"worker pid {p.pid} still running after {timeout_s}s\n{self.tail()}")
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)

    def signal(self, index: int, sig: int = signal.SIGTERM) -> None:
        self.procs[index].send_signal(sig)

    def tail(self, lines: int = 25) -> str:
        out = []
        for i, path in enumerate(self.logs):
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"--- process {i} ---\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def signal_when_running(self, index: int, sig: int, timeout_s: float) -> list[int]:
        """Once process 0 trains (``running-0``), send ``sig`` to process ``index``; the exit codes of all (every
        process is killed on the way out, whatever happened)."""
        try:
            self.wait_for_file("running-0", timeout_s)
            self.signal(index, sig)
            return self.wait(timeout_s)
        finally:
            self.kill()

    def assert_resumed(self, step: int, timeout_s: float) -> None:
        """Every process ends with 0 within ``timeout_s``, each having resumed at ``step + 1``."""
        try:
            assert self.wait(timeout_s) == [0] * len(self.procs), self.tail()
        finally:
            self.kill()
        for log in self.logs:
            assert f"resuming at step {step + 1}" in log.read_text(), self.tail()

    def wait_for_file(self, name: str, timeout_s: float) -> None:
        limit = time.monotonic() + timeout_s
        while not (self.workdir / name).exists():
            if time.monotonic() > limit or any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"{name} did not appear within {timeout_s}s\n{self.tail()}")
            time.sleep(0.05)

    def saved(self) -> dict[int, dict[int, float]]:
        """``{step: {process: x[0]}}`` for every committed step (x counts the steps trained)."""
        result: dict[int, dict[int, float]] = {}
        for marker in self.ckpt.glob("step_*/COMMITTED"):
            step = int(marker.parent.name[5:])
            result[step] = {}
            for npz in marker.parent.glob("proc_*.npz"):
                with np.load(npz) as data:
                    result[step][int(npz.stem[5:])] = float(data["['x']"][0])
        return result

    def committed_at(self, step: int) -> float:
        return float(json.loads((self.ckpt / f"step_{step}" / "COMMITTED").read_text())["time"])


def launch(workdir: Path, n: int, *, steps: int = 400, step_seconds: float = 0.02, interval: int = 0,
           grace_seconds: float = 30.0, save_delay: float = 0.0, notice_file: bool = False,
           heartbeat_s: int = 10, extra_env: dict[str, str] | None = None, bare: bool = False,
           worker: Path = WORKER, supervised: bool = False,
           process_env: dict[int, dict[str, str]] | None = None) -> Gang:
    """Start ``n`` workers (``worker``, default tests/runtime/workers/train_worker.py) as one real
    ``jax.distributed`` job.

    ``bare``: one process with no contract variable but the checkpoint URI (a laptop, not a pod).
    ``supervised``: each process gets a supervisor socket (``REPRIEVE_SUPERVISOR_FD``) whose other end the test
    reads (:meth:`Gang.supervisor_events`), as ``reprieve-supervisor`` would.
    ``process_env``: variables for one process only (process index -> variables), after ``extra_env``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs, logs, ends = [], [], []
    for i in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "KUBERNETES_"))}
        env.update({
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")]),  # this checkout's runtime
            "PYTHONUNBUFFERED": "1",
            "REPRIEVE_NUM_PROCESSES": str(n),
            "REPRIEVE_PROCESS_ID": str(i),
            "REPRIEVE_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "REPRIEVE_POD_IP": "127.0.0.1",
            "REPRIEVE_CHECKPOINT_URI": str(workdir / "ckpt"),
            "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": str(interval),
            "REPRIEVE_TERMINATION_GRACE_SECONDS": str(grace_seconds),
            "REPRIEVE_HEARTBEAT_TIMEOUT_SECONDS": str(heartbeat_s),
            "REPRIEVE_SHUTDOWN_TIMEOUT_SECONDS": "20",
            "REPRIEVE_AGREEMENT_TIMEOUT_SECONDS": "30",
            "REPRIEVE_NOTICE_POLL_SECONDS": "0.2",
            "REPRIEVE_SAVE_SECONDS_ESTIMATE": "1",
            "WORKER_DIR": str(workdir),
            "WORKER_STEPS": str(steps),
            "WORKER_STEP_SECONDS": str(step_seconds),
            "WORKER_SAVE_DELAY": str(save_delay),
        })
        if bare:
            env = {k: v for k, v in env.items() if not k.startswith("REPRIEVE_") or k.endswith("_URI")}
        if notice_file:
            env["REPRIEVE_NOTICE_FILE"] = str(workdir / f"annotations-{i}")
        env.update(extra_env or {})
        env.update((process_env or {}).get(i, {}))
        child: socket.socket | None = None
        if supervised:
            end, child = socket.socketpair()
            ends.append(end)
            env["REPRIEVE_SUPERVISOR_FD"] = str(child.fileno())
        log_path = workdir / f"worker-{i}.log"
        logs.append(log_path)
        with open(log_path, "wb") as out:
            procs.append(subprocess.Popen([sys.executable, str(worker)], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=str(workdir),
                                          pass_fds=() if child is None else (child.fileno(),)))
        if child is not None:
            child.close()  # the worker's end is the worker's alone: its exit closes it
    return Gang(workdir, procs, logs, supervisor_ends=ends)


def worker_start(default_steps: int) -> tuple[int, Path, int, float]:
    """A test worker's first lines: logging with its process id; (process id, ``WORKER_DIR``, ``WORKER_STEPS``,
    ``WORKER_STEP_SECONDS``)."""
    import logging

    pid = int(os.environ.get("REPRIEVE_PROCESS_ID", "0"))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s p{pid} %(name)s %(levelname)s %(message)s")
    return (pid, Path(os.environ["WORKER_DIR"]), int(os.environ.get("WORKER_STEPS", str(default_steps))),
            float(os.environ.get("WORKER_STEP_SECONDS", "0.02")))


def worker_env(name: str, default: Knob) -> Knob:
    """A test worker's knob ``WORKER_<name>``, read as the type of ``default`` (a bool: on when "1"); ``default``
    when unset."""
    raw = os.environ.get(f"WORKER_{name}")
    if raw is None:
        return default
    return cast(Knob, raw == "1") if isinstance(default, bool) else type(default)(raw)


def node_notice(reason: str, node: str, deadline: float, observed: float | None = None) -> dict[str, Any]:
    """A notice as the operator writes it for signal ``reason`` on ``node`` (``observed``: now)."""
    return {"id": f"{reason}/{node}/1", "reason": reason, "node": node, "deadline": rfc3339(deadline),
            "observedAt": rfc3339(time.time() if observed is None else observed)}


def rfc3339(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_notice_file(path: Path, notice: dict[str, Any]) -> None:
    """Write a downward-API annotations file atomically, quoted like the kubelet does."""
    from localcluster.downward import format_map  # the process kubelet's real formatter

    tmp = path.with_suffix(".tmp")
    tmp.write_text(format_map({"other.io/x": "y", "reprieve.dev/notice": json.dumps(notice)}))
    os.replace(tmp, path)


def tcp_rows(local: tuple[str, int]) -> list[list[str]]:
    """The rows of /proc/net/tcp whose local end is ``local`` (an IPv4 address and port of this host; the file writes
    addresses as little-endian hex): each row's fields (``[3]`` the state: ``01`` established, ``0A`` listening;
    ``[4]`` ``tx_queue:rx_queue``)."""
    ip = "".join(f"{int(part):02X}" for part in reversed(local[0].split(".")))
    want = f"{ip}:{local[1]:04X}"
    rows = (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
    return [fields for fields in rows if fields[1] == want]


def accept_queue(address: tuple[str, int]) -> int:
    """How many connections wait in the accept queue of the socket listening at ``address`` (its LISTEN row's
    ``rx_queue``)."""
    for fields in tcp_rows(address):
        if fields[3] == "0A":
            return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"nothing listens at {address[0]}:{address[1]}")


def fill_accept_queue(address: tuple[str, int], most: int = 64, settle_s: float = 1.0) -> list[socket.socket]:
    """Connect to a stopped process's listening ``address`` until its accept queue is full: the kernel drops the
    next SYNs, as for a node that vanished or a pod cut off the network. Full is read from the kernel (the queue no
    longer grows for a connect within ``settle_s``), not from a connect's short timeout: on a loaded machine a
    loopback handshake can outlast one, and the queue was left with room, so the watching process's probes were
    answered (suite run L). The connections held (close them after)."""
    held: list[socket.socket] = []
    while True:
        before = accept_queue(address)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(address)  # EINPROGRESS: the kernel completes the handshake, or drops the SYN when full
        held.append(sock)
        limit = time.monotonic() + settle_s
        while (queued := accept_queue(address)) <= before and time.monotonic() < limit:
            time.sleep(0.001)
        if queued <= before:
            return held
        if len(held) >= most:
            for sock in held:
                sock.close()
            raise AssertionError(f"the accept queue at {address} never filled ({most} connects answered)")
