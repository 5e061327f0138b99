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
from localcluster.injectors import fill, mount_tmpfs, remount, resize_tmpfs

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
