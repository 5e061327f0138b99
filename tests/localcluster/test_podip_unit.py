"""Process pods' loopback addresses (localcluster.podip): per cluster, stable, and what names rewrite to."""

from __future__ import annotations

import pytest
from localcluster.podip import HOST_IP, address_space, dns_ip, pod_ip, rewrite_dns

pytestmark = pytest.mark.unit


def pod(name: str, namespace: str = "warm-up", **spec: object) -> dict:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}


def test_two_clusters_on_one_host_give_the_same_pod_different_addresses() -> None:
    """pytest-xdist runs a cluster per worker on one host: the same pod name in both must not share an address
    (two jax.distributed coordinators on 127.x.y.z:8476 made one fail with EADDRINUSE)."""
    a, b = address_space("/tmp/pytest-1/popen-gw0/cluster0"), address_space("/tmp/pytest-1/popen-gw1/cluster0")
    assert a != b
    assert pod_ip(pod("warm-up-0"), a) != pod_ip(pod("warm-up-0"), b)
    assert dns_ip("ns", "job-0", "job", a) != dns_ip("ns", "job-0", "job", b)


def test_an_address_is_stable_within_a_cluster_and_a_headless_name_rewrites_to_its_pods_address() -> None:
    space = address_space("/tmp/c")
    worker = pod("ignored", "ns", hostname="job-0", subdomain="job")
    assert pod_ip(worker, space) == dns_ip("ns", "job-0", "job", space) == pod_ip(worker, space)
    assert rewrite_dns("job-0.job.ns.svc:8476", "ns", space=space) == f"{dns_ip('ns', 'job-0', 'job', space)}:8476"
    assert rewrite_dns("job-0.job:1", "ns", ["job"], space) == f"{dns_ip('ns', 'job-0', 'job', space)}:1"
    assert pod_ip(pod("x", hostNetwork=True), space) == HOST_IP
    octets = [int(o) for o in pod_ip(pod("y"), space).split(".")]
    assert octets[0] == 127 and all(1 <= o <= 254 for o in octets[1:])
