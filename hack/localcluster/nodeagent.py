"""The node side of the process kubelet: registration, lease + status heartbeats, noticing Node deletion."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from localcluster import nodespec
from localcluster.podio import REQUEST_TIMEOUT_S

log = logging.getLogger("localcluster.kubelet")

WATCH_TIMEOUT_S = 30  # server-side watch timeout; the stream is re-opened after it
RETRY_DELAY_S = 1.0   # after an API error in a loop


def _now() -> datetime:
    return datetime.now(UTC)


class NodeAgent:
    """Keeps Node ``name`` registered and alive; calls ``on_deleted`` once when the Node object is deleted.

    Only the Node's status subresource is written after registration (and labels merged on re-registration),
    so taints, labels and ``unschedulable`` set by others stay.
    """

    def __init__(self, api_client: client.ApiClient, name: str, *, labels: dict[str, str],
                 capacity: dict[str, str], heartbeat_period: float, stop: threading.Event,
                 on_deleted: Callable[[], None]) -> None:
        self.name = name
        self.labels = labels
        self.capacity = capacity
        self.heartbeat_period = heartbeat_period
        self.core = client.CoreV1Api(api_client)
        self.coord = client.CoordinationV1Api(api_client)
        self._stop = stop
        self._on_deleted = on_deleted
        self._deleted = threading.Event()
        self._uid: str | None = None
        self._ready_since = _now()

    def register(self) -> None:
        """Create the Node (Ready) and its Lease. Raises ApiException if the API refuses."""
        body = nodespec.node_object(self.name, self.labels, self.capacity, _now())
        try:
            node = self.core.create_node(body, _request_timeout=REQUEST_TIMEOUT_S)  # type: ignore[arg-type]
        except ApiException as e:
            if e.status != 409:
                raise
            # Re-registration: add our labels, leave everything else (taints, other labels) alone.
            node = self.core.patch_node(self.name, {"metadata": {"labels": body["metadata"]["labels"]}},
                                        _request_timeout=REQUEST_TIMEOUT_S)
        self._uid = node.metadata.uid if node.metadata else None
        self._post_status()
        self._renew_lease()

    def loops(self) -> list[Callable[[], None]]:
        """The thread bodies to run: heartbeats and the Node watch."""
        return [self._heartbeat_loop, self._node_watch_loop]

    def _post_status(self) -> None:
        status = nodespec.node_status(self.name, self.capacity, _now(), self._ready_since)
        self.core.patch_node_status(self.name, {"status": status}, _request_timeout=REQUEST_TIMEOUT_S)

    def _renew_lease(self) -> None:
        body = nodespec.lease_object(self.name, self._uid, _now())
        try:
            self.coord.patch_namespaced_lease(self.name, nodespec.LEASE_NAMESPACE, {"spec": body["spec"]},
                                              _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease(nodespec.LEASE_NAMESPACE, body,  # type: ignore[arg-type]
                                               _request_timeout=REQUEST_TIMEOUT_S)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_period):
            try:
                self._renew_lease()
                self._post_status()
            except ApiException as e:
                if e.status == 404 and self._confirm_deleted():
                    return
                log.warning("heartbeat of node %s failed: %s %s", self.name, e.status, e.reason)
            except Exception as e:  # noqa: BLE001 - a heartbeat error must never end the heartbeats
                log.warning("heartbeat of node %s failed: %r", self.name, e)

    def _confirm_deleted(self) -> bool:
        try:
            self.core.read_node(self.name, _request_timeout=REQUEST_TIMEOUT_S)
            return False
        except ApiException as e:
            if e.status != 404:
                return False
        self._deleted_now()
        return True

    def _deleted_now(self) -> None:
        if not self._deleted.is_set() and not self._stop.is_set():  # not after a deliberate stop
            self._deleted.set()
            self._on_deleted()

    def _node_watch_loop(self) -> None:
        selector = f"metadata.name={self.name}"
        while not self._stop.is_set():
            try:
                w = watch.Watch()
                for ev in w.stream(self.core.list_node, field_selector=selector, timeout_seconds=WATCH_TIMEOUT_S,
                                   _request_timeout=WATCH_TIMEOUT_S + 10):
                    if ev["type"] == "DELETED":
                        self._deleted_now()
                    if self._stop.is_set():
                        w.stop()
                        break
                # Deleted while no watch was open: the list no longer has it.
                if not self._stop.is_set():
                    nodes = self.core.list_node(field_selector=selector, _request_timeout=REQUEST_TIMEOUT_S)
                    if not nodes.items:
                        self._deleted_now()
            except Exception as e:  # noqa: BLE001 - reconnect after any error
                if not self._stop.is_set():
                    log.info("node watch of %s restarting after: %r", self.name, e)
                    self._stop.wait(RETRY_DELAY_S)
