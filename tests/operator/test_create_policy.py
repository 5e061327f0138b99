"""classify_refusal: what an API refusal of a worker pod means (final, waiting or transient), field named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.create import (
    INVALID,
    REJECTED,
    TRANSIENT,
    WAITING,
    bad_quantities,
    classify_refusal,
    retry_seconds,
)

pytestmark = pytest.mark.unit


def status(message: str, causes: list[dict[str, str]] | None = None) -> str:
    body: dict[str, Any] = {"kind": "Status", "message": message}
    if causes:
        body["details"] = {"causes": causes}
    return json.dumps(body)


ROWS: list[tuple[str, int | None, Any, str, str, str]] = [
    ("no image", 422, status('Pod "llama-0" is invalid', [{"field": "spec.containers[0].image",
                                                          "message": "Required value"}]),
     INVALID, "InvalidSpec", "spec.template.spec.containers[0].image: Required value"),
    ("bad container name", 422, status("invalid", [{"field": "spec.containers[0].name",
                                                     "message": "Invalid value: \"Trainer_1\""}]),
     INVALID, "InvalidSpec", "spec.template.spec.containers[0].name: Invalid value"),
    ("misspelt field", 400, status('Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
                                   'unknown field "spec.containers[0].imagePullPolicyy"'),
     INVALID, "InvalidSpec", "spec.template.spec.containers[0].imagePullPolicyy: unknown field"),
    ("missing service account", 403, status('pods "llama-0" is forbidden: error looking up service account '
                                            'ml/trainer: serviceaccount "trainer" not found'),
     WAITING, "ServiceAccountNotFound", "spec.template.spec.serviceAccountName: ServiceAccount ml/trainer"),
    ("quota", 403, status('pods "llama-1" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1'),
     TRANSIENT, "QuotaExceeded", "exceeded quota"),
    ("pod security", 403, status('pods "llama-0" is forbidden: violates PodSecurity "restricted:latest": '
                                 'allowPrivilegeEscalation != false'),
     REJECTED, "PodRejected", "violates PodSecurity"),
    ("webhook", 403, status('admission webhook "policy.example.com" denied the request: no GPUs here'),
     REJECTED, "PodRejected", "denied the request"),
    ("operator RBAC", 403, status('pods is forbidden: User "system:serviceaccount:x:y" cannot create resource'),
     TRANSIENT, "Forbidden", "check the operator's RBAC"),
    ("server error", 500, status("etcdserver: request timed out"), TRANSIENT, "ApiError", "HTTP 500"),
    ("throttled", 429, status("too many requests"), TRANSIENT, "ApiError", "HTTP 429"),
    ("no answer", None, "ReadTimeoutError: timed out", TRANSIENT, "ApiError", "no answer from the API server"),
    ("name taken by a stranger", 409, status('pods "llama-0" already exists'), TRANSIENT, "NameConflict",
     "not this job's worker"),
]


@pytest.mark.parametrize("code,body,kind,reason,needle", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_classify_refusal(code: int | None, body: Any, kind: str, reason: str, needle: str) -> None:
    spec = {"containers": [{"name": "trainer", "image": "x"}], "serviceAccountName": "trainer"}
    job = make_job(name="llama", namespace="ml", template={"spec": spec}).model()
    r = classify_refusal(job, code, body, "llama-0")
    assert (r.kind, r.reason) == (kind, reason)
    assert needle in r.message and r.message.startswith("TrainingJob ml/llama: ")
    assert r.final is (kind in (INVALID, REJECTED))


def test_a_bad_quantity_is_named_although_the_api_server_names_none() -> None:
    spec = {"containers": [{"name": "t", "image": "x", "resources": {"requests": {"cpu": "lots", "memory": "1Gi"},
                                                                       "limits": {"cpu": 2}}}]}
    job = make_job(template={"spec": spec}).model()
    expected = "spec.template.spec.containers[0].resources.requests.cpu: 'lots' is not a quantity (e.g. 500m, 2, 4Gi)"
    assert bad_quantities(job) == [expected]
    body = status("Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression "
                  "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    r = classify_refusal(job, 400, body, "llama-0")
    assert r.kind == INVALID and "requests.cpu: 'lots' is not a quantity" in r.message


def test_retry_backoff() -> None:
    assert [retry_seconds(n) for n in (1, 2, 3, 9, 20)] == [2, 4, 8, 300, 300]


def test_the_clients_own_body_validation_is_reported_like_the_api_servers() -> None:
    """kubernetes >= 35 checks a request body itself (pydantic) before anything is sent."""
    from kubernetes import client
    from reprieve_operator.apply import refusal_of

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llama-0", "namespace": "ml"},
           "spec": {"containers": [{"name": "t", "image": "x", "imagee": "y"}], "terminationGracePeriod": 5}}
    with pytest.raises(Exception) as info:
        client.CoreV1Api(client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))).create_namespaced_pod(
            "ml", pod, dry_run="All")
    code, body = refusal_of(info.value)
    r = classify_refusal(make_job(name="llama", namespace="ml").model(), code, body, "llama-0")
    assert (code, r.kind, r.reason) == (422, INVALID, "InvalidSpec")
    assert "spec.template.spec.containers[0].imagee: unknown field (misspelt?)" in r.message
    assert "spec.template.spec.terminationGracePeriod: unknown field (misspelt?)" in r.message
