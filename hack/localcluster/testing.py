"""Helpers for tests against the local cluster: node signals and bounded waits with clear messages."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A bounded wait ran out; the message says what was awaited and what was last seen."""


def wait_for(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.1,
             describe: Callable[[], str] | None = None) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned); :class:`WaitTimeout` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_err: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - keep polling; report the last error on timeout
            last_err = err
        if time.monotonic() > deadline:
            detail = describe() if describe else ""
            if last_err is not None:
                detail += f" (last error: {last_err})"
            raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {what}{': ' + detail if detail else ''}")
        time.sleep(interval)


def _core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


def taint_node(api: Any, name: str, key: str, value: str | None = None, effect: str = "NoSchedule") -> None:
    """Add (or replace) taint ``key`` on Node ``name``; NoExecute taints get a ``timeAdded`` like the real ones."""
    core = _core(api)
    node = core.read_node(name)
    taints = [t for t in (node.spec.taints or []) if t.key != key]
    new: dict[str, Any] = {"key": key, "effect": effect}
    if value is not None:
        new["value"] = value
    if effect == "NoExecute":
        new["timeAdded"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = [api.sanitize_for_serialization(t) for t in taints] + [new]
    core.patch_node(name, {"spec": {"taints": body}})


def untaint_node(api: Any, name: str, key: str) -> None:
    core = _core(api)
    node = core.read_node(name)
    taints = [api.sanitize_for_serialization(t) for t in (node.spec.taints or []) if t.key != key]
    core.patch_node(name, {"spec": {"taints": taints}})


def label_node(api: Any, name: str, labels: dict[str, str | None]) -> None:
    """Set labels on Node ``name``; a ``None`` value removes the label."""
    _core(api).patch_node(name, {"metadata": {"labels": labels}})


def cordon_node(api: Any, name: str, unschedulable: bool = True) -> None:
    _core(api).patch_node(name, {"spec": {"unschedulable": unschedulable}})


def set_node_condition(api: Any, name: str, type_: str, status: str, reason: str = "Test",
                       message: str = "") -> None:
    """Add or replace a Node condition (e.g. AKS ``VMEventScheduled``) through the status subresource."""
    core = _core(api)
    node = core.read_node_status(name)
    conds = [api.sanitize_for_serialization(c) for c in (node.status.conditions or []) if c.type != type_]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conds.append({"type": type_, "status": status, "reason": reason, "message": message,
                  "lastHeartbeatTime": now, "lastTransitionTime": now})
    core.patch_node_status(name, {"status": {"conditions": conds}})


def pod_phase(api: Any, namespace: str, name: str) -> str | None:
    from kubernetes.client.rest import ApiException

    try:
        return str(_core(api).read_namespaced_pod(name, namespace).status.phase)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def wait_for_pod_phase(api: Any, namespace: str, name: str, phases: Iterable[str] | str,
                       timeout: float = 60.0) -> Any:
    """Wait until pod ``namespace/name`` is in one of ``phases``; return the pod."""
    wanted = {phases} if isinstance(phases, str) else set(phases)
    core = _core(api)
    last: dict[str, Any] = {}

    def check() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        last["phase"] = pod.status.phase
        return pod if pod.status.phase in wanted else None

    return wait_for(check, timeout, f"pod {namespace}/{name} to reach phase {sorted(wanted)}",
                    describe=lambda: f"last phase {last.get('phase')!r}")


def wait_for_pod_gone(api: Any, namespace: str, name: str, timeout: float = 60.0) -> None:
    wait_for(lambda: pod_phase(api, namespace, name) is None, timeout, f"pod {namespace}/{name} to be deleted",
             describe=lambda: f"phase {pod_phase(api, namespace, name)!r}")


def container_exit_code(pod: Any) -> int | None:
    for cs in pod.status.container_statuses or []:
        if cs.state and cs.state.terminated:
            return int(cs.state.terminated.exit_code)
    return None


def serviceaccount_dir(cluster: Any, namespace: str, service_account: str, path: Any) -> Any:
    """A directory laid out as a pod's ``/var/run/secrets/kubernetes.io/serviceaccount`` (``token``, ``namespace``,
    ``ca.crt``) for ``service_account``: what the runtime's ``KubeClient`` reads (``path``: a fresh ``Path``)."""
    import shutil

    path.mkdir(parents=True, exist_ok=True)
    (path / "token").write_text(cluster.kubectl("create", "token", service_account, "-n", namespace).stdout.strip())
    (path / "namespace").write_text(namespace)
    shutil.copy(cluster.pki.ca_crt, path / "ca.crt")
    return path
