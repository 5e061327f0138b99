#!/usr/bin/env python3
"""The image lock files agree with the pyprojects: every declared dependency is pinned (``==``) with hashes, at a
version its specifier allows. ``make verify`` runs it; ``make lock`` regenerates the files.

    python hack/check_locks.py
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
# lock file -> (pyproject, extras whose dependencies it must pin; None: the project's own dependencies)
LOCKS = {
    "requirements/operator.lock": ("operator/pyproject.toml", None),
    "requirements/example.lock": ("pyproject.toml", ("runtime", "example")),
}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def pins(text: str) -> dict[str, tuple[Version, int]]:
    """Package -> (pinned version, number of hashes) of a ``--generate-hashes`` requirements file."""
    out: dict[str, tuple[Version, int]] = {}
    current = None
    for line in text.splitlines():
        m = PIN.match(line)
        if m:
            current = canonicalize_name(m.group(1))
            out[current] = (Version(m.group(2)), 0)
        elif current and "--hash=sha256:" in line:
            version, n = out[current]
            out[current] = (version, n + 1)
        elif line and not line.startswith((" ", "#")):
            current = None
    return out


def declared(pyproject: dict, extras: tuple[str, ...] | None) -> list[Requirement]:
    project = pyproject["project"]
    raw = project.get("dependencies", []) if extras is None else \
        [d for e in extras for d in project["optional-dependencies"][e]]
    return [Requirement(d) for d in raw]


def problems(lock_text: str, requirements: list[Requirement], lock_name: str) -> list[str]:
    found = pins(lock_text)
    out = []
    for req in requirements:
        name = canonicalize_name(req.name)
        if name not in found:
            out.append(f"{lock_name}: {req.name} is declared ({req}) but not pinned; run make lock")
            continue
        version, hashes = found[name]
        if version not in req.specifier:
            out.append(f"{lock_name}: {req.name}=={version} does not satisfy {req}; run make lock")
        if not hashes:
            out.append(f"{lock_name}: {req.name}=={version} has no --hash (pip --require-hashes refuses it)")
    unhashed = sorted(n for n, (_, h) in found.items() if not h)
    out += [f"{lock_name}: {n} has no --hash" for n in unhashed if n not in {canonicalize_name(r.name)
                                                                           for r in requirements}]
    return out


def main() -> int:
    errors = []
    for lock, (pyproject, extras) in LOCKS.items():
        path = REPO / lock
        if not path.exists():
            errors.append(f"{lock} is missing; run make lock")
            continue
        errors += problems(path.read_text(), declared(tomllib.loads((REPO / pyproject).read_text()), extras), lock)
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
