"""Nothing in ``reprieve_operator/policy/`` does I/O: the pure core imports no API client, no framework, no
threads or sockets, none of the operator's shell modules (not even through another module), and never reads the
clock (``now`` is an argument). ``impurities`` (pure: sources in, problems out) is table-tested on broken sources
so the check is known to fail when it should.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "reprieve_operator"
# Outside policy/, what the core may lean on: the package's constants and the TrainingJob models.
PURE_SHELL = {"reprieve_operator", "reprieve_operator.models"}
# Top-level modules that do I/O, run things concurrently or read the environment.
IO = {"kubernetes", "kopf", "prometheus_client", "asyncio", "threading", "concurrent", "socket", "subprocess",
      "http", "urllib", "requests", "os", "time", "ctypes", "pathlib", "shutil", "tempfile", "io", "signal",
      "multiprocessing", "sys", "tracemalloc", "yaml"}
CLOCK_READS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(module: str, tree: ast.AST, is_package: bool) -> set[str]:
    """Every module ``module`` imports (absolute names; ``from . import x`` counts as both ``.`` and ``.x``)."""
    out: set[str] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = ".".join(base[:len(base) - node.level + 1])
                target = f"{root}.{node.module}" if node.module else root
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
    return out


def _clock_reads(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in CLOCK_READS and isinstance(n.func.value, ast.Name)
            and n.func.value.id in ("datetime", "date", "time")]


def impurities(srcs: Mapping[str, str], packages: set[str] | None = None) -> list[str]:
    """What makes the policy package impure: an I/O import or a clock read anywhere in what it imports, or a
    shell module among them; [] when it is pure."""
    packages = packages if packages is not None else {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    trees = {m: ast.parse(s) for m, s in srcs.items()}
    out: list[str] = []
    todo = [m for m in srcs if m == "reprieve_operator.policy" or m.startswith("reprieve_operator.policy.")]
    seen: dict[str, str] = {m: m for m in todo}  # module -> the policy module whose imports reach it
    while todo:
        module = todo.pop()
        tree = trees[module]
        for line in _clock_reads(tree):
            out.append(f"{module}:{line} reads the clock (pass `now` in)")
        for name in sorted(_imports(module, tree, module in packages)):
            top = name.split(".")[0]
            if top in IO:
                out.append(f"{module} imports {name} (I/O), reached from {seen[module]}")
            if top != "reprieve_operator" or name not in trees or name in seen:
                continue
            if not (name.startswith("reprieve_operator.policy") or name in PURE_SHELL):
                out.append(f"{module} imports the shell module {name}, reached from {seen[module]}")
                continue
            seen[name] = seen[module]
            todo.append(name)
    return sorted(set(out))


def test_the_policy_package_is_pure() -> None:
    assert impurities(sources()) == []


def test_the_policy_package_is_the_whole_core() -> None:
    """decide, events, the pod/node views and the status patch live in policy/, not beside the shell."""
    names = set(sources())
    for part in ("decide", "events", "views", "status", "signals", "builders", "kueue"):
        assert f"reprieve_operator.policy.{part}" in names
    for gone in ("decide", "events", "observe", "signals", "builders"):
        assert f"reprieve_operator.{gone}" not in names


BROKEN = [
    ("a client import", "reprieve_operator.policy.restart", "import kubernetes\n",
     "reprieve_operator.policy.restart imports kubernetes (I/O)"),
    ("a shell module", "reprieve_operator.policy.notice", "from .. import apply\n",
     "reprieve_operator.policy.notice imports the shell module reprieve_operator.apply"),
    ("the clock", "reprieve_operator.policy.events", "from datetime import datetime\nX = datetime.now()\n",
     "reprieve_operator.policy.events:2 reads the clock"),
    ("I/O behind a pure module", "reprieve_operator.models", "import socket\n",
     "reprieve_operator.models imports socket (I/O), reached from reprieve_operator.policy"),
    ("the builders", "reprieve_operator.policy.builders", "import kubernetes\n",
     "reprieve_operator.policy.builders imports kubernetes (I/O)"),
]


@pytest.mark.parametrize("module,prefix,problem", [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_each_kind_of_impurity_is_reported(module: str, prefix: str, problem: str) -> None:
    broken = sources()
    broken[module] = prefix + broken[module]
    assert any(p.startswith(problem) for p in impurities(broken)), impurities(broken)
