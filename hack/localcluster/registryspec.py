"""What the local cluster's registry and package index are made of (pure): their configuration, their password
files and the real nodes' containerd configuration that pulls from the registry.

Both listen on the host's ``127.0.0.1`` (each on a free port), serve TLS with a certificate from the cluster's CA
(SANs ``127.0.0.1`` and ``localhost``) and ask for HTTP basic auth. The registry's address is the same string on
the host and on real nodes (``127.0.0.1:<port>``): in the cluster network namespace a forwarder
(:mod:`.hostforward`) listens on that address and carries connections to the host's, so an image reference pushed
from the host is the reference a kubelet pulls.
"""

from __future__ import annotations

import base64
import json
import secrets
import warnings
from dataclasses import dataclass, field
from pathlib import Path

with warnings.catch_warnings():  # deprecated since 3.11 (gone in 3.13): bcrypt through libxcrypt, no extra package
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    @classmethod
    def generate(cls, username: str = "reprieve") -> Credentials:
        return cls(username, secrets.token_urlsafe(18))

    def basic(self) -> str:
        """The value of an ``Authorization: Basic`` header."""
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


@dataclass(frozen=True)
class RegistryAccess:
    """What a client (real node, helm, podman, pip, twine) needs to reach the registry and the index."""

    registry: str            # 127.0.0.1:<port>: the host part of image references and oci:// chart URLs
    index_url: str           # https://127.0.0.1:<port>/ : pypiserver's root (``simple/`` is under it)
    ca_file: Path            # the cluster's CA certificate, which signed both servers' certificates
    credentials: Credentials

    @property
    def simple_url(self) -> str:
        return self.index_url.rstrip("/") + "/simple/"

    def to_json(self) -> str:
        return json.dumps({"registry": self.registry, "index_url": self.index_url, "ca_file": str(self.ca_file),
                           "username": self.credentials.username, "password": self.credentials.password})

    @classmethod
    def from_json(cls, text: str) -> RegistryAccess:
        d = json.loads(text)
        return cls(d["registry"], d["index_url"], Path(d["ca_file"]), Credentials(d["username"], d["password"]))


def bcrypt_htpasswd(creds: Credentials, salt: str | None = None) -> str:
    """One htpasswd line with a bcrypt hash (what the distribution registry's htpasswd auth accepts)."""
    hashed = crypt.crypt(creds.password, salt or crypt.mksalt(crypt.METHOD_BLOWFISH))
    if not hashed or not hashed.startswith("$2"):
        raise RuntimeError("this libc's crypt() has no bcrypt: the registry's htpasswd needs bcrypt hashes")
    return f"{creds.username}:{hashed}\n"


def registry_config(*, port: int, storage: Path, cert: Path, key: Path, htpasswd: Path) -> dict:
    """The distribution registry's configuration (``docker-registry serve <file>``; YAML, of which JSON is a
    subset): loopback only, TLS, htpasswd basic auth, deletes allowed (a partial release can be cleaned)."""
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True},
                    "cache": {"blobdescriptor": "inmemory"}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "local-only",
                 "tls": {"certificate": str(cert), "key": str(key)},
                 "debug": {"addr": ""}, "headers": {"X-Content-Type-Options": ["nosniff"]}},
        "auth": {"htpasswd": {"realm": "reprieve-local", "path": str(htpasswd)}},
        "health": {"storagedriver": {"enabled": False}},
    }


def containerd_hosts_toml(registry: str, ca_file: Path) -> str:
    """``<config_path>/<registry>/hosts.toml``: pull from ``https://<registry>`` trusting the cluster's CA.

    containerd tries every ``[host]`` section, then the top-level ``server`` as the last fallback (and cannot read the
    file without a ``[host]`` section), so both name the registry and both trust the CA: with the CA on the host only,
    a pull of a tag that does not exist ended on the fallback's "x509: certificate signed by unknown authority"
    instead of the registry's "not found"."""
    return "\n".join([
        f'server = "https://{registry}"',
        f'ca = "{ca_file}"',
        "",
        f'[host."https://{registry}"]',
        '  capabilities = ["pull", "resolve"]',
        f'  ca = "{ca_file}"',
        "",
    ])


def containerd_registry_section(config_dir: Path, registry: str, creds: Credentials) -> list[str]:
    """The CRI plugin's registry section: hosts from ``config_dir`` (hosts.toml), node-wide credentials for
    ``registry`` (what a cloud node's credential helper gives; a pod's imagePullSecrets would take precedence)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return [
        f"[{cri}.registry]",
        f'  config_path = "{config_dir}"',
        f'[{cri}.registry.configs."{registry}".auth]',
        f"  username = {json.dumps(creds.username)}",
        f"  password = {json.dumps(creds.password)}",
    ]
