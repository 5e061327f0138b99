"""Real-node configuration (localcluster.realnodespec): addresses and the configs handed to containerd, CNI, kubelet."""

from __future__ import annotations

import ipaddress
import os
import tomllib
from pathlib import Path

import pytest
from localcluster import realnodespec as spec

pytestmark = pytest.mark.unit


def test_nodes_get_distinct_addresses_and_disjoint_pod_ranges_inside_the_pod_subnet() -> None:
    subnet = ipaddress.ip_network(spec.POD_SUBNET)
    seen: set[str] = set()
    for i in (0, 1, 7, spec.MAX_REAL_NODES - 1):
        start, end = (ipaddress.ip_address(a) for a in spec.pod_range(i))
        assert start in subnet and end in subnet and start < end
        assert ipaddress.ip_address(spec.POD_GATEWAY) not in range_of(start, end)
        assert spec.node_ip(i) not in seen
        seen.add(spec.node_ip(i))
    with pytest.raises(ValueError, match="real node index must be in 0..249, got 250"):
        spec.node_ip(spec.MAX_REAL_NODES)


def range_of(a: ipaddress.IPv4Address, b: ipaddress.IPv4Address) -> range:
    return range(int(a), int(b) + 1)


def test_cni_network_has_no_default_route_and_no_nat() -> None:
    bridge = spec.cni_config(3)["plugins"][0]
    assert bridge["ipMasq"] is False and bridge["bridge"] == spec.BRIDGE
    routes = [r["dst"] for r in bridge["ipam"]["routes"]]
    assert "0.0.0.0/0" not in routes and all(ipaddress.ip_network(r).is_private for r in routes)
    assert bridge["ipam"]["ranges"][0][0]["rangeStart"] == "10.244.4.1"


def test_containerd_config_is_valid_toml_with_the_settings_this_host_needs(tmp_path: Path) -> None:
    paths = spec.NodePaths(tmp_path / "n0")
    cfg = tomllib.loads(spec.containerd_config(paths, "reprieve.local/pause:abc"))
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "reprieve.local/pause:abc"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["stream_server_port"] == "0"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cfg["grpc"]["address"] == str(paths.socket) and cfg["root"].startswith(str(tmp_path))
    assert cfg["state"].startswith(spec.PRIVATE_DIRS[0])


def test_kubelet_config_binds_to_the_node_address_and_keeps_host_tunables(tmp_path: Path) -> None:
    paths = spec.NodePaths(tmp_path / "n1")
    cfg = spec.kubelet_config(paths, index=1, cgroup_root="/x/reprieve-c/n1", ca_file=tmp_path / "ca.crt")
    assert cfg["address"] == spec.node_ip(1) and cfg["healthzPort"] == 0 and cfg["readOnlyPort"] == 0
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["clusterDNS"] == [spec.CLUSTER_DNS] and cfg["resolvConf"] == ""
    assert cfg["containerRuntimeEndpoint"] == f"unix://{paths.socket}"
    assert cfg["protectKernelDefaults"] is False


def test_an_archive_name_gives_back_the_image_reference_it_holds() -> None:
    from localcluster.realnode import _archive_ref

    assert _archive_ref("/c/images/reprieve.local_reprieve-example_528d0eb5b540.tar") == \
        "reprieve.local/reprieve-example:528d0eb5b540"
    assert _archive_ref("reprieve.local_pause_b1c06a220b71.tar") == "reprieve.local/pause:b1c06a220b71"


def test_node_templates_of_archives_that_are_gone_are_pruned(tmp_path: Path) -> None:
    from localcluster.realnodes import prune_templates

    archive = tmp_path / "reprieve.local_pause_abc.tar"
    archive.write_text("x")
    for name, listed in (("current", str(archive)), ("stale", str(tmp_path / "reprieve.local_pause_old.tar"))):
        (tmp_path / "nodes" / name / "root").mkdir(parents=True)
        (tmp_path / "nodes" / name / "complete").write_text(listed)
    (tmp_path / "nodes" / "x.tmp123").mkdir()  # a copy a killed launcher left half-made
    os.utime(tmp_path / "nodes" / "x.tmp123", (1, 1))
    (tmp_path / "nodes" / "y.tmp456").mkdir()  # a copy being made right now
    removed = prune_templates(tmp_path / "nodes")
    assert sorted(p.name for p in removed) == ["stale", "x.tmp123"]
    assert (tmp_path / "nodes" / "y.tmp456").is_dir()
    assert (tmp_path / "nodes" / "current" / "root").is_dir()


@pytest.mark.parametrize(("used", "released", "expected"), [
    (set(), {}, 0),
    ({0, 1}, {}, 2),
    ({0, 2}, {}, 1),
    ({0}, {1: 50.0}, 2),                       # a node went from index 1 a moment ago: a fresh index instead
    ({0, 2}, {1: 50.0, 3: 40.0}, 4),           # fresh ones first, whatever went when
    (set(range(2, spec.MAX_REAL_NODES)), {0: 50.0, 1: 40.0}, 1),  # none fresh: the one given back longest ago
    (set(range(1, spec.MAX_REAL_NODES)), {0: 50.0}, 0),
])
def test_a_new_node_takes_an_index_no_node_had_or_the_one_given_back_longest_ago(
        used: set[int], released: dict[int, float], expected: int) -> None:
    assert spec.next_index(used, released) == expected


def test_no_index_left_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="all 250 real node indexes are in use"):
        spec.next_index(set(range(spec.MAX_REAL_NODES)), {})
