"""What a real node is made of (pure): addresses, containerd's and the kubelet's configuration, the CNI network.

Addresses, all inside the cluster network namespace (:mod:`.clusternet`), never on the host:

- node ``i`` has the address ``10.243.0.<i+2>`` (on ``lo`` of that namespace; the kubelet binds its API there);
- pods share one bridge ``rpv0`` (gateway ``10.244.0.1/16``) and node ``i`` hands out ``10.244.<i+1>.1-254``,
  so pods on different nodes talk over the bridge without routes; a new node takes an index no node has had
  before while there is one (:func:`next_index`);
- Services: ``10.96.0.1`` (API server) and ``10.96.0.10`` (DNS), as in a kind cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POD_SUBNET, POD_GATEWAY = "10.244.0.0/16", "10.244.0.1"
BRIDGE = "rpv0"
CLUSTER_DNS, CLUSTER_DOMAIN = "10.96.0.10", "cluster.local"
MAX_REAL_NODES = 250
KUBELET_PORT = 10250
# Kernel tunables the kubelet sets at start (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables).
# They are host-wide, so each real node sees its own copies, bind-mounted over /proc/sys in its mount namespace.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Host paths containerd, runc, CNI and the kubelet use whatever their configuration says: each real node mounts a
# tmpfs of its own over them (in its mount namespace), so nodes never share them and nothing is left on the host.
PRIVATE_DIRS = ("/run/containerd", "/run/netns", "/var/lib/cni", "/var/log/containers")


def node_ip(index: int) -> str:
    if not 0 <= index < MAX_REAL_NODES:
        raise ValueError(f"real node index must be in 0..{MAX_REAL_NODES - 1}, got {index}")
    return f"10.243.0.{index + 2}"


def next_index(used: set[int], released: dict[int, float]) -> int:
    """The index (so the addresses) a new node gets (pure): one no node has had yet, else the one given back
    longest ago (``released``: index -> when its node went). Never the lowest free one: a node that went a moment
    ago left its pods' addresses in the ARP caches of the pods that talked to them (the nodes' pods share one
    bridge, so pods resolve each other directly); a new pod at the same address was unreachable from those pods
    until the stale entries were probed again, up to ~45 s (the 30-minute soak: a gang's roll call waited 28 s).
    ``ValueError`` when all ``MAX_REAL_NODES`` are in use."""
    free = [i for i in range(MAX_REAL_NODES) if i not in used]
    if not free:
        raise ValueError(f"all {MAX_REAL_NODES} real node indexes are in use")
    fresh = [i for i in free if i not in released]
    return fresh[0] if fresh else min(free, key=lambda i: (released[i], i))


def pod_range(index: int) -> tuple[str, str]:
    """First and last pod address node ``index`` hands out."""
    node_ip(index)  # validates
    return f"10.244.{index + 1}.1", f"10.244.{index + 1}.254"


class _Under:
    """A path of a fixed name under the instance's ``root``: ``kubelet_root = _Under("kubelet")``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, paths: Any, owner: Any = None) -> Path:
        return Path(paths.root) / self.name


@dataclass(frozen=True)
class NodePaths:
    """Where one real node keeps its state: every path under ``root`` (``<cluster workdir>/realnodes/<name>``)."""

    root: Path
    containerd_root = _Under("containerd")
    containerd_config = _Under("containerd.toml")
    socket = _Under("containerd.sock")
    cni_conf_dir = _Under("cni")
    kubelet_root = _Under("kubelet")
    kubelet_config = _Under("kubelet.yaml")
    pod_logs = _Under("pod-logs")
    sysctl_dir = _Under("sysctl")


def containerd_config(paths: NodePaths, pause_ref: str, registry: list[str] | None = None) -> str:
    """containerd 1.6 configuration (TOML, version 2) for one node; ``registry``: the CRI plugin's registry
    section (:func:`localcluster.registryspec.containerd_registry_section`) when the cluster has a registry."""
    disabled = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join([
        "version = 2",
        f'root = "{paths.containerd_root}"',
        'state = "/run/containerd/state"',  # a tmpfs private to the node (PRIVATE_DIRS)
        f"disabled_plugins = {json.dumps(disabled)}",
        "[grpc]",
        f'  address = "{paths.socket}"',
        "[metrics]",
        '  address = ""',
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{paths.root / "opt"}"',
        f"[{cri}]",
        f'  sandbox_image = "{pause_ref}"',
        # root lacks CAP_SYS_RESOURCE here: containerd must not ask for an oom_score_adj below its own
        "  restrict_oom_score_adj = true",
        "  disable_apparmor = true",
        "  enable_selinux = false",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',  # nodes share a network namespace: no fixed port
        "  max_container_log_line_size = 16384",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f"[{cri}.cni]",
        '  bin_dir = "/usr/lib/cni"',
        f'  conf_dir = "{paths.cni_conf_dir}"',
        "  max_conf_num = 1",
        *(registry or []),
        "",
    ])


def cni_config(index: int) -> dict:
    """The node's CNI network: the shared bridge, this node's slice of the pod subnet, no NAT, no routes out."""
    start, end = pod_range(index)
    return {
        "cniVersion": "0.4.0",
        "name": "reprieve",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": "/var/lib/cni/networks",
                      "ranges": [[{"subnet": POD_SUBNET, "rangeStart": start, "rangeEnd": end,
                                   "gateway": POD_GATEWAY}]],
                      # only the pod subnet and the Service range: no default route, nothing leaves the cluster
                      "routes": [{"dst": "10.96.0.0/16"}, {"dst": "10.243.0.0/24"}]}},
        ],
    }


def kubelet_config(paths: NodePaths, *, index: int, cgroup_root: str, ca_file: Path) -> dict:
    """KubeletConfiguration (kubelet.config.k8s.io/v1beta1) for one node; upstream defaults unless noted."""
    ip = node_ip(index)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,            # the host has hybrid cgroups (v1 controllers) and cannot move to v2
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,        # each node's pods under a cgroup of its own
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "address": ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzPort": 0,                 # nodes share a network namespace; readiness is read from the Node
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",                 # no host search domains or upstream servers in pods
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "imageServiceEndpoint": f"unix://{paths.socket}",
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.root / "volume-plugins"),
        "protectKernelDefaults": False,   # it writes its tunables into the node's own copies (KERNEL_TUNABLES)
        "failSwapOn": False,
        "serializeImagePulls": False,
        # Test machines run with little free disk; the default 10-15 % thresholds would evict for no reason.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                         "nodefs.inodesFree": "2%"},
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "registerNode": True,
        "kubeAPIQPS": 50,
        "kubeAPIBurst": 100,
    }
