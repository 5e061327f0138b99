"""cgroup v1 (hybrid hosts) helpers for real nodes: one cgroup tree per node, created, joined and killed whole.

A real node's tree is ``<base>/reprieve-<cluster>/<node>`` in every v1 hierarchy, where ``<base>`` is the cgroup the
cluster's owner runs in (so the node stays inside whatever memory limit the owner has): its containerd, kubelet
and launcher in ``<tree>/node``, its pods in ``<tree>/kubepods/...`` (the kubelet's ``cgroupRoot`` is the tree).
Killing a node freezes the tree, SIGKILLs every process in it, thaws it and removes the directories, which is
also how a stopped cluster leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


def hierarchies() -> dict[str, Path]:
    """``{controller or name=...: mount point}`` of the mounted cgroup v1 hierarchies, and ``unified`` for the v2
    one of a hybrid host (runc and the kubelet make their cgroups there too)."""
    out: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = right.split()
        if len(fields) >= 3 and fields[0] == "cgroup2":
            out["unified"] = Path(left.split()[4])
        if len(fields) < 3 or fields[0] != "cgroup":
            continue
        mount_point = Path(left.split()[4])
        for opt in fields[2].split(","):
            if opt in ("rw", "ro", "relatime", "nosuid", "nodev", "noexec", "clone_children") or opt.startswith(
                    "release_agent"):
                continue
            out[opt] = mount_point
    return out


def own_path(controller: str = "memory") -> str:
    """The calling process's cgroup path in ``controller``'s hierarchy ("/" if none)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


def _mounts() -> list[Path]:
    return sorted(set(hierarchies().values()))


def create(rel: str) -> None:
    """``rel`` (absolute cgroup path like ``/a/b``) in every v1 hierarchy; cpuset levels get their parent's cpus/mems."""
    parts = [p for p in rel.split("/") if p]
    for mount in _mounts():
        d = mount
        for part in parts:
            d = d / part
            if not d.is_dir():
                d.mkdir()
            for knob in ("cpuset.cpus", "cpuset.mems"):
                f = d / knob
                if f.exists() and not f.read_text().strip():
                    f.write_text((d.parent / knob).read_text())


def join(rel: str, pid: int = 0) -> None:
    """Move ``pid`` (0: the caller) into ``rel`` in every v1 hierarchy."""
    for mount in _mounts():
        procs = mount / rel.lstrip("/") / "cgroup.procs"
        if procs.exists():
            procs.write_text(str(pid or os.getpid()))


def _walk(root: Path) -> list[Path]:
    """``root`` and every cgroup below it, deepest first."""
    if not root.is_dir():
        return []
    found = [Path(d) for d, _, _ in os.walk(root)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def pids(rel: str) -> set[int]:
    out: set[int] = set()
    for mount in _mounts():
        for d in _walk(mount / rel.lstrip("/")):
            try:
                out |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
    return out


def _freeze(rel: str, state: str) -> None:
    mount = hierarchies().get("freezer")
    f = mount / rel.lstrip("/") / "freezer.state" if mount else None
    if f is not None and f.exists():
        try:
            f.write_text(state)
        except OSError:
            pass


def kill(rel: str, *, timeout: float = 10.0) -> set[int]:
    """SIGKILL every process in the tree ``rel``, frozen first so none can fork away; return the pids that are still
    there after ``timeout`` (empty when all are gone). The caller must not be in the tree."""
    deadline = time.monotonic() + timeout
    if os.getpid() in pids(rel):
        raise RuntimeError(f"cgroups.kill({rel!r}) called from inside the tree it would freeze")
    _freeze(rel, "FROZEN")
    try:
        for pid in pids(rel):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        _freeze(rel, "THAWED")
    left = pids(rel)
    while left and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        left = pids(rel)
    return left


def remove(rel: str) -> list[str]:
    """rmdir the tree ``rel`` in every hierarchy, deepest first; return what could not be removed."""
    failed = []
    for mount in _mounts():
        for d in _walk(mount / rel.lstrip("/")):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as err:
                failed.append(f"{d}: {err.strerror}")
    return failed
