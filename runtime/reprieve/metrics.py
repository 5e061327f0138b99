"""Runtime metrics: a tiny in-process store, exported as Prometheus text on an opt-in port.

``REPRIEVE_METRICS_PORT`` unset -> nothing listens. Set -> ``prometheus_client`` serves the values when it is
importable (the runtime extra does not require it), else a stdlib ``http.server`` renders the same text.
"""

from __future__ import annotations

import http.server
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

_HELP = {
    "reprieve_notices_total": ("counter", "Preemption notices received by this process, by source and reason."),
    "reprieve_notice_lead_seconds": ("gauge", "Deadline minus receipt time of the last notice."),
    "reprieve_agreed_step": ("gauge", "Step all processes agreed to save at (-1 before any notice)."),
    "reprieve_notice_to_commit_seconds": ("gauge", "Seconds from notice receipt to the agreed save's commit."),
    "reprieve_step_seconds": ("gauge", "Moving average of the training step time."),
    "reprieve_save_seconds": ("gauge", "Last measured save-call-to-commit time."),
    "reprieve_saves_total": ("counter", "Checkpoint saves started, by kind (periodic, early, final)."),
    "reprieve_last_committed_step": ("gauge", "Last checkpoint step known to be committed (-1 if none)."),
}

Labels = tuple[tuple[str, str], ...]


class Metrics:
    """Thread-safe named values with optional labels; :meth:`render` gives Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = {name: {} for name in _HELP}
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

    def render(self) -> str:
        lines = []
        for name, family in self.snapshot().items():
            kind, text = _HELP[name]
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            for labels, value in sorted(family.items()):
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{name}{{{label_text}}} {value!r}" if label_text else f"{name} {value!r}")
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
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
