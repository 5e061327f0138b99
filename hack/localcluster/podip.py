"""Pod IPs and headless-service DNS names for the process kubelet (pure).

Every pod gets its own loopback address ``127.x.y.z`` (Linux routes all of 127.0.0.0/8 to ``lo``, so any of
them can be bound without set-up). The address is a pure function of the pod's DNS identity, so a pod can be
told the address of a peer that does not exist yet:

- a pod with ``spec.hostname`` H and ``spec.subdomain`` S in namespace NS is keyed by ``NS/H.S`` (the name
  ``H.S.NS.svc`` it has in a real cluster);
- any other pod by ``NS/<metadata.name>``;
- a ``hostNetwork`` pod has the node's address, 127.0.0.1.

``space`` (a cluster's address space, :func:`address_space`) salts the key: the process kubelets of two clusters
on one host (pytest-xdist workers, each with its cluster) share ``lo``, and a pod ``warm-up/warm-up-0`` in each
would otherwise get the same address and fight over its ports.

x, y and z are each in 1..254, which keeps clear of 127.0.0.1, network and broadcast-looking octets.
Collisions are possible (about N^2 / 3.3e7 for N live pods) and only matter between pods that are alive at
the same time and bind the same port.

``rewrite_dns`` replaces headless-service names inside a string (an env value, an argument) by those IPs:

- ``H.S.NS.svc.cluster.local`` and ``H.S.NS.svc``: always (the ``.svc`` suffix is unambiguous);
- ``H.S.NS`` (NS the pod's own namespace) and ``H.S``: only when S is a known subdomain, i.e. the pod's own
  ``spec.subdomain`` or a Service name the caller lists, because ``train.py`` or ``example.com`` look the same.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

HOST_IP = "127.0.0.1"  # the node's address; hostNetwork pods share it
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
# A name starts where no DNS character (or dot) precedes it and ends where no DNS character follows it and
# no further ".label" continues it.
_BEFORE = r"(?<![A-Za-z0-9.\-])"
_AFTER = r"(?![A-Za-z0-9\-])(?!\.[A-Za-z0-9\-])"
_SVC_NAME = re.compile(
    _BEFORE + rf"({_LABEL})\.({_LABEL})\.({_LABEL})\.svc(?:\.cluster\.local)?" + _AFTER
)
_SHORT_NAME = re.compile(_BEFORE + rf"({_LABEL})\.({_LABEL})(?:\.({_LABEL}))?" + _AFTER)


def address_space(cluster_dir: str) -> str:
    """The address space of the cluster working in ``cluster_dir`` (unique on the host while the cluster runs)."""
    return hashlib.sha256(cluster_dir.encode()).hexdigest()[:12]


def _ip_from_key(key: str, space: str) -> str:
    digest = hashlib.sha256(f"{space}|{key}".encode() if space else key.encode()).digest()
    x, y, z = (1 + digest[i] % 254 for i in range(3))
    return f"127.{x}.{y}.{z}"


def dns_ip(namespace: str, hostname: str, subdomain: str, space: str = "") -> str:
    """IP of the pod answering to ``<hostname>.<subdomain>.<namespace>.svc``."""
    return _ip_from_key(f"dns:{namespace}/{hostname}.{subdomain}", space)


def pod_ip(pod: dict, space: str = "") -> str:
    """IP of a pod (a Kubernetes Pod as a JSON dict)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = meta.get("namespace") or "default"
    if spec.get("hostNetwork"):
        return HOST_IP
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    if hostname and subdomain:
        return dns_ip(namespace, hostname, subdomain, space)
    name = meta.get("name")
    if not name:
        raise ValueError("Pod without metadata.name: cannot derive its IP")
    return _ip_from_key(f"pod:{namespace}/{name}", space)


def rewrite_dns(value: str, namespace: str, subdomains: Collection[str] = (), space: str = "") -> str:
    """``value`` with every headless-service pod name replaced by that pod's IP (rules in the module doc)."""

    def svc(m: re.Match[str]) -> str:
        return dns_ip(m.group(3), m.group(1), m.group(2), space)

    def short(m: re.Match[str]) -> str:
        hostname, subdomain, ns = m.group(1), m.group(2), m.group(3)
        if subdomain not in subdomains or (ns is not None and ns != namespace):
            return m.group(0)
        return dns_ip(namespace, hostname, subdomain, space)

    value = _SVC_NAME.sub(svc, value)
    if subdomains:
        value = _SHORT_NAME.sub(short, value)
    return value
