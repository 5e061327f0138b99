"""classify_refusal: what an API refusal of a worker pod means (final, waiting or transient), field named; and
the outcome it leads to (``refused``, ``decide.failed``, ``NotCreated.instead``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.create import (
    INVALID,
    REJECTED,
    TRANSIENT,
    WAITING,
    NotCreated,
    Refusal,
    bad_quantities,
    classify_refusal,
    refused,
    retry_seconds,
    watched_since,
)
from reprieve_operator.policy.decide import Counter, Outcome, failed
from reprieve_operator.policy.restart import RestartPlan

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


# --- what a refusal leads to: an Outcome like every other decision (apply_outcome writes it) ---
NOW = datetime(2026, 11, 25, 8, 0, 0, tzinfo=UTC)
CREATING = RestartPlan(phase="Pending", attempt=1, create=(0, 1), new_attempt=True)


def test_a_transient_refusal_sets_the_condition_warns_and_tries_again_later() -> None:
    job = make_job(namespace="ml").model()
    refusal = classify_refusal(job, 403, status("exceeded quota: compute"), "llama-0")
    out = refused(job, CREATING, refusal, 3, 8.0, NOW)
    assert out.record is None and out.first_event is None and not out.create
    (cond,) = out.status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodsCreated", "False", "QuotaExceeded")
    assert cond["message"].endswith("; try 3, next in 8 s") and out.status["phase"] == "Pending"
    assert [(e.reason, e.type) for e in out.status_events] == [("FailedCreate", "Warning")]
    assert out.counter == Counter("error", "create")
    assert out.requeue_after == 8.0 and out.plan.requeue_after == 8.0 and out.plan.create == ()


def test_a_transient_refusal_of_a_running_job_keeps_its_phase() -> None:
    job = make_job(namespace="ml").with_status(phase="Running", attempt=1).model()
    out = refused(job, CREATING, Refusal(TRANSIENT, "ApiError", "no answer"), 1, 2.0, NOW)
    assert "phase" not in out.status


def test_a_final_refusal_fails_the_job_event_first() -> None:
    job = make_job(namespace="ml").with_status(phase="Pending", conditions=[
        {"type": "PodsCreated", "status": "False", "reason": "QuotaExceeded", "message": "m",
         "lastTransitionTime": "2026-11-25T07:00:00Z"}]).model()
    refusal = classify_refusal(job, 403, status("admission webhook denied the request"), "llama-0")
    out = refused(job, CREATING, refusal, 0, 0.0, NOW)
    assert out.first_event is not None and (out.first_event.reason, out.first_event.type) == ("PodRejected",
                                                                                               "Warning")
    assert out.record is not None and out.record["phase"] == "Failed"
    assert [c["type"] for c in out.record["conditions"]] == ["Failed"]  # PodsCreated dropped
    assert out.record["completionTime"] == "2026-11-25T08:00:00Z" and out.counter == Counter("failed", "PodRejected")
    assert out.job is job and (out.plan.phase, out.plan.create) == ("Failed", ()) and out.requeue_after is None


def test_a_job_failed_already_is_not_failed_again() -> None:
    out = failed({"phase": "Failed", "attempt": 2}, "InvalidSpec", "bad", NOW)
    assert (out.first_event, out.record, out.counter) == (None, None, None) and out.plan.phase == "Failed"


def test_a_job_whose_spec_does_not_parse_fails_on_its_raw_status() -> None:
    out = failed({"phase": "Running", "attempt": 2, "conditions": [{"type": "Ready", "status": "True"}]},
                 "InvalidSpec", "TrainingJob ml/llama: spec.replicas must be >= 1, got 0", NOW)
    assert out.job is None and out.plan.attempt == 2 and out.record is not None
    assert [c["type"] for c in out.record["conditions"]] == ["Ready", "Failed"]


def _pod(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ml"}}


def _kinds(objects: Any) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objects]


def test_a_final_refusal_deletes_what_its_try_made_after_failing_the_job() -> None:
    """A running job's new pods: the pods this try made are deleted (step 4, after the Failed record), and only
    the objects this try made are removed; the running attempt's own are stopped by the Failed phase."""
    job = make_job(namespace="ml").with_status(phase="Running", attempt=2).model()
    svc = {"kind": "Service", "metadata": {"name": "llama", "namespace": "ml"}}
    refusal = Refusal(REJECTED, "PodRejected", "admission refuses its worker pods")
    out = NotCreated(0.0, refusal, 0, (svc, _pod("llama-0"), _pod("llama-1"))).instead(Outcome(job, CREATING), NOW)
    assert out.record is not None and out.record["phase"] == "Failed" and out.first_event is not None
    assert out.delete == ("llama-0", "llama-1") and _kinds(out.remove) == [("Service", "llama")]
    assert not out.create and out.requeue_after is None


def test_a_final_refusal_of_a_job_that_never_started_removes_its_service_and_identity_in_reverse() -> None:
    job = make_job(name="llama", namespace="ml").model()
    out = NotCreated(0.0, Refusal(INVALID, "InvalidSpec", "bad"), 0, ()).instead(Outcome(job, CREATING), NOW)
    assert out.delete == () and _kinds(out.remove) == [("RoleBinding", "llama-worker"), ("Role", "llama-worker"),
                                                       ("ServiceAccount", "llama-worker"), ("Service", "llama")]


def test_a_transient_refusal_deletes_nothing_and_tries_again() -> None:
    job = make_job(namespace="ml").model()
    out = NotCreated(8.0, Refusal(TRANSIENT, "QuotaExceeded", "quota"), 3, (_pod("llama-0"),)).instead(
        Outcome(job, CREATING), NOW)
    assert out == refused(job, CREATING, Refusal(TRANSIENT, "QuotaExceeded", "quota"), 3, 8.0, NOW)
    assert out.delete == () and out.remove == () and out.requeue_after == 8.0


def test_a_backoff_still_running_only_looks_again_when_it_ends() -> None:
    job = make_job(namespace="ml").model()
    out = NotCreated(5.0).instead(Outcome(job, CREATING, status={"phase": "Pending"}), NOW)
    assert out == Outcome(job, RestartPlan(phase="Pending", attempt=1, create=(), new_attempt=True,
                                           requeue_after=5.0))


def pod(uid: str | None, *, verdict: bool = False) -> dict[str, Any]:
    status = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]} if verdict \
        else {"phase": "Pending"}
    return {"metadata": {"name": "llama-1-x7k2p", "uid": uid}, "status": status}


@pytest.mark.parametrize(("created", "cached", "kept"), [
    # the watch delivered the scheduler's verdict before the create call returned: the answer must not replace it
    (pod("u1"), pod("u1", verdict=True), True),
    (pod("u1"), pod("u1"), True),  # the watch's ADDED: the same pod, no older
    (pod("u1"), None, False),  # nothing watched yet: the answer goes in the cache
    (pod("u2"), pod("u1", verdict=True), False),  # an older pod of the same name (deleted, event on its way)
    (pod(None), pod(None), False),  # no uid to tell them apart: the answer
])
def test_a_create_answer_does_not_replace_what_the_watch_delivered_of_that_pod(
        created: dict[str, Any], cached: dict[str, Any] | None, kept: bool) -> None:
    assert watched_since(created, cached) is kept
