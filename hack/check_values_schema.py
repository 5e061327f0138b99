"""Check that the chart's values.schema.json and values.yaml describe the same values (make verify).

    python hack/check_values_schema.py   # exit 1 listing every mismatch

Helm validates values against the schema, which catches a value the schema forbids; it does not notice a schema
that has fallen behind the other way: a property no value has any more (the schema then documents and allows a
key the chart ignores), or a value whose type the schema states differently from its default. Both directions,
and every default's type, are checked here. A schema object without ``properties`` is free-form (resources,
affinity, annotations) and is not descended into.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "reprieve"

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,), "null": (type(None),),
    "integer": (int,), "number": (int, float),
}


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    types = schema.get("type")
    if types is None:
        return True
    for name in [types] if isinstance(types, str) else types:
        if isinstance(value, bool) and name in ("integer", "number"):
            continue  # YAML true is not a number
        if isinstance(value, _JSON_TYPES[name]):
            return True
    return False


def problems(values: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Every mismatch between a values tree and its JSON schema, as 'path: what' lines (empty when in step)."""
    where = path or "(top level)"
    out: list[str] = []
    if not _type_ok(values, schema):
        out.append(f"{where}: the schema says type {schema.get('type')}, values.yaml has {values!r}")
        return out
    if not isinstance(values, dict):
        return out
    props: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    if not props:
        if isinstance(extra, dict):  # a map: every entry follows one schema
            for key, value in values.items():
                out += problems(value, extra, f"{path}.{key}" if path else key)
        return out
    for key, value in values.items():
        sub = f"{path}.{key}" if path else key
        if key in props:
            out += problems(value, props[key], sub)
        elif isinstance(extra, dict):
            out += problems(value, extra, sub)
        else:
            out.append(f"{sub}: in values.yaml but not in values.schema.json")
    for key in props:
        if key not in values:
            out.append(f"{path + '.' if path else ''}{key}: in values.schema.json but not in values.yaml")
    return out


def main() -> int:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    found = problems(values, schema)
    for line in found:
        print(f"check_values_schema: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
