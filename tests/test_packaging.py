"""pyproject.toml lists every Python package under runtime/ and operator/ (else a wheel would miss it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject() -> None:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for name, root in cfg["package-dir"].items():
        base = REPO / root
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            found.add(".".join((name, *rel)))
    assert found == listed, f"pyproject [tool.setuptools] packages: missing {sorted(found - listed)}, " \
                            f"stale {sorted(listed - found)}"


def test_license_is_the_apache_2_text_pyproject_declares() -> None:
    """LICENSE at the root is the unmodified Apache License 2.0 (copied from an installed package's dist-info,
    the same bytes as https://www.apache.org/licenses/LICENSE-2.0.txt), as pyproject's SPDX id says."""
    import hashlib

    text = (REPO / "LICENSE").read_bytes()
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    assert b"Apache License\n                           Version 2.0, January 2004" in text
    assert b"END OF TERMS AND CONDITIONS" in text
    assert hashlib.sha256(text).hexdigest() == "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30", \
        "LICENSE differs from the canonical Apache-2.0 text"
