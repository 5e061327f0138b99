"""The layout docs/modules.md draws, held against the code's imports (function-level imports and those under
``if TYPE_CHECKING:`` included: a circle of types is a circle a reader follows too): no import circle in the runtime, the operator or the local cluster;
the two halves never import each other; the checkpoint tier never imports the memory tier, and the memory tier takes
only public names of the checkpoint tier (shared array code lives in ``reprieve.arrays``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"reprieve": REPO / "runtime/reprieve", "reprieve_operator": REPO / "operator/reprieve_operator",
            "localcluster": REPO / "hack/localcluster"}


def _modules(package: str) -> dict[str, Path]:
    root = PACKAGES[package]
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((package, *parts))
        out[name.removesuffix(".__init__")] = path
    return out


def imports(module: str, path: Path) -> Iterator[tuple[str, tuple[str, ...], int]]:
    """(imported module, names taken from it, line) for every import, resolved to absolute names."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            yield target, tuple(a.name for a in node.names), node.lineno


def graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from . import x`` names the submodule ``x`` where there is one).
    Importing a module of another subpackage runs that subpackage's ``__init__`` first (whose lazy imports count as
    its own): an edge to it too."""
    mods = _modules(package)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        own = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for target, names, _ in imports(mod, path):
            hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods] or \
                ([target] if target in mods else [])
            for hit in list(hits):
                parent = hit.rpartition(".")[0]
                while parent and parent != own and not own.startswith(parent + ".") and parent in mods:
                    hits.append(parent)
                    parent = parent.rpartition(".")[0]
            edges[mod].update(h for h in hits if h != mod)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    """The check can fail: two modules that import each other, one of them inside a function."""
    edges = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert circles(edges) == [["p.a", "p.b", "p.c"]]
    (tmp_path / "m.py").write_text("def f():\n    from .b import x\n")
    assert [t for t, _, _ in imports("p.m", tmp_path / "m.py")] == ["p.b"]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circles(package: str) -> None:
    assert circles(graph(package)) == []


def test_the_two_halves_never_import_each_other() -> None:
    """docs/contract.md is all that passes between them; the runtime imports no Kubernetes client or kopf."""
    found = []
    for package, forbidden in (("reprieve", ("reprieve_operator", "kopf", "kubernetes")),
                               ("reprieve_operator", ("reprieve",))):
        for mod, path in _modules(package).items():
            for target, _, line in imports(mod, path):
                if target.split(".")[0] in forbidden:
                    found.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert found == []


def test_the_checkpoint_tier_never_imports_the_memory_tier_and_memory_takes_only_public_names() -> None:
    found = []
    for mod, path in _modules("reprieve").items():
        for target, names, line in imports(mod, path):
            where = f"{path.relative_to(REPO)}:{line}"
            if mod.startswith("reprieve.checkpoint") and target.startswith("reprieve.memtier"):
                found.append(f"{where} imports {target}")
            if mod.startswith("reprieve.memtier") and target.startswith("reprieve.checkpoint"):
                private = [n for n in names if n.startswith("_")]
                if private or target.rpartition(".")[2].startswith("_"):
                    found.append(f"{where} takes private {private or target} from {target}")
    assert found == []


LOOP_AND_ENTRY = ("reprieve", "reprieve.job", "reprieve.targets", "reprieve.restore", "reprieve.teardown",
                  "reprieve.measures", "reprieve.bootstrap", "reprieve.cli", "reprieve.keras", "reprieve.orbax_policy")


def test_the_tiers_never_import_the_loop_or_an_entry_point() -> None:
    """Down, never up: the loop asks the tiers through protocols; a tier imports shared and pure modules only."""
    g = graph("reprieve")
    found = sorted(f"{m} imports {x}" for m, deps in g.items() if m.startswith(("reprieve.checkpoint", "reprieve.memtier"))
                   for x in deps if x in LOOP_AND_ENTRY)
    assert found == []
