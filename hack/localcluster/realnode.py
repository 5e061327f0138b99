"""A real node: the upstream kubelet with its own containerd + runc, inside the cluster network namespace.

``python -m localcluster.realnode ...`` is the node's launcher. :class:`localcluster.realnodes.RealNodes` starts it
as ``nsenter --net=<cluster network> unshare --mount --propagation private python -m localcluster.realnode``, so
the node has the cluster's network (:mod:`.clusternet`) and a mount namespace of its own. There it

1. makes the node's cgroup tree and moves itself into ``<tree>/node`` (:mod:`.cgroups`);
2. mounts a tmpfs over the host paths containerd, runc, CNI and the kubelet use regardless of their configuration
   (``realnodespec.PRIVATE_DIRS``) and bind-mounts the node's own copies of the kernel tunables the kubelet sets
   (``realnodespec.KERNEL_TUNABLES``) over ``/proc/sys``: the host's values never change;
3. adds the node's address to ``lo`` of the cluster network;
4. starts containerd with the images (pause first) in its ``k8s.io`` namespace: imported with ``ctr`` the first
   time a set of images is asked for, and saved as a *node template* (``~/.cache/reprieve/nodes/<key>``, the
   containerd root: content blobs and unpacked layers); later nodes start from a hard-linked copy of it (layers
   are never written in place: containers write to their own upper directories) with the bolt databases copied,
   which takes seconds instead of the import's tens of seconds;
5. starts the kubelet (``localkube kubelet``), which registers the Node.

On SIGTERM, or when its parent dies, it stops the kubelet, SIGKILLs everything left in the node's cgroup tree
(containerd, shims, containers), removes the address and the cgroups and exits; its mount namespace (overlay
mounts, volume tmpfs, pod network namespaces) goes with it. Every step logs how long it took.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from localcluster import cgroups
from localcluster.clusternet import die_with_parent
from localcluster.realnodespec import (
    KERNEL_TUNABLES,
    PRIVATE_DIRS,
    NodePaths,
    cni_config,
    containerd_config,
    kubelet_config,
    node_ip,
)
from localcluster.registryspec import RegistryAccess, containerd_registry_section

log = logging.getLogger("localcluster.realnode")
PR_SET_CHILD_SUBREAPER = 36


class NodeStartError(RuntimeError):
    """A step of the node's start failed; the message names it and shows the component's log tail."""


def _run(*cmd: str, timeout: float = 60) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise NodeStartError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    return proc.stdout


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _archive_ref(archive: str) -> str:
    """The image reference a docker-archive of hack/build-images.sh holds (its file name encodes it)."""
    name = Path(archive).name.removesuffix(".tar")  # reprieve.local_<image>_<key>
    registry, image, key = name.split("_", 2)
    return f"{registry}/{image}:{key}"


def _pdeathsig_kill() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


class Launcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.paths = NodePaths(Path(args.dir))
        self.tree = args.cgroup
        self.ip = node_ip(args.index)
        self.logs = Path(args.log_dir)
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.own_cgroups = Path("/proc/self/cgroup").read_text()

    # -- start ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.monotonic()
        cgroups.create(self.tree + "/node")
        cgroups.join(self.tree + "/node")
        self._private_mounts()
        _run("ip", "addr", "add", f"{self.ip}/32", "dev", "lo")
        self._write_configs()
        log.info("node set up in %.2fs (cgroup %s, address %s)", time.monotonic() - t0, self.tree, self.ip)
        templated = self._from_template()
        self._start_containerd()
        missing = self._missing_images()
        if templated and missing:
            log.warning("the node template lacks %s: importing", missing)
        self._import_images(missing)
        if missing and not templated and self._template() is not None:
            self._restart_containerd_around(self._save_template)  # a quiet copy: containerd stopped
        self._start_kubelet()

    def _private_mounts(self) -> None:
        for d in PRIVATE_DIRS:
            Path(d).mkdir(parents=True, exist_ok=True)
            _run("mount", "-t", "tmpfs", "-o", "mode=755,size=256m", f"reprieve-{self.args.name}", d)
        self.paths.sysctl_dir.mkdir(parents=True, exist_ok=True)
        for key in KERNEL_TUNABLES:
            copy = self.paths.sysctl_dir / key.replace("/", ".")
            copy.write_text(Path("/proc/sys", key).read_text())
            _run("mount", "--bind", str(copy), f"/proc/sys/{key}")

    def _write_configs(self) -> None:
        p = self.paths
        for d in (p.containerd_root, p.cni_conf_dir, p.kubelet_root, p.pod_logs):
            d.mkdir(parents=True, exist_ok=True)
        registry = None
        if self.args.registry_access:
            access = RegistryAccess.from_json(Path(self.args.registry_access).read_text())
            registry = containerd_registry_section(Path(self.args.registry_config_dir), access.registry,
                                                   access.credentials)
        p.containerd_config.write_text(containerd_config(p, self.args.pause_ref, registry))
        (p.cni_conf_dir / "10-reprieve.conflist").write_text(json.dumps(cni_config(self.args.index), indent=1))
        cfg = kubelet_config(p, index=self.args.index, cgroup_root=self.tree, ca_file=Path(self.args.ca_file))
        p.kubelet_config.write_text(json.dumps(cfg, indent=1))  # JSON is YAML

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}-{self.args.name}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_pdeathsig_kill)  # noqa: PLW1509 - prctl only, no threads yet
        self.daemons[name] = proc
        return proc

    def _log_of(self, name: str) -> Path:
        return self.logs / f"{name}-{self.args.name}.log"

    def _start_containerd(self, timeout: float = 60) -> None:
        t0 = time.monotonic()
        proc = self._spawn("containerd", ["containerd", "--config", str(self.paths.containerd_config)])
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise NodeStartError(f"containerd exited with {proc.returncode} during start-up; last lines of "
                                     f"{self._log_of('containerd')}:\n{_tail(self._log_of('containerd'))}")
            if self.paths.socket.exists() and subprocess.run(
                    ["ctr", "--address", str(self.paths.socket), "version"], capture_output=True,
                    timeout=10, check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise NodeStartError(f"containerd did not answer on {self.paths.socket} within {timeout:.0f}s; "
                                     f"last lines of its log:\n{_tail(self._log_of('containerd'))}")
            time.sleep(0.1)
        log.info("containerd ready in %.2fs", time.monotonic() - t0)

    def _template(self) -> Path | None:
        if not self.args.template_cache:
            return None
        version = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=False).stdout
        key = hashlib.sha256("\n".join([version, "template v1", *sorted(Path(a).name for a in self.args.image)])
                             .encode()).hexdigest()[:12]
        return Path(self.args.template_cache) / key

    def _from_template(self) -> bool:
        """Fill the (empty) containerd root from the node template, if there is one; True if so."""
        template = self._template()
        if template is None or not (template / "complete").exists():
            return False
        t0 = time.monotonic()
        root = self.paths.containerd_root
        shutil.rmtree(root, ignore_errors=True)
        _run("cp", "-al", str(template / "root"), str(root), timeout=120)
        for db in root.rglob("*.db"):  # bolt databases are written in place: each node gets its own copy
            db.unlink()
            shutil.copy2(template / "root" / db.relative_to(root), db)
        log.info("containerd root from the node template %s in %.2fs", template.name, time.monotonic() - t0)
        return True

    def _save_template(self) -> None:
        """After an import: keep this containerd root (containerd idle, before the kubelet) as the node template."""
        template = self._template()
        if template is None or (template / "complete").exists():
            return
        t0 = time.monotonic()
        tmp = template.with_name(f"{template.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        root = self.paths.containerd_root
        _run("cp", "-al", str(root), str(tmp / "root"), timeout=120)
        for db in (tmp / "root").rglob("*.db"):
            db.unlink()
            shutil.copy2(root / db.relative_to(tmp / "root"), db)
        (tmp / "complete").write_text("\n".join(self.args.image))
        try:
            tmp.rename(template)
            log.info("saved the node template %s in %.2fs", template.name, time.monotonic() - t0)
        except OSError:  # another node saved it first
            shutil.rmtree(tmp, ignore_errors=True)

    def _missing_images(self) -> list[str]:
        out = _run("ctr", "--address", str(self.paths.socket), "-n", "k8s.io", "images", "ls", "-q")
        have = set(out.split())
        return [a for a in self.args.image if _archive_ref(a) not in have]

    def _restart_containerd_around(self, step: Callable[[], None]) -> None:
        proc = self.daemons.pop("containerd")
        proc.terminate()
        proc.wait(15)
        try:
            step()
        finally:
            self._start_containerd()

    def _import_images(self, archives: list[str]) -> None:
        for archive in archives:
            t0 = time.monotonic()
            _run("ctr", "--address", str(self.paths.socket), "-n", "k8s.io", "images", "import", archive,
                 timeout=600)
            log.info("imported %s in %.2fs", Path(archive).name, time.monotonic() - t0)

    def _start_kubelet(self) -> None:
        labels = ",".join(self.args.label)
        argv = [str(Path(self.args.bin_dir) / "localkube"), "kubelet", f"--config={self.paths.kubelet_config}",
                f"--kubeconfig={self.args.kubeconfig}", f"--root-dir={self.paths.kubelet_root}",
                f"--hostname-override={self.args.name}", f"--node-ip={self.ip}", "--v=2"]
        if labels:
            argv.append(f"--node-labels={labels}")
        self._spawn("kubelet", argv)
        log.info("kubelet started")

    # -- stop -------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        t0 = time.monotonic()
        kubelet = self.daemons.get("kubelet")
        if kubelet is not None and kubelet.poll() is None:
            kubelet.terminate()
            try:
                kubelet.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._leave_cgroups()  # a frozen tree must not hold the process that thaws it
        left = cgroups.kill(self.tree)
        for proc in self.daemons.values():
            try:
                proc.wait(1)
            except subprocess.TimeoutExpired:
                pass
        subprocess.run(["ip", "addr", "del", f"{self.ip}/32", "dev", "lo"], capture_output=True, check=False)
        failed = cgroups.remove(self.tree)
        if left or failed:
            log.warning("node %s stopped with leftovers: pids %s, cgroups %s", self.args.name, sorted(left), failed)
        log.info("node %s stopped in %.2fs", self.args.name, time.monotonic() - t0)

    def _leave_cgroups(self) -> None:
        """Back into the cgroups the launcher started in, in every hierarchy (``0::`` is the v2 one)."""
        mounts = cgroups.hierarchies()
        for line in self.own_cgroups.splitlines():
            hid, controllers, path = line.split(":", 2)
            names = ["unified"] if hid == "0" else controllers.split(",")
            mount = next((mounts[c] for c in names if c in mounts), None)
            if mount is not None:
                try:
                    (mount / path.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
                except OSError as err:
                    log.warning("cannot move back to %s%s: %s", mount, path, err)

    def reap(self) -> None:
        """Collect orphans re-parented to us (we are the node's subreaper), but not our own daemons."""
        ours = {p.pid for p in self.daemons.values()}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in ours:
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                try:
                    os.waitpid(int(entry.name), os.WNOHANG)
                except ChildProcessError:
                    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.realnode", description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--dir", required=True, help="the node's directory")
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--cgroup", required=True, help="the node's cgroup tree (absolute cgroup path)")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--ca-file", required=True)
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--pause-ref", required=True)
    parser.add_argument("--image", action="append", default=[], help="docker-archive to import (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="Node label KEY=VALUE (repeatable)")
    parser.add_argument("--registry-config-dir", default="", help="containerd's registry config_path (hosts.toml)")
    parser.add_argument("--registry-access", default="", help="the cluster registry's access.json ('': none)")
    parser.add_argument("--template-cache", default="", help="directory of node templates ('' : none)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s realnode[{args.name}] %(levelname)s %(message)s")
    die_with_parent(signal.SIGTERM)
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stopping.update(now=True))
    node = Launcher(args)
    code = 0
    try:
        node.start()
        while not stopping["now"]:
            kubelet = node.daemons["kubelet"]
            if kubelet.poll() is not None:
                log.error("kubelet exited with %s; last lines of its log:\n%s", kubelet.returncode,
                          _tail(node._log_of("kubelet")))
                code = 1
                break
            node.reap()
            time.sleep(0.5)
    except (NodeStartError, OSError, subprocess.SubprocessError) as err:
        log.error("node %s failed to start: %s", args.name, err)
        code = 1
    finally:
        node.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
