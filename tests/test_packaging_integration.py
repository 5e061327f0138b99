"""The wheels, built for real with pip (tests/test_packaging.py checks the pyprojects without building)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[1]


def test_wheels_hold_what_they_promise(tmp_path: Path) -> None:
    """Built for real: the runtime wheel has its version and py.typed and no operator or console script; the
    operator wheel has the command, py.typed and the PodSpec schema crdgen embeds."""
    import subprocess
    import sys
    import zipfile

    for project in (".", "operator"):
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path), str(REPO / project)], check=True, capture_output=True)
    runtime = zipfile.ZipFile(next(tmp_path.glob("reprieve-*.whl")))
    operator = zipfile.ZipFile(next(tmp_path.glob("reprieve_operator-*.whl")))
    rnames, onames = runtime.namelist(), operator.namelist()
    assert "reprieve/py.typed" in rnames and "reprieve/checkpoint/manager.py" in rnames
    assert not any(n.startswith("reprieve_operator/") for n in rnames)
    rentry = runtime.read(next(n for n in rnames if n.endswith("entry_points.txt"))).decode()
    assert "reprieve-run = reprieve.supervisor:main" in rentry and "reprieve-operator" not in rentry
    assert {"reprieve_operator/py.typed", "reprieve_operator/podspec_schema.json",
            "reprieve_operator/policy/restart.py"} <= set(onames)
    entry = operator.read(next(n for n in onames if n.endswith("entry_points.txt"))).decode()
    assert "reprieve-operator = reprieve_operator.__main__:main" in entry
    assert not any(n.startswith("reprieve/") for n in onames)
