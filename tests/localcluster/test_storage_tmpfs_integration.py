"""The soak's checkpoint-storage tmpfs as a real node sees it (issue #25's storage faults on real nodes).

A real node runs in a private mount namespace (``unshare --mount --propagation private``, ``realnodes.py``): a
copy of the host's mounts at its start. The soak mounts the tmpfs before the nodes start
(``injectors.mount_tmpfs``), sizes it after the fault-free run (``resize_tmpfs``) and breaks it with
``remount``/a ballast file on the host: all of it must reach the node's (and so its pods') view. Mounted after the
node started, the node sees the plain directory under it (what the soak did first: the pods never saw the faults).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster.injectors import deny_writes, fill, mount_tmpfs, remount, resize_tmpfs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None,
                       reason="needs root, unshare and nsenter (mounts, mount namespaces)"),
]


class Node:
    """A process in a private mount namespace, as a real node's launcher is; ``sh`` runs a command there."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sleep", "120"])

    def sh(self, cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", "-t", str(self.proc.pid), "-m", "sh", "-c", cmd], capture_output=True,
                              text=True, check=False)

    def wait_ready(self) -> None:
        # unshare execs sleep once the namespace exists: the namespace differs from ours from then on
        for _ in range(100):
            if os.readlink(f"/proc/{self.proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                return
            subprocess.run(["sleep", "0.05"], check=True)
        raise AssertionError("unshare never made its mount namespace")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "storage-soak" / "checkpoints"
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def test_a_tmpfs_mounted_before_the_node_starts_is_the_nodes_storage_and_its_faults_reach_it(root: Path) -> None:
    mount_tmpfs(root, 1 << 30)
    node = Node()
    try:
        node.wait_ready()
        got = node.sh(f"echo a > {root}/x && cat {root}/x")
        assert got.returncode == 0 and got.stdout.strip() == "a", got.stderr
        assert (root / "x").read_text().strip() == "a"  # the host and the node see one file system
        resize_tmpfs(root, 2 << 20)
        assert node.sh(f"df -k {root} | tail -1").stdout.split()[1] == "2048"
        remount(root, "ro")
        got = node.sh(f"echo b > {root}/y")
        assert got.returncode != 0 and "Read-only" in got.stderr
        remount(root, "rw")
        assert node.sh(f"echo c > {root}/z").returncode == 0
        fill(root / "soak-ballast")
        got = node.sh(f"head -c 65536 /dev/zero > {root}/w")
        assert got.returncode != 0 and "No space left" in got.stderr
    finally:
        node.stop()


def test_a_tmpfs_mounted_after_the_node_started_never_reaches_it(root: Path) -> None:
    root.mkdir(parents=True)
    node = Node()
    try:
        node.wait_ready()
        mount_tmpfs(root, 2 << 20)
        (root / "x").write_text("host")
        assert node.sh(f"cat {root}/x").returncode != 0  # the node writes to the directory under the tmpfs
    finally:
        node.stop()


TRAINER = "setpriv --reuid 65532 --regid 65532 --clear-groups"  # the example image's non-root user


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A storage root the non-root user can reach (pytest's tmp_path is under a root-only directory)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="reprieve-storage-", dir="/tmp"))
    base.chmod(0o755)
    yield base / "checkpoints"
    subprocess.run(["umount", "-l", str(base / "pod-mount")], check=False, capture_output=True)
    subprocess.run(["umount", "-l", str(base / "checkpoints")], check=False, capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def test_storage_unavailable_on_real_nodes_refuses_the_trainers_writes_and_leaks_into_no_mount(
        open_root: Path) -> None:
    """``storage-unavailable`` on real nodes (``deny_writes``): the non-root trainer can write nothing new while it
    lasts, and nothing about the mount changes, so a container made during it (runc copies its source's
    read-only flag into the bind mount) has a writable checkpoint mount after it. (With the remount form, runc
    made such a mount read-only for good: what the 30-minute soak met.)"""
    root = open_root
    mount_tmpfs(root, 8 << 20)
    nested = root / "checkpoints" / "step_1"
    nested.mkdir(parents=True)
    os.chown(nested, 65532, 65532)
    (root / "checkpoints").chmod(0o1777)
    node = Node()
    during = root.parent / "pod-mount"
    during.mkdir()
    try:
        node.wait_ready()
        assert node.sh(f"{TRAINER} touch {nested}/a").returncode == 0
        undo = deny_writes(root)
        try:
            assert oct(root.stat().st_mode & 0o777) == oct(0o555)
            assert oct((root / "checkpoints").stat().st_mode & 0o7777) == oct(0o1555)
            for target in (root / "x", nested / "b"):
                got = node.sh(f"{TRAINER} touch {target}")
                assert got.returncode != 0 and "Permission denied" in got.stderr, (target, got)
            assert not os.statvfs(root).f_flag & os.ST_RDONLY  # what runc would copy into a new bind mount
            # a pod's mount made now, with runc's rule: read-only when its source's mount is
            assert node.sh(f"mount --bind {root} {during} && if grep -q ' {root} .* ro,' /proc/self/mounts; then "
                           f"mount -o remount,bind,ro {during}; fi").returncode == 0
        finally:
            undo()
        assert oct(root.stat().st_mode & 0o777) == oct(0o777)
        assert oct((root / "checkpoints").stat().st_mode & 0o7777) == oct(0o1777)
        got = node.sh(f"{TRAINER} touch {during}/checkpoints/step_1/c {during}/y")
        assert got.returncode == 0, got.stderr  # the mount made during the fault is writable after it
        assert (nested / "c").exists()
    finally:
        node.sh(f"umount {during}")
        node.stop()
