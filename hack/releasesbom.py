"""An SBOM for each released image, made from what the image holds, pushed beside it.

buildah 1.28 (Debian 12's) has no ``--sbom``, so the release reads the image's own inventory instead: the Debian
packages in ``/var/lib/dpkg/status`` and the Python distributions in the venv's ``*.dist-info`` directories
(``podman image mount``, read-only), and writes an SPDX 2.3 JSON document (:func:`spdx`, pure). It is pushed as an
OCI artifact tagged ``sha256-<image digest hex>.sbom`` in the image's repository (the tag cosign uses, so tools
that look there find it) with ``subject`` naming the image (OCI 1.1 referrers; registries without that API keep
the tag). What it cannot say: files not installed by dpkg or pip (none in these images), and provenance (how the
image was built) — on CI GitHub's attestation covers that; here it is a gap.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SPDX_MEDIA_TYPE = "application/spdx+json"


def dpkg_packages(status: str) -> list[tuple[str, str]]:
    """(name, version) of each installed package in a dpkg status file."""
    out = []
    for stanza in status.split("\n\n"):
        fields = dict(re.findall(r"^(Package|Version|Status): (.*)$", stanza, re.MULTILINE))
        if "Package" in fields and "installed" in fields.get("Status", "installed").split():
            out.append((fields["Package"], fields.get("Version", "")))
    return sorted(out)


def python_packages(dist_infos: list[str]) -> list[tuple[str, str]]:
    """(name, version) from ``<name>-<version>.dist-info`` directory names."""
    out = []
    for d in dist_infos:
        m = re.fullmatch(r"(.+?)-([^-]+)\.dist-info", d)
        if m:
            out.append((m.group(1).replace("_", "-").lower(), m.group(2)))
    return sorted(out)


def spdx(image: str, digest: str, *, debs: list[tuple[str, str]], pythons: list[tuple[str, str]],
         created: str) -> dict[str, Any]:
    """An SPDX 2.3 document for ``image@digest`` listing its Debian and Python packages (with purls)."""
    def pkg(kind: str, name: str, version: str) -> dict[str, Any]:
        purl = f"pkg:deb/debian/{name}@{version}" if kind == "deb" else f"pkg:pypi/{name}@{version}"
        return {"SPDXID": f"SPDXRef-{kind}-{re.sub(r'[^A-Za-z0-9.-]', '-', name)}", "name": name,
                "versionInfo": version, "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
                "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                  "referenceLocator": purl}]}

    packages = [pkg("deb", n, v) for n, v in debs] + [pkg("pypi", n, v) for n, v in pythons]
    root = {"SPDXID": "SPDXRef-image", "name": image, "versionInfo": digest, "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False, "primaryPackagePurpose": "CONTAINER"}
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image}@{digest}", "documentNamespace": f"https://reprieve.dev/spdx/{image}/{digest}",
        "creationInfo": {"created": created, "creators": ["Tool: reprieve hack/releasesbom.py"]},
        "packages": [root, *packages],
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": "SPDXRef-image"}]
        + [{"spdxElementId": "SPDXRef-image", "relationshipType": "CONTAINS", "relatedSpdxElement": p["SPDXID"]}
           for p in packages],
    }


def inventory(root: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(Debian packages, Python distributions) of an image's root filesystem mounted at ``root``."""
    status = root / "var" / "lib" / "dpkg" / "status"
    debs = dpkg_packages(status.read_text(errors="replace")) if status.exists() else []
    dist = [p.name for p in root.glob("opt/venv/lib/python3*/site-packages/*.dist-info")]
    return debs, python_packages(dist)


def sbom_manifest(subject_digest: str, subject_size: int, config_digest: str, blob_digest: str,
                  blob_size: int) -> dict[str, Any]:
    return {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": SPDX_MEDIA_TYPE,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config_digest, "size": 2},
            "layers": [{"mediaType": SPDX_MEDIA_TYPE, "digest": blob_digest, "size": blob_size}],
            "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": subject_digest,
                        "size": subject_size}}


def dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()
