"""Reads of the local cluster's objects for tests and tools: one HTTPS GET as the cluster's admin, returning the
JSON that ``kubectl get -o json`` prints, without starting kubectl.

Why: the tests poll. One ``kubectl get`` is a Go binary's start, ~235 ms of CPU on the 2-core CI machine; a test
that waits 200 s for a job's phase at 0.3 s intervals spent ~45 CPU-s on kubectl alone, on a suite that is
CPU-bound (benchmarks/RESULTS.md, "Test suite"). A GET here is a few milliseconds. Writes (apply, label, annotate,
delete) stay with kubectl: they happen once, not in a loop, and kubectl's behaviour there is what a user meets.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

# kind (as tests name it; plurals and kubectl's short names too) -> (API prefix, resource, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "pod": ("/api/v1", "pods", True),
    "configmap": ("/api/v1", "configmaps", True),
    "event": ("/api/v1", "events", True),
    "serviceaccount": ("/api/v1", "serviceaccounts", True),
    "namespace": ("/api/v1", "namespaces", False),
    "node": ("/api/v1", "nodes", False),
    "lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "trainingjob": ("/apis/reprieve.dev/v1alpha1", "trainingjobs", True),
    "workload": ("/apis/kueue.x-k8s.io/v1beta2", "workloads", True),
    "clusterqueue": ("/apis/kueue.x-k8s.io/v1beta2", "clusterqueues", False),
}
_ALIASES = {"tj": "trainingjob", "sa": "serviceaccount", "cm": "configmap", "ns": "namespace", "po": "pod"}


def resource_path(kind: str, name: str | None = None, namespace: str | None = None, *,
                  selector: str | None = None, field_selector: str | None = None) -> str:
    """The API path of one object (``name``) or of a list (no ``name``; ``namespace`` None lists a namespaced kind
    in every namespace). ``selector``/``field_selector``: ``kubectl -l`` / ``--field-selector``."""
    key = _ALIASES.get(kind.lower(), kind.lower())
    key = key[:-1] if key not in _KINDS and key.endswith("s") and key[:-1] in _KINDS else key
    if key not in _KINDS:
        raise ValueError(f"resource_path: unknown kind {kind!r}; known: {', '.join(sorted(_KINDS))} "
                         f"(add it to localcluster/reads.py)")
    prefix, resource, namespaced = _KINDS[key]
    if namespaced and name is not None and not namespace:
        raise ValueError(f"resource_path: {key} {name!r} is namespaced: give its namespace")
    path = prefix + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{resource}"
    if name is not None:
        path += f"/{name}"
    query = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", field_selector)) if v}
    return path + (f"?{urllib.parse.urlencode(query)}" if query else "")


class Reader:
    """GETs against ``server`` with the admin's client certificate (one TLS context, built once)."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server
        self._ctx = ssl.create_default_context(cafile=str(ca))
        self._ctx.load_cert_chain(str(cert), str(key))

    def get(self, kind: str, name: str | None = None, namespace: str | None = None, *,
            selector: str | None = None, field_selector: str | None = None, missing_ok: bool = False,
            timeout: float = 30) -> Any:
        """The object (or the list: ``items``) as JSON. A missing object raises :class:`NotFound` (a ``LookupError``
        naming it), or returns None with ``missing_ok``; any other refusal raises ``urllib.error.HTTPError``."""
        path = resource_path(kind, name, namespace, selector=selector, field_selector=field_selector)
        try:
            with urllib.request.urlopen(self.server + path, context=self._ctx, timeout=timeout) as resp:
                return _without_managed_fields(json.loads(resp.read()))
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
            if missing_ok:
                return None
            raise NotFound(f"{kind} {namespace + '/' if namespace else ''}{name or ''} not found ({path})") from None


def _without_managed_fields(body: Any) -> Any:
    """As kubectl prints it (``--show-managed-fields=false``): no ``metadata.managedFields``."""
    for obj in [body, *(body.get("items") or [])]:
        (obj.get("metadata") or {}).pop("managedFields", None)
    return body


class NotFound(LookupError):
    """The object read does not exist (HTTP 404)."""
