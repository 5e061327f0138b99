#!/usr/bin/env python3
"""Generate the PodSpec schema embedded in the TrainingJob CRD from a Kubernetes API server's OpenAPI v3.

    python hack/gen_podspec_schema.py --openapi openapi_v1.json     # a saved /openapi/v3/api/v1 document
    python hack/gen_podspec_schema.py --kubeconfig K                # read it from a running cluster

Writes ``operator/reprieve_operator/podspec_schema.json``: ``io.k8s.api.core.v1.PodSpec`` as a structural
schema (references inlined; Quantity and IntOrString as ``x-kubernetes-int-or-string``; no defaults, so the
API server never adds fields to a user's template; list-map and patch markers dropped; descriptions cut to
their first paragraph). ``crdgen`` puts it under ``spec.template.spec`` so that ``kubectl explain`` documents
the template and ``kubectl apply`` checks its types. ``tests/operator/test_podspec_schema_integration.py``
regenerates it from the local control plane and fails on drift.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "operator" / "reprieve_operator" / "podspec_schema.json"
ROOT = "io.k8s.api.core.v1.PodSpec"
# The same pattern controller-gen writes for resource.Quantity: the schema refuses `cpu: lots` at apply.
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+"
                    r"(\.[0-9]*)?)|(\.[0-9]+))))?$")
DROP = {"default", "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-patch-merge-key",
        "x-kubernetes-patch-strategy", "x-kubernetes-map-type", "x-kubernetes-unions", "x-kubernetes-group-version-kind"}


def _describe(text: str, limit: int = 400) -> str:
    first = text.split("\n\n", 1)[0].strip()
    return first if len(first) <= limit else first[: limit - 3].rstrip() + "..."


def structural(node: Any, schemas: dict[str, Any], stack: tuple[str, ...] = ()) -> Any:
    """One OpenAPI v3 schema node as a Kubernetes structural schema node."""
    if isinstance(node, list):
        return [structural(n, schemas, stack) for n in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if ref is None and len(node.get("allOf") or []) == 1 and "$ref" in node["allOf"][0]:
        ref = node["allOf"][0]["$ref"]
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        if name in stack:
            raise ValueError(f"recursive schema {' -> '.join(stack + (name,))}")
        target = structural(schemas[name], schemas, stack + (name,))
        rest = {k: v for k, v in node.items() if k not in ("$ref", "allOf", *DROP)}
        if "description" in rest:
            rest["description"] = _describe(rest["description"])
        return {**target, **rest}
    if node.get("format") == "int-or-string" or _is_quantity(node):
        out: dict[str, Any] = {"anyOf": [{"type": "integer"}, {"type": "string"}],
                               "x-kubernetes-int-or-string": True}
        if _is_quantity(node):
            out["pattern"] = QUANTITY_PATTERN
        if "description" in node:
            out["description"] = _describe(node["description"])
        return out
    out = {}
    for key, value in node.items():
        if key in DROP:
            continue
        if key == "description":
            out[key] = _describe(value)
        elif key == "properties":
            out[key] = {k: structural(v, schemas, stack) for k, v in sorted(value.items())}
        elif key in ("items", "additionalProperties"):
            out[key] = structural(value, schemas, stack)
        else:
            out[key] = value
    return out


def _is_quantity(node: dict[str, Any]) -> bool:
    options = node.get("oneOf") or []
    return sorted(o.get("type") for o in options) == ["number", "string"]


def pod_spec_schema(openapi: dict[str, Any]) -> dict[str, Any]:
    schemas = openapi["components"]["schemas"]
    spec: dict[str, Any] = structural(schemas[ROOT], schemas, (ROOT,))
    return spec


def read_openapi(args: argparse.Namespace) -> dict[str, Any]:
    if args.openapi:
        return dict(json.loads(Path(args.openapi).read_text()))
    cmd = ["kubectl", "get", "--raw", "/openapi/v3/api/v1"]
    if args.kubeconfig:
        cmd += ["--kubeconfig", args.kubeconfig]
    return dict(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=None, sort_keys=True, separators=(",", ":")) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--openapi", help="a saved /openapi/v3/api/v1 document")
    p.add_argument("--kubeconfig", help="read the document from this cluster (kubectl on PATH)")
    args = p.parse_args(argv)
    OUT.write_text(render(pod_spec_schema(read_openapi(args))))
    print(f"wrote {OUT.relative_to(REPO)} ({OUT.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
