"""Local Kubernetes for Reprieve's tests and demo: a real control plane plus process kubelets."""

from .cluster import Cluster, ensure_tools
from .procs import ClusterError, cache_dir

__all__ = ["Cluster", "ClusterError", "cache_dir", "ensure_tools"]
