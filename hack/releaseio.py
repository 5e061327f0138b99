"""The release's adapters: the OCI distribution API (the release record), podman, helm, pip and twine.

Every function here does one I/O step and raises :class:`ReleaseError` with the component's own message and what
to do; the decisions (what is pushed, what must agree) are in :mod:`releaseplan`.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from releaseplan import OCI_MANIFEST, RECORD_CONFIG_MEDIA_TYPE, RECORD_MEDIA_TYPE, RECORD_REPO

MANIFEST_TYPES = (OCI_MANIFEST, "application/vnd.oci.image.index.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json")


class ReleaseError(RuntimeError):
    """A release step failed; the message names the step, quotes the component and says what to do."""


@dataclass(frozen=True)
class Endpoint:
    """A registry or an index with its credentials and the CA that signed its certificate (None: the system's)."""

    url: str  # registry: host[:port]; index: https://.../
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: Path | None = None

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)


def run(step: str, cmd: list[str], *, env: dict[str, str] | None = None, input: str | None = None,
        timeout: float = 1800, hint: str = "", stderr_too: bool = False) -> str:
    """Run ``cmd``; its stdout (and stderr after it with ``stderr_too``). Raises ReleaseError naming ``step`` with the command's own last lines."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, input=input,
                              timeout=timeout, check=False)
    except FileNotFoundError:
        raise ReleaseError(f"{step}: {cmd[0]} not found{f' ({hint})' if hint else ''}") from None
    if proc.returncode != 0:
        said = "\n".join((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-12:])
        raise ReleaseError(f"{step}: `{' '.join(cmd[:3])} ...` failed ({proc.returncode}):\n{said}"
                           + (f"\n{hint}" if hint else ""))
    return proc.stdout + (proc.stderr if stderr_too else "")


def build_wheels(sources: list[Path], out: Path, *, timeout: float = 600) -> None:
    """``pip wheel`` each source tree into ``out``. setuptools builds in the source tree (its build/ and
    *.egg-info), so two builds of one tree at once can break each other: an exclusive lock on that tree's
    build/.wheels.lock serialises them (tests, the release and a user's own build alike)."""
    for src in sources:
        lockdir = src / "build"
        lockdir.mkdir(exist_ok=True)
        with open(lockdir / ".wheels.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            run(f"build the wheel of {src}", [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                                              "--no-build-isolation", "-w", str(out), str(src)], timeout=timeout,
                hint="the build backend (setuptools) must be installed where this runs")


# -- the OCI distribution API ---------------------------------------------------------------------------------------
def http(ep: Endpoint, method: str, url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None,
         auth: str | None = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One request; (status, headers, body). Status 0: nothing answered (refused, timed out, TLS failed)."""
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ep.ssl_context()) as resp:
            return int(resp.status), dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), dict(err.headers.items()), err.read()
    except (urllib.error.URLError, OSError) as err:
        return 0, {}, str(getattr(err, "reason", err)).encode()


class Registry:
    """A tiny OCI distribution client: basic auth, or a bearer token from the registry's token service (GHCR)."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self._auth: str | None = f"Basic {ep.basic()}" if ep.username else None

    def _url(self, path: str) -> str:
        return f"https://{self.ep.url}/v2/{path}"

    def request(self, method: str, path_or_url: str, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        url = path_or_url if "://" in path_or_url else self._url(path_or_url)
        status, headers, body = http(self.ep, method, url, auth=self._auth, **kw)
        challenge = headers.get("WWW-Authenticate", headers.get("Www-Authenticate", ""))
        if status == 401 and challenge.lower().startswith("bearer "):
            params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
            query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
            t_status, _, t_body = http(self.ep, "GET", f"{params.get('realm', '')}?{query}",
                                       auth=f"Basic {self.ep.basic()}" if self.ep.username else None)
            if t_status == 200:
                token = json.loads(t_body).get("token") or json.loads(t_body).get("access_token")
                self._auth = f"Bearer {token}"
                status, headers, body = http(self.ep, method, url, auth=self._auth, **kw)
        return status, headers, body

    def push_blob(self, repo: str, blob: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        if self.request("HEAD", f"{repo}/blobs/{digest}")[0] == 200:
            return digest
        status, headers, body = self.request("POST", f"{repo}/blobs/uploads/", data=b"")
        if status != 202:
            raise ReleaseError(f"release record: starting a blob upload to {self.ep.url}/{repo} answered {status}: "
                               f"{body[:300]!r}")
        location = headers.get("Location", "")
        if location.startswith("/"):
            location = f"https://{self.ep.url}{location}"
        sep = "&" if "?" in location else "?"
        status, _, body = self.request("PUT", f"{location}{sep}digest={digest}", data=blob,
                                       headers={"Content-Type": "application/octet-stream"})
        if status != 201:
            raise ReleaseError(f"release record: blob upload to {self.ep.url}/{repo} answered {status}: {body[:300]!r}")
        return digest

    def push_record(self, namespace: str, version: str, content: dict[str, Any]) -> str:
        """Push the release record as an OCI artifact ``<namespace>/reprieve-release:<version>``; its digest."""
        repo = f"{namespace}/{RECORD_REPO}"
        blob = json.dumps(content, indent=1, sort_keys=True).encode()
        config = b"{}"
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": RECORD_MEDIA_TYPE,
                    "config": {"mediaType": RECORD_CONFIG_MEDIA_TYPE, "digest": self.push_blob(repo, config),
                               "size": len(config)},
                    "layers": [{"mediaType": RECORD_MEDIA_TYPE, "digest": self.push_blob(repo, blob),
                                "size": len(blob), "annotations": {
                                    "org.opencontainers.image.title": f"reprieve-{version}.release.json"}}],
                    "annotations": {"org.opencontainers.image.version": version}}
        body = json.dumps(manifest).encode()
        status, headers, said = self.request("PUT", f"{repo}/manifests/{version}", data=body,
                                             headers={"Content-Type": OCI_MANIFEST})
        if status != 201:
            raise ReleaseError(f"release record: manifest push to {self.ep.url}/{repo}:{version} answered {status}: "
                               f"{said[:300]!r}")
        return headers.get("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())

    def put_manifest(self, repo: str, tag: str, manifest: dict[str, Any]) -> str:
        """Push an OCI manifest (its blobs pushed before) as ``repo:tag``; its digest."""
        body = json.dumps(manifest).encode()
        status, headers, said = self.request("PUT", f"{repo}/manifests/{tag}", data=body,
                                             headers={"Content-Type": manifest["mediaType"]})
        if status != 201:
            raise ReleaseError(f"manifest push to {self.ep.url}/{repo}:{tag} answered {status}: {said[:300]!r}")
        return headers.get("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())

    def manifest_info(self, repo: str, ref: str) -> tuple[str, int]:
        """(media type, size) of the manifest ``repo:ref`` (a tag or a digest)."""
        accept = ", ".join(MANIFEST_TYPES)
        status, headers, body = self.request("GET", f"{repo}/manifests/{ref}", headers={"Accept": accept})
        if status != 200:
            raise ReleaseError(f"manifest {self.ep.url}/{repo}@{ref}: the registry answered {status}")
        return headers.get("Content-Type", OCI_MANIFEST).split(";")[0], len(body)

    def fetch_record(self, namespace: str, version: str) -> dict[str, Any] | None:
        """The release record of ``version``, or None when there is none (an unfinished or unknown release)."""
        repo = f"{namespace}/{RECORD_REPO}"
        status, _, body = self.request("GET", f"{repo}/manifests/{version}", headers={"Accept": OCI_MANIFEST})
        if status == 404:
            return None
        if status != 200:
            raise ReleaseError(f"release record {self.ep.url}/{repo}:{version}: the registry answered {status}: "
                               f"{body[:300]!r}")
        layer = json.loads(body)["layers"][0]
        status, _, blob = self.request("GET", f"{repo}/blobs/{layer['digest']}")
        if status != 200 or "sha256:" + hashlib.sha256(blob).hexdigest() != layer["digest"]:
            raise ReleaseError(f"release record {self.ep.url}/{repo}:{version}: its blob {layer['digest']} is "
                               f"missing or does not match its digest ({status})")
        record: dict[str, Any] = json.loads(blob)
        return record

    def has_record(self, namespace: str, version: str) -> bool:
        status, _, body = self.request("HEAD", f"{namespace}/{RECORD_REPO}/manifests/{version}",
                                       headers={"Accept": OCI_MANIFEST})
        if status not in (200, 404):
            raise ReleaseError(f"registry {self.ep.url}: looking up {namespace}/{RECORD_REPO}:{version} answered "
                               f"{status}: {body[:200]!r}")
        return status == 200

    def catalog(self) -> list[str]:
        status, _, body = self.request("GET", "_catalog")
        return list(json.loads(body).get("repositories") or []) if status == 200 else []


# -- clients' credentials and trust ---------------------------------------------------------------------------------
def write_authfile(path: Path, ep: Endpoint) -> Path:
    """A containers-auth.json / docker config.json (podman --authfile, helm --registry-config), mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"auths": {ep.url: {"auth": ep.basic()}}}, f)
    return path


def cert_dir(path: Path, ep: Endpoint) -> Path | None:
    """A directory with the CA as ``ca.crt`` (podman's --cert-dir); None when the system's CAs are meant."""
    if ep.ca_file is None:
        return None
    path.mkdir(parents=True, exist_ok=True)
    (path / "ca.crt").write_bytes(ep.ca_file.read_bytes())
    return path


def ca_bundle(path: Path, ca_file: Path) -> Path:
    """The system's CAs plus ``ca_file`` in one file: clients that take one bundle (pip, twine, requests) then
    trust both the local index and the public index its dependencies come from."""
    system = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))
    path.write_bytes((system.read_bytes() if system.exists() else b"") + b"\n" + ca_file.read_bytes())
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
