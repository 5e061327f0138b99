"""Reprieve on the local cluster: the chart installed with helm, the operator run with the chart's RBAC.

The operator image cannot be built here (no container engine), so the chart is installed with
``replicaCount=0`` (CRD, ServiceAccount, ClusterRole and binding only) and the operator runs as a local process
(``python -m reprieve_operator``) authenticated with a token of the chart's ServiceAccount: exactly the
permissions the Deployment would have in a real cluster. Used by the end-to-end tests, the demo and the goodput
benchmark.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .cluster import REPO, Cluster, ClusterError, wait_until

CHART = REPO / "charts" / "reprieve"
RELEASE, RELEASE_NS, OPERATOR_SA = "reprieve", "reprieve-system", "reprieve"


def install_chart(cluster: Cluster, *, timeout: float = 60.0) -> None:
    """``helm upgrade --install`` the chart without the operator pod; wait until TrainingJobs are served."""
    cluster.helm("upgrade", "--install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace",
                 "--set", "replicaCount=0", "--wait", "--timeout", f"{int(timeout)}s", timeout=timeout + 30)
    wait_until(lambda: cluster.kubectl("get", "trainingjobs", "-A", check=False).returncode == 0, timeout,
               "the TrainingJob CRD to be served", interval=0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OperatorProcess:
    """``python -m reprieve_operator`` with the chart's ServiceAccount token: start, stop, kill, restart."""

    def __init__(self, cluster: Cluster, log_dir: Path, *, namespaces: list[str] | None = None,
                 log_level: str = "INFO", extra_args: list[str] | None = None,
                 identity: tuple[str, str] = (RELEASE_NS, OPERATOR_SA)) -> None:
        self.cluster, self.log_dir = cluster, log_dir
        self.identity = identity  # (namespace, ServiceAccount) whose token the operator runs with
        self.namespaces = namespaces or []
        self.log_level = log_level
        self.extra_args = extra_args or []
        self.metrics_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.runs}.log"

    def start(self, timeout: float = 30.0) -> OperatorProcess:
        kubeconfig = self.cluster.token_kubeconfig(*self.identity)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update(KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
        self.runs += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "reprieve_operator", "--metrics-port", str(self.metrics_port),
                "--log-level", self.log_level, *self.extra_args]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise ClusterError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
            self.metrics()
            return True

        wait_until(ready, timeout, "the operator's metrics endpoint", interval=0.2,
                   on_timeout=lambda: "\n" + self.tail())
        return self

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
            return str(r.read().decode())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no operator log)"


# -- the example job ------------------------------------------------------------------------------------

EXAMPLE = REPO / "examples" / "trainingjob.yaml"


def example_job(name: str, *, replicas: int = 2, steps: int = 300, step_sleep: float = 0.05,
                interval: int = 50, checkpoint_dir: Path, node_selector: dict[str, str] | None = None,
                devices_per_process: int = 2, extra_env: dict[str, str] | None = None,
                max_failures: int | None = None) -> dict[str, Any]:
    """``examples/trainingjob.yaml`` adapted to the process kubelet: the repository mounted at ``/app`` and the
    checkpoint directory at ``/ckpt`` through hostPath volumes (both shared by every node of this host)."""
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["name"] = name
    spec = body["spec"]
    spec["replicas"] = replicas
    spec["checkpoint"]["intervalSteps"] = interval
    spec["checkpoint"]["uri"] = "/ckpt/checkpoints"
    if max_failures is not None:
        spec.setdefault("restartPolicy", {})["maxFailures"] = max_failures
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container.get("env", [])}
    values = {"TRAIN_STEPS": str(steps), "TRAIN_STEP_SLEEP": str(step_sleep), "TRAIN_RESULT": "/ckpt/result.json",
              "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
              **(extra_env or {})}
    for k, v in values.items():
        env[k] = {"name": k, "value": v}
    container["env"] = list(env.values())
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    pod["volumes"] = [v for v in pod.get("volumes", []) if v["name"] not in ("app", "ckpt")] + [
        {"name": "app", "hostPath": {"path": str(REPO), "type": "Directory"}},
        {"name": "ckpt", "hostPath": {"path": str(checkpoint_dir), "type": "Directory"}},
    ]
    mounts = [m for m in container.get("volumeMounts", []) if m["name"] not in ("app", "ckpt")]
    container["volumeMounts"] = mounts + [{"name": "app", "mountPath": "/app"},
                                          {"name": "ckpt", "mountPath": "/ckpt"}]
    if node_selector:
        pod["nodeSelector"] = node_selector
    return dict(body)
