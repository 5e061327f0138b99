"""The kube-apiserver's command line and environment, built in one place: :meth:`Cluster.start` spawns it with
them, and :meth:`Cluster.restart_apiserver` starts it again with exactly the same (same port, same etcd, same
certificates), so every object stored in etcd is there after a restart.

Pure: paths and ports in, arguments out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .pki import PKI


def apiserver_args(*, workdir: Path, pki: PKI, api_port: int, etcd_port: int) -> list[str]:
    """The ``localkube kube-apiserver ...`` arguments of the cluster in ``workdir``."""
    return [
        "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
        f"--tls-cert-file={pki.crt('apiserver')}", f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca_crt}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={workdir / 'pki' / 'sa.pub'}",
        f"--service-account-signing-key-file={pki.key('sa')}",
        "--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16",
        "--allow-privileged=true", "--endpoint-reconciler-type=none", "--profiling=false",
        f"--cert-dir={workdir / 'apiserver-certs'}", "--v=1",
        f"--kubelet-client-certificate={pki.crt('admin')}", f"--kubelet-client-key={pki.key('admin')}",
    ]


def apiserver_env(base: Mapping[str, str], kubelet_proxy_port: int) -> dict[str, str]:
    """``base`` (the harness's environment) with the proxy the apiserver reaches real kubelets through: to
    kubelets only (loopback, i.e. etcd, is never proxied)."""
    return {**base, "HTTPS_PROXY": f"http://127.0.0.1:{kubelet_proxy_port}", "NO_PROXY": "127.0.0.1,localhost"}
