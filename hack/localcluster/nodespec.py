"""Node and Lease objects of the process kubelet (pure builders)."""

from __future__ import annotations

import platform
from datetime import datetime

from localcluster.podstatus import micro_time, rfc3339

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
HOST_IP = "127.0.0.1"
KUBELET_VERSION = "v1.35.4-process"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def node_labels(name: str, extra: dict[str, str] | None) -> dict[str, str]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": _ARCH,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": _ARCH,
    }
    labels.update(extra or {})
    return labels


def node_conditions(now: datetime, since: datetime) -> list[dict]:
    """Ready plus the three pressure conditions, as a healthy kubelet reports them."""
    hb, tr = rfc3339(now), rfc3339(since)
    conds = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "process kubelet is posting ready status"),
    ]
    return [{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": hb, "lastTransitionTime": tr}
            for t, s, r, m in conds]


def node_status(name: str, capacity: dict[str, str], now: datetime, since: datetime) -> dict:
    return {
        "capacity": dict(capacity),
        "allocatable": dict(capacity),
        "conditions": node_conditions(now, since),
        "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": platform.release(),
            "osImage": "process kubelet (pods run as local processes)", "containerRuntimeVersion": "process://",
            "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": _ARCH,
        },
    }


def node_object(name: str, labels: dict[str, str] | None, capacity: dict[str, str], now: datetime) -> dict:
    """The Node to create on registration (Nodes accept status on create)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels(name, labels)},
        "spec": {},
        "status": node_status(name, capacity, now, now),
    }


def lease_object(name: str, node_uid: str | None, now: datetime) -> dict:
    """The node's Lease in kube-node-lease, owned by the Node (so it is garbage-collected with it)."""
    meta: dict = {"name": name, "namespace": LEASE_NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                 "renewTime": micro_time(now)},
    }
