"""Generate the chart's README from Chart.yaml, its template and the `# --` comments of values.yaml.

    python hack/gen_chart_readme.py           # rewrite charts/reprieve/README.md
    python hack/gen_chart_readme.py --check   # exit 1 with a diff when it is stale (make verify)

The comment convention is helm-docs': a comment block whose first documenting line starts with ``# --``
documents the key below it (the whole block from that line on is the description), and ``# @default -- text``
in the block replaces the rendered default. A documented key gets one row and its children none unless they
carry their own ``# --``; an undocumented key with children is a section and is descended into; an
undocumented leaf outside any documented key is an error (every value is documented).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "reprieve"
TEMPLATE = CHART / "README.md.tmpl"
README = CHART / "README.md"

_KEY = re.compile(r"^(\s*)([A-Za-z][\w.\-/]*):(.*)$")
_MARKER = re.compile(r"\{\{ (\w+) \}\}")


@dataclass(frozen=True)
class Row:
    """One documented value: its dotted path, type, rendered default and description."""

    key: str
    type: str
    default: str
    description: str


class UndocumentedValue(ValueError):
    """A value in values.yaml has no `# --` comment (neither its own nor a documented parent's)."""


# YAML's types as the README names them; bool before int (a bool is an int in Python).
_TYPE_NAMES: tuple[tuple[type, str], ...] = ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"),
                                             (list, "list"), (dict, "object"), (type(None), "null"))


def _type(value: Any) -> str:
    return next((name for kind, name in _TYPE_NAMES if isinstance(value, kind)), type(value).__name__)


def _lookup(values: dict[str, Any], path: list[str]) -> Any:
    node: Any = values
    for part in path:
        node = node[part]
    return node


def _doc(block: list[str]) -> tuple[str, str | None] | None:
    """(description, @default override) of a comment block (top line first), or None without `# --`."""
    start = next((i for i, line in enumerate(block) if line.lstrip().startswith("# --")), None)
    if start is None:
        return None
    words, default = [], None
    for i, line in enumerate(block[start:]):
        text = line.lstrip()[1:].strip()
        if i == 0:
            text = text[2:].strip()
        if text.startswith("@default --"):
            default = text[len("@default --"):].strip()
        elif text:
            words.append(text)
    return " ".join(words), default


def rows(values_text: str) -> list[Row]:
    """Every documented value of a values.yaml text, in file order."""
    values = yaml.safe_load(values_text) or {}
    lines = values_text.splitlines()
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented) of the enclosing keys
    out: list[Row] = []
    undocumented: list[str] = []
    for i, line in enumerate(lines):
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        block: list[str] = []
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#"):
            block.insert(0, lines[j])
            j -= 1
        doc = _doc(block)
        inherited = any(d for _, _, d in stack)
        path = [k for _, k, _ in stack] + [key]
        if doc is not None:
            value = _lookup(values, path)
            description, default = doc
            shown = default if default is not None else f"`{json.dumps(value, separators=(',', ':'))}`"
            out.append(Row(".".join(path), _type(value), shown, description))
        elif not inherited and rest.strip() and not rest.strip().startswith("#"):
            undocumented.append(".".join(path))
        stack.append((indent, key, doc is not None or inherited))
    if undocumented:
        raise UndocumentedValue(f"values without a '# --' comment: {', '.join(undocumented)}")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def values_table(values_text: str) -> str:
    head = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    body = [f"| {_cell(r.key)} | {r.type} | {_cell(r.default)} | {_cell(r.description)} |"
            for r in rows(values_text)]
    return "\n".join(head + body)


def render(chart_dir: Path = CHART, template: Path = TEMPLATE) -> str:
    """The README text for a chart directory (Chart.yaml, values.yaml) and a template with {{ markers }}."""
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    fields = {
        "name": chart["name"],
        "description": " ".join(str(chart["description"]).split()),
        "version": chart["version"],
        "app_version": chart["appVersion"],
        "kube_version": chart.get("kubeVersion", "any"),
        "home": chart.get("home", ""),
        "values": values_table((chart_dir / "values.yaml").read_text()),
    }

    def fill(m: re.Match[str]) -> str:
        if m.group(1) not in fields:
            raise KeyError(f"{template}: unknown marker {m.group(0)}; known: {sorted(fields)}")
        return str(fields[m.group(1)])

    header = "<!-- Generated by hack/gen_chart_readme.py from README.md.tmpl and values.yaml. Do not edit. -->\n"
    return header + _MARKER.sub(fill, template.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail (exit 1) when the README is stale")
    args = parser.parse_args(argv)
    try:
        text = render()
    except UndocumentedValue as err:
        print(f"gen_chart_readme: {err}", file=sys.stderr)
        return 1
    if args.check:
        current = README.read_text() if README.exists() else ""
        if current != text:
            diff = difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                        str(README.relative_to(REPO)), "generated")
            sys.stderr.writelines(diff)
            print(f"gen_chart_readme: {README.relative_to(REPO)} is stale; run python hack/gen_chart_readme.py",
                  file=sys.stderr)
            return 1
        return 0
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
