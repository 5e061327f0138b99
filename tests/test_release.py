"""What a release publishes: one version everywhere, images from pinned bases and hashed locks, a workflow that
passes actionlint and runs hack/release.py (which tests/e2e/test_release_e2e.py runs here end to end)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

import check_locks
import release_version

DOCKERFILES = ["operator/Dockerfile", "examples/Dockerfile"]


@pytest.mark.unit
def test_the_repository_agrees_on_one_version() -> None:
    assert release_version.disagreements(release_version.versions(), None) == []


@pytest.mark.unit
@pytest.mark.parametrize("tag,problem", [
    ("v0.1.0", None), ("0.1.0", None), ("v0.2.0", "expected 0.2.0"), ("release-1", "is not v<major>"),
])
def test_the_tag_must_match(tag: str, problem: str | None) -> None:
    found = {"a": "0.1.0", "b": "0.1.0"}
    got = release_version.disagreements(found, tag)
    assert (not got) if problem is None else any(problem in g for g in got), got


@pytest.mark.unit
def test_lock_check_finds_what_is_wrong() -> None:
    from packaging.requirements import Requirement

    lock = "kopf==1.45.2 \\\n    --hash=sha256:aa\nurllib3==2.8.0\n    # via kubernetes\n"
    reqs = [Requirement("kopf>=1.37"), Requirement("pydantic>=2.6"), Requirement("urllib3<2")]
    got = check_locks.problems(lock, reqs, "x.lock")
    assert any("pydantic is declared" in g for g in got)
    assert any("urllib3==2.8.0 does not satisfy" in g for g in got)
    assert any("urllib3==2.8.0 has no --hash" in g for g in got)
    assert not any("kopf" in g for g in got)
    assert check_locks.main() == 0  # the checked-in locks agree with the pyprojects


@pytest.mark.unit
@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfiles_build_what_a_platform_team_accepts(dockerfile: str) -> None:
    text = (REPO / dockerfile).read_text()
    base = re.search(r"^ARG BASE=(\S+)$", text, re.MULTILINE)
    assert base and re.search(r"@sha256:[0-9a-f]{64}$", base.group(1)), "base not pinned by digest"
    assert "--require-hashes" in text and "--only-binary=:all:" in text  # locked, wheels only: no compiler
    final = text.rsplit("\nFROM ", 1)[1]
    assert "pip uninstall" in text.split("\nFROM ", 2)[1] and "pip install" not in final  # no pip in the image
    assert re.search(r"^USER 65532:65532$", final, re.MULTILINE)
    for label in ("title", "source", "licenses", "version", "revision", "created"):
        assert f"org.opencontainers.image.{label}=" in final


@pytest.mark.integration
def test_the_release_workflow_passes_actionlint_which_can_fail(tmp_path: Path) -> None:
    out = subprocess.run(["bash", str(REPO / "hack/build-tools.sh")], capture_output=True, text=True, check=True)
    actionlint = Path(out.stdout.strip().splitlines()[-1]) / "actionlint"
    workflows = sorted((REPO / ".github/workflows").glob("*.yml"))
    assert workflows
    ok = subprocess.run([str(actionlint), *map(str, workflows)], check=False, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "release.yml"
    shutil.copy(REPO / ".github/workflows/release.yml", broken)
    broken.write_text(broken.read_text().replace("steps.digests.outputs.operator", "steps.digestz.outputs.operator"))
    bad = subprocess.run([str(actionlint), str(broken)], check=False, capture_output=True, text=True)
    assert bad.returncode != 0 and "digestz" in bad.stdout, bad.stdout


@pytest.mark.unit
def test_the_workflow_publishes_with_the_script_the_tests_run() -> None:
    """One copy of the release: the workflow runs hack/release.py publish and pushes nothing by other means."""
    text = (REPO / ".github/workflows/release.yml").read_text()
    assert "python hack/release.py publish --tag \"$GITHUB_REF_NAME\"" in text
    for other in ("helm push", "docker/build-push-action", "gh-action-pypi-publish", "twine upload", "podman push"):
        assert other not in text, other
