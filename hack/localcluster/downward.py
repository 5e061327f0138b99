"""Downward API for the process kubelet (pure): fieldRef values and volume file contents.

Formats follow the real kubelet: a ``metadata.labels`` / ``metadata.annotations`` file holds one
``key="value"`` line per entry, keys sorted, values quoted like Go's ``strconv.Quote`` (``%q``), no trailing
newline (k8s.io/kubernetes/pkg/fieldpath.FormatMap).
"""

from __future__ import annotations

import re

_NAMED_ESCAPES = {
    "\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v",
    "\\": "\\\\", '"': '\\"',
}
# metadata.labels['key'] / metadata.annotations['key'] (the real kubelet accepts exactly this subscript form)
_SUBSCRIPT = re.compile(r"^(metadata\.(?:labels|annotations))\['([^']*)'\]$")


class FieldRefError(ValueError):
    """A fieldRef path the process kubelet (or Kubernetes) does not support."""


def go_quote(value: str) -> str:
    """``value`` quoted exactly like Go's ``strconv.Quote`` for valid UTF-8 input."""
    out = ['"']
    for ch in value:
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif ch.isprintable():  # same classes as Go's unicode.IsPrint: L, M, N, P, S and ASCII space
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def format_map(mapping: dict[str, str] | None) -> str:
    """The real kubelet's downward-API rendering of a labels/annotations map."""
    mapping = mapping or {}
    return "\n".join(f"{key}={go_quote(mapping[key])}" for key in sorted(mapping))


def field_value(pod: dict, field_path: str, *, pod_ip: str, node_name: str, host_ip: str = "127.0.0.1") -> str:
    """The value of a downward-API ``fieldRef.fieldPath`` for ``pod`` (env var or volume file).

    Raises:
        FieldRefError: unsupported path (message names pod and path).
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName") or node_name,
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if field_path in simple:
        return simple[field_path]
    if field_path == "metadata.labels":
        return format_map(meta.get("labels"))
    if field_path == "metadata.annotations":
        return format_map(meta.get("annotations"))
    m = _SUBSCRIPT.match(field_path)
    if m:
        source = meta.get("labels" if m.group(1) == "metadata.labels" else "annotations") or {}
        return source.get(m.group(2), "")
    raise FieldRefError(
        f"Pod {meta.get('namespace')}/{meta.get('name')}: fieldRef.fieldPath {field_path!r} is not supported "
        f"by the process kubelet (supported: {', '.join(sorted(simple))}, metadata.labels, "
        "metadata.annotations, metadata.labels['k'], metadata.annotations['k'])"
    )


def downward_files(pod: dict, items: list[dict], *, pod_ip: str, node_name: str) -> dict[str, str]:
    """``{relative path: content}`` for the ``items`` of a downwardAPI volume (or projected source).

    Raises:
        FieldRefError: an item uses resourceFieldRef or an unsupported fieldRef path.
    """
    files: dict[str, str] = {}
    for item in items or []:
        path = item.get("path")
        field_ref = item.get("fieldRef")
        if not path or not field_ref:
            meta = pod.get("metadata") or {}
            raise FieldRefError(
                f"Pod {meta.get('namespace')}/{meta.get('name')}: downwardAPI item {item!r} needs path and "
                "fieldRef (resourceFieldRef is not supported by the process kubelet)"
            )
        files[path] = field_value(pod, field_ref["fieldPath"], pod_ip=pod_ip, node_name=node_name)
    return files
