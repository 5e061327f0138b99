"""The pod's own view of the Kubernetes API: watch its notice annotation (progress reports: ``progress.py``).

Standard library only (``http.client`` + ``ssl``), so the runtime extra stays light. In-cluster credentials
come from ``REPRIEVE_SERVICEACCOUNT_DIR`` (``token``, ``ca.crt``; the token is re-read on every connection
because projected tokens rotate) and the API address from ``KUBERNETES_SERVICE_HOST``/``_PORT``. The watch
runs in a daemon thread and reconnects with exponential backoff; training never waits on the API.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from .notice import NOTICE_ANNOTATION, Notice, notice_from_annotations

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """The Kubernetes API refused or failed a request (message names the request and the status)."""


class KubeClient:
    """Minimal in-cluster client for one pod's own object."""

    def __init__(self, host: str, port: int, serviceaccount_dir: str, *, timeout_s: float = 10.0) -> None:
        self.host = host.strip("[]")
        self.port = port
        self.sa_dir = serviceaccount_dir
        self.timeout_s = timeout_s

    def _context(self) -> ssl.SSLContext:
        ca = os.path.join(self.sa_dir, "ca.crt")
        return ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "reprieve-runtime"}
        token_path = os.path.join(self.sa_dir, "token")
        try:
            with open(token_path, encoding="utf-8") as fh:
                headers["Authorization"] = f"Bearer {fh.read().strip()}"
        except OSError as err:
            log.debug("no service-account token at %s (%s); requests go unauthenticated", token_path, err)
        return headers

    def _connect(self, timeout_s: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self._context(), timeout=timeout_s)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                content_type: str = "application/json", timeout_s: float | None = None) -> dict[str, Any]:
        conn = self._connect(timeout_s or self.timeout_s)
        try:
            headers = self._headers()
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            if resp.status >= 300:
                raise KubeError(f"{method} {path}: HTTP {resp.status}: {payload[:300]!r}")
            return json.loads(payload) if payload else {}
        finally:
            conn.close()

    def patch_pod_annotations(self, namespace: str, pod: str, annotations: dict[str, str | None], *,
                              timeout_s: float | None = None) -> None:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(pod)}"
        self.request("PATCH", path, {"metadata": {"annotations": annotations}},
                     content_type="application/merge-patch+json", timeout_s=timeout_s)

    def watch_pod(self, namespace: str, pod: str, *, timeout_seconds: int = 290) -> Iterator[dict[str, Any]]:
        """Watch events for one pod (the first is a synthetic ADDED with its current state)."""
        query = urllib.parse.urlencode({"fieldSelector": f"metadata.name={pod}", "watch": "true",
                                        "timeoutSeconds": str(timeout_seconds)})
        path = f"/api/v1/namespaces/{_q(namespace)}/pods?{query}"
        conn = self._connect(timeout_seconds + 30.0)
        try:
            conn.request("GET", path, headers=self._headers())
            resp = conn.getresponse()
            if resp.status >= 300:
                raise KubeError(f"GET {path}: HTTP {resp.status}: {resp.read()[:300]!r}")
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def backoff_delays(initial: float = 1.0, maximum: float = 30.0) -> Iterator[float]:
    """1, 2, 4, ... capped at ``maximum`` (pure)."""
    delay = initial
    while True:
        yield delay
        delay = min(maximum, delay * 2)


class PodWatchSource:
    """Watches this pod's ``reprieve.dev/notice`` annotation; forwards notices via ``put``."""

    def __init__(self, client: KubeClient, namespace: str, pod: str, put: Callable[[Notice], None], *,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._ns = namespace
        self._pod = pod
        self._put = put
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_value: str | None = None

    def start(self) -> PodWatchSource:
        self._thread = threading.Thread(target=self._run, name="reprieve-pod-watch", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        delays = backoff_delays()
        failures = 0
        while not self._stop.is_set():
            try:
                for event in self._client.watch_pod(self._ns, self._pod):
                    if failures:
                        log.info("pod watch of %s/%s reconnected after %d failure(s)", self._ns, self._pod,
                                 failures)
                    failures, delays = 0, backoff_delays()
                    self.handle_event(event)
                    if self._stop.is_set():
                        return
                continue  # server closed the watch at timeoutSeconds: reconnect at once
            except Exception as err:  # noqa: BLE001 - any failure: back off and reconnect
                failures += 1
                delay = next(delays)
                level = logging.WARNING if failures in (1, 10) or failures % 100 == 0 else logging.DEBUG
                log.log(level, "pod watch of %s/%s failed (%s, failure %d); retrying in %.0fs", self._ns,
                        self._pod, err, failures, delay)
                self._stop.wait(delay)

    def handle_event(self, event: dict[str, Any]) -> None:
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return
        annotations = ((event.get("object") or {}).get("metadata") or {}).get("annotations") or {}
        value = annotations.get(NOTICE_ANNOTATION)
        if value is None or value == self._last_value:
            return
        self._last_value = value
        notice = notice_from_annotations(annotations, self._clock(), source="annotation")
        if notice is not None:
            self._put(notice)
