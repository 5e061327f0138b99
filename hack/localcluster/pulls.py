"""Image pulls as the kubelet reports them: its ``Pulled`` events, read into times and sizes (pure).

The upstream kubelet says ``Successfully pulled image "<ref>" in 41.2s (41.2s including waiting). Image size:
938512345 bytes.`` (durations in Go's notation: ``850ms``, ``1m3.5s``); an image already on the node gets
``Container image "<ref>" already present on machine`` instead, and no pull. The process kubelet's emulated pull
says ``... in 20s (emulated)``. Used by the release's end-to-end test and by benchmarks that pay real pulls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_PULLED = re.compile(r'Successfully pulled image "(?P<ref>[^"]+)" in (?P<took>[0-9.hmsµu]+)'
                     r'(?P<rest>.*?)(?:Image size: (?P<size>\d+) bytes)?\.?$')
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"([0-9.]+)(h|ms|us|µs|ns|m|s)")


@dataclass(frozen=True)
class Pull:
    image: str
    seconds: float
    size_bytes: int | None  # None: the kubelet did not say (older kubelets, the process kubelet)
    emulated: bool


def go_duration(text: str) -> float:
    """Seconds of a Go ``time.Duration`` string (``1m3.5s``, ``850ms``); ValueError naming it otherwise."""
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r} (expected e.g. 1m3.5s or 850ms)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_pulled(message: str) -> Pull | None:
    """The pull a ``Pulled`` event's message reports; None for "already present" (no pull happened)."""
    m = _PULLED.search(message.strip())
    if not m:
        return None
    size = m.group("size")
    return Pull(m.group("ref"), go_duration(m.group("took")), int(size) if size else None,
                "(emulated)" in m.group("rest"))


def pulls(events: list[dict[str, Any]]) -> dict[str, Pull]:
    """Image reference -> its pull, from a list of Event objects (``kubectl get events -o json``'s items); the
    first pull of each image (a node that pulls again after a failure reports the later one separately)."""
    out: dict[str, Pull] = {}
    for ev in sorted(events, key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or ""):
        if ev.get("reason") != "Pulled":
            continue
        p = parse_pulled(ev.get("message", ""))
        if p is not None and p.image not in out:
            out[p.image] = p
    return out
