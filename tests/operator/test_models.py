"""TrainingJob spec parsing: defaults, aliases and the invalid specs pydantic rejects."""

from __future__ import annotations

import pytest
from op_jobs import make_job
from pydantic import ValidationError
from reprieve_operator.models import TrainingJobSpec, spec_error

pytestmark = pytest.mark.unit


def test_defaults_and_camel_case() -> None:
    job = make_job(replicas=3).model()
    s = job.spec
    assert (s.replicas, s.coordinator_port, s.termination_grace_period_seconds) == (3, 8476, 30)
    assert s.restart_policy.restart_exit_code == 42 and s.restart_policy.max_failures == 3
    assert s.checkpoint.interval_steps == 0 and s.checkpoint.keep == 3
    assert s.preemption.enabled and s.preemption.signals is None
    dumped = s.model_dump(by_alias=True)
    assert "restartPolicy" in dumped and "restartExitCode" in dumped["restartPolicy"]


INVALID = [
    ("no template", lambda b: b["spec"].pop("template"), "template"),
    ("replicas 0", lambda b: b["spec"].update(replicas=0), "replicas"),
    ("replicas 10001", lambda b: b["spec"].update(replicas=10_001), "replicas"),
    ("no containers", lambda b: b["spec"]["template"]["spec"].update(containers=[]), "containers"),
    ("restart code 0", lambda b: b["spec"].update(restartPolicy={"restartExitCode": 0}), "restartExitCode"),
    ("restart code 256", lambda b: b["spec"].update(restartPolicy={"restartExitCode": 256}), "restartExitCode"),
    ("unknown field", lambda b: b["spec"].update(replica=2), "replica"),
    ("bad uri scheme", lambda b: b["spec"].update(checkpoint={"uri": "http://x/y"}), "uri"),
    ("negative maxFailures", lambda b: b["spec"].update(restartPolicy={"maxFailures": -1}), "maxFailures"),
    ("port too low", lambda b: b["spec"].update(coordinatorPort=80), "coordinatorPort"),
    ("unknown signal", lambda b: b["spec"].update(preemption={"signals": ["gce-spot"]}), "signals"),
    ("pod restartPolicy", lambda b: b["spec"]["template"]["spec"].update(restartPolicy="Always"), "restartPolicy"),
]


@pytest.mark.parametrize("mutate,field", [(m, f) for _, m, f in INVALID], ids=[c for c, _, _ in INVALID])
def test_invalid_spec_names_the_field(mutate, field) -> None:  # type: ignore[no-untyped-def]
    body = make_job()
    mutate(body)
    with pytest.raises(ValidationError) as info:
        TrainingJobSpec.model_validate(body["spec"])
    msg = spec_error("llama", "default", info.value)
    assert msg.startswith("TrainingJob default/llama: spec.")
    assert field in msg, msg


PASSES_CRD_BUT_INVALID = [
    ("hostname set", lambda b: b["spec"]["template"]["spec"].update(hostname="x"), "hostname"),
    ("duplicate container", lambda b: b["spec"]["template"]["spec"]["containers"].append(
        {"name": "trainer", "image": "x"}), "unique names"),
    ("unknown noticeSeconds key", lambda b: b["spec"].update(preemption={"noticeSeconds": {"gke-spt": 5}}),
     "gke-spt"),
]


@pytest.mark.parametrize("mutate,needle", [(m, f) for _, m, f in PASSES_CRD_BUT_INVALID],
                         ids=[c for c, _, _ in PASSES_CRD_BUT_INVALID])
def test_semantic_errors_beyond_the_crd(mutate, needle) -> None:  # type: ignore[no-untyped-def]
    body = make_job()
    mutate(body)
    with pytest.raises(ValidationError) as info:
        TrainingJobSpec.model_validate(body["spec"])
    assert needle in spec_error("llama", "default", info.value)


@pytest.mark.parametrize("code", [1, 2, 126, 127, 128, 134, 137, 143, 255])
def test_restart_codes_that_collide_with_crashes_are_refused(code: int) -> None:
    body = make_job().with_spec(restartPolicy={"restartExitCode": code})
    with pytest.raises(ValidationError) as info:
        TrainingJobSpec.model_validate(body["spec"])
    msg = spec_error("llama", "default", info.value)
    assert "restartExitCode must be between 3 and 125" in msg and f"found {code}" in msg


def test_invalid_template_message_names_the_field_not_the_template() -> None:
    body = make_job()
    body["spec"]["template"]["spec"]["hostname"] = "mine"
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x" * 50}
                                                                for i in range(20)]
    with pytest.raises(ValidationError) as info:
        TrainingJobSpec.model_validate(body["spec"])
    msg = spec_error("llama", "default", info.value)
    assert "spec.template: " in msg and "hostname is set by the operator" in msg
    assert "python:3.11" not in msg and "V19" not in msg and len(msg) < 300, msg


def test_a_5000_pod_gang_is_accepted() -> None:
    """The issue's 5,000-node gang (JobSet's KEP-467 scale); the CRD once capped replicas at 4096."""
    assert make_job(replicas=5000).model().spec.replicas == 5000
