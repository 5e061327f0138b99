"""The one I/O adapter: idempotent create/delete/patch against the Kubernetes API.

409 Conflict/AlreadyExists on create and 404 on delete are expected when a reconcile repeats after an
operator restart or a stale read; they are logged at INFO and treated as done. Everything else raises.
The kubernetes client is synchronous; async callers use :func:`run` to keep the event loop free.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from . import rest
from .models import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")


def _raw(response: Any) -> Any:
    """Body of a ``_preload_content=False`` call: skips the client's slow model deserialisation."""
    try:
        data = response.data
        return json.loads(data) if data else None
    finally:
        response.release_conn()


class Api:
    """The API groups the operator uses, sharing one ApiClient: core and RBAC through ``rest`` (the client's generated
    classes of those groups load a model of every type they name), custom objects through the client's own."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.client = api_client
        self.core = rest.CoreV1Api(api_client)
        self.rbac = rest.RbacAuthorizationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))


def tolerate(call: Callable[[], T], status: int, otherwise: U, *note: Any) -> T | U:
    """``call()``, or ``otherwise`` when the API answers ``status`` (404: already gone, 409: already exists): an
    expected answer when a reconcile repeats, logged at INFO (``note``: a %-style message and its arguments).
    Every other error is raised."""
    try:
        return call()
    except ApiException as err:
        if err.status != status:
            raise
        if note:
            log.info(*note)
        return otherwise


# The namespaced kinds a job owns: (API group attribute of ``Api``, the client's method suffix).
_KINDS = {"Pod": ("core", "pod"), "Service": ("core", "service"), "ServiceAccount": ("core", "service_account"),
          "ConfigMap": ("core", "config_map"), "Secret": ("core", "secret"), "Role": ("rbac", "role"), "RoleBinding": ("rbac", "role_binding")}


def _method(api: Api, verb: str, kind: str) -> Any:
    """The client's ``<verb>_namespaced_<kind>`` (e.g. ``api.rbac.delete_namespaced_role_binding``)."""
    group, suffix = _KINDS[kind]
    return getattr(getattr(api, group), f"{verb}_namespaced_{suffix}")


def create(api: Api, obj: dict[str, Any]) -> bool:
    """Create ``obj``; False (logged at INFO) if it already exists."""
    meta = obj["metadata"]

    def call() -> bool:
        _raw(_method(api, "create", obj["kind"])(meta["namespace"], obj, _preload_content=False))
        return True

    return tolerate(call, 409, False, "%s %s/%s already exists; leaving it", obj["kind"], meta["namespace"],
                    meta["name"])


def patch_metadata(api: Api, obj: dict[str, Any]) -> None:
    """Merge ``obj``'s labels and annotations into the existing ServiceAccount of that name."""
    meta = obj["metadata"]
    body = {"metadata": {k: meta[k] for k in ("labels", "annotations") if meta.get(k)}}
    _raw(api.core.patch_namespaced_service_account(meta["name"], meta["namespace"], body, _preload_content=False,
                                                   _content_type="application/merge-patch+json"))


def put(api: Api, obj: dict[str, Any], owned: str) -> None:
    """Create ``obj``, or replace its ``owned`` field in the existing object of that name, whole (the operator is
    that field's only writer: an assignment's data, the worker Role's rules, which follow replacements and spares).

    Whole, not merged: a key the new value lacks must go (a merge patch kept a grow's ``resize`` and a 2-process
    attempt's ``memoryPeers`` in every later assignment, so a shrink after a grow was told it grows)."""
    meta = obj["metadata"]

    def create() -> bool:
        _raw(_method(api, "create", obj["kind"])(meta["namespace"], obj, _preload_content=False))
        return True

    if not tolerate(create, 409, False):
        _raw(_method(api, "patch", obj["kind"])(meta["name"], meta["namespace"], replace_field(obj, owned),
                                                _preload_content=False,
                                                _content_type="application/json-patch+json"))


def replace_field(obj: dict[str, Any], owned: str) -> list[dict[str, Any]]:
    """The JSON patch that sets ``obj``'s top-level field ``owned`` whole (``add`` replaces a member that exists)."""
    return [{"op": "add", "path": f"/{owned}", "value": obj[owned]}]


def write_data(api: Api, obj: dict[str, Any], exists: bool) -> None:
    """One write of a ConfigMap's ``data``: a merge patch when the object is known to exist (else, gone: created),
    a create when not (else, there after all: patched). Any other refusal raises (the caller falls back)."""
    meta = obj["metadata"]

    def patch() -> bool:
        _raw(api.core.patch_namespaced_config_map(meta["name"], meta["namespace"], {"data": obj["data"]},
                                                  _preload_content=False,
                                                  _content_type="application/merge-patch+json"))
        return True

    def create() -> bool:
        _raw(api.core.create_namespaced_config_map(meta["namespace"], obj, _preload_content=False))  # type: ignore[arg-type]
        return True

    if exists:
        if not tolerate(patch, 404, False):
            create()
    elif not tolerate(create, 409, False):
        patch()


def put_configmap(api: Api, obj: dict[str, Any]) -> None:
    put(api, obj, "data")


def put_role(api: Api, role: dict[str, Any]) -> None:
    put(api, role, "rules")


def get_configmap(api: Api, namespace: str, name: str) -> dict[str, Any] | None:
    return tolerate(lambda: _raw(api.core.read_namespaced_config_map(name, namespace, _preload_content=False)),
                    404, None)


def dry_run_pod(api: Api, pod: dict[str, Any]) -> None:
    """Send ``pod`` through validation and admission without creating it; raises ``ApiException`` if refused.

    Strict field validation: a misspelt field is an error here, not a silently dropped setting."""
    meta = pod["metadata"]
    _raw(api.core.create_namespaced_pod(meta["namespace"], pod, dry_run="All",  # type: ignore[arg-type]
                                        field_validation="Strict", _preload_content=False))


def create_pod(api: Api, pod: dict[str, Any]) -> dict[str, Any] | None:
    """Create a pod; the created object, or None (logged at INFO) if it already exists."""
    meta = pod["metadata"]

    def create() -> dict[str, Any] | None:
        return _raw(api.core.create_namespaced_pod(meta["namespace"], pod, field_validation="Strict",  # type: ignore[arg-type]
                                                   _preload_content=False))

    # a spare or a replacement has only a generateName (a 409 cannot name it; it would not happen for one either)
    name = meta.get("name") or f"{meta.get('generateName', '')}*"
    return tolerate(create, 409, None, "Pod %s/%s already exists; leaving it", meta["namespace"], name)


def delete(api: Api, obj: dict[str, Any]) -> bool:
    """Delete ``obj`` (a Service or identity object); False (logged at INFO) if it is already gone."""
    meta = obj["metadata"]

    def call() -> bool:
        _raw(_method(api, "delete", obj["kind"])(meta["name"], meta["namespace"], _preload_content=False))
        return True

    return tolerate(call, 404, False, "%s %s/%s already gone", obj["kind"], meta["namespace"], meta["name"])


def refusal_of(err: BaseException) -> tuple[int | None, Any]:
    """(HTTP status, body) of a failed API call; (None, text) when no answer came (timeout, connection).

    The kubernetes client (>= 35) validates a request body itself (pydantic) before sending it; such a
    refusal is reported as the API server would report it: 422 with one cause per field."""
    if isinstance(err, ApiException):
        return err.status, err.body
    if isinstance(err, ValidationError):
        causes = [{"field": _field_path(e["loc"][1:]),
                   "message": "unknown field (misspelt?)" if e["type"] == "extra_forbidden" else e["msg"]}
                  for e in err.errors()]
        return 422, {"kind": "Status", "message": str(err)[:600], "details": {"causes": causes}}
    return None, f"{type(err).__name__}: {err}"


def is_no_answer(err: BaseException) -> bool:
    """A call that got no answer (a timeout, a refused or reset connection, a broken response), as opposed to an
    error in the operator's own code, which is a bug to log with its traceback, not a flaky API server."""
    import urllib3

    return isinstance(err, OSError | TimeoutError | asyncio.TimeoutError | urllib3.exceptions.HTTPError)


def _field_path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def delete_pod(api: Api, namespace: str, name: str, *, grace_seconds: int | None = None) -> bool:
    """Delete a pod (default grace, so the runtime still gets SIGTERM); False if already gone.

    ``grace_seconds=0`` force-deletes: only for pods whose Node is gone, where no kubelet will ever confirm a
    graceful deletion (PodGC would do the same, but only after its quarantine of tens of seconds)."""
    def call() -> bool:
        _raw(api.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds,
                                            _preload_content=False))
        return True

    return tolerate(call, 404, False, "pod %s/%s already gone", namespace, name)


def annotate_pod(api: Api, namespace: str, name: str, annotations: dict[str, str | None]) -> bool:
    def call() -> bool:
        _raw(api.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                           _preload_content=False,
                                           _content_type="application/merge-patch+json"))
        return True

    return tolerate(call, 404, False, "pod %s/%s gone before it could be annotated", namespace, name)


def list_job_pods(api: Api, namespace: str, job: str, seen: str | None = None) -> list[dict[str, Any]]:
    """The job's pods, from the API server's watch cache: not older than ``seen`` (the resourceVersion this
    operator's pod watch last applied), or as the cache has them. Never a consistent read: a LIST with a label
    selector that the watch cache cannot serve at once goes to etcd as a range over every pod of the namespace
    (at 50,000 pods 264 MB a LIST, which filled this VM's etcd and API server)."""
    from . import LABEL_JOB

    version = {"resource_version": seen, "resource_version_match": "NotOlderThan"} if seen else \
        {"resource_version": "0"}
    body = _raw(api.core.list_namespaced_pod(namespace, label_selector=f"{LABEL_JOB}={job}",
                                             _preload_content=False, **version))
    return list(body.get("items") or [])


def get_node(api: Api, name: str) -> dict[str, Any] | None:
    return tolerate(lambda: _raw(api.core.read_node(name, _preload_content=False)), 404, None)


def get_job(api: Api, namespace: str, name: str) -> dict[str, Any] | None:
    return tolerate(lambda: _raw(api.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, _preload_content=False)), 404, None)


def patch_job_status(api: Api, namespace: str, name: str, status: dict[str, Any]) -> bool:
    """Merge-patch ``status`` (status subresource); False if the job is gone."""
    def call() -> bool:
        _raw(api.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                              {"status": status}, _preload_content=False))
        return True

    return tolerate(call, 404, False, "TrainingJob %s/%s gone before its status could be written", namespace, name)


def post_event(api: Api, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal",
               name: str | None = None) -> None:
    """Post a core/v1 Event on ``obj`` (ref: apiVersion, kind, name, namespace, uid); failures only logged.

    With ``name`` the Event is posted at most once: a second post of the same name (an operator that
    restarted between posting and recording it) finds it already there.
    """
    now = datetime.now(UTC)
    ns = obj["namespace"]
    meta = {"name": name} if name else {"generateName": f"{obj['name']}."}
    body = {
        "metadata": {**meta, "namespace": ns},
        "involvedObject": {k: obj[k] for k in ("apiVersion", "kind", "name", "namespace", "uid") if obj.get(k)},
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "reprieve-operator"},
        "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "count": 1,
    }
    try:  # a named Event posted before: 409, done
        tolerate(lambda: _raw(api.core.create_namespaced_event(ns, body, _preload_content=False)),  # type: ignore[arg-type]
                 409 if name else 0, None)
    except ApiException as err:
        log.info("could not post event %s on %s %s/%s: %s", reason, obj.get("kind"), ns, obj["name"], err.reason)


async def gather(calls: Iterable[Callable[[], T]]) -> list[T]:
    """Run blocking calls concurrently on the loop's executor; the first error is raised after all finish. The
    executor's futures are awaited as they are (no task and coroutine a call). A notice burst's writes go through
    ``state.Lanes`` instead."""
    loop = asyncio.get_running_loop()
    results = await asyncio.gather(*(loop.run_in_executor(None, c) for c in calls), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


LIST_PAGE = 500  # objects a LIST page holds (ours, and kopf's listing before it watches): a page decoded at a time


def list_pages(fn: Callable[..., Any], *args: Any, page: int = LIST_PAGE,
               **kwargs: Any) -> Iterator[list[dict[str, Any]]]:
    """A paginated LIST, one page of plain dicts at a time (callers keep only what they need of each)."""
    for items, _ in list_pages_versioned(fn, *args, page=page, **kwargs):
        yield items


def list_pages_versioned(fn: Callable[..., Any], *args: Any, page: int = LIST_PAGE,
                         **kwargs: Any) -> Iterator[tuple[list[dict[str, Any]], str]]:
    """:func:`list_pages`, each page with the list's resourceVersion (the one to watch from)."""
    token = None
    while True:
        extra: dict[str, Any] = {"_continue": token} if token else {}
        body = _raw(fn(*args, limit=page, _preload_content=False, **kwargs, **extra))
        meta = body.get("metadata") or {}
        yield body.get("items") or [], meta.get("resourceVersion") or ""
        token = meta.get("continue")
        if not token:
            return
