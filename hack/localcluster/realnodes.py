"""The real-node tier of a local cluster: its images, its network namespace and its nodes.

:class:`RealNodes` is what :meth:`localcluster.cluster.Cluster.add_node` uses for ``kind="real"``. The first real
node builds or reuses the images (``hack/build-images.sh``, cached by content hash) and starts the cluster network
(:mod:`.clusternet`); each node is a launcher process (:mod:`.realnode`) with its own containerd and kubelet.

:func:`prerequisites` says what the machine lacks for the tier (and how to get it) without changing anything; the
test suite reports the tier as NOT RUN with that message when it is not empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from localcluster import cgroups
from localcluster.pki import PKI
from localcluster.procs import (
    REPO,
    ClusterError,
    Proc,
    cache_dir,
    hack_env,
    killpg,
    spawn,
    terminate,
    wait_until,
)
from localcluster.realnodespec import NodePaths, next_index, node_ip
from localcluster.registry import LocalRegistry


class Host(Protocol):
    """What the real-node tier uses of the cluster it extends (:class:`localcluster.cluster.Cluster`)."""

    workdir: Path
    bin_dir: Path
    pki: PKI
    api_port: int
    kubelet_proxy_port: int

    @property
    def registry(self) -> LocalRegistry | None: ...

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]: ...

    def write_kubeconfig(self, path: Path, *, user: dict[str, str], namespace: str = "default",
                         server: str | None = None) -> None: ...

BUILD_IMAGES = REPO / "hack" / "build-images.sh"


class RealNodeError(RuntimeError):
    """The real-node tier cannot be set up here; the message says what is missing and what to do."""


@dataclass(frozen=True)
class Image:
    name: str     # pause | operator | example
    ref: str      # reprieve.local/<image>:<content key>
    archive: Path


def prerequisites() -> list[str]:
    """What this machine lacks for real nodes that ``hack/build-images.sh`` cannot install (empty: nothing)."""
    problems = []
    if os.environ.get("REPRIEVE_REAL_NODES") == "0":
        problems.append("turned off by REPRIEVE_REAL_NODES=0")
    elif sys.platform != "linux":
        problems.append(f"real nodes need Linux (this is {sys.platform})")
    elif os.geteuid() != 0:
        problems.append("real nodes need root (namespaces, mounts, cgroups, containerd)")
    elif not Path("/sys/fs/cgroup/memory").is_dir():
        problems.append("real nodes need the cgroup v1 memory controller at /sys/fs/cgroup/memory (the local kubelet "
                        "setup is written for hybrid-cgroup hosts)")
    elif shutil.which("apt-get") is None and not all(shutil.which(c) for c in ("containerd", "runc", "podman")):
        problems.append("containerd, runc and podman are missing and apt-get is not available to install them")
    return problems


def build_images(timeout: float = 3600) -> dict[str, Image]:
    """Run ``hack/build-images.sh`` (a no-op when cached); its images by name.

    Raises:
        RealNodeError: the script failed; the message has its last lines and what to do.
    """
    proc = subprocess.run(["bash", str(BUILD_IMAGES)], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise RealNodeError(f"{BUILD_IMAGES.relative_to(REPO)} failed with exit code {proc.returncode}:\n{tail}")
    images = {}
    for line in proc.stdout.splitlines():
        name, ref, archive = line.split()
        images[name] = Image(name, ref, Path(archive))
    return images


def prune_templates(root: Path) -> list[Path]:
    """Remove node templates made from image archives that are gone (hack/build-images.sh deletes an image's older
    archives when it builds a new one); return what was removed. Nodes made from them keep their hard links."""
    removed = []
    for template in root.glob("*"):
        marker = template / "complete"
        if not template.is_dir():
            continue
        if marker.exists():
            stale = any(not Path(a).exists() for a in marker.read_text().split())
        else:  # a copy being made (by a node starting now), or one a killed launcher left: only old ones go
            stale = ".tmp" in template.name and time.time() - template.stat().st_mtime > 600
        if stale:
            shutil.rmtree(template, ignore_errors=True)
            removed.append(template)
    return removed


@dataclass
class RealNodes:
    cluster: Host
    images: dict[str, Image] = field(default_factory=dict)
    net: Proc | None = None
    nodes: dict[str, Proc] = field(default_factory=dict)
    indexes: dict[str, int] = field(default_factory=dict)
    released: dict[int, float] = field(default_factory=dict)  # index -> when its node went (realnodespec.next_index)
    cluster_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def cgroup_base(self) -> str:
        return f"{cgroups.own_path('memory').rstrip('/')}/reprieve-{self.cluster_id}"

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.workdir / "realnodes" / "admin.kubeconfig"

    def tree(self, name: str) -> str:
        return f"{self.cgroup_base}/{name}"

    # -- the tier's set-up ---------------------------------------------------------------------------------------
    def ensure(self) -> None:
        """Images built and the cluster network up (once per cluster)."""
        problems = prerequisites()
        if problems:
            raise RealNodeError("; ".join(problems))
        if not self.images:
            self.images = build_images()
            prune_templates(cache_dir() / "nodes")
        if self.net is None:
            self._start_network()

    def _start_network(self, timeout: float = 30) -> None:
        c = self.cluster
        d = c.workdir / "realnodes"
        d.mkdir(parents=True, exist_ok=True)
        c.write_kubeconfig(self.kubeconfig, user={"client-certificate": str(c.pki.crt("admin")),
                                                   "client-key": str(c.pki.key("admin"))},
                            server="https://10.96.0.1:443")
        ready = d / "clusternet.ready"
        host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
        try:
            self.net = spawn(c.workdir / "logs", "clusternet", [
                "unshare", "--net", "--", sys.executable, "-m", "localcluster.clusternet",
                "--host-netns-fd", str(host_ns), "--api-port", str(c.api_port),
                "--kubeconfig", str(self.kubeconfig), "--ready-file", str(ready),
                "--kubelet-proxy-port", str(c.kubelet_proxy_port)],
                hack_env(), (host_ns,))
        finally:
            os.close(host_ns)
        net = self.net

        def up() -> bool:
            if net.popen.poll() is not None:
                raise ClusterError(f"the cluster network (clusternet) exited with {net.popen.returncode}; last "
                                   f"lines of {net.log_path}:\n{net.tail()}")
            return ready.exists()

        wait_until(up, timeout, "the cluster network namespace (clusternet)", on_timeout=lambda: "\n" + net.tail())
        if c.registry is not None:  # the registry's address, inside the cluster network too
            c.registry.attach(net)
        # kube-dns: the Service the kubelet's clusterDNS stands for (its IP is the DNS address in the namespace).
        c.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"k8s-app": "kube-dns"},
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                               {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}}))

    # -- nodes ---------------------------------------------------------------------------------------------------
    def add(self, name: str, labels: dict[str, str], images: list[str] | None = None) -> Proc:
        """Start real node ``name`` (returns its launcher); the caller waits for the Node to be Ready. ``images``:
        the built images imported into its containerd (default: all; ``[]``: a cold node that pulls everything
        but the pause image from the cluster's registry)."""
        self.ensure()
        assert self.net is not None
        index = next_index(set(self.indexes.values()), self.released)
        self.released.pop(index, None)
        self.indexes[name] = index
        paths = NodePaths(self.cluster.workdir / "realnodes" / name)
        paths.root.mkdir(parents=True, exist_ok=True)
        cgroups.create(self.cgroup_base)
        wanted = ["pause", *(images if images is not None else [n for n in self.images if n != "pause"])]
        args = ["nsenter", f"--net=/proc/{self.net.popen.pid}/ns/net", "--",
                "unshare", "--mount", "--propagation", "private", "--",
                sys.executable, "-m", "localcluster.realnode", "--name", name, "--index", str(index),
                "--dir", str(paths.root), "--log-dir", str(self.cluster.workdir / "logs"),
                "--cgroup", self.tree(name), "--kubeconfig", str(self.kubeconfig),
                "--ca-file", str(self.cluster.pki.ca_crt), "--bin-dir", str(self.cluster.bin_dir),
                "--pause-ref", self.images["pause"].ref,
                "--template-cache", "" if os.environ.get("REPRIEVE_NODE_TEMPLATES") == "0" else str(cache_dir() / "nodes")]
        for image in wanted:
            args += ["--image", str(self.images[image].archive)]
        if self.cluster.registry is not None:
            args += self.cluster.registry.node_args()
        for k, v in labels.items():
            args += ["--label", f"{k}={v}"]
        proc = spawn(self.cluster.workdir / "logs", f"realnode-{name}", args, hack_env())
        self.nodes[name] = proc
        return proc

    def paths(self, name: str) -> NodePaths:
        return NodePaths(self.cluster.workdir / "realnodes" / name)

    def stop_node(self, name: str, *, hard: bool = False, timeout: float = 30) -> None:
        """Stop node ``name``: SIGTERM to its launcher (which cleans up), or ``hard``: SIGKILL everything in it at once
        (the machine is gone), then remove what the launcher would have."""
        proc = self.nodes.pop(name, None)
        if proc is None:
            return
        tree = self.tree(name)
        if hard:
            killpg(proc.popen, 9)
            cgroups.kill(tree)
            proc.popen.wait(10)
            if self.net is not None:  # the launcher died before it could remove the node's address
                subprocess.run(["nsenter", f"--net=/proc/{self.net.popen.pid}/ns/net", "ip", "addr", "del",
                                f"{node_ip(self.indexes[name])}/32", "dev", "lo"], capture_output=True, check=False)
        else:
            terminate(proc.popen, timeout)
        cgroups.kill(tree)
        cgroups.remove(tree)
        index = self.indexes.pop(name, None)
        if index is not None:
            self.released[index] = time.monotonic()

    def stop(self) -> None:
        for name in list(self.nodes):
            self.stop_node(name)
        if self.net is not None:
            terminate(self.net.popen, 10)
            self.net = None
        cgroups.kill(self.cgroup_base)
        cgroups.remove(self.cgroup_base)

    def pod_logs(self, namespace: str, pod: str, container: str) -> list[Path]:
        found = []
        for name in self.indexes:
            base = self.paths(name).pod_logs
            found += [p for p in base.glob(f"{namespace}_{pod}_*/{container}/*.log")
                      if p.parents[1].name.count("_") == 2]
        return found
