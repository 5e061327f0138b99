"""Kueue's I/O (the decisions are ``policy.kueue``'s): read a queued job's Workload and what it names
(:func:`read`), carry out one Workload write the decision asked for (:func:`write`: create, delete, patch, the
status subresource), and watch Workloads to reconcile their jobs. No job status, no Event: those are
``reconcile.apply_outcome``'s.

Only with the operator's ``--kueue`` (chart ``kueue.enabled``); without it a queue label is ignored.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from . import LABEL_JOB, apply
from .models import TrainingJob
from .policy import kueue as policy
from .policy import workload
from .state import State

log = logging.getLogger("reprieve_operator")
G, V = workload.KUEUE_GROUP, workload.KUEUE_VERSION


def _body(err: ApiException) -> dict[str, Any]:
    try:
        parsed = json.loads(err.body or "{}")
        return parsed if isinstance(parsed, dict) else {}
    except ValueError:
        return {}


def _not_served(err: ApiException) -> bool:
    """A 404 for the resource itself (Kueue's CRDs not installed), not for one object of it."""
    return err.status == 404 and not (_body(err).get("details") or {}).get("name")


def _get(api: apply.Api, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    def call() -> dict[str, Any]:
        if namespace is None:
            return apply._raw(api.custom.get_cluster_custom_object(G, V, plural, name, _preload_content=False))
        return apply._raw(api.custom.get_namespaced_custom_object(G, V, namespace, plural, name,
                                                                  _preload_content=False))
    try:
        return call()
    except ApiException as err:
        if err.status == 404 and not _not_served(err):
            return None
        raise


def _create(api: apply.Api, wl: dict[str, Any]) -> dict[str, Any]:
    ns = wl["metadata"]["namespace"]
    return apply._raw(api.custom.create_namespaced_custom_object(G, V, ns, workload.WORKLOADS, wl,  # type: ignore[no-any-return]
                                                                 _preload_content=False))


def _patch(api: apply.Api, ns: str, name: str, body: dict[str, Any], status: bool = False) -> None:
    fn = api.custom.patch_namespaced_custom_object_status if status else api.custom.patch_namespaced_custom_object
    apply._raw(fn(G, V, ns, workload.WORKLOADS, name, body, _preload_content=False))


def _message(err: ApiException) -> str:
    return str(_body(err).get("message") or err.reason or err)[:600]


def read(api: apply.Api, body: dict[str, Any], job: TrainingJob) -> policy.Read:
    """What the job's queue needs read (``policy.kueue.Read``): its labels, its Workload, the WorkloadPriorityClass
    a Workload still to be created names, the flavors an admission assigned. Writes nothing (blocking: run it with
    ``apply.run``)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    queue, pc = labels.get(policy.QUEUE_LABEL), labels.get(policy.PRIORITY_LABEL)
    if not queue:
        return policy.Read(None)
    ns = job.namespace
    try:
        raw = _get(api, workload.WORKLOADS, workload.workload_name(job.name, job.uid), ns)
        priority = None
        if raw is None and pc:
            obj = _get(api, workload.PRIORITY_CLASSES, pc)
            priority = int(obj.get("value") or 0) if obj is not None else None
        flavors: dict[str, Any] = {}
        if raw is not None and job.status.phase not in ("Succeeded", "Failed"):
            admitted = workload.parse_workload(raw).flavors.values()
            for f in sorted({f for fs in admitted for f in fs}):
                flavors[f] = _get(api, workload.FLAVORS, f)
    except ApiException as err:
        if _not_served(err):
            return policy.Read(queue, pc, served=False)
        raise
    return policy.Read(queue, pc, raw, priority, flavors)


class Refused(Exception):
    """The API server (Kueue's webhook) refused to create the Workload; the message is its own."""


def write(api: apply.Api, namespace: str, op: policy.WorkloadOp) -> bool:
    """Carry out one Workload write (``policy.kueue.WorkloadOp``): True once done; False when the Workload changed
    meanwhile or is already there (a stale read: look again). A refused create raises :class:`Refused`. Blocking:
    run it with ``apply.run``."""
    try:
        if op.verb == "create":
            assert op.body is not None
            _create(api, dict(op.body))
        elif op.verb == "delete":
            apply.tolerate(lambda: api.custom.delete_namespaced_custom_object(
                G, V, namespace, workload.WORKLOADS, op.name), 404, None)
        else:
            assert op.body is not None
            _patch(api, namespace, op.name, dict(op.body), op.verb == "status")
    except ApiException as err:
        if err.status == 409:
            log.info("Workload %s/%s changed meanwhile (%s): looking again", namespace, op.name, op.verb)
            return False
        if op.verb == "create" and err.status in (400, 403, 422):
            raise Refused(_message(err)) from err
        if op.verb == "delete" and _not_served(err):
            return True  # Kueue is gone: there is no Workload to delete
        raise
    return True


def watch_workloads(state: State, namespaces: Iterable[str] | None, loop: asyncio.AbstractEventLoop,
                    stop: threading.Event) -> list[threading.Thread]:
    """Threads that watch the operator's Workloads (label ``reprieve.dev/job-name``) and kick their jobs'
    reconciles: an admission, an eviction or a requeue is seen at once."""
    def run(ns: str | None) -> None:
        api = state.api.custom
        while not stop.is_set():
            try:
                fn = (functools.partial(api.list_namespaced_custom_object, G, V, ns, workload.WORKLOADS) if ns
                      else functools.partial(api.list_cluster_custom_object, G, V, workload.WORKLOADS))
                for ev in watch.Watch().stream(fn, label_selector=LABEL_JOB, timeout_seconds=60):
                    obj = ev.get("object") or {}
                    meta = obj.get("metadata") or {}
                    job = (meta.get("labels") or {}).get(LABEL_JOB)
                    if job:
                        loop.call_soon_threadsafe(state.queue.kick, str(meta.get("namespace")), str(job))
                    if stop.is_set():
                        return
            except Exception as err:  # noqa: BLE001 - Kueue not installed yet, a dropped watch: try again
                log.debug("watching Workloads%s: %s", f" in {ns}" if ns else "", err)
                stop.wait(5.0)

    threads = [threading.Thread(target=run, args=(ns,), name=f"reprieve-kueue-{ns or 'all'}", daemon=True)
               for ns in (list(namespaces) if namespaces else [None])]
    for t in threads:
        t.start()
    return threads
