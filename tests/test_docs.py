"""The docs stay true to the tree: the module map (``docs/modules.md``) lists exactly the modules that exist, every
relative link in the docs (``docs/**/*.md``, ``README.md``, ``benchmarks/RESULTS.md``) reaches a file and, for an
``#anchor`` into a Markdown file, a heading there; every ``docs/X.md, "Section"`` the code points a reader to is a
heading (or a bold run-in heading) of that file; and the two guides stay short enough to read in one go.

Reading the files is kept apart from the checks (pure: texts in, problems out), which are table-tested on broken
copies so each check is known to fail when it should.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
MODULE_MAP = "docs/modules.md"
PACKAGES = {"operator/reprieve_operator/": ROOT / "operator/reprieve_operator",
            "runtime/reprieve/": ROOT / "runtime/reprieve"}
LIMITS = {"docs/operator.md": 350, "docs/runtime.md": 300}

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
BOLD_HEAD = re.compile(r"\*\*([^*\n]+?)\.?\*\*")
SECTION_REF = re.compile(r"docs/([\w./-]+\.md)`*(?:\s*,\s*|\s*\(\s*|\s*,?\s*section\s+)(?:section\s+)?\\?[\"']([^\"'\\]+)\\?[\"']")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors a Markdown file has: one per heading, outside code fences; repeats get ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def module_rows(markdown: str) -> dict[str, list[str]]:
    """For each ``## ... (`<package>/`)`` section of the map: the module named by each table row's first cell."""
    rows: dict[str, list[str]] = {}
    package = None
    for line in markdown.splitlines():
        if line.startswith("## "):
            m = re.search(r"\(`([\w/]+/)`\)", line)
            package = m.group(1) if m else None
            if package is not None:
                rows[package] = []
        elif package is not None and line.startswith("| `"):
            rows[package].append(line.split("|")[1].strip().strip("`"))
    return rows


def map_problems(listed: Mapping[str, list[str]], existing: Mapping[str, set[str]]) -> list[str]:
    """Every way the module map and the tree disagree; [] if none."""
    out = []
    for package in sorted(existing.keys() - listed.keys()):
        out.append(f"{MODULE_MAP}: no section for {package}")
    for package, modules in sorted(listed.items()):
        if package not in existing:
            out.append(f"{MODULE_MAP}: section {package} names no package of the tree")
            continue
        for name in sorted({m for m in modules if modules.count(m) > 1}):
            out.append(f"{MODULE_MAP}: {package}{name} has more than one line")
        for name in sorted(existing[package] - set(modules)):
            out.append(f"{MODULE_MAP}: {package}{name} exists but has no line")
        for name in sorted(set(modules) - existing[package]):
            out.append(f"{MODULE_MAP}: {package}{name} has a line but does not exist")
    return out


def link_problems(docs: Mapping[str, str], exists: Callable[[str], bool]) -> list[str]:
    """Every relative link in ``docs`` (path -> text) whose file does not exist, or whose anchor names no heading
    of a Markdown file in ``docs``; [] if none. Links in code spans and fences are examples, not links."""
    out = []
    for path, text in sorted(docs.items()):
        prose = CODE_SPAN.sub("", FENCE.sub("", text))
        for target in LINK.findall(prose):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:, ...
            file, _, anchor = target.partition("#")
            resolved = str(PurePosixPath(path).parent / file) if file else path
            resolved = _normalise(resolved)
            if not exists(resolved):
                out.append(f"{path}: link {target!r}: {resolved} does not exist")
            elif anchor and resolved.endswith(".md"):
                if resolved not in docs:
                    continue  # a Markdown file outside the checked set: its anchors are not read here
                if anchor not in anchors(docs[resolved]):
                    out.append(f"{path}: link {target!r}: {resolved} has no heading with anchor #{anchor}")
    return out


def section_ref_problems(sources: Mapping[str, str], docs: Mapping[str, str]) -> list[str]:
    """Every ``docs/X.md, "Section"`` (or ``("Section")``, ``section "Section"``) in ``sources`` whose file is not
    in ``docs`` or has no heading, nor bold run-in heading, that starts with the quoted words; [] if none."""
    out = []
    for path, text in sorted(sources.items()):
        for file, section in SECTION_REF.findall(re.sub(r"\s+", " ", text)):
            doc = docs.get(f"docs/{file}")
            if doc is None:
                out.append(f"{path}: points to docs/{file}, which does not exist")
                continue
            heads = [h.strip("` ") for h in HEADING.findall(doc) + BOLD_HEAD.findall(doc)]
            words = section.strip()
            if not any(h.startswith(words) or h.replace("`", "").startswith(words) for h in heads):
                out.append(f"{path}: points to docs/{file}, {words!r}: no such section")
    return out


def length_problems(docs: Mapping[str, str], limits: Mapping[str, int]) -> list[str]:
    return [f"{path}: {len(docs[path].splitlines())} lines, at most {limit}"
            for path, limit in sorted(limits.items()) if len(docs[path].splitlines()) > limit]


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in PurePosixPath(path).parts:
        if part == "..":
            if parts:
                parts.pop()
            else:
                parts.append(part)
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def _texts(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(paths)}


def _docs() -> dict[str, str]:
    return _texts([*ROOT.glob("docs/**/*.md"), ROOT / "README.md", ROOT / "benchmarks/RESULTS.md"])


def _modules(package: Path) -> set[str]:
    return {str(p.relative_to(package)) for p in package.rglob("*.py") if "__pycache__" not in p.parts}


def _sources() -> dict[str, str]:
    globs = ("runtime/**/*.py", "operator/**/*.py", "hack/**/*.py", "benchmarks/*.py", "tests/**/*.py")
    here = Path(__file__).resolve()
    return _texts(p for g in globs for p in ROOT.glob(g) if p.resolve() != here and "__pycache__" not in p.parts)


def test_the_module_map_lists_every_module_and_nothing_else() -> None:
    listed = module_rows((ROOT / MODULE_MAP).read_text())
    assert map_problems(listed, {name: _modules(path) for name, path in PACKAGES.items()}) == []


def test_every_relative_link_in_the_docs_reaches_a_file_and_its_anchor() -> None:
    assert link_problems(_docs(), lambda rel: (ROOT / rel).exists()) == []


def test_every_section_the_code_points_to_exists() -> None:
    assert section_ref_problems(_sources(), _docs()) == []


def test_the_guides_stay_short_enough_to_read_in_one_go() -> None:
    assert length_problems(_docs(), LIMITS) == []


# --- the checks fail when they should ----------------------------------------------------------------------

MAP = """# Module map

## Operator (`op/`)

| module | what |
|---|---|
| `a.py` | a |
| `policy/b.py` | b |

## Runtime (`rt/`)

| module | what |
|---|---|
| `c.py` | c |
"""
TREE = {"op/": {"a.py", "policy/b.py"}, "rt/": {"c.py"}}


@pytest.mark.parametrize(("tree", "text", "expected"), [
    (TREE, MAP, []),
    ({**TREE, "op/": {"a.py", "policy/b.py", "new.py"}}, MAP, ["op/new.py exists but has no line"]),
    ({**TREE, "op/": {"a.py"}}, MAP, ["op/policy/b.py has a line but does not exist"]),
    (TREE, MAP + "| `c.py` | again |\n", ["rt/c.py has more than one line"]),
    ({**TREE, "ext/": {"d.py"}}, MAP, ["no section for ext/"]),
    ({"op/": TREE["op/"]}, MAP, ["section rt/ names no package"]),
])
def test_map_problems_names_each_disagreement(tree: dict[str, set[str]], text: str, expected: list[str]) -> None:
    problems = map_problems(module_rows(text), tree)
    assert len(problems) == len(expected), problems
    for problem, words in zip(problems, expected, strict=True):
        assert words in problem, problems


DOCS = {
    "README.md": "See [the guide](docs/guide.md) and [numbers](benchmarks/RESULTS.md#goodput-benchmarksgoodputpy).\n",
    "docs/guide.md": ("# Guide\n\n## Two words (`x.py`)\n\nUp: [readme](../README.md), [self](#two-words-xpy), "
                      "[web](https://example.com), `[not a link](nowhere.md)`.\n"),
    "benchmarks/RESULTS.md": "# Results\n\n## Goodput (`benchmarks/goodput.py`)\n",
}


def _exists_in(docs: Mapping[str, str]) -> Callable[[str], bool]:
    return lambda rel: rel in docs


@pytest.mark.parametrize(("change", "expected"), [
    ({}, []),
    ({"README.md": "[gone](docs/gone.md)\n"}, ["docs/gone.md does not exist"]),
    ({"README.md": "[bad anchor](docs/guide.md#three-words)\n"}, ["no heading with anchor #three-words"]),
    ({"docs/guide.md": "# Guide\n\n[self](#missing)\n"}, ["docs/guide.md has no heading with anchor #missing"]),
    ({"docs/guide.md": "# Guide\n\n[up too far](../../x.md)\n"}, ["../x.md does not exist"]),
])
def test_link_problems_names_each_broken_link(change: dict[str, str], expected: list[str]) -> None:
    docs = {**DOCS, **change}
    problems = link_problems(docs, _exists_in(docs))
    assert len(problems) == len(expected), problems
    for problem, words in zip(problems, expected, strict=True):
        assert words in problem, problems


@pytest.mark.parametrize(("source", "expected"), [
    ('"""See docs/guide.md, "Two words"."""', []),
    ("raise X('(docs/guide.md, \\'Two words\\')')", []),
    ('msg = "see docs/guide.md (\\"Two\n        words\\")"', []),
    ('"""See ``docs/guide.md``, "Bold head"."""', []),
    ('"""See docs/guide.md, section "Two words"."""', []),
    ('"""See docs/guide.md, "Three words"."""', ["'Three words': no such section"]),
    ('"""See docs/gone.md, "Two words"."""', ["docs/gone.md, which does not exist"]),
    ('assert "docs/guide.md" in text', []),
    ('"""docs/guide.md\'s first paragraph is "quoted" later."""', []),
])
def test_section_ref_problems_names_each_dangling_pointer(source: str, expected: list[str]) -> None:
    docs = {"docs/guide.md": "# Guide\n\n## Two words (`x.py`)\n\n**Bold head.** text\n"}
    problems = section_ref_problems({"x.py": source}, docs)
    assert len(problems) == len(expected), problems
    for problem, words in zip(problems, expected, strict=True):
        assert words in problem, problems


def test_length_problems_names_a_guide_over_its_limit() -> None:
    docs = {"docs/a.md": "x\n" * 3, "docs/b.md": "x\n" * 4}
    assert length_problems(docs, {"docs/a.md": 3, "docs/b.md": 3}) == ["docs/b.md: 4 lines, at most 3"]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Goodput and restart gaps (`benchmarks/goodput.py`)", "goodput-and-restart-gaps-benchmarksgoodputpy"),
    ("Orbax's format (`reprieve.orbax.OrbaxCheckpointer`)", "orbaxs-format-reprieveorbaxorbaxcheckpointer"),
    ("Operator ↔ runtime contract", "operator--runtime-contract"),
    ("Test suite (make test)", "test-suite-make-test"),
])
def test_slug_is_githubs_anchor(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
