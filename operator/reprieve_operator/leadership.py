"""Leader election on a ``coordination.k8s.io`` Lease, so that two operator replicas never act at once.

The kubernetes client's ``LeaderElection`` runs in a thread: a standby blocks until it holds the Lease, then
the operator starts (kopf in the main thread). A leader that cannot renew within the renew deadline exits at
once (the process restarts as a standby): it never keeps acting on a Lease another replica may already hold.
On SIGTERM (a drain, a rollout) the leader releases the Lease, so a standby takes over within one retry period
instead of waiting for the Lease to expire. Timings follow client-go's defaults (15 s / 10 s / 2 s).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from . import metrics

log = logging.getLogger("reprieve_operator.leadership")
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class ElectionSettings:
    namespace: str
    name: str = "reprieve-operator"
    identity: str = ""
    lease_seconds: int = 15
    renew_seconds: int = 10
    retry_seconds: int = 2

    def __post_init__(self) -> None:
        if not self.lease_seconds > self.renew_seconds > 1.2 * self.retry_seconds >= 1.2:
            raise ValueError(f"leader election needs lease ({self.lease_seconds} s) > renew deadline "
                             f"({self.renew_seconds} s) > 1.2 x retry period ({self.retry_seconds} s) >= 1.2 s")


def default_namespace() -> str:
    """The operator's own namespace: $POD_NAMESPACE, the ServiceAccount's namespace, or reprieve-system."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SA_NAMESPACE_FILE) as f:
            return f.read().strip() or "reprieve-system"
    except OSError:
        return "reprieve-system"


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


class CountedLeaseLock(LeaseLock):  # type: ignore[misc]
    """The Lease lock, counting each read of the Lease (``reprieve_leader_election_tries_total``): every try to
    take or renew it starts with one, and what the try then does follows from what it read."""

    def get(self, name: str, namespace: str) -> Any:
        try:
            return super().get(name, namespace)
        finally:
            metrics.LEADER_TRIES.inc()


class Election:
    """Blocks in :meth:`wait_until_leading`; calls ``on_lost`` (default: exit the process) if leadership ends."""

    def __init__(self, api_client: client.ApiClient, settings: ElectionSettings,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.identity = settings.identity or default_identity()
        self.lock = CountedLeaseLock(settings.name, settings.namespace, self.identity)
        self.lock.api_instance = client.CoordinationV1Api(api_client)
        self.leading = threading.Event()
        self.on_lost = on_lost or _exit_now
        config = electionconfig.Config(self.lock, settings.lease_seconds, settings.renew_seconds,
                                       settings.retry_seconds, self._started, self._stopped)
        self._election = leaderelection.LeaderElection(config)
        self._thread = threading.Thread(target=self._election.run, name="reprieve-leader-election", daemon=True)
        logging.getLogger("leaderelection").setLevel(logging.WARNING)  # it logs every retry at INFO

    def start(self) -> Election:
        log.info("leader election: %s waits for Lease %s/%s", self.identity, self.settings.namespace,
                 self.settings.name)
        self._thread.start()
        return self

    def wait_until_leading(self, timeout: float | None = None) -> bool:
        return self.leading.wait(timeout)

    def _started(self) -> None:
        log.info("leader election: %s leads (Lease %s/%s)", self.identity, self.settings.namespace,
                 self.settings.name)
        self.leading.set()

    def _stopped(self) -> None:
        if self.leading.is_set():
            log.error("leader election: %s lost Lease %s/%s; stopping so that only one operator acts",
                      self.identity, self.settings.namespace, self.settings.name)
            self.on_lost()

    def release(self) -> None:
        """Give the Lease up (on a graceful stop): a standby takes over after one retry period."""
        if not self.leading.is_set():
            return
        api = self.lock.api_instance
        try:
            lease = api.read_namespaced_lease(self.settings.name, self.settings.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = datetime.now(UTC)
            api.replace_namespaced_lease(self.settings.name, self.settings.namespace, lease)
            log.info("leader election: %s released Lease %s/%s", self.identity, self.settings.namespace,
                     self.settings.name)
        except ApiException as err:
            log.warning("leader election: could not release Lease %s/%s: %s", self.settings.namespace,
                        self.settings.name, err.reason)


def _exit_now() -> None:
    logging.shutdown()
    os._exit(1)  # no cleanup that could still act on the cluster: the Lease may be someone else's now
