"""Thin registration: importing this module registers every handler; ``configure`` is the startup hook."""

from __future__ import annotations

import asyncio
import concurrent.futures
import fnmatch
import functools
import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from . import LABEL_JOB, apply, handlers, kueue, memory, metrics, podwatch, reconcile  # noqa: F401  (handlers: registration)
from .cache import Cache, Relist
from .eventsink import POSTERS
from .models import GROUP, PLURAL, VERSION
from .nodesignals import NodeSignals
from .policy import builders
from .policy.notice import DEFAULT_HORIZON_SECONDS
from .policy.restart import PEER_LOST_WAIT_SECONDS
from .policy.signals import signal_table
from .state import OBJECT_THREADS, POD_THREADS, State

ENV_SIGNALS = "REPRIEVE_SIGNALS_JSON"


EXECUTOR_THREADS = 32  # the default executor's: reconciles, notice objects, every other call

# Connections kept for reuse: one a thread that calls the API at once (the executor's, the notice lanes', the Event
# posters') and the long watches; a call beyond it opens a connection it then discards (a TLS handshake).
POOL = EXECUTOR_THREADS + OBJECT_THREADS + POD_THREADS + POSTERS + 8


def api_client(pool: int = POOL) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else ``$KUBECONFIG`` / ``~/.kube/config``."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def standby_health(port: int) -> ThreadingHTTPServer | None:
    """A standby's ``/healthz`` (kopf serves its own once this replica leads): alive, not yet acting."""
    if not port:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            body = b'{"standby": true}' if self.path.startswith("/healthz") else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="reprieve-standby-health", daemon=True).start()
    return server


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    memory.start_tracing()  # REPRIEVE_TRACEMALLOC=1: each resync round logs the top allocations
    # kopf's bookkeeping goes into our own annotations, so the CRD status stays ours.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="reprieve.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="reprieve.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    # kopf keeps a worker (holding the object's last full body) per object until it idles this long;
    # with 10,000 pods a short idle time is what bounds memory after a burst of events.
    settings.queueing.idle_timeout = 0.5
    # kopf lists every TrainingJob and Node before it watches: in pages, not all the bodies decoded at once.
    settings.watching.chunk_size = apply.LIST_PAGE
    settings.execution.max_workers = EXECUTOR_THREADS
    settings.watching.server_timeout = 300
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(EXECUTOR_THREADS))
    raw = getattr(memo, "signals_json", None) or os.environ.get(ENV_SIGNALS) or "{}"
    try:
        table = signal_table(json.loads(raw))
    except (ValueError, TypeError) as err:
        raise kopf.PermanentError(f"{ENV_SIGNALS}: invalid signal table: {err}") from err
    horizon = float(getattr(memo, "notice_horizon_seconds", 0) or DEFAULT_HORIZON_SECONDS)
    cache = Cache()
    memo.state = state = State(api=apply.Api(api_client()), cache=cache, nodes=NodeSignals(table, horizon, cache),
                               reconcile=reconcile.reconcile, kueue=bool(getattr(memo, "kueue", False)),
                               peer_lost_wait_s=float(getattr(memo, "peer_lost_wait_seconds", None)
                                                      or PEER_LOST_WAIT_SECONDS))
    memo.podwatch = await prime(state, list(getattr(memo, "namespaces", None) or []))
    if state.kueue:
        memo.kueue_stop = threading.Event()
        kueue.watch_workloads(state, literal_namespaces(list(getattr(memo, "namespaces", None) or [])),
                              asyncio.get_running_loop(), memo.kueue_stop)
    port = int(getattr(memo, "metrics_port", 0) or 0)
    try:
        metrics.serve(port)
    except OSError as err:
        raise kopf.PermanentError(f"--metrics-port {port}: cannot serve metrics: {err}") from err
    memo.resync = asyncio.get_running_loop().create_task(state.queue.resync(
        float(getattr(memo, "resync_seconds", 60.0) or 60.0), lambda: _unfinished(state), memory.each_resync))
    logging.getLogger("reprieve_operator").info("watching %d node signals: %s", len(table),
                                                ", ".join(s.name for s in table))


def literal_namespaces(namespaces: list[str]) -> list[str] | None:
    """The namespaces to LIST and WATCH one by one (no globs: namespaced RBAC grants no cluster-wide reads),
    or None to list cluster-wide (all namespaces, or patterns)."""
    if namespaces and not any(ch in ns for ns in namespaces for ch in "*?["):
        return sorted(set(namespaces))
    return None


async def prime(state: State, namespaces: list[str]) -> list[podwatch.PodWatch]:
    """Fill the cache with one paginated LIST per kind (and watched namespace) before kopf starts watching
    (see ``cache.py``); start the worker-pod watches."""
    api = state.api
    literal = literal_namespaces(namespaces)
    scopes: list[str | None] = list(literal) if literal else [None]

    def in_scope(obj: dict[str, Any]) -> bool:
        ns = (obj.get("metadata") or {}).get("namespace", "")
        return not namespaces or any(fnmatch.fnmatchcase(ns, pat) for pat in namespaces)

    def jobs_pages(scope: str | None) -> Any:
        if scope is None:
            return apply.list_pages(api.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        return apply.list_pages(api.custom.list_namespaced_custom_object, GROUP, VERSION, scope, PLURAL)

    def notice_objects() -> None:
        # Every job's notice object, so a burst of notices writes each without reading it first (a refused list:
        # each is read once, as before).
        listed = []
        try:
            for scope in scopes:
                pages = (apply.list_pages(api.core.list_config_map_for_all_namespaces, label_selector=LABEL_JOB)
                         if scope is None else
                         apply.list_pages(api.core.list_namespaced_config_map, scope, label_selector=LABEL_JOB))
                for page in pages:
                    listed += [n for n in map(builders.listed_notice_object, filter(in_scope, page)) if n]
        except ApiException as err:
            logging.getLogger("reprieve_operator").warning(
                "could not list the jobs' notice objects (%s): each is read before its first notice", err.reason)
            return
        state.nodes.prime_objects(listed)
        logging.getLogger("reprieve_operator").info("%d notice object(s) listed", len(listed))

    def fill() -> dict[str | None, str]:
        # Page by page into the cache: never all the pods' bodies, nor a second compact copy of them all, at once
        # (a list of every compact pod before the cache's own copies doubled the start-up's peak).
        cache = state.cache
        versions = {}
        for scope in scopes:
            for page in jobs_pages(scope):
                for job in filter(in_scope, page):
                    cache.upsert_job(job)
            for page, version in podwatch.pod_pages(api, scope):
                versions[scope] = version
                for pod in filter(in_scope, page):
                    cache.upsert_pod(pod)
        notice_objects()
        # After the pods and notice objects: a signal already there is dated by the notices an operator before this
        # one delivered on that node's pods or objects, else at this operator's start (NodeSignals.prime).
        for page in apply.list_pages(api.core.list_node):
            for n in page:
                state.nodes.prime(n)
        cache.mark_primed()
        return versions

    versions = await apply.run(fill)

    def on_pod(kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            state.cache.pod_gone(pod)
        else:
            state.cache.upsert_pod(pod)
        meta = pod["metadata"]
        state.queue.kick(meta["namespace"], meta["labels"][LABEL_JOB])

    watches = []
    for scope in scopes:
        watch = podwatch.PodWatch(api, asyncio.get_running_loop(), on_pod,
                                  functools.partial(state.cache.relist, scope), functools.partial(on_relisted, state),
                                  in_scope, versions[scope], scope, on_seen=functools.partial(saw_pods, state))
        watch.start()
        watches.append(watch)
    memory.release()
    memory.mark_primed()
    logging.getLogger("reprieve_operator").info("cache primed: %s (pods watched in %s), RSS %.0f MB",
                                                state.cache.stats(), ", ".join(s or "all namespaces" for s in scopes),
                                                memory.rss_mb())
    return watches


def saw_pods(state: State, resource_version: str) -> None:
    """The pod watch applied everything up to ``resource_version``: a fresh LIST asks for no older state."""
    state.cache.pods_seen = resource_version


def on_relisted(state: State, relist: Relist) -> None:
    """A re-list of the pods is all in the cache: forget the pods it did not list, reconcile every job that had or
    has pods, and hand the heap the listing used back."""
    for namespace, job in relist.end():
        state.queue.kick(namespace, job)
    memory.release()


def _unfinished(state: State) -> list[tuple[str, str]]:
    keys = state.cache.unfinished_jobs()
    logging.getLogger("reprieve_operator").debug("resync: %d unfinished job(s); cache %s", len(keys),
                                                 state.cache.stats())
    return keys


@kopf.on.cleanup()
async def stop_resync(memo: Any, **_: Any) -> None:
    for watch in getattr(memo, "podwatch", None) or []:
        watch.stop()
    stop = getattr(memo, "kueue_stop", None)
    if stop is not None:
        stop.set()
    task = getattr(memo, "resync", None)
    if task is not None:
        task.cancel()
