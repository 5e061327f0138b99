"""hack/gen_chart_readme.py: the chart README is generated from the `# --` comments of values.yaml and fails
`make verify` when stale."""

from __future__ import annotations

from pathlib import Path

import gen_chart_readme as gen
import pytest
import yaml

pytestmark = pytest.mark.unit

VALUES = """\
# File header: not a value's documentation.

# -- How many.
# Continued on a second line.
count: 2
section:
  # -- A nested flag.
  flag: true
  # -- A documented map: one row, its children none.
  # @default -- see the table above
  table:
    a: {x: 1}
    b: [1, 2]
# -- Names | with a pipe.
names: []
"""


def test_readme_is_fresh() -> None:
    assert gen.README.read_text() == gen.render(), \
        "charts/reprieve/README.md is stale: run python hack/gen_chart_readme.py"


def test_rows_from_comments() -> None:
    assert gen.rows(VALUES) == [
        gen.Row("count", "int", "`2`", "How many. Continued on a second line."),
        gen.Row("section.flag", "bool", "`true`", "A nested flag."),
        gen.Row("section.table", "object", "see the table above", "A documented map: one row, its children none."),
        gen.Row("names", "list", "`[]`", "Names | with a pipe."),
    ]
    assert "| names | list | `[]` | Names \\| with a pipe. |" in gen.values_table(VALUES)


def test_an_undocumented_value_is_an_error() -> None:
    with pytest.raises(gen.UndocumentedValue, match=r"section\.other"):
        gen.rows(VALUES.replace("  # -- A nested flag.\n  flag: true\n", "  # -- A nested flag.\n  flag: true\n"
                                "  other: 1\n"))


def test_every_chart_value_has_a_row() -> None:
    """Every leaf of values.yaml is in the table, as a row or inside a documented row."""
    values = yaml.safe_load((gen.CHART / "values.yaml").read_text())
    documented = {r.key for r in gen.rows((gen.CHART / "values.yaml").read_text())}

    def leaves(node: object, path: str) -> list[str]:
        if isinstance(node, dict) and node and path not in documented:
            return [leaf for k, v in node.items() for leaf in leaves(v, f"{path}.{k}" if path else k)]
        return [path]

    missing = [p for p in leaves(values, "") if not any(p == d or p.startswith(d + ".") for d in documented)]
    assert not missing
    assert {"priorityClass.value", "avoidSpotNodes.nodeLabels", "metrics.serviceMonitor.enabled",
            "podDisruptionBudget.minAvailable", "rbac.aggregateClusterRoles"} <= documented


def test_check_fails_on_a_stale_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(gen.render().replace("| replicaCount | int | `2` |", "| replicaCount | int | `1` |"))
    monkeypatch.setattr(gen, "README", stale)
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "-| replicaCount | int | `1` |" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0  # regenerated: fresh
