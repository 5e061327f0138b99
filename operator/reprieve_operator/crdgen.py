"""Generate what the chart and ``crds/`` derive from the code: the TrainingJob CustomResourceDefinition (from the
pydantic models, the built-in signal names included).

Run ``python -m reprieve_operator.crdgen`` (or ``hack/gen_crd.py``) to rewrite ``crds/`` and the chart's template;
``--check`` (``make verify``) and ``tests/operator/test_crdgen.py`` fail when the checked-in files drift from the
code. The chart's template also defines ``reprieve.builtinSignals``, the names its ``signals.builtin`` value
accepts (``templates/deployment.yaml`` refuses any other), so the names live in the two generated files only.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from . import models

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = REPO_ROOT / "crds" / "reprieve.dev_trainingjobs.yaml"
CHART_CRD_PATH = REPO_ROOT / "charts" / "reprieve" / "templates" / "crd.yaml"

_DROP = {"title", "$defs"}
ROOT_RULES = [
    {
        "rule": "self.metadata.name.size() <= 42 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "message": "metadata.name must be a DNS-1035 label of at most 42 characters "
                   "(worker pods are named <name>-<index> and use it as hostname and subdomain)",
    }
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Turn pydantic's JSON Schema into a Kubernetes structural schema: refs inlined, nulls dropped."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "crd" in node:  # a hand-written schema for an embedded Kubernetes type (the pod template)
        embedded: dict[str, Any] = copy.deepcopy(node["crd"])
        if "description" in node:
            embedded["description"] = node["description"]
        if embedded.get("x-reprieve-embed") == "PodTemplateSpec":
            embedded.pop("x-reprieve-embed")
            embedded["properties"]["spec"] = with_pod_spec(embedded["properties"]["spec"])
        return embedded
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']!r} structurally")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            rest.pop("default")
        return _structural({**options[0], **rest}, defs)
    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key == "additionalProperties":
            # Structural schemas forbid `additionalProperties: false`; the API server prunes unknown
            # fields, and `kubectl apply` (fieldValidation=Strict) rejects them with the field's path.
            if isinstance(value, dict):
                out[key] = _structural(value, defs)
        elif key in ("items",):
            out[key] = _structural(value, defs)
        elif key == "default" and value == [] :
            continue
        else:
            out[key] = value
    if out.get("enum") and "type" not in out:
        out["type"] = "string"
    return out


POD_SPEC_PATH = Path(__file__).with_name("podspec_schema.json")
# Not settable at creation (the API server refuses them in a new pod): left out of the template's schema.
POD_SPEC_OMIT = ("ephemeralContainers",)


def with_pod_spec(ours: dict[str, Any]) -> dict[str, Any]:
    """The template's ``spec``: Kubernetes' PodSpec schema (``hack/gen_podspec_schema.py``) for documentation
    (``kubectl explain``) and type checks at apply, overlaid with our own rules (``models.TEMPLATE_SCHEMA``).

    ``x-kubernetes-preserve-unknown-fields`` stays on the pod spec and its containers, so a field that a newer
    Kubernetes adds is kept; a misspelt one is refused when the operator dry-runs the pods (and by
    ``kubectl apply``'s strict field validation where the schema knows the object)."""
    pod = json.loads(POD_SPEC_PATH.read_text())
    for key in POD_SPEC_OMIT:
        pod["properties"].pop(key, None)
    merged = {**pod, **{k: v for k, v in ours.items() if k != "properties"}}
    props = merged["properties"]
    for key, rule in ours.get("properties", {}).items():
        base = props.get(key, {})
        if key == "containers":
            items = {**base.get("items", {}), **rule.get("items", {}),
                     "properties": {**base.get("items", {}).get("properties", {}),
                                    **rule.get("items", {}).get("properties", {})}}
            props[key] = {**base, **rule, "items": items}
        else:
            props[key] = {**base, **rule}
    return merged


def model_schema(model: type[models._Model]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def build_crd() -> dict[str, Any]:
    spec_schema = model_schema(models.TrainingJobSpec)
    status_schema = model_schema(models.TrainingJobStatus)
    status_schema.pop("required", None)
    root = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": ROOT_RULES,
    }
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
        # desired and current workers: equal but while an elastic job runs shrunk (docs/elastic-operator.md,
        # "Status, condition and Events"); the operator writes them for every job once it runs
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredWorkers"},
        {"name": "Current", "type": "integer", "jsonPath": ".status.currentWorkers"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Goodput", "type": "number", "format": "float", "jsonPath": ".status.goodput.goodput"},
        {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restartCount"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.lastCheckpointStep", "priority": 1},
        {"name": "Mode", "type": "string", "jsonPath": ".status.restartMode", "priority": 1},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{models.PLURAL}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": models.SHORT_NAMES,
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    # scale: `kubectl scale tj` reaches the CRD's rules and is refused ("replicas is
                    # immutable") instead of answering "not found"; HPA-style readers get the pod selector.
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                             "statusReplicasPath": ".status.replicas",
                                                             "labelSelectorPath": ".status.selector"}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = "# Generated by `python -m reprieve_operator.crdgen` from reprieve_operator/models.py. Do not edit.\n"


def render_plain() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def render_chart() -> str:
    """The same CRD as a chart template: behind ``crds.enabled``, kept on uninstall unless ``crds.keep=false``."""
    crd = build_crd()
    body = yaml.safe_dump(crd, sort_keys=False, width=120)
    head, rest = body.split("metadata:\n", 1)
    name_line, rest = rest.split("\n", 1)
    meta = (
        "metadata:\n"
        f"{name_line}\n"
        "  labels:\n"
        "    {{- include \"reprieve.labels\" . | nindent 4 }}\n"
        "  {{- if .Values.crds.keep }}\n"
        "  annotations:\n"
        "    helm.sh/resource-policy: keep\n"
        "  {{- end }}\n"
    )
    return (HEADER + builtin_signals_define() + "{{- if .Values.crds.enabled }}\n" + head + meta + rest
            + "{{- end }}\n")


def builtin_signals_define() -> str:
    """The names the chart's ``signals.builtin`` accepts (the built-in signals), as the named template
    ``reprieve.builtinSignals``: one space-separated line, defined whether or not the chart installs the CRD."""
    return ('{{- define "reprieve.builtinSignals" -}}\n' + " ".join(models.BUILTIN_SIGNAL_NAMES)
            + "\n{{- end }}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in files differ")
    args = parser.parse_args(argv)
    outputs = {CRD_PATH: render_plain(), CHART_CRD_PATH: render_chart()}
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(REPO_ROOT)} is out of date; run python -m reprieve_operator.crdgen", file=sys.stderr)
        return 1 if stale else 0
    for p, text in outputs.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        print(f"wrote {p.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
