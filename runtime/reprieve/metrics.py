"""Runtime metrics: a tiny in-process store, exported as Prometheus text on an opt-in port.

``REPRIEVE_METRICS_PORT`` unset -> nothing listens. Set -> ``prometheus_client`` serves the values when it is
importable (the runtime extra does not require it), else a stdlib ``http.server`` renders the same text.
Durations are histograms. Step times never take a lock on the training thread: it appends them to
``pending_steps`` (a deque) and they are observed into ``reprieve_step_seconds`` when the values are read.
"""

from __future__ import annotations

import http.server
import logging
import threading
from bisect import bisect_left
from collections import deque
from typing import Any

log = logging.getLogger(__name__)

_HELP = {
    "reprieve_notices_total": ("counter", "Preemption notices received by this process, by source and reason."),
    "reprieve_notice_lead_seconds": ("gauge", "Deadline minus receipt time of the last notice."),
    "reprieve_agreed_step": ("gauge", "Step all processes agreed to save at (-1 before any notice)."),
    "reprieve_notice_to_commit_seconds": ("gauge", "Seconds from notice receipt to the agreed save's commit."),
    "reprieve_step_average_seconds": ("gauge", "Moving average of the training step time."),
    "reprieve_step_seconds": ("histogram", "Training step time (between two steps of Job.steps)."),
    "reprieve_save_blocking_seconds": ("histogram", ("Time the training loop was blocked by a save (the copy "
                                                     "off the devices, a wait for the previous commit).")),
    "reprieve_save_to_commit_seconds": ("histogram", "From a save call to its commit on every process."),
    "reprieve_restore_seconds": ("histogram", "Reading the checkpoint at start-up."),
    "reprieve_saves_total": ("counter", "Checkpoint saves started, by kind (periodic, early, final)."),
    "reprieve_save_failures_total": ("counter", ("Checkpoint saves that failed (the storage refused a write or "
                                                 "the commit); REPRIEVE_MAX_FAILED_SAVES in a row are fatal.")),
    "reprieve_last_committed_step": ("gauge", "Last checkpoint step known to be committed (-1 if none)."),
}

Labels = tuple[tuple[str, str], ...]
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
IO_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
BUCKETS = {"reprieve_step_seconds": STEP_BUCKETS}


class _Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, n in zip((*[repr(float(b)) for b in self.bounds], "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class Metrics:
    """Thread-safe named values with optional labels; :meth:`render` gives Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = {name: {} for name, (k, _) in _HELP.items()
                                                        if k != "histogram"}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {name: {} for name, (k, _) in _HELP.items()
                                                                 if k == "histogram"}
        self.pending_steps: deque[float] = deque(maxlen=100_000)  # step times not yet observed
        self._values["reprieve_agreed_step"][()] = -1.0
        self._values["reprieve_last_committed_step"][()] = -1.0
        self._server: Any = None

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._family(name)[_labels(labels)] = float(value)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        with self._lock:
            family = self._family(name)
            key = _labels(labels)
            family[key] = family.get(key, 0.0) + amount

    def observe(self, name: str, value: float, **labels: str) -> None:
        """One observation of histogram ``name``."""
        with self._lock:
            self._histogram(name, _labels(labels)).observe(value)

    def _histogram(self, name: str, key: Labels) -> _Histogram:
        if name not in self._histograms:
            raise KeyError(f"unknown histogram {name!r}; known: {sorted(self._histograms)}")
        family = self._histograms[name]
        if key not in family:
            family[key] = _Histogram(BUCKETS.get(name, IO_BUCKETS))
        return family[key]

    def histogram(self, name: str, **labels: str) -> tuple[int, float]:
        """(count, sum) of histogram ``name`` (pending step times included)."""
        with self._lock:
            self._drain()
            h = self._histograms[name].get(_labels(labels))
            return (0, 0.0) if h is None else (h.count, h.sum)

    def _drain(self) -> None:
        pending = self.pending_steps
        if pending:
            h = self._histogram("reprieve_step_seconds", ())
            while pending:
                h.observe(pending.popleft())

    def get(self, name: str, **labels: str) -> float | None:
        with self._lock:
            return self._family(name).get(_labels(labels))

    def _family(self, name: str) -> dict[Labels, float]:
        if name not in self._values:
            raise KeyError(f"unknown metric {name!r}; known: {sorted(self._values)}")
        return self._values[name]

    def snapshot(self) -> dict[str, dict[Labels, float]]:
        with self._lock:
            return {name: dict(family) for name, family in self._values.items()}

    def histograms(self) -> dict[str, dict[Labels, tuple[list[tuple[str, int]], float]]]:
        """Every histogram: labels -> (cumulative (le, count) pairs, sum)."""
        with self._lock:
            self._drain()
            return {name: {k: (h.cumulative(), h.sum) for k, h in family.items()}
                    for name, family in self._histograms.items()}

    def render(self) -> str:
        lines = []
        for name, family in self.snapshot().items():
            kind, text = _HELP[name]
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            for labels, value in sorted(family.items()):
                lines.append(f"{name}{_label_text(labels)} {value!r}")
        for name, hfamily in self.histograms().items():
            lines += [f"# HELP {name} {_HELP[name][1]}", f"# TYPE {name} histogram"]
            for labels, (buckets, total) in sorted(hfamily.items()):
                for le, n in buckets:
                    lines.append(f"{name}_bucket{_label_text((*labels, ('le', le)))} {float(n)!r}")
                lines.append(f"{name}_sum{_label_text(labels)} {total!r}")
                lines.append(f"{name}_count{_label_text(labels)} {float(buckets[-1][1])!r}")
        return "\n".join(lines) + "\n"

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the exporter; returns the bound port (``port=0`` picks a free one)."""
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            return self._serve_stdlib(port, addr)
        return self._serve_prometheus_client(port, addr)

    def _serve_prometheus_client(self, port: int, addr: str) -> int:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        metrics = self

        class _Collector:
            def collect(self) -> Any:
                for name, family in metrics.snapshot().items():
                    kind, text = _HELP[name]
                    names = sorted({k for labels in family for k, _ in labels})
                    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                    out = cls(name.removesuffix("_total") if kind == "counter" else name, text, labels=names)
                    for labels, value in family.items():
                        d = dict(labels)
                        out.add_metric([d.get(k, "") for k in names], value)
                    yield out
                for name, hfamily in metrics.histograms().items():
                    names = sorted({k for labels in hfamily for k, _ in labels})
                    hist = HistogramMetricFamily(name, _HELP[name][1], labels=names)
                    for labels, (buckets, total) in hfamily.items():
                        d = dict(labels)
                        hist.add_metric([d.get(k, "") for k in names], buckets, total)
                    yield hist

        registry = CollectorRegistry()
        registry.register(_Collector())
        server, _thread = start_http_server(port, addr=addr, registry=registry)
        self._server = server
        bound = int(server.server_address[1])
        log.info("metrics (prometheus_client) on %s:%d", addr, bound)
        return bound

    def _serve_stdlib(self, port: int, addr: str) -> int:
        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = http.server.ThreadingHTTPServer((addr, port), Handler)
        threading.Thread(target=server.serve_forever, name="reprieve-metrics", daemon=True).start()
        self._server = server
        bound = int(server.server_address[1])
        log.info("metrics (stdlib exporter) on %s:%d", addr, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _label_text(labels: Labels) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}" if labels else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
