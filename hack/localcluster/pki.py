"""Certificates and keys for the local control plane, made with the openssl CLI.

EC P-256 keys: generating them takes milliseconds, so a fresh cluster gets a fresh PKI every time and nothing
secret outlives the cluster's temp dir.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class PKIError(RuntimeError):
    pass


@dataclass(frozen=True)
class PKI:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise PKIError("openssl not found on PATH: install it (Debian: apt-get install openssl)")
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise PKIError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def _eckey(path: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(path), cwd=path.parent)
    path.chmod(0o600)


def make_pki(dir: Path, *, sans: list[str]) -> PKI:
    """CA, apiserver serving cert (``sans``), admin client cert (system:masters), SA signing key pair."""
    dir.mkdir(parents=True, exist_ok=True)
    pki = PKI(dir)
    _eckey(pki.ca_key)
    _openssl("req", "-x509", "-new", "-key", str(pki.ca_key), "-subj", "/CN=reprieve-local-ca", "-days", "7",
             "-out", str(pki.ca_crt), cwd=dir)
    _issue(pki, "apiserver", "/CN=kube-apiserver", server_sans=sans)
    _issue(pki, "admin", "/O=system:masters/CN=reprieve-admin")
    _eckey(pki.key("sa"))
    _openssl("ec", "-in", str(pki.key("sa")), "-pubout", "-out", str(dir / "sa.pub"), cwd=dir)
    return pki


def _issue(pki: PKI, name: str, subject: str, *, server_sans: list[str] | None = None) -> None:
    _eckey(pki.key(name))
    csr = pki.dir / f"{name}.csr"
    _openssl("req", "-new", "-key", str(pki.key(name)), "-subj", subject, "-out", str(csr), cwd=pki.dir)
    ext = pki.dir / f"{name}.ext"
    if server_sans:
        alt = ",".join(f"IP:{s}" if s.replace(".", "").isdigit() else f"DNS:{s}" for s in server_sans)
        ext.write_text(f"keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
                       f"subjectAltName={alt}\n")
    else:
        ext.write_text("keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki.ca_crt), "-CAkey", str(pki.ca_key),
             "-CAcreateserial", "-days", "7", "-extfile", str(ext), "-out", str(pki.crt(name)), cwd=pki.dir)
