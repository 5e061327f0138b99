"""The local registry's configuration (localcluster.registryspec) and what real nodes' containerd gets from it."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
from localcluster import realnodespec, registryspec

pytestmark = pytest.mark.unit
CREDS = registryspec.Credentials("reprieve", 'p"w\\d')


def test_the_htpasswd_line_is_bcrypt_and_checks_the_password() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    user, hashed = registryspec.bcrypt_htpasswd(CREDS).rstrip("\n").split(":", 1)
    assert user == "reprieve" and hashed.startswith("$2")
    assert crypt.crypt(CREDS.password, hashed) == hashed
    assert crypt.crypt("wrong", hashed) != hashed


def test_generated_credentials_differ_and_keep_the_password_out_of_repr() -> None:
    a, b = registryspec.Credentials.generate(), registryspec.Credentials.generate()
    assert a.password != b.password and len(a.password) >= 20
    assert a.password not in repr(a)


def test_the_registry_listens_on_loopback_only_with_tls_and_basic_auth(tmp_path: Path) -> None:
    cfg = registryspec.registry_config(port=5123, storage=tmp_path / "s", cert=tmp_path / "c", key=tmp_path / "k",
                                       htpasswd=tmp_path / "h")
    assert cfg["http"]["addr"] == "127.0.0.1:5123"
    assert cfg["http"]["tls"] == {"certificate": str(tmp_path / "c"), "key": str(tmp_path / "k")}
    assert cfg["auth"] == {"htpasswd": {"realm": "reprieve-local", "path": str(tmp_path / "h")}}
    assert cfg["http"]["debug"]["addr"] == ""  # no second, unauthenticated listener


def test_containerd_pulls_from_the_registry_over_tls_with_the_cluster_ca_and_node_credentials(
        tmp_path: Path) -> None:
    hosts = tomllib.loads(registryspec.containerd_hosts_toml("127.0.0.1:5123", tmp_path / "ca.crt"))
    # the fallback server trusts the CA too: a missing tag ends on the registry's "not found", not on x509
    assert hosts == {"server": "https://127.0.0.1:5123", "ca": str(tmp_path / "ca.crt"),
                     "host": {"https://127.0.0.1:5123": {"capabilities": ["pull", "resolve"],
                                                         "ca": str(tmp_path / "ca.crt")}}}
    section = registryspec.containerd_registry_section(tmp_path / "hosts", "127.0.0.1:5123", CREDS)
    paths = realnodespec.NodePaths(tmp_path / "node")
    cfg = tomllib.loads(realnodespec.containerd_config(paths, "reprieve.local/pause:x", section))
    reg = cfg["plugins"]["io.containerd.grpc.v1.cri"]["registry"]
    assert reg["config_path"] == str(tmp_path / "hosts")
    assert reg["configs"]["127.0.0.1:5123"]["auth"] == {"username": "reprieve", "password": CREDS.password}
    plain = tomllib.loads(realnodespec.containerd_config(paths, "reprieve.local/pause:x"))
    assert "registry" not in plain["plugins"]["io.containerd.grpc.v1.cri"]


def test_access_round_trips_through_its_file_form(tmp_path: Path) -> None:
    a = registryspec.RegistryAccess("127.0.0.1:1", "https://127.0.0.1:2/", tmp_path / "ca.crt", CREDS)
    assert registryspec.RegistryAccess.from_json(a.to_json()) == a
    assert a.simple_url == "https://127.0.0.1:2/simple/"
