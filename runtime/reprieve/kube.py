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
import queue
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from .background import Reconnecting, backoff_delays
from .notice import NOTICE_ANNOTATION, Notice, notice_from_annotations

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """The Kubernetes API refused or failed a request (message names the request and the status; ``status`` is
    the HTTP status, None when the refusal came inside a watch without one)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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
        headers = {"Accept": "application/json", "User-Agent": "reprieve-supervisortime"}
        token_path = os.path.join(self.sa_dir, "token")
        try:
            with open(token_path, encoding="utf-8") as fh:
                headers["Authorization"] = f"Bearer {fh.read().strip()}"
        except OSError as err:
            log.debug("no service-account token at %s (%s); requests go unauthenticated", token_path, err)
        return headers

    def _connect(self, timeout_s: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self._context(), timeout=timeout_s)

    def _watch_connection(self, timeout_s: float) -> http.client.HTTPSConnection:
        """A connection for a long watch: TCP keepalive finds a dead peer in ~30 s instead of at the timeout."""
        conn = self._connect(timeout_s)
        conn.connect()
        sock = conn.sock
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
                if hasattr(socket, name):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        return conn

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
                raise KubeError(f"{method} {path}: HTTP {resp.status}: {payload[:300]!r}", resp.status)
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
        return self.watch_named(namespace, "pods", pod, timeout_seconds=timeout_seconds)

    def list_named(self, namespace: str, resource: str, name: str, *,
                   timeout_s: float | None = None) -> dict[str, Any]:
        """A list of the one object ``name`` (core/v1 ``resource``): ``items`` is empty when it does not exist;
        ``metadata.resourceVersion`` is where a watch goes on. Needs only get/list on that resourceName."""
        query = urllib.parse.urlencode({"fieldSelector": f"metadata.name={name}"})
        return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/{resource}?{query}", timeout_s=timeout_s)

    def watch_named(self, namespace: str, resource: str, name: str, *, resource_version: str | None = None,
                    timeout_seconds: int = 290) -> Iterator[dict[str, Any]]:
        """Watch events for the one object ``name``; from ``resource_version`` (else a synthetic ADDED first)."""
        params = {"fieldSelector": f"metadata.name={name}", "watch": "true",
                  "timeoutSeconds": str(timeout_seconds)}
        if resource_version:
            params.update(resourceVersion=resource_version, allowWatchBookmarks="true")
        path = f"/api/v1/namespaces/{_q(namespace)}/{resource}?{urllib.parse.urlencode(params)}"
        conn = self._watch_connection(timeout_seconds + 30.0)
        try:
            conn.request("GET", path, headers=self._headers())
            resp = conn.getresponse()
            if resp.status >= 300:
                raise KubeError(f"GET {path}: HTTP {resp.status}: {resp.read()[:300]!r}", resp.status)
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


class PodWatchSource(Reconnecting):
    """Watches this pod's ``reprieve.dev/notice`` annotation; forwards notices via ``put``."""

    def __init__(self, client: KubeClient, namespace: str, pod: str, put: Callable[[Notice], None], *,
                 clock: Callable[[], float] = time.time, attempt: int | None = None,
                 started_at: float | None = None) -> None:
        super().__init__("reprieve-pod-watch", f"pod watch of {namespace}/{pod}", log)
        self._client = client
        self._ns = namespace
        self._pod = pod
        self._values = NoticeValues(put, "annotation", clock=clock, attempt=attempt, started_at=started_at)

    def _session(self, connected: Callable[[], None]) -> None:
        for event in self._client.watch_pod(self._ns, self._pod):
            connected()
            self.handle_event(event)
            if self._stop.is_set():
                return
        # the server closed the watch at timeoutSeconds: opened again at once

    def handle_event(self, event: dict[str, Any]) -> None:
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return
        self._values.offer(((event.get("object") or {}).get("metadata") or {}).get("annotations") or {})


class NoticeValues:
    """Successive values of a notice (a pod's annotations, the job's notice object) -> notices for ``put``: each
    value parsed once; one of another attempt, or stale at start (``notice.notice_from_annotations``), dropped."""

    def __init__(self, put: Callable[[Notice], None], source: str, *, clock: Callable[[], float] = time.time,
                 attempt: int | None = None, started_at: float | None = None) -> None:
        self._put = put
        self.source = source
        self._clock = clock
        self._attempt = attempt  # notices delivered to another attempt are ignored
        self._started_at = started_at  # a notice past its deadline by then: notice.stale_at_start
        self._last_value: str | None = None

    def offer(self, annotations: dict[str, str]) -> None:
        value = annotations.get(NOTICE_ANNOTATION)
        if value is None or value == self._last_value:
            return
        self._last_value = value
        notice = notice_from_annotations(annotations, self._clock(), source=self.source, attempt=self._attempt,
                                         started_at=self._started_at)
        if notice is not None:
            self._put(notice)


class ObjectWatch(Reconnecting):
    """List, then watch, one named object (``reprieve-supervisor``'s assignment ConfigMap), in a daemon thread.

    ``on_change(obj)`` gets the object after the list and after every change, ``None`` when it does not exist (or
    was deleted). Failures back off (1 s doubling to 30 s) and start again with a fresh list; a watch expired by
    the server (410) lists again at once. Every request is bounded: lists by ``timeout_s``, watches by
    ``watch_seconds`` on the server plus TCP keepalive on the client.
    """

    def __init__(self, client: KubeClient, namespace: str, resource: str, name: str,
                 on_change: Callable[[dict[str, Any] | None], None], *, watch_seconds: int = 120,
                 timeout_s: float = 10.0) -> None:
        super().__init__(f"reprieve-watch-{name}", f"watch of {resource} {namespace}/{name}", log)
        self._client = client
        self._ns, self._resource, self._name = namespace, resource, name
        self._on_change = on_change
        self._watch_seconds = watch_seconds
        self._timeout_s = timeout_s

    def _session(self, connected: Callable[[], None]) -> None:
        listed = self._client.list_named(self._ns, self._resource, self._name, timeout_s=self._timeout_s)
        items = listed.get("items") or []
        connected()
        self._on_change(items[0] if items else None)
        version = (listed.get("metadata") or {}).get("resourceVersion")
        while not self._stop.is_set() and version is not None:
            version = self._watch(version)

    def _watch(self, version: str) -> str | None:
        """One watch request from ``version``; the version to go on from, None to list again (410 Gone)."""
        for event in self._client.watch_named(self._ns, self._resource, self._name, resource_version=version,
                                              timeout_seconds=self._watch_seconds):
            if self._stop.is_set():
                return version
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    log.debug("%s expired (410): listing again", self.what)
                    return None
                code = obj.get("code")
                raise KubeError(f"{self.what}: {obj.get('message') or obj}", code if isinstance(code, int) else None)
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind in ("ADDED", "MODIFIED"):
                self._on_change(obj)
            elif kind == "DELETED":
                self._on_change(None)
        return version


class PodAnnotator:
    """Merge-patches annotations onto one pod from a daemon thread, in order, retrying with backoff.

    ``put`` never blocks. A value waiting behind a newer value of the same annotation is dropped (only the newest
    matters to a reader); ``flush`` waits, bounded, until everything put so far has landed (or was dropped).
    """

    def __init__(self, client: KubeClient, namespace: str, pod: str, *, timeout_s: float = 5.0) -> None:
        self._client = client
        self._ns, self._pod = namespace, pod
        self._timeout_s = timeout_s
        self._queue: queue.SimpleQueue[dict[str, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._newest: dict[str, int] = {}  # annotation -> serial of its newest value
        self._serial = 0
        self._done = threading.Condition(self._lock)
        self._landed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reprieve-annotate", daemon=True)
        self._thread.start()

    def put(self, annotations: dict[str, str]) -> None:
        with self._lock:
            self._serial += 1
            for key in annotations:
                self._newest[key] = self._serial
            self._queue.put({"__serial__": str(self._serial), **annotations})

    def flush(self, timeout_s: float) -> bool:
        """Wait until every put value landed or was superseded; False after ``timeout_s``."""
        with self._done:
            return self._done.wait_for(lambda: self._landed >= self._serial, timeout_s)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            serial = int(item.pop("__serial__"))
            delays = backoff_delays(0.5, 10.0)
            while not self._stop.is_set():
                with self._lock:
                    body = {k: v for k, v in item.items() if self._newest.get(k) == serial}
                if not body:
                    break
                try:
                    self._client.patch_pod_annotations(self._ns, self._pod, dict(body), timeout_s=self._timeout_s)
                    log.debug("annotated pod %s/%s: %s", self._ns, self._pod, body)
                    break
                except Exception as err:  # noqa: BLE001 - retried until it lands or is superseded
                    delay = next(delays)
                    log.warning("could not annotate pod %s/%s with %s (%s); retrying in %.1fs", self._ns,
                                self._pod, sorted(body), err, delay)
                    self._stop.wait(delay)
            with self._done:
                self._landed = serial
                self._done.notify_all()
