#!/usr/bin/env python3
"""One version everywhere a release publishes it: both distributions, the chart (version and appVersion), the
example manifest's image tag and the images' version label (the Dockerfiles' ``ARG VERSION`` default). The release workflow runs ``--tag "$GITHUB_REF_NAME"``; ``make verify`` runs it
without a tag (the files must agree with each other).

    python hack/release_version.py [--tag v0.1.0]
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
IMAGE = re.compile(r"image:\s*ghcr\.io/reprieve-dev/reprieve-example:(\S+)")
ARG_VERSION = re.compile(r"^ARG VERSION=(\S+)$", re.MULTILINE)  # the images' org.opencontainers.image.version


def versions(repo: Path = REPO) -> dict[str, str]:
    chart = yaml.safe_load((repo / "charts/reprieve/Chart.yaml").read_text())
    out = {
        "pyproject.toml": tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"],
        "operator/pyproject.toml": tomllib.loads((repo / "operator/pyproject.toml").read_text())["project"]["version"],
        "charts/reprieve/Chart.yaml version": str(chart["version"]),
        "charts/reprieve/Chart.yaml appVersion": str(chart["appVersion"]),
    }
    extra = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["operator"]
    out["pyproject.toml extra operator"] = next(d.split("==", 1)[1] for d in extra if d.startswith("reprieve-operator=="))
    m = IMAGE.search((repo / "examples/trainingjob.yaml").read_text())
    out["examples/trainingjob.yaml image"] = m.group(1) if m else "(no ghcr.io/reprieve-dev/reprieve-example image)"
    for dockerfile in ("operator/Dockerfile", "examples/Dockerfile"):
        m = ARG_VERSION.search((repo / dockerfile).read_text())
        out[f"{dockerfile} ARG VERSION"] = m.group(1) if m else "(no ARG VERSION=...)"
    return out


def disagreements(found: dict[str, str], tag: str | None) -> list[str]:
    want = tag[1:] if tag and tag.startswith("v") else tag
    if tag is not None and not re.fullmatch(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?", want or ""):
        return [f"tag {tag!r} is not v<major>.<minor>.<patch>[-prerelease]"]
    want = want or found["pyproject.toml"]
    return [f"{where}: {v} (expected {want})" for where, v in found.items() if v != want]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tag", help="the release tag, e.g. v0.1.0")
    args = p.parse_args(argv)
    problems = disagreements(versions(), args.tag)
    for line in problems:
        print(f"release_version: {line}", file=sys.stderr)
    if not problems:
        print(versions()["pyproject.toml"])
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
