"""Worker pod, Service and identity builders compared against the contract (docs/contract.md)."""

from __future__ import annotations

import pytest
from op_jobs import make_job
from reprieve_operator.policy.builders import build_identity, build_service, build_worker_pod

pytestmark = pytest.mark.unit

CONTRACT_ENV = {
    "REPRIEVE_JOB": "llama", "REPRIEVE_NAMESPACE": "ml", "REPRIEVE_NUM_PROCESSES": "4",
    "REPRIEVE_PROCESS_ID": "2", "REPRIEVE_COORDINATOR_ADDRESS": "llama-0.llama.ml.svc:9000",
    "REPRIEVE_CHECKPOINT_URI": "gs://b/ckpt", "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "100",
    "REPRIEVE_CHECKPOINT_KEEP": "3", "REPRIEVE_ATTEMPT": "5", "REPRIEVE_RESTART_EXIT_CODE": "42",
    "REPRIEVE_NOTICE_FILE": "/etc/reprieve/annotations", "REPRIEVE_TERMINATION_GRACE_SECONDS": "45",
    "REPRIEVE_SERVICEACCOUNT_DIR": "/var/run/secrets/kubernetes.io/serviceaccount",
}


def job():  # type: ignore[no-untyped-def]
    body = make_job("llama", "ml", replicas=4, coordinatorPort=9000, terminationGracePeriodSeconds=45)
    body.with_checkpoint("gs://b/ckpt", interval=100, keep=3)
    c = body["spec"]["template"]["spec"]["containers"][0]
    c["env"] = [{"name": "USER_VAR", "value": "1"}, {"name": "REPRIEVE_ATTEMPT", "value": "spoofed"}]
    body["spec"]["template"]["metadata"] = {"labels": {"team": "a"}, "annotations": {"reprieve.dev/notice": "old"}}
    return body.model()


def test_worker_pod_follows_the_contract() -> None:
    pod = build_worker_pod(job(), 2, 5)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "llama-2" and meta["namespace"] == "ml"
    assert meta["labels"] == {"team": "a", "reprieve.dev/job-name": "llama", "reprieve.dev/replica-index": "2",
                              "reprieve.dev/attempt": "5"}
    assert "annotations" not in meta  # a template can never pre-deliver a notice
    (owner,) = meta["ownerReferences"]
    assert owner == {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob", "name": "llama",
                     "uid": "uid-llama", "controller": True, "blockOwnerDeletion": True}
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == ("llama-2", "llama", "Never")
    assert spec["terminationGracePeriodSeconds"] == 45 and spec["serviceAccountName"] == "llama-worker"
    (c,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert {k: env[k] for k in CONTRACT_ENV} == CONTRACT_ENV
    assert env["USER_VAR"] == "1"
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert refs == {"REPRIEVE_POD_NAME": "metadata.name", "REPRIEVE_POD_IP": "status.podIP"}
    assert {"name": "reprieve-podinfo", "mountPath": "/etc/reprieve", "readOnly": True} in c["volumeMounts"]
    assert {"name": "reprieve-podinfo", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}} in spec["volumes"]
    assert "affinity" not in spec


def test_excluded_nodes_become_required_anti_affinity_in_every_term() -> None:
    j = job()
    j.spec.template["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                              {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]}}}
    spec = build_worker_pod(j, 0, 2, exclude_nodes=["n2", "n1", "n2"])["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    for t in terms:
        # One requirement per node: the API server takes exactly one value for a node field selector.
        assert t["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
                                    {"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]
        assert t["matchExpressions"][0]["key"] == "pool"
    assert "affinity" in j.spec.template["spec"]  # the job's template itself is untouched
    assert "matchFields" not in str(j.spec.template)


def test_index_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"TrainingJob ml/llama: index must be in \[0, 4\), got 4"):
        build_worker_pod(job(), 4, 1)


def test_headless_service() -> None:
    svc = build_service(job())
    assert svc["metadata"]["name"] == "llama"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"reprieve.dev/job-name": "llama"}
    assert svc["spec"]["ports"][0]["port"] == 9000


def test_identity_is_limited_to_the_jobs_pods() -> None:
    sa, role, binding = build_identity(job())
    assert sa["metadata"]["name"] == role["metadata"]["name"] == binding["metadata"]["name"] == "llama-worker"
    rule, notice = role["rules"]
    assert rule["resources"] == ["pods"] and rule["verbs"] == ["get", "list", "watch", "patch"]
    assert rule["resourceNames"] == ["llama-0", "llama-1", "llama-2", "llama-3"]
    # the job's notice object, read only, by name: one write per job reaches every pod (docs/notices.md)
    assert notice == {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["llama-notice"],
                      "verbs": ["get", "list", "watch"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-worker", "namespace": "ml"}]


def test_a_user_named_service_account_gets_the_same_role_bound_to_it() -> None:
    """Workload identity (GKE, EKS IRSA) needs the user's own ServiceAccount; the pod watch still needs RBAC."""
    j = job()
    j.spec.template["spec"]["serviceAccountName"] = "mine"
    role, binding = build_identity(j)  # no ServiceAccount: the user owns it
    assert role["kind"] == "Role" and role["metadata"]["name"] == binding["metadata"]["name"] == "llama-worker"
    assert role["rules"][0]["resourceNames"] == ["llama-0", "llama-1", "llama-2", "llama-3"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mine", "namespace": "ml"}]
    assert build_worker_pod(j, 0, 1)["spec"]["serviceAccountName"] == "mine"


def test_created_service_account_carries_the_users_annotations() -> None:
    body = make_job(name="llama", namespace="ml", replicas=1, serviceAccount={
        "annotations": {"iam.gke.io/gcp-service-account": "trainer@p.iam.gserviceaccount.com"},
        "labels": {"team": "ml"}})
    sa = build_identity(body.model())[0]
    assert sa["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": "trainer@p.iam.gserviceaccount.com"}
    assert sa["metadata"]["labels"] == {"team": "ml", "reprieve.dev/job-name": "llama"}


def test_annotations_for_a_service_account_the_user_names_are_refused() -> None:
    from pydantic import ValidationError

    body = make_job(serviceAccount={"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}})
    body["spec"]["template"]["spec"]["serviceAccountName"] = "mine"
    with pytest.raises(ValidationError, match="names your own \\('mine'\\): annotate that one"):
        body.model()


def test_in_place_workers_run_under_reprieve_run_and_replacements_wait_for_their_index() -> None:
    body = make_job("llama", "ml", replicas=4, restartMode="InPlace", spares=1)
    body.with_command("python", "train.py")
    tj = body.model()

    def env(pod: dict) -> dict:
        return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}

    worker = build_worker_pod(tj, 2, 1)
    assert worker["spec"]["containers"][0]["command"][:2] == ["reprieve-supervisor", "--"]
    assert env(worker)["REPRIEVE_PROCESS_ID"] == "2"
    # a replacement (generated name) and a spare: index -1 in the environment, only an assignment lists them
    replacement = build_worker_pod(tj, 2, 3, name="llama-2-")
    assert replacement["metadata"]["labels"]["reprieve.dev/replica-index"] == "2"
    assert env(replacement)["REPRIEVE_PROCESS_ID"] == "-1" and env(replacement)["REPRIEVE_ATTEMPT"] == "3"
    assert env(build_worker_pod(tj, -1, 3, name="llama-spare-", role="spare"))["REPRIEVE_PROCESS_ID"] == "-1"
