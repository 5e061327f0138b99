"""spec.elastic: its defaults, the specs it refuses (naming the field), and that a job without it is unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from op_jobs import make_job
from pydantic import ValidationError
from reprieve_operator import crdgen
from reprieve_operator.models import ELASTIC_NEEDS_INPLACE, TrainingJobSpec, spec_error
from reprieve_operator.policy.builders import build_worker_pod

pytestmark = pytest.mark.unit


def elastic_job(replicas: int = 4, mode: str | None = "InPlace", **elastic: Any) -> dict[str, Any]:
    body = make_job(replicas=replicas, elastic=elastic).with_command("python", "train.py")
    if mode:
        body["spec"]["restartMode"] = mode
    return dict(body)


def test_defaults() -> None:
    spec = TrainingJobSpec.model_validate(elastic_job(minReplicas=2)["spec"])
    assert spec.elastic is not None
    e = spec.elastic
    assert (e.min_replicas, e.unschedulable_seconds, e.grow_back, e.min_resize_interval_seconds,
            e.virtual_shards) == (2, 60, True, 300, None)
    assert spec.elastic.model_dump(by_alias=True) == {"minReplicas": 2, "unschedulableSeconds": 60,
                                                      "growBack": True, "minResizeIntervalSeconds": 300,
                                                      "virtualShards": None}


def test_in_place_by_default_with_a_command() -> None:
    assert TrainingJobSpec.model_validate(elastic_job(mode=None, minReplicas=1)["spec"]).mode == "InPlace"


INVALID = [
    ("minReplicas 0", elastic_job(minReplicas=0), "spec.elastic.minReplicas"),
    ("minReplicas above replicas", elastic_job(minReplicas=5),
     "spec.elastic.minReplicas must be at most spec.replicas (4), got 5"),
    ("no minReplicas", elastic_job(), "spec.elastic.minReplicas"),
    ("Recreate", elastic_job(mode="Recreate", minReplicas=1), ELASTIC_NEEDS_INPLACE),
    ("virtualShards not a multiple of replicas", elastic_job(minReplicas=1, virtualShards=6),
     "spec.elastic.virtualShards must be a multiple of spec.replicas (4), got 6"),
    ("negative unschedulableSeconds", elastic_job(minReplicas=1, unschedulableSeconds=-1),
     "spec.elastic.unschedulableSeconds"),
    ("unknown field", elastic_job(minReplicas=1, maxReplicas=8), "spec.elastic.maxReplicas"),
]


@pytest.mark.parametrize("body,needle", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_elastic_names_the_field(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        TrainingJobSpec.model_validate(body["spec"])
    assert needle in spec_error("llama", "default", info.value)


def test_a_job_without_the_block_is_unchanged() -> None:
    """No default puts the block on a job (the CRD gives it none; the model leaves it None), and its pods are the
    pods of the same job before the block existed: the builders do not read it."""
    body = make_job(replicas=4).with_command("python", "train.py")
    job = body.model()
    assert job.spec.elastic is None and "elastic" not in job.spec.model_dump(by_alias=True, exclude_none=True)
    crd = yaml.safe_load(crdgen.CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "default" not in schema["properties"]["elastic"] and "elastic" not in schema.get("required", [])
    with_block = make_job(replicas=4, elastic={"minReplicas": 2}).with_command("python", "train.py").model()
    assert build_worker_pod(job, 1, 3) == build_worker_pod(with_block, 1, 3)
