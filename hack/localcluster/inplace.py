"""One supervised worker pod (``reprieve-supervisor -- <command>``) and the operator's half of the in-place protocol,
played by hand: write the assignment ConfigMap, read the exit reports, deliver a notice. For the runtime's
supervisor tests (tests/runtime/test_supervisor_cluster.py); the operator has
its own builders. The worker gets exactly the RBAC docs/contract.md names: get/list/watch/patch on its job's
pods, get/list/watch on the one assignment ConfigMap.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from localcluster.kubelet import find_log
from localcluster.testing import wait_for, wait_for_pod_phase

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NOTICE_DIR = "/etc/reprieve"  # the pod's annotations as a downward-API file, mounted as the operator does


def worker_rbac(namespace: str, job: str, pods: list[str]) -> list[dict[str, Any]]:
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"],
              "resourceNames": pods},
             {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"],
              "resourceNames": [f"{job}-assignment"]}]
    name = f"{job}-worker"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def worker_pod(job: str, pod: str, command: list[str], out: Path, *, node: str, grace: int = 5,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Process 0 of 1, attempt 1 in its environment (the first attempt); ``out`` is a hostPath at /out. The notice
    reaches it both ways the operator's pods get it: the pod watch and the downward-API annotations file."""
    plain = {"REPRIEVE_JOB": job, "REPRIEVE_ATTEMPT": "1", "REPRIEVE_PROCESS_ID": "0", "REPRIEVE_NUM_PROCESSES": "1",
             "REPRIEVE_CONTRACT": "1", "REPRIEVE_TERMINATION_GRACE_SECONDS": str(grace),
             "REPRIEVE_SERVICEACCOUNT_DIR": SA_DIR, "REPRIEVE_CHECKPOINT_URI": "/out/ckpt", "OUT": "/out",
             "REPRIEVE_NOTICE_FILE": f"{NOTICE_DIR}/annotations", **(env or {})}
    container = {
        "name": "main", "image": "ignored", "command": ["reprieve-supervisor", "--", *command],
        "env": [{"name": "REPRIEVE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "REPRIEVE_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "REPRIEVE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                *({"name": k, "value": v} for k, v in plain.items())],
        "volumeMounts": [{"name": "out", "mountPath": "/out"}, {"name": "podinfo", "mountPath": NOTICE_DIR}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": {"reprieve.dev/job-name": job}},
            "spec": {"containers": [container], "restartPolicy": "Never", "serviceAccountName": f"{job}-worker",
                     "terminationGracePeriodSeconds": grace, "nodeName": node,
                     "volumes": [{"name": "out", "hostPath": {"path": str(out), "type": "DirectoryOrCreate"}},
                                 {"name": "podinfo", "downwardAPI": {"items": [
                                     {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}]}}


class SupervisedPod:
    """One worker pod under reprieve-supervisor, and the operator's side of the protocol for it."""

    def __init__(self, cluster: Any, namespace: str, out: Path, *, job: str = "job", pod: str = "job-0",
                 node: str = "worker-0") -> None:
        self.cluster, self.ns, self.out = cluster, namespace, out
        self.job, self.pod, self.node = job, pod, node
        self.core = client.CoreV1Api(cluster.api_client())

    def close(self) -> None:
        self.core.api_client.close()

    @classmethod
    @contextlib.contextmanager
    def under(cls, cluster: Any, namespace: str, tmp_path: Path, *, pod: str = "job-0") -> Iterator[Any]:
        """The pod's object (not created yet) with its output directory ``tmp_path/out``; closed on exit."""
        out = tmp_path / "out"
        out.mkdir()
        pod_ = cls(cluster, namespace, out, pod=pod)
        try:
            yield pod_
        finally:
            pod_.close()

    def create(self, command: list[str], *, grace: int = 5, env: dict[str, str] | None = None) -> None:
        objects = [*worker_rbac(self.ns, self.job, [self.pod]),
                   worker_pod(self.job, self.pod, command, self.out, node=self.node, grace=grace, env=env)]
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-",
                             input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def start(self, command: list[str], *, grace: int = 5, env: dict[str, str] | None = None) -> Any:
        self.create(command, grace=grace, env=env)
        return self.wait_phase("Running")

    def wait_phase(self, phase: str, timeout: float = 90) -> Any:
        return wait_for_pod_phase(self.core.api_client, self.ns, self.pod, phase, timeout=timeout)

    def assign(self, attempt: int, processes: dict[str, int] | None = None, *, count: int = 1,
               coordinator: str = "127.0.0.1:1", contract: str = "1") -> float:
        """Write the assignment ConfigMap as the operator does; returns the wall time just before the write."""
        name = f"{self.job}-assignment"
        body = {"metadata": {"name": name},
                "data": {"contract": contract, "attempt": str(attempt), "numProcesses": str(count),
                         "coordinator": coordinator, "processes": json.dumps(processes or {self.pod: 0})}}
        t = time.time()
        try:
            self.core.replace_namespaced_config_map(name, self.ns, body)
        except client.ApiException as err:
            if err.status != 404:
                raise
            t = time.time()
            self.core.create_namespaced_config_map(self.ns, body)
        return t

    def notify(self, attempt: int, deadline_s: float, notice_id: str) -> None:
        """The operator's notice annotation for ``attempt`` (deadline ``deadline_s`` from now)."""
        deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + deadline_s))
        value = {"id": notice_id, "reason": "benchmark", "node": self.node, "deadline": deadline,
                 "observedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "attempt": attempt}
        self.core.patch_namespaced_pod(self.pod, self.ns,
                                       {"metadata": {"annotations": {"reprieve.dev/notice": json.dumps(value)}}})

    def annotation(self, key: str) -> dict[str, Any] | None:
        pod = self.core.read_namespaced_pod(self.pod, self.ns)
        value = (pod.metadata.annotations or {}).get(key)
        return json.loads(value) if value else None

    def wait_exit_report(self, attempt: int, timeout: float = 90) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            report = self.annotation("reprieve.dev/exit")
            return report if report and report["attempt"] == attempt else None

        return wait_for(check, timeout, f"the exit report of attempt {attempt}", interval=0.02,
                        describe=lambda: f"last {self.annotation('reprieve.dev/exit')}; log:\n{self.log()[-3000:]}")

    def exit_report_since(self, attempt: int, resource_version: str, timeout: float = 30) -> dict[str, Any]:
        """The exit report of ``attempt`` from the pod's watch events after ``resource_version``: the report of a
        deleted pod is on it only between the supervisor's patch and the pod's removal (about 0.1 s on a process
        node), which polling can miss under load; the watch sees every change, the final one (DELETED) included."""
        w = watch.Watch()
        seen: list[Any] = []
        try:  # the server ends the watch after ``timeout``
            for ev in w.stream(self.core.list_namespaced_pod, self.ns, field_selector=f"metadata.name={self.pod}",
                               resource_version=resource_version, timeout_seconds=max(1, int(timeout))):
                value = (ev["object"].metadata.annotations or {}).get("reprieve.dev/exit")
                seen.append((ev["type"], value))
                report = json.loads(value) if value else None
                if report and report.get("attempt") == attempt:
                    return report
        finally:
            w.stop()
        raise AssertionError(f"no exit report of attempt {attempt} in the pod's events within {timeout:.0f} s: "
                             f"{seen[-5:]}; log:\n{self.log()[-3000:]}")

    def log(self) -> str:
        path = find_log(self.cluster.workdir / "nodes" / self.node, self.ns, self.pod)
        return path.read_text() if path is not None and path.exists() else ""

    def wait_log(self, text: str, timeout: float = 90, *, count: int = 1) -> str:
        return wait_for(lambda: self.log().count(text) >= count and self.log(), timeout,
                        f"{text!r} {count}x in the pod's log", describe=lambda: self.log()[-3000:])
