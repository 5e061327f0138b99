"""hack/check_values_schema.py: values.schema.json and values.yaml describe the same values (make verify)."""

from __future__ import annotations

import json
from typing import Any

import check_values_schema as check
import pytest
import yaml

pytestmark = pytest.mark.unit

SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "replicas": {"type": "integer"},
    "flag": {"type": "boolean"},
    "labels": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    "resources": {"type": "object"},
    "nested": {"type": "object", "additionalProperties": False, "properties": {"port": {"type": "integer"}}},
}}
VALUES: dict[str, Any] = {"replicas": 2, "flag": True, "labels": {"a": ["x"]}, "resources": {"any": {"thing": 1}},
                          "nested": {"port": 80}}


def test_the_chart_is_in_step() -> None:
    values = yaml.safe_load((check.CHART / "values.yaml").read_text())
    schema = json.loads((check.CHART / "values.schema.json").read_text())
    assert check.problems(values, schema) == []


@pytest.mark.parametrize("change,expected", [
    ({}, []),
    ({"extra": 1}, ["extra: in values.yaml but not in values.schema.json"]),
    ({"nested": {"port": 80, "host": "h"}}, ["nested.host: in values.yaml but not in values.schema.json"]),
    ({"nested": {}}, ["nested.port: in values.schema.json but not in values.yaml"]),
    ({"replicas": "2"}, ["replicas: the schema says type integer, values.yaml has '2'"]),
    ({"replicas": True}, ["replicas: the schema says type integer, values.yaml has True"]),
    ({"labels": {"a": "x"}}, ["labels.a: the schema says type array, values.yaml has 'x'"]),
])
def test_mismatches_are_named(change: dict[str, Any], expected: list[str]) -> None:
    assert check.problems({**VALUES, **change}, SCHEMA) == expected


def test_a_schema_property_nobody_sets_is_stale() -> None:
    values = {k: v for k, v in VALUES.items() if k != "flag"}
    assert check.problems(values, SCHEMA) == ["flag: in values.schema.json but not in values.yaml"]
