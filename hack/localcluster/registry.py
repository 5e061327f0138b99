"""The local cluster's OCI registry and Python package index, started on request and stopped with the cluster.

:meth:`localcluster.cluster.Cluster.start_registry` (``python -m localcluster up --registry``) starts

- Debian's ``docker-registry`` (the CNCF distribution registry) with the configuration of
  :func:`.registryspec.registry_config`, storage under the cluster's workdir;
- pypiserver (:mod:`.pyindex`) from the release tools' venv, serving what is uploaded to it and, read-only, the
  release tools' wheelhouse (the locks' dependencies: jax, tensorstore, kopf, ...), so an install from it needs no
  other index;

both on the host's ``127.0.0.1`` with a serving certificate from the cluster's CA and one generated user (basic
auth). Real nodes started afterwards pull from the registry: their containerd gets a ``hosts.toml`` trusting the
CA and node-wide credentials (:func:`.registryspec.containerd_registry_section`), and a forwarder in the cluster
network (:mod:`.hostforward`) carries ``127.0.0.1:<port>`` there to the host's. What a client needs is
:class:`.registryspec.RegistryAccess` (also written to ``<workdir>/registry/access.json``, mode 0600).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.pki import PKI, _issue
from localcluster.procs import REPO, ClusterError, Proc, free_port, hack_env, spawn, terminate, wait_until
from localcluster.registryspec import (
    Credentials,
    RegistryAccess,
    bcrypt_htpasswd,
    containerd_hosts_toml,
    registry_config,
)

log = logging.getLogger("localcluster.registry")
INSTALL_TOOLS = REPO / "hack" / "install-release-tools.sh"


class RegistryError(RuntimeError):
    """The registry or the index cannot be set up here; the message says what is missing and what to do."""


@dataclass(frozen=True)
class ReleaseTools:
    registry: Path  # the docker-registry binary
    venv: Path      # pypiserver, passlib, twine
    wheelhouse: Path | None = None  # the locks' distributions (jax, kopf, ...); None until `make release-tier`

    @property
    def twine(self) -> Path:
        return self.venv / "bin" / "twine"


def release_tools(timeout: float = 900) -> ReleaseTools:
    """Run ``hack/install-release-tools.sh`` (a no-op when installed); what it installed.

    Raises:
        RegistryError: the script failed; the message has its last lines.
    """
    proc = subprocess.run(["bash", str(INSTALL_TOOLS)], capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        raise RegistryError(f"{INSTALL_TOOLS.relative_to(REPO)} failed with exit code {proc.returncode}:\n{tail}")
    found = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    return ReleaseTools(Path(found["registry"]), Path(found["venv"]),
                        Path(found["wheelhouse"]) if "wheelhouse" in found else None)


def probe(url: str, ca_file: Path, creds: Credentials | None, timeout: float = 5) -> int:
    """HTTP status of a GET of ``url`` (TLS verified against ``ca_file``); 0 when nothing answers."""
    req = urllib.request.Request(url)
    if creds is not None:
        req.add_header("Authorization", f"Basic {creds.basic()}")
    ctx = ssl.create_default_context(cafile=str(ca_file))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, OSError):
        return 0


@dataclass
class LocalRegistry:
    workdir: Path  # the cluster's
    pki: PKI       # the cluster's: the registry's serving certificate is issued by its CA
    access: RegistryAccess
    tools: ReleaseTools
    procs: list[Proc] = field(default_factory=list)
    forward: Proc | None = None
    dir: Path = field(init=False)          # <workdir>/registry: storage, packages, configuration
    hosts_dir: Path = field(init=False)    # containerd's ``config_path``: ``<host>/hosts.toml`` under it
    access_file: Path = field(init=False)  # what a client needs (mode 0600)

    def __post_init__(self) -> None:
        self.dir = self.workdir / "registry"
        self.hosts_dir = self.dir / "containerd-hosts"
        self.access_file = self.dir / "access.json"

    @classmethod
    def start(cls, workdir: Path, pki: PKI, timeout: float = 30) -> LocalRegistry:
        tools = release_tools()
        d = workdir / "registry"
        d.mkdir(parents=True, exist_ok=True)
        if not pki.crt("registry").exists():
            _issue(pki, "registry", "/CN=reprieve-local-registry", server_sans=["127.0.0.1", "localhost"])
        creds = Credentials.generate()
        htpasswd = d / "htpasswd"
        htpasswd.write_text(bcrypt_htpasswd(creds))
        reg_port, idx_port = free_port(), free_port()
        access = RegistryAccess(f"127.0.0.1:{reg_port}", f"https://127.0.0.1:{idx_port}/", pki.ca_crt, creds)
        fd = os.open(d / "access.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(access.to_json())
        self = cls(workdir, pki, access, tools)
        hosts = self.hosts_dir / access.registry
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(containerd_hosts_toml(access.registry, pki.ca_crt))
        config = d / "config.yml"
        config.write_text(json.dumps(registry_config(port=reg_port, storage=d / "storage", cert=pki.crt("registry"),
                                                     key=pki.key("registry"), htpasswd=htpasswd), indent=1))
        try:
            self.procs.append(spawn(workdir / "logs", "registry", [str(tools.registry), "serve", str(config)]))
            ready = d / "pyindex.ready"
            self.procs.append(spawn(workdir / "logs", "pyindex", [
                str(tools.venv / "bin" / "python"), str(REPO / "hack" / "localcluster" / "pyindex.py"),
                "--port", str(idx_port), "--root", str(d / "packages"), "--cert", str(pki.crt("registry")),
                "--key", str(pki.key("registry")), "--htpasswd", str(htpasswd), "--ready-file", str(ready),
                *(["--extra-root", str(tools.wheelhouse)] if tools.wheelhouse else [])]))
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        log.info("registry at %s and package index at %s (user %s, CA %s)", access.registry, access.index_url,
                 creds.username, pki.ca_crt)
        return self

    def _wait_ready(self, timeout: float) -> None:
        a = self.access

        def up() -> bool:
            for proc in self.procs:
                if proc.popen.poll() is not None:
                    raise ClusterError(f"{proc.name} exited with {proc.popen.returncode} during start-up; last "
                                       f"lines of {proc.log_path}:\n{proc.tail()}")
            return (probe(f"https://{a.registry}/v2/", a.ca_file, None) == 401
                    and probe(f"https://{a.registry}/v2/", a.ca_file, a.credentials) == 200
                    and probe(a.simple_url, a.ca_file, None) == 401
                    and probe(a.simple_url, a.ca_file, a.credentials) == 200)

        wait_until(up, timeout, "the registry (/v2/ 401 without and 200 with the password) and the index",
                   interval=0.2, on_timeout=lambda: "\n" + "\n".join(p.tail(10) for p in self.procs))

    def attach(self, net: Proc, timeout: float = 15) -> None:
        """Forward the registry's address into the cluster network (whose first process is ``net``)."""
        if self.forward is not None:
            return
        ready = self.dir / "hostforward.ready"
        port = self.access.registry.rsplit(":", 1)[1]
        host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
        try:
            self.forward = spawn(self.workdir / "logs", "registry-forward", [
                "nsenter", f"--net=/proc/{net.popen.pid}/ns/net", "--", sys.executable, "-m",
                "localcluster.hostforward", "--host-netns-fd", str(host_ns), "--port", port,
                "--ready-file", str(ready)], hack_env(), (host_ns,))
        finally:
            os.close(host_ns)
        fwd = self.forward

        def up() -> bool:
            if fwd.popen.poll() is not None:
                raise ClusterError(f"the registry forwarder exited with {fwd.popen.returncode}:\n{fwd.tail()}")
            return ready.exists()

        wait_until(up, timeout, "the registry forwarder in the cluster network", on_timeout=fwd.tail)

    def push_image(self, ref: str, repo: str, tag: str) -> str:
        """Push local image ``ref`` (hack/build-images.sh's container storage) to ``<registry>/<repo>:<tag>``;
        return the pushed reference by digest (what a pod names so that its node pulls exactly that image).

        Raises:
            RegistryError: podman's message.
        """
        from release import podman_env  # hack/release.py: build-images.sh's storage configuration

        target = f"{self.access.registry}/{repo}:{tag}"
        certs = self.dir / "podman-certs" / self.access.registry
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.access.ca_file, certs / "ca.crt")
        digestfile = self.dir / f"{repo.replace('/', '_')}.digest"
        c = self.access.credentials
        proc = subprocess.run(["podman", "push", "--cert-dir", str(certs), "--creds", f"{c.username}:{c.password}",
                               "--digestfile", str(digestfile), ref, f"docker://{target}"],
                              capture_output=True, text=True, env={**os.environ, **podman_env()}, timeout=1800,
                              check=False)
        if proc.returncode != 0:
            raise RegistryError(f"podman push {ref} to {target} failed: {proc.stderr.strip()[-800:]}")
        return f"{self.access.registry}/{repo}@{digestfile.read_text().strip()}"

    def node_args(self) -> list[str]:
        """The real-node launcher's arguments that make its containerd pull from this registry."""
        return ["--registry-config-dir", str(self.hosts_dir), "--registry-access", str(self.access_file)]

    def stop(self) -> None:
        """Stop both servers and the forwarder; remove the storage (blobs, packages: GBs after a release)."""
        for proc in [*self.procs, *([self.forward] if self.forward else [])]:
            terminate(proc.popen, 10)
        self.procs.clear()
        self.forward = None
        for sub in ("storage", "packages"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
