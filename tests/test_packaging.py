"""pyproject.toml lists every Python package under runtime/ and operator/ (else a wheel would miss it). The wheels
themselves are built in tests/test_packaging_integration.py."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[1]


DISTRIBUTIONS = {"pyproject.toml": "reprieve", "operator/pyproject.toml": "reprieve-operator"}


def _packages(pyproject: str) -> tuple[set[str], set[str]]:
    """(listed, found): the packages a pyproject lists and those its package directories hold."""
    cfg = tomllib.loads((REPO / pyproject).read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = cfg.get("package-dir") or {name.split(".")[0]: name.split(".")[0] for name in listed}
    base_dir = (REPO / pyproject).parent
    found = set()
    for name, root in dirs.items():
        for init in (base_dir / root).rglob("__init__.py"):
            rel = init.parent.relative_to(base_dir / root).parts
            found.add(".".join((name, *rel)))
    return listed, found


@pytest.mark.parametrize("pyproject", sorted(DISTRIBUTIONS))
def test_every_package_is_listed_in_its_pyproject(pyproject: str) -> None:
    listed, found = _packages(pyproject)
    assert found == listed, f"{pyproject} [tool.setuptools] packages: missing {sorted(found - listed)}, " \
                            f"stale {sorted(listed - found)}"


def test_the_operator_is_a_distribution_of_its_own() -> None:
    """Only reprieve-operator installs the operator's command and kopf; the runtime's commands are the supervisor,
    reprieve-supervisor (and reprieve-run, its deprecated name for one release), and reprieve (ls, inspect, verify,
    run)."""
    runtime = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    operator = tomllib.loads((REPO / "operator/pyproject.toml").read_text())["project"]
    assert runtime["scripts"] == {"reprieve-supervisor": "reprieve.supervisor:main", "reprieve": "reprieve.cli:main",
                                  "reprieve-run": "reprieve.supervisor:main_deprecated"}
    assert operator["scripts"] == {"reprieve-operator": "reprieve_operator.__main__:main"}
    assert not any("kopf" in d for d in runtime.get("dependencies", []) + runtime["optional-dependencies"]["runtime"])
    assert runtime["optional-dependencies"]["operator"] == [f"reprieve-operator=={operator['version']}"]
    assert all(not p.startswith("reprieve_operator") for p in _packages("pyproject.toml")[0])


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


def test_versions_are_exposed() -> None:
    import reprieve
    import reprieve_operator

    assert reprieve.__version__ and reprieve_operator.__version__
    assert "__version__" in reprieve.__all__
