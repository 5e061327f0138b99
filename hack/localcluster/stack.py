"""Reprieve on the local cluster: the chart installed with helm, the operator run with the chart's RBAC.

Two ways, both through the chart:

- :func:`install_operator` is the real install path: ``helm install`` with the operator image built from
  ``operator/Dockerfile``; the operator runs as the chart's Deployment on a real node (upstream kubelet,
  containerd), in a namespace where restricted Pod Security is enforced.
- :func:`install_chart` + :class:`OperatorProcess`, for process-node clusters: the chart with
  ``replicaCount=0`` (CRD, ServiceAccount, ClusterRole and binding only) and the operator as a local process
  (``python -m reprieve_operator``) authenticated with a token of the chart's ServiceAccount: exactly the
  permissions the Deployment has.

Used by the end-to-end tests, the demo and the goodput benchmark.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .cluster import REPO, Cluster, ClusterError, free_port, wait_until

CHART = REPO / "charts" / "reprieve"
RELEASE, RELEASE_NS, OPERATOR_SA = "reprieve", "reprieve-system", "reprieve"


def install_chart(cluster: Cluster, *, timeout: float = 60.0) -> None:
    """``helm upgrade --install`` the chart without the operator pod; wait until TrainingJobs are served."""
    cluster.helm("upgrade", "--install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace",
                 "--set", "replicaCount=0", "--wait", "--timeout", f"{int(timeout)}s", timeout=timeout + 30)
    wait_until(lambda: cluster.read("trainingjobs", missing_ok=True) is not None, timeout,
               "the TrainingJob CRD to be served", interval=0.2)


def bench_namespace(cluster: Cluster, namespace: str, *, pool: int = 32) -> Any:
    """For a benchmark whose operator runs as a local process: the chart's CRD and RBAC, ``namespace`` with its
    default ServiceAccount (pods are refused until it exists), and an API client with ``pool`` connections."""
    install_chart(cluster)
    cluster.kubectl("create", "namespace", namespace)
    wait_until(lambda: cluster.read("sa", "default", namespace, missing_ok=True) is not None,
               60, "the namespace's default ServiceAccount", interval=0.2)
    api = cluster.api_client()
    api.configuration.connection_pool_maxsize = pool
    return api


# Node pools of a real-node cluster (label reprieve.test/pool): the operator's node, and the workers' nodes.
SYSTEM_POOL, WORKER_POOL = "system", "realw"
OPERATOR_SELECTOR = f"app.kubernetes.io/name=reprieve,app.kubernetes.io/instance={RELEASE}"
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")}


def operator_values(image: str, *, node_selector: dict[str, str] | None = None,
                    values: dict[str, Any] | None = None) -> str:
    """The chart values that run the operator from ``image`` (``repository:tag``), as a values file's text.

    JSON, not PyYAML's dump: a content tag such as ``9711789198e1`` is a plain string to PyYAML (YAML 1.1 floats
    need a dot) but a number to helm's parser, which the chart's schema then refuses (``/image/tag: got number``).
    JSON quotes every string, and a JSON document is a YAML one."""
    repository, _, tag = image.rpartition(":")
    return json.dumps({"image": {"repository": repository, "tag": tag}, "nodeSelector": node_selector or {},
                       **(values or {})}, indent=1, sort_keys=True)


def install_operator(cluster: Cluster, image: str, *, node_selector: dict[str, str] | None = None,
                     values: dict[str, Any] | None = None, timeout: float = 180.0) -> str:
    """``helm install`` the chart with the operator Deployment running ``image`` (``repository:tag``) in
    ``reprieve-system``, labelled to enforce the restricted Pod Security Standard; wait for the rollout and
    return the operator pod's name.

    Raises:
        ClusterError: helm failed, or the Deployment did not become available (with the pod's state and log).
    """
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NS, "labels": RESTRICTED}}))
    values_file = cluster.workdir / "operator-values.yaml"
    values_file.write_text(operator_values(image, node_selector=node_selector, values=values))
    proc = cluster.helm("upgrade", "--install", RELEASE, str(CHART), "-n", RELEASE_NS, "-f", str(values_file),
                        "--wait", "--timeout", f"{int(timeout)}s", check=False, timeout=timeout + 30)
    if proc.returncode != 0:
        raise ClusterError(f"helm install of {CHART.name} with {image} failed: {proc.stderr.strip()}\n"
                           f"{operator_state(cluster)}")
    return operator_pod(cluster)


def operator_pod(cluster: Cluster) -> str:
    """The name of the running (not terminating) operator pod of the Deployment."""
    pods = [p for p in cluster.read("pods", namespace=RELEASE_NS, selector=OPERATOR_SELECTOR)["items"]
            if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]
    if not pods:
        raise ClusterError(f"no running operator pod in {RELEASE_NS}\n{operator_state(cluster)}")
    return str(pods[0]["metadata"]["name"])


def operator_state(cluster: Cluster, lines: int = 40) -> str:
    """The operator pods, their events and the last log lines: what a failed install or wait shows."""
    pods = cluster.kubectl("get", "pods", "-n", RELEASE_NS, "-o", "wide", check=False).stdout
    events = cluster.kubectl("get", "events", "-n", RELEASE_NS, "--sort-by=.lastTimestamp", check=False).stdout
    logs = []
    for name in yaml.safe_load(cluster.kubectl("get", "pods", "-n", RELEASE_NS, "-l", OPERATOR_SELECTOR, "-o",
                                               "json", check=False).stdout or "{}").get("items", []):
        for path in cluster.pod_logs(RELEASE_NS, name["metadata"]["name"], "operator")[-1:]:
            logs.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
    recent = "\n".join(events.splitlines()[-15:])
    return f"pods:\n{pods}\nevents:\n{recent}\n" + "\n".join(logs)


class DeployedOperator:
    """The operator installed by :func:`install_operator`: its pod, its log, and deleting that pod."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @property
    def pod(self) -> str:
        """The operator pod that acts: the holder of the leader-election Lease (with leader election), else the
        running pod."""
        return self.leader() or operator_pod(self.cluster)

    def leader(self) -> str | None:
        lease = self.cluster.read("lease", RELEASE, RELEASE_NS, missing_ok=True) or {}
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        return holder.rsplit("_", 1)[0] or None  # identity: <pod>_<pid>

    def tail(self, lines: int = 60) -> str:
        return operator_state(self.cluster, lines)

    def delete_pod(self, timeout: float = 120.0) -> str:
        """Delete the acting operator pod (graceful; with leader election it releases the Lease and the standby
        takes over); return the name of the pod that acts next, once it does."""
        old = self.pod
        self.cluster.kubectl("delete", "pod", old, "-n", RELEASE_NS, "--wait=false")

        def replaced() -> bool:
            try:
                return self.pod != old
            except ClusterError:
                return False

        wait_until(replaced, timeout, "another operator pod to act", interval=0.5,
                   on_timeout=lambda: "\n" + self.tail())
        return self.pod


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
        self.metrics_port = free_port()
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

def reference_run(workdir: Path, steps: int, shards: int) -> subprocess.Popen[bytes]:
    """The uninterrupted run an elastic job is compared with: ``examples/train_lm.py`` over ``shards`` virtual
    shards in canonical order, one process of one device on this host (canonical order: bitwise the same parameters
    on any process and device count, docs/elastic.md). Its result in ``workdir/reference.json``, its log in
    ``workdir/reference.log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "TRAIN_", "XLA_FLAGS"))}
    env |= {"REPRIEVE_VIRTUAL_SHARDS": str(shards), "REPRIEVE_CHECKPOINT_URI": str(workdir / "reference"),
            "TRAIN_STEPS": str(steps), "TRAIN_RESULT": str(workdir / "reference.json"), "JAX_PLATFORMS": "cpu"}
    with open(workdir / "reference.log", "wb") as out:
        return subprocess.Popen([sys.executable, str(REPO / "examples" / "train_lm.py")], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


EXAMPLE = REPO / "examples" / "trainingjob.yaml"


def example_job(name: str, *, replicas: int = 2, steps: int = 300, step_sleep: float = 0.05,
                interval: int = 50, checkpoint_dir: Path, node_selector: dict[str, str] | None = None,
                devices_per_process: int = 2, extra_env: dict[str, str] | None = None,
                max_failures: int | None = None, image: str | None = None,
                requests: dict[str, str] | None = None, compilation_cache: Path | None = None) -> dict[str, Any]:
    """``examples/trainingjob.yaml`` adapted to the local cluster: the checkpoint directory at ``/ckpt`` through
    a hostPath volume (shared by every node of this host). For process nodes (``image=None``) the repository is
    mounted at ``/app``; for real nodes ``image`` is the example image built from ``examples/Dockerfile``, which
    holds the trainer at ``/app/examples``, and ``/ckpt`` is made writable for its non-root user.

    ``compilation_cache``: a host directory mounted at ``/xla-cache`` and used as the JAX compilation cache instead
    of one under the job's own ``/ckpt`` (jobs of the same shape then compile their programs once between them).
    With it, JAX's XLA caches beside the persistent cache are off (``JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none``):
    the one JAX turns on by default is GPU autotuning's, whose directory (under the cache directory) is part of
    every cache key, so a process node (which sees the host path) and a real node's container (``/xla-cache``)
    never hit each other's entries; on CPU the option changes nothing else."""
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
              **({"REPRIEVE_COMPILATION_CACHE_DIR": "/xla-cache", "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}
                 if compilation_cache is not None else {}),
              **(extra_env or {})}
    for k, v in values.items():
        env[k] = {"name": k, "value": v}
    container["env"] = list(env.values())
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    volumes = [{"name": "ckpt", "hostPath": {"path": str(checkpoint_dir), "type": "Directory"}}]
    mounts = [{"name": "ckpt", "mountPath": "/ckpt"}]
    if compilation_cache is not None:
        compilation_cache.mkdir(parents=True, exist_ok=True)
        compilation_cache.chmod(0o777)  # written by the example image's non-root user on real nodes
        volumes.append({"name": "xla-cache", "hostPath": {"path": str(compilation_cache), "type": "Directory"}})
        mounts.append({"name": "xla-cache", "mountPath": "/xla-cache"})
    if image is None:
        volumes.append({"name": "app", "hostPath": {"path": str(REPO), "type": "Directory"}})
        mounts.append({"name": "app", "mountPath": "/app"})
    else:
        container["image"] = image
        checkpoint_dir.chmod(0o777)  # the image runs as uid 65532; hostPath volumes keep host permissions
    ours = {v["name"] for v in volumes}
    pod["volumes"] = [v for v in pod.get("volumes", []) if v["name"] not in ours] + volumes
    container["volumeMounts"] = [m for m in container.get("volumeMounts", []) if m["name"] not in ours] + mounts
    if node_selector:
        pod["nodeSelector"] = node_selector
    if requests:
        container.setdefault("resources", {})["requests"] = requests
    return dict(body)
