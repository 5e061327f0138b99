"""Real Kueue against the local control plane: its manager built from ``sigs.k8s.io/kueue`` (hack/build-kueue.sh,
cached by version), its CRDs and webhook configurations from the same module, its webhooks served with a
certificate of the cluster's own CA.

    kq = start_kueue(cluster)          # CRDs, the manager process, webhooks registered and answering
    kq.apply(cluster_queue(...))       # objects go through Kueue's webhooks
    kq.stop()

Kueue runs as a local process (like the control plane), not as a pod: the process kubelets run Python programs,
not images. What this leaves out is listed in docs/kueue.md ("Kueue in the local cluster").
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .cluster import Cluster, run_build_script
from .pki import _issue, _openssl
from .procs import ClusterError, Proc, free_port, wait_until

# The external framework Kueue must know for the operator's Workloads (operator/reprieve_operator/policy/kueue.py).
FRAMEWORK = "TrainingJob.v1alpha1.reprieve.dev"
# The webhooks kept: Kueue's own objects and batch/v1 Jobs (the one built-in integration turned on here). The
# others (pods, deployments, JobSet, Kubeflow, Ray, ...) are left out: their integrations are off, so their paths
# are not served, and a failing webhook on pods would stop every pod in the cluster.
WEBHOOK_GROUPS = {"kueue.x-k8s.io", "batch"}


def ensure_kueue() -> Path:
    """Build (or reuse) Kueue; the directory with ``kueue``, ``crd/`` and ``webhook/manifests.yaml``."""
    return run_build_script("build-kueue.sh")


def config(webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int,
           frameworks: Sequence[str] = ("batch/job",)) -> dict[str, Any]:
    """Kueue's Configuration for a manager outside the cluster (pure)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(frameworks), "externalFrameworks": [FRAMEWORK]},
    }


def webhooks(manifests: str, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations pointed at ``url`` (the local manager) with the cluster CA (pure):
    only the webhooks of :data:`WEBHOOK_GROUPS`, renamed ``reprieve-local-kueue-*``."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups or not groups <= WEBHOOK_GROUPS:
                continue
            path = (hook.get("clientConfig") or {}).get("service", {}).get("path", "")
            kept.append({**hook, "clientConfig": {"url": f"{url}{path}", "caBundle": ca_bundle}})
        kind = doc["kind"]
        name = "reprieve-local-kueue-" + ("mutating" if kind.startswith("Mutating") else "validating")
        out.append({"apiVersion": doc["apiVersion"], "kind": kind, "metadata": {"name": name}, "webhooks": kept})
    return out


@dataclass
class Kueue:
    cluster: Cluster
    proc: Proc
    dir: Path
    version: str
    health_port: int

    def apply(self, *docs: dict[str, Any]) -> None:
        """``kubectl apply`` of ``docs`` (they pass Kueue's webhooks)."""
        self.cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))

    def tail(self, lines: int = 40) -> str:
        return self.proc.tail(lines)

    def stop(self) -> None:
        if self.proc.popen.poll() is None:
            self.proc.popen.terminate()
            try:
                self.proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.popen.kill()
        # Webhooks pointing at a stopped manager would refuse every write to Kueue's objects and batch Jobs.
        for kind, name in (("mutatingwebhookconfiguration", "mutating"), ("validatingwebhookconfiguration",
                                                                           "validating")):
            self.cluster.kubectl("delete", kind, f"reprieve-local-kueue-{name}", "--ignore-not-found", check=False)


# Kueue v0.17's manager reads its metrics server's certificate from this fixed path whenever its internal
# certificate management is off (cmd/kueue/main.go); there is no flag to move it.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")


def metrics_certs(path: Path = METRICS_CERTS) -> None:
    """A self-signed pair for Kueue's metrics server at ``path``, made once (an existing pair is kept: several
    clusters may start Kueue at once). Raises ClusterError when the path cannot be written (not root)."""
    if (path / "tls.crt").exists() and (path / "tls.key").exists():
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path))
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(tmp / "tls.key"), "-out", str(tmp / "tls.crt"), "-days", "3650",
                 "-subj", "/CN=kueue-metrics", "-addext", "subjectAltName=IP:127.0.0.1", cwd=tmp)
        for name in ("tls.key", "tls.crt"):  # the key first: a reader that sees the certificate finds its key
            os.replace(tmp / name, path / name)
        shutil.rmtree(tmp, ignore_errors=True)
    except OSError as err:
        raise ClusterError(f"Kueue's manager needs a metrics certificate at {path} (a fixed path in Kueue "
                           f"v0.17 when its internal certificate management is off) and it cannot be written: "
                           f"{err}. Run as root, or create tls.crt/tls.key there.") from err


def start_kueue(cluster: Cluster, *, timeout: float = 120.0, frameworks: Sequence[str] = ("batch/job",)) -> Kueue:
    """Install Kueue's CRDs, start its manager against ``cluster`` and register its webhooks; return once they
    answer (a server-side dry run of a ResourceFlavor passes through them)."""
    built = ensure_kueue()
    metrics_certs()
    version = built.name.split("-go")[0]
    wd = cluster.workdir / "kueue"
    certs = wd / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    _issue(cluster.pki, "kueue-webhook", "/CN=kueue-webhook", server_sans=["127.0.0.1", "localhost"])
    shutil.copy(cluster.pki.crt("kueue-webhook"), certs / "tls.crt")
    shutil.copy(cluster.pki.key("kueue-webhook"), certs / "tls.key")
    # Server-side apply: the CRDs are larger than client-side apply's last-applied annotation allows.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(built / "crd"), timeout=120)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(built / "crd"), timeout=90)
    cluster.kubectl("create", "namespace", "kueue-system", check=False)
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    cfg = wd / "config.yaml"
    cfg.write_text(json.dumps(config(webhook_port, certs, health_port, metrics_port, frameworks)))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    proc = cluster._spawn("kueue", [str(built / "kueue"), f"--config={cfg}", "--zap-log-level=2",
                                    "--feature-gates=VisibilityOnDemand=false"], env=env)
    kq = Kueue(cluster, proc, built, version, health_port)
    t0 = time.monotonic()
    try:
        wait_until(lambda: cluster._check_alive(proc) or _ready(health_port), timeout, "Kueue /readyz",
                   on_timeout=lambda: "\n" + proc.tail())
        ca = base64.b64encode(cluster.pki.ca_crt.read_bytes()).decode()
        hooks = webhooks((built / "webhook" / "manifests.yaml").read_text(), f"https://127.0.0.1:{webhook_port}", ca)
        cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(h) for h in hooks))
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "reprieve-webhook-probe"}}

        def webhooks_answer() -> bool:
            cluster._check_alive(proc)
            out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
            return out.returncode == 0

        wait_until(webhooks_answer, timeout, "Kueue's webhooks", interval=0.5, on_timeout=lambda: "\n" + proc.tail())
    except BaseException:
        kq.stop()
        raise
    _log(f"Kueue {version} up in {time.monotonic() - t0:.1f}s (webhooks on 127.0.0.1:{webhook_port})")
    return kq


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _log(msg: str) -> None:
    logging.getLogger("localcluster").info(msg)


# -- the objects a test or the demo queues into (pure builders) ------------------------------------------------
def resource_flavor(name: str, node_labels: dict[str, str] | None = None,
                    tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if node_labels:
        spec["nodeLabels"] = node_labels
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": spec}


def cluster_queue(name: str, flavor: str, cpu: str, *, preempt: bool = True) -> dict[str, Any]:
    """A ClusterQueue with ``cpu`` of quota on ``flavor``; ``preempt``: a higher priority preempts within it."""
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["cpu"],
                            "flavors": [{"name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu}]}]}],
    }
    if preempt:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": spec}


def local_queue(namespace: str, name: str, cq: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cq}}


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": name},
            "value": value}
