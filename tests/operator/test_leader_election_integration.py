"""Two operator replicas with leader election on a Lease (the chart's RBAC): only the leader acts; when it dies
(SIGKILL: its node is lost) or stops (SIGTERM: its node is drained) the standby takes over and notices still
reach every pod. Prints the failover times (docs/operator.md quotes them)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Operator, apply, job_manifest, node_tag
from kubernetes import client
from localcluster.stack import RELEASE_NS
from localcluster.testing import taint_node, wait_for
from test_operator_integration import notices, wait_running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SPOT = "cloud.google.com/impending-node-termination"


def replica(cluster: Any, namespace: str, path: Path, lease: str) -> Operator:
    op = Operator(cluster, namespace, path)
    op.extra_args = ["--leader-elect", "--leader-election-namespace", RELEASE_NS, "--leader-election-name", lease]
    return op.start()


def leading(ops: list[Operator]) -> list[Operator]:
    out = []
    for op in ops:
        try:
            if op.proc is not None and op.proc.poll() is None and op.metric("reprieve_leader") == 1:
                out.append(op)
        except OSError:
            pass
    return out


def lease_of(api: Any, name: str) -> Any:
    return client.CoordinationV1Api(api).read_namespaced_lease(name, RELEASE_NS).spec


def test_standby_takes_over_and_delivers_notices(cluster, api, namespace, chart, nodes, tmp_path) -> None:
    lease = f"reprieve-{namespace}"
    ops = [replica(cluster, namespace, tmp_path / name, lease) for name in ("a", "b")]
    try:
        (leader,) = wait_for(lambda: len(found := leading(ops)) == 1 and found, 40, "exactly one leader")
        (standby,) = [op for op in ops if op is not leader]
        # The standby must not lead while the Lease is held: two of its tries (each a read of the Lease, counted
        # once it has ended) with the leader alive, then the Lease is still the leader's, never changed hands.
        held = lease_of(api, lease)
        tries = standby.metric("reprieve_leader_election_tries_total")
        standby.handled("reprieve_leader_election_tries_total", tries + 1)
        now = lease_of(api, lease)
        assert (now.holder_identity, now.lease_transitions) == (held.holder_identity, held.lease_transitions), now
        assert leading(ops) == [leader], "the standby must not lead while the Lease is held"
        apply(cluster, job_manifest("llama", namespace, tag=node_tag(cluster, nodes[0]), save_seconds=60))
        pods = wait_running(api, namespace, "llama")
        assert "attempt 1" not in standby.log_path.read_text()  # only the leader acted

        # The leader's node is lost: SIGKILL, the Lease is not released and must expire (15 s).
        t0 = time.monotonic()
        leader.kill()
        taint_node(api, pods[0].spec.node_name, SPOT, "true", "NoSchedule")
        wait_for(lambda: all(notices(api, namespace, "llama").values()), 90,
                 "the standby to deliver the notice", describe=lambda: standby.tail(40))
        hard = time.monotonic() - t0
        assert leading([standby]) == [standby]

        # The new leader is drained: SIGTERM releases the Lease; a fresh standby takes over in seconds.
        fresh = replica(cluster, namespace, tmp_path / "c", lease)
        fresh.handled("reprieve_leader_election_tries_total", 0)  # it is trying to take the Lease
        t1 = time.monotonic()
        standby.stop(signal.SIGTERM)
        wait_for(lambda: leading([fresh]) == [fresh], 60, "the fresh standby to lead after a graceful stop",
                 describe=lambda: fresh.tail(40))
        soft = time.monotonic() - t1
        print(f"\nleader election failover: SIGKILL -> notice on every pod {hard:.1f}s; "
              f"SIGTERM -> new leader {soft:.1f}s")
        # The graceful hand-over beats the expiry path measured above (a released Lease is taken within a retry
        # period, an unreleased one only once it has expired), on whatever machine this runs.
        assert soft < hard, f"a released Lease took {soft:.1f}s to be taken, an expired one {hard:.1f}s"
        ops.append(fresh)
    finally:
        for op in ops:
            op.stop()
