"""A dedicated watch of worker pods (server-side label selector) feeding the cache.

kopf would watch every pod in full and keep each body alive in a per-object worker; at 10,000 pods that is
hundreds of MB. This thread reads the watch stream line by line, keeps only ``policy.views.compact_pod`` of each
event, and hands it to the event loop, which updates the cache and kicks the job's reconcile.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

from . import LABEL_JOB, apply
from .background import BackgroundLoop
from .cache import Relist
from .policy.views import compact_pod

Handler = Callable[[str, dict[str, Any]], None]


def _pods_call(api: apply.Api, namespace: str | None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The LIST/WATCH of pods: cluster-wide, or one namespace (namespaced RBAC grants no more)."""
    if namespace is None:
        return api.core.list_pod_for_all_namespaces, ()
    return api.core.list_namespaced_pod, (namespace,)


def pod_pages(api: apply.Api, namespace: str | None = None) -> Iterator[tuple[list[dict[str, Any]], str]]:
    """Every worker pod, a page of full bodies at a time, with the resourceVersion to watch from."""
    fn, args = _pods_call(api, namespace)
    return apply.list_pages_versioned(fn, *args, label_selector=LABEL_JOB)


class PodWatch(BackgroundLoop):
    """One watch stream at a time (any stream error: reconnect from the last resourceVersion; the cache stays)."""

    def __init__(self, api: apply.Api, loop: asyncio.AbstractEventLoop, on_event: Handler,
                 relist: Callable[[], Relist], on_relisted: Callable[[Relist], None],
                 keep: Callable[[dict[str, Any]], bool], resource_version: str, namespace: str | None = None,
                 on_seen: Callable[[str], None] = lambda rv: None) -> None:
        super().__init__(f"reprieve-podwatch-{namespace or 'all'}", "pod watch")
        self.api, self.loop, self.on_event, self.keep, self.on_seen = api, loop, on_event, keep, on_seen
        self.relist, self.on_relisted = relist, on_relisted
        self.rv = resource_version
        self.namespace = namespace

    def step(self) -> None:
        fn, args = _pods_call(self.api, self.namespace)
        resp: Any = fn(*args, label_selector=LABEL_JOB, watch=True, resource_version=self.rv,
                       allow_watch_bookmarks=True, timeout_seconds=300, _preload_content=False)
        try:
            buf = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self._handle(json.loads(line))
                if self.stopped.is_set():
                    return
        finally:
            resp.release_conn()

    def _relist(self) -> str:
        """Every worker pod into the cache, a page at a time: each page is in the cache before the next is asked
        for (the loop's queue never holds more than one). The resourceVersion to watch from once all are in."""
        relist, rv = self.relist(), ""
        for page, rv in pod_pages(self.api, self.namespace):
            self._on_loop(relist.page, [compact_pod(p) for p in page if self.keep(p)])
        self._on_loop(self.on_relisted, relist)
        return rv

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)`` on the event loop (where the cache is written), waited for."""
        async def call() -> None:
            fn(*args)

        asyncio.run_coroutine_threadsafe(call(), self.loop).result()

    def _handle(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type", ""), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:  # our resourceVersion is too old: list again
                self.rv = self._relist()
                return
            raise RuntimeError(f"watch error: {obj.get('message')}")
        self.rv = (obj.get("metadata") or {}).get("resourceVersion") or self.rv
        if kind == "BOOKMARK" or not self.keep(obj):
            self.loop.call_soon_threadsafe(self.on_seen, self.rv)
            return
        self.loop.call_soon_threadsafe(self.on_event, kind, compact_pod(obj))
        self.loop.call_soon_threadsafe(self.on_seen, self.rv)
