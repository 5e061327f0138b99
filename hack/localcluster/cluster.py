"""A real Kubernetes control plane on loopback, for tests, benchmarks and the demo.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run from the ``localkube`` multi-call binary
that ``hack/build-tools.sh`` builds from the official Go modules. Authentication and authorization are real:
client certificates for the admin (``system:masters``), ServiceAccount tokens signed by the apiserver, and
``--authorization-mode=RBAC``. Nodes are process kubelets (:mod:`localcluster.kubelet`) that run pods as local
processes.

    with Cluster.start(workdir) as cluster:
        cluster.add_node("node-0")
        cluster.kubectl("get", "nodes")
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .apiserver import apiserver_args, apiserver_env
from .costs import EmulatedCosts
from .pki import PKI, make_pki
from .podip import address_space
from .procs import (
    REPO,
    ClusterError,
    Proc,
    free_port,
    hack_env,
    killpg,
    spawn,
    terminate,
    wait_until,
)
from .reads import Reader
from .realnodes import RealNodes
from .registry import LocalRegistry

if TYPE_CHECKING:
    from .registryspec import RegistryAccess

log = logging.getLogger("localcluster")

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# A real node's launcher starts its kubelet once containerd holds the images: seconds from a node template, but the
# first node of an image set imports them (up to several minutes with other clusters busy on 2 cores); the Node's
# Ready timeout counts from the kubelet's start.
REAL_NODE_IMPORT_TIMEOUT = 1200.0


def run_build_script(name: str) -> Path:
    """Run ``hack/<name>`` (a build cached by content under ``cache_dir()``, a no-op when nothing changed); the
    path it prints last. Its stderr passes through, so a failure's reason is above the ClusterError."""
    script = REPO / "hack" / name
    proc = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"{script} failed with exit code {proc.returncode} (its output is above)")
    return Path(proc.stdout.strip().splitlines()[-1])


def ensure_tools() -> Path:
    """Build (or reuse) localkube and helm; return the bin dir. Rebuilds only when the sources changed."""
    return run_build_script("build-tools.sh")


@dataclass
class Cluster:
    """A running local control plane. Use :meth:`start`; :meth:`stop` (or the context manager) cleans up."""

    workdir: Path
    bin_dir: Path
    pki: PKI
    api_port: int
    kubeconfig: Path
    _procs: list[Proc] = field(default_factory=list)
    _nodes: dict[str, Proc] = field(default_factory=dict)
    _owns_workdir: bool = False
    _real: RealNodes | None = None
    _registry: LocalRegistry | None = None
    _kcm_args: tuple[str, ...] = ()  # extra kube-controller-manager flags (start(controller_manager_args=...))
    _reader: Reader | None = None  # read(): the admin's GETs, its TLS context built once
    kubelet_proxy_port: int = 0  # the API server reaches real kubelets through clusternet's CONNECT proxy here
    etcd_port: int = 0
    _apiserver_env: dict[str, str] = field(default_factory=dict)  # its environment at start: a restart reuses it

    # -- lifecycle -------------------------------------------------------------------------------------
    @classmethod
    def start(cls, workdir: Path | None = None, *, bin_dir: Path | None = None, timeout: float = 90.0,
              controller_manager_args: tuple[str, ...] = ()) -> Cluster:
        """``controller_manager_args``: extra kube-controller-manager flags (the scale benchmarks, whose Node
        objects have no kubelet to heartbeat, turn the node lifecycle controller off: otherwise it rewrites
        every Node as NotReady 40 s in, thousands of writes in the middle of the measurement)."""
        bin_dir = bin_dir or ensure_tools()
        localkube = bin_dir / "localkube"
        if not localkube.exists():
            raise ClusterError(f"{localkube} missing: run hack/build-tools.sh (make tools)")
        owns = workdir is None
        workdir = Path(workdir or tempfile.mkdtemp(prefix="reprieve-cluster-"))
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "logs").mkdir(exist_ok=True)
        t0 = time.monotonic()
        pki = make_pki(workdir / "pki", sans=["127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
                                              "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
                                              "10.96.0.1"])
        api_port = free_port()
        cluster = cls(workdir, bin_dir, pki, api_port, workdir / "admin.kubeconfig", _owns_workdir=owns,
                      _kcm_args=tuple(controller_manager_args))
        cluster.kubelet_proxy_port = free_port()
        cluster.write_kubeconfig(cluster.kubeconfig, user={"client-certificate": str(pki.crt("admin")),
                                                            "client-key": str(pki.key("admin"))})
        try:
            cluster._start_components(timeout)
        except BaseException:
            cluster.stop()
            raise
        log.info("local cluster up in %.1fs: %s (kubeconfig %s)", time.monotonic() - t0, cluster.server,
                 cluster.kubeconfig)
        return cluster

    def __enter__(self) -> Cluster:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None,
               pass_fds: tuple[int, ...] = ()) -> Proc:
        proc = spawn(self.workdir / "logs", name,
                     [str(self.bin_dir / "localkube"), *args] if name in COMPONENTS else args, env, pass_fds)
        self._procs.append(proc)
        return proc

    def _check_alive(self, proc: Proc) -> None:
        if proc.popen.poll() is not None:
            raise ClusterError(f"{proc.name} exited with code {proc.popen.returncode} during start-up; "
                               f"last lines of {proc.log_path}:\n{proc.tail()}")

    def _start_components(self, timeout: float) -> None:
        wd = self.workdir
        etcd_port, peer_port = free_port(), free_port()
        etcd = self._spawn("etcd", [
            "etcd", "--name=local", f"--data-dir={wd / 'etcd'}", "--log-level=warn", "--unsafe-no-fsync",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=local=http://127.0.0.1:{peer_port}",
        ])
        wait_until(lambda: self._check_alive(etcd) or _http_ok(f"http://127.0.0.1:{etcd_port}/health"),
                   timeout, "etcd /health", on_timeout=lambda: "\n" + etcd.tail())

        self.etcd_port = etcd_port
        self._apiserver_env = apiserver_env(os.environ, self.kubelet_proxy_port)
        self._start_apiserver(timeout)

        self._start_controllers(timeout)

    def _start_controllers(self, timeout: float, replacing: dict[str, Proc] | None = None) -> None:
        """Spawn kube-controller-manager and kube-scheduler and wait until both serve. ``replacing``: the stopped
        ones by name, whose places in ``_procs`` (stop() order) the new ones take."""
        pki = self.pki
        kcm_port, sched_port = free_port(), free_port()
        kcm = self._spawn("kube-controller-manager", [
            "kube-controller-manager", f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={kcm_port}", "--leader-elect=false",
            f"--service-account-private-key-file={pki.key('sa')}", f"--root-ca-file={pki.ca_crt}",
            f"--cluster-signing-cert-file={pki.ca_crt}", f"--cluster-signing-key-file={pki.ca_key}",
            "--use-service-account-credentials=false", "--concurrent-gc-syncs=5", "--v=1",
            *self._kcm_args,
        ])
        sched = self._spawn("kube-scheduler", [
            "kube-scheduler", f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={sched_port}", "--leader-elect=false", "--v=1",
        ])
        for proc in (kcm, sched) if replacing else ():
            self._procs.remove(proc)
            self._procs[self._procs.index(replacing[proc.name])] = proc
        wait_until(lambda: self._check_alive(sched) or _https_ok(f"https://127.0.0.1:{sched_port}/healthz"),
                   timeout, "kube-scheduler /healthz", on_timeout=lambda: "\n" + sched.tail())
        if replacing:
            wait_until(lambda: self._check_alive(kcm) or _https_ok(f"https://127.0.0.1:{kcm_port}/healthz"),
                       timeout, "kube-controller-manager /healthz", on_timeout=lambda: "\n" + kcm.tail())
            return
        # The ServiceAccount controller creating `default` in `default` proves the controller-manager works.
        wait_until(lambda: self._check_alive(kcm) or self.read("serviceaccount", "default", "default",
                                                                missing_ok=True) is not None,
            timeout, "kube-controller-manager (ServiceAccount 'default' in namespace 'default')",
            interval=0.25, on_timeout=lambda: "\n" + kcm.tail())

    def _restart_controllers(self, timeout: float) -> None:
        """Stop kube-controller-manager and kube-scheduler (SIGTERM, SIGKILL after 10 s) and start them again.

        Why :meth:`restart_apiserver` does this: after a restart the new apiserver's watch cache refuses the
        controllers' resource versions ("too old resource version"), and client-go's reflector re-lists only after
        its back-off, which doubles from 0.8 s to 30 s, is jittered up to twice that and resets only after two
        minutes without a failure. Three 2 s restarts 11-20 s apart left the ServiceAccount controller blind for
        2.3, 13.7 and 66.6 s (a new namespace got no `default` account, so no pod could be created in it; the
        scheduler's pod informer backs off the same way). A control plane's restart (an upgrade, a static pod's
        new manifest) restarts its controllers too; here they are restarted so one test's apiserver restarts do
        not leave the shared cluster's next tests waiting on a back-off."""
        old = {p.name: p for p in self._procs if p.name in ("kube-controller-manager", "kube-scheduler")}
        for proc in old.values():
            killpg(proc.popen, signal.SIGTERM)
        for proc in old.values():
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                killpg(proc.popen, signal.SIGKILL)
                proc.popen.wait(10)
        self._start_controllers(timeout, replacing=old)

    def _start_apiserver(self, timeout: float, replacing: Proc | None = None) -> Proc:
        """Spawn kube-apiserver (:mod:`localcluster.apiserver`'s arguments, the environment of the first start)
        and wait for /readyz. ``replacing``: the stopped one's place in ``_procs`` (stop() order) goes to it."""
        args = apiserver_args(workdir=self.workdir, pki=self.pki, api_port=self.api_port, etcd_port=self.etcd_port)
        proc = self._spawn("kube-apiserver", args, env=self._apiserver_env)
        if replacing is not None:
            self._procs.remove(proc)
            self._procs[self._procs.index(replacing)] = proc
        wait_until(lambda: self._check_alive(proc) or self._readyz(), timeout, "kube-apiserver /readyz",
                   on_timeout=lambda: "\n" + proc.tail())
        return proc

    def restart_apiserver(self, down_seconds: float = 5.0, timeout: float = 60.0,
                          until: Callable[[], Any] | None = None, restart_controllers: bool = True) -> float:
        """Stop kube-apiserver (SIGTERM), keep its port closed ``down_seconds`` (and then until ``until()`` is
        true, at most ``timeout`` more), start it again with the same arguments and environment (same port, same
        etcd: every object is kept) and wait for /readyz; then restart the controller-manager and the scheduler
        (``restart_controllers``; why: :meth:`_restart_controllers`). Returns the seconds from the SIGTERM to ready. A start
        that fails (the process exits, or no /readyz within ``timeout``) is a ClusterError with its log's last
        lines; so is an ``until`` that does not come true (the apiserver is started again first).

        On SIGTERM the apiserver stops listening at once but its process lingers (~10 s here, every time, after
        "HTTPServerStoppedListening"): the down window counts from the port's closing, and a process still there
        at its end is SIGKILLed, so the window is what was asked and no two apiservers share etcd."""
        old = next((p for p in self._procs if p.name == "kube-apiserver"), None)
        if old is None:
            raise ClusterError("restart_apiserver: this cluster has no kube-apiserver process (not started, or "
                               "stopped)")
        t0 = time.monotonic()
        killpg(old.popen, signal.SIGTERM)
        wait_until(lambda: not _port_open(self.api_port), timeout,
                   f"kube-apiserver's port {self.api_port} to close after SIGTERM")
        closed = time.monotonic()
        try:
            old.popen.wait(max(down_seconds, 0.1))
        except subprocess.TimeoutExpired:
            killpg(old.popen, signal.SIGKILL)
            old.popen.wait(10)
        time.sleep(max(0.0, down_seconds - (time.monotonic() - closed)))
        waited: ClusterError | None = None
        if until is not None:
            try:
                wait_until(until, timeout, "the condition the apiserver's restart waits for")
            except Exception as err:  # noqa: BLE001 - the apiserver comes back whatever happened
                waited = ClusterError(f"restart_apiserver: {err}")
        log.info("kube-apiserver down for %.1fs (exit code %s)", time.monotonic() - closed, old.popen.returncode)
        with open(old.log_path, "a") as out:
            out.write(f"--- restarted by Cluster.restart_apiserver after {down_seconds:.1f}s down ---\n")
        try:
            self._start_apiserver(timeout, replacing=old)
        except ClusterError as err:
            raise ClusterError(f"kube-apiserver did not come back after a restart: {err}") from None
        took = time.monotonic() - t0
        if restart_controllers:
            self._restart_controllers(timeout)
        log.info("kube-apiserver ready again %.1fs after it was stopped", took)
        if waited is not None:
            raise waited
        return took

    def stop(self) -> None:
        """Stop kubelets, then the control plane (SIGTERM, then SIGKILL after 10 s); remove an owned workdir."""
        for name in list(self._nodes):
            self._stop_kubelet(name)
        if self._real is not None:
            self._real.stop()
        if self._registry is not None:
            self._registry.stop()
        for proc in reversed(self._procs):
            terminate(proc.popen, 10.0)
        self._procs.clear()
        if self._owns_workdir and os.environ.get("REPRIEVE_KEEP_CLUSTER_DIR") != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- clients ---------------------------------------------------------------------------------------
    def _readyz(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.crt("admin")), str(self.pki.key("admin")))
        with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm subprocesses aimed at this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("HELM_CACHE_HOME", str(self.workdir / "helm" / "cache"))
        env.setdefault("HELM_CONFIG_HOME", str(self.workdir / "helm" / "config"))
        env.setdefault("HELM_DATA_HOME", str(self.workdir / "helm" / "data"))
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = self.env()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return _run([str(self.bin_dir / "kubectl"), *args], env, input, check, timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([str(self.bin_dir / "helm"), *args], self.env(), None, check, timeout)

    def read(self, kind: str, name: str | None = None, namespace: str | None = None, **kwargs: Any) -> Any:
        """``kubectl get KIND [NAME] -n NAMESPACE -o json``'s JSON, read without starting kubectl (tests poll with
        it; localcluster.reads says why). ``kwargs``: ``selector``, ``field_selector``, ``missing_ok``."""
        if self._reader is None:
            self._reader = Reader(self.server, self.pki.ca_crt, self.pki.crt("admin"), self.pki.key("admin"))
        return self._reader.get(kind, name, namespace, **kwargs)

    def api_client(self) -> Any:
        """An admin ``kubernetes.client.ApiClient``."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def token_kubeconfig(self, namespace: str, service_account: str, *, duration: str = "2h") -> Path:
        """A kubeconfig that authenticates as ``namespace/service_account`` with a fresh bound token."""
        token = self.kubectl("create", "token", service_account, "-n", namespace,
                             f"--duration={duration}").stdout.strip()
        path = self.workdir / f"{namespace}.{service_account}.kubeconfig"
        self.write_kubeconfig(path, user={"token": token}, namespace=namespace)
        return path

    def write_kubeconfig(self, path: Path, *, user: dict[str, str], namespace: str = "default",
                          server: str | None = None) -> None:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "local", "preferences": {},
            "clusters": [{"name": "local", "cluster": {"server": server or self.server,
                                                       "certificate-authority": str(self.pki.ca_crt)}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user",
                                                       "namespace": namespace}}],
        }
        path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML; kubectl, helm and the client read it
        path.chmod(0o600)

    # -- nodes ---------------------------------------------------------------------------------------------
    def add_node(self, name: str, labels: dict[str, str] | None = None, *, kind: str = "process",
                 timeout: float | None = None, images: list[str] | None = None,
                 costs: EmulatedCosts | None = None) -> str:
        """Start a kubelet registering Node ``name``; return once the Node is Ready.

        ``kind="process"``: a process kubelet (pods are host processes; starts in under a second).
        ``kind="real"``: the upstream kubelet with its own containerd + runc in the cluster network namespace
        (:mod:`localcluster.realnode`); ``images`` names the built images to import (default: all of them).
        ``costs``: a process node's emulated image pull and container start (default: from the environment,
        ``REPRIEVE_EMULATE_PULL_SECONDS`` / ``REPRIEVE_EMULATE_START_SECONDS``, else none).
        """
        if name in self._nodes:
            raise ClusterError(f"node {name!r} already has a kubelet in this cluster")
        if kind == "real":
            proc = self.real.add(name, labels or {}, images)
            timeout = timeout or float(os.environ.get("REPRIEVE_REAL_NODE_TIMEOUT", "300"))
            logs = [self.workdir / "logs" / f"{c}-{name}.log" for c in ("containerd", "kubelet")]
        elif kind == "process":
            args = [sys.executable, "-m", "localcluster.kubelet", "--kubeconfig", str(self.kubeconfig),
                    "--node", name, "--workdir", str(self.workdir / "nodes" / name),
                    "--ca-file", str(self.pki.ca_crt), "--address-space", self.address_space]
            for k, v in (labels or {}).items():
                args += ["--label", f"{k}={v}"]
            if costs is not None:
                args += ["--emulate-pull-seconds", str(costs.pull_seconds),
                         "--emulate-start-seconds", str(costs.start_seconds)]
            proc = spawn(self.workdir / "logs", f"kubelet-{name}", args, hack_env())
            timeout, logs = timeout or 30.0, []
        else:
            raise ClusterError(f"add_node({name!r}): kind must be 'process' or 'real', got {kind!r}")
        self._nodes[name] = proc

        def ready() -> bool:
            self._check_alive(proc)
            node = self.read("node", name, missing_ok=True) or {}
            return any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (node.get("status") or {}).get("conditions") or [])

        def tails() -> str:
            return "\n" + "\n".join([proc.tail()] + [f"--- {p.name}:\n" + Proc(p.name, proc.popen, p).tail(15)
                                                     for p in logs if p.exists()])

        try:
            if kind == "real":  # the first node of an image set imports the images (minutes on a busy machine)
                launcher_log = self.workdir / "logs" / f"realnode-{name}.log"

                def kubelet_started() -> bool:
                    self._check_alive(proc)
                    return launcher_log.exists() and "kubelet started" in launcher_log.read_text(errors="replace")

                wait_until(kubelet_started, REAL_NODE_IMPORT_TIMEOUT, f"node {name}'s containerd and images",
                           interval=0.5, on_timeout=tails)
            wait_until(ready, timeout, f"node {name} Ready", interval=0.2, on_timeout=tails)
        except ClusterError as err:
            if kind == "real":  # the launcher's error (containerd, image import, kubelet) with the logs
                self._stop_kubelet(name)
                raise ClusterError(f"real node {name}: {err}{tails() if 'exited' in str(err) else ''}") from None
            raise
        return name

    @property
    def address_space(self) -> str:
        """Salt of this cluster's process pods' loopback addresses (:func:`localcluster.podip.address_space`)."""
        return address_space(str(self.workdir))

    @property
    def real(self) -> RealNodes:
        """The real-node tier of this cluster (images, cluster network, real nodes), created on first use."""
        if self._real is None:
            self._real = RealNodes(self)
        return self._real

    @property
    def registry(self) -> LocalRegistry | None:
        """The cluster's registry and package index (:meth:`start_registry`), or None."""
        return self._registry

    def start_registry(self) -> RegistryAccess:
        """Start the cluster's OCI registry and package index (:mod:`localcluster.registry`) once; real nodes
        started from then on pull from the registry. Returns what a client needs to reach both."""
        if self._registry is None:
            self._registry = LocalRegistry.start(self.workdir, self.pki)
            if self._real is not None and self._real.net is not None:
                self._registry.attach(self._real.net)
        return self._registry.access

    def is_real(self, name: str) -> bool:
        return self._real is not None and name in self._real.nodes

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def remove_node(self, name: str, *, timeout: float = 30.0) -> None:
        """The VM is gone: delete the Node object; every pod process dies at once.

        A process kubelet notices the deletion, SIGKILLs its pods and exits. A real kubelet would carry on
        (it does not watch its own Node), so a real node is killed whole first (:meth:`kill_node`)."""
        if self.is_real(name):
            self.kill_node(name)
        self.kubectl("delete", "node", name, "--wait=false")
        proc = self._nodes.get(name)
        if proc is not None:
            wait_until(lambda: proc.popen.poll() is not None, timeout, f"kubelet of deleted node {name} to exit",
                       on_timeout=lambda: "\n" + proc.tail())
            self._nodes.pop(name, None)

    def kill_node(self, name: str) -> None:
        """The node vanishes without a word: SIGKILL the kubelet and its pods; the Node object stays."""
        self._stop_kubelet(name, hard=True)

    def _stop_kubelet(self, name: str, hard: bool = False) -> None:
        proc = self._nodes.pop(name, None)
        if proc is None:
            return
        if self._real is not None and name in self._real.nodes:
            self._real.stop_node(name, hard=hard)
        elif hard:
            killpg(proc.popen, signal.SIGKILL)
            proc.popen.wait(10)
        else:
            terminate(proc.popen, 15.0)

    def pod_logs(self, namespace: str, pod: str, container: str = "*") -> list[Path]:
        """Log files of every incarnation of pod ``namespace/pod`` on any node, oldest first."""
        found = [p for p in self.workdir.glob(f"nodes/*/pods/{namespace}/{pod}-*/logs/{container}.log")
                 if len(p.parents[1].name) == len(pod) + 9]  # "<pod>-<uid8>", not another pod's "<pod>-x-..."
        if self._real is not None:
            found += self._real.pod_logs(namespace, pod, container)
        return sorted(found, key=lambda p: p.stat().st_ctime_ns)

    def kubelet_log(self, name: str) -> str:
        prefix = "kubelet" if not self.is_real(name) else "realnode"
        return (self.workdir / "logs" / f"{prefix}-{name}.log").read_text(errors="replace")


def _run(cmd: list[str], env: dict[str, str], input: str | None, check: bool,
         timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(cmd, env=env, input=input, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as err:
        raise ClusterError(f"{' '.join(cmd[:4])} ... did not finish within {timeout:.0f}s") from err
    if check and proc.returncode != 0:
        raise ClusterError(f"{Path(cmd[0]).name} {' '.join(cmd[1:])} failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _https_ok(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # component's self-signed serving cert; only liveness is asked
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
