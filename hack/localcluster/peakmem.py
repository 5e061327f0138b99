"""The peak memory of a job's trainer processes, per pod, sampled from ``/proc`` (the benchmarks report it: with
``--state-mib``, issue #48). Trainers on process nodes and in real nodes' containers are all processes of this
machine; each is told by its command line and its pod by ``REPRIEVE_POD_NAME`` in its environment. The kernel keeps
each process's own high-water mark (``VmHWM``): reading it about once a second while the process lives gives its
peak up to the last read (a peak in the last second of a process killed then is missed)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path


def high_water_kib(status: str) -> int | None:
    """``VmHWM`` (KiB) from a ``/proc/<pid>/status`` text; None without one (a kernel thread, a zombie)."""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def pod_of(environ: bytes) -> str:
    """``REPRIEVE_POD_NAME`` from a ``/proc/<pid>/environ`` (``""``: not a pod's process)."""
    for item in environ.split(b"\0"):
        if item.startswith(b"REPRIEVE_POD_NAME="):
            return item.partition(b"=")[2].decode(errors="replace")
    return ""


class PeakMemory:
    """Samples, in a thread of its own, every process whose command line ``match``es; :meth:`by_pod` is each pod's
    largest process peak (KiB)."""

    def __init__(self, match: Callable[[str], bool], interval: float = 1.0, proc: Path = Path("/proc")) -> None:
        self.match, self.interval, self.proc = match, interval, proc
        self._peaks: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if not self.match((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")):
                    continue
                kib = high_water_kib((entry / "status").read_text())
                pod = pod_of((entry / "environ").read_bytes())
            except OSError:  # gone between the listing and the read
                continue
            if kib is not None and pod:
                key = (pod, int(entry.name))
                self._peaks[key] = max(kib, self._peaks.get(key, 0))

    def start(self) -> PeakMemory:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.sample()

        self.sample()
        self._thread = threading.Thread(target=loop, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def by_pod(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (pod, _), kib in self._peaks.items():
            out[pod] = max(kib, out.get(pod, 0))
        return dict(sorted(out.items()))


def in_words(by_pod: dict[str, int]) -> str:
    """``bench-0 1.92 GiB, bench-1 1.90 GiB`` (``none seen``: no trainer was sampled)."""
    return ", ".join(f"{pod} {kib / 2**20:.2f} GiB" for pod, kib in by_pod.items()) or "none seen"
