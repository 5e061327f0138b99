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
