"""Copies of pod logs that outlive their pods (the chaos soak).

A real node's kubelet removes a pod's log directory (``<node>/pod-logs/<ns>_<pod>_<uid>/``) once the pod is
deleted, and a fault that kills a spare or a worker usually ends with its pod deleted: its trainer's and its
supervisor's lines went with it. :class:`LogKeeper` copies what every matching log file gained, every
``interval`` seconds and once more at :meth:`LogKeeper.stop`, to ``dest/<node>/<log dir>/<container>/<n>.log``:
a deleted pod keeps its log up to the last copy before it went.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("localcluster.keeplogs")


def copy_new(src: Path, dst: Path, offset: int) -> int:
    """Append to ``dst`` what ``src`` holds beyond ``offset`` (the bytes copied before); the new offset.

    A ``src`` shorter than ``offset`` is another file in its place: copied from its start (appended). A ``src``
    that is gone copies nothing and keeps the offset."""
    try:
        with open(src, "rb") as f:
            size = f.seek(0, 2)
            start = offset if size >= offset else 0
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return offset
    if data:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst, "ab") as out:
            out.write(data)
    return start + len(data)


class LogKeeper:
    """Keeps copies of the log files ``sources()`` lists (each ``(path, its copy's path relative to dest)``)."""

    def __init__(self, sources: Callable[[], Iterable[tuple[Path, Path]]], dest: Path, interval: float = 1.0):
        self.sources, self.dest, self.interval = sources, dest, interval
        self.offsets: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-keeplogs", daemon=True)

    def copy_once(self) -> None:
        for src, rel in self.sources():
            self.offsets[src] = copy_new(src, self.dest / rel, self.offsets.get(src, 0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.copy_once()
            except Exception as err:  # noqa: BLE001 - a copy that failed is tried again next time
                log.debug("keeping pod logs: %s", err)

    def start(self) -> LogKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop copying after one last pass (what the files still there gained since the last one)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.copy_once()


def real_node_logs(workdir: Path, namespace: str) -> list[tuple[Path, Path]]:
    """The container log files of ``namespace``'s pods on the cluster's real nodes (``workdir``: the cluster's),
    each with its copy's relative path ``<node>/<log dir>/<container>/<n>.log``."""
    out = []
    for path in workdir.glob(f"realnodes/*/pod-logs/{namespace}_*/*/*.log"):
        container, pod_dir, node = path.parent, path.parent.parent, path.parent.parent.parent.parent
        out.append((path, Path(node.name, pod_dir.name, container.name, path.name)))
    return out
