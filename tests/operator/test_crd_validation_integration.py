"""Invalid TrainingJobs are rejected by the API server at `kubectl apply`, naming the field (CRD schema + CEL)."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import job_manifest

pytestmark = pytest.mark.integration

Mutation = Callable[[dict[str, Any]], None]


def spec(**fields: Any) -> Mutation:
    return lambda m: m["spec"].update(fields)


def pod(**fields: Any) -> Mutation:
    return lambda m: m["spec"]["template"]["spec"].update(fields)


def drop(key: str) -> Mutation:
    return lambda m: m["spec"].pop(key)


def memory(mode: str = "InPlace", **fields: Any) -> Mutation:
    """A memory tier (``spec.checkpoint.memory``) in ``mode`` (the stand-in worker sets its command)."""
    return lambda m: m["spec"].update(restartMode=mode, checkpoint={"uri": "/c", "memory": fields})


def elastic(mode: str = "InPlace", **fields: Any) -> Mutation:
    """An elastic block (``spec.elastic``) on the 2-worker job in ``mode`` (the stand-in worker sets its command)."""
    return lambda m: m["spec"].update(restartMode=mode, elastic=fields)


def entrypoint_spares(m: dict[str, Any]) -> None:
    m["spec"].pop("restartMode")
    m["spec"]["spares"] = 1
    m["spec"]["template"]["spec"]["containers"][0].pop("command")


def no_command_in_place(m: dict[str, Any]) -> None:
    m["spec"]["restartMode"] = "InPlace"
    m["spec"]["template"]["spec"]["containers"][0].pop("command")


# (case, mutation, text the rejection must contain)
INVALID: list[tuple[str, Mutation, str]] = [
    ("no template", drop("template"), "spec.template: Required value"),
    ("no checkpoint", drop("checkpoint"), "spec.checkpoint: Required value"),
    ("replicas 0", spec(replicas=0), "spec.replicas"),
    ("replicas too many", spec(replicas=10_001), "spec.replicas"),
    ("replicas not a number", spec(replicas="two"), "spec.replicas"),
    ("restart code 0", spec(restartPolicy={"restartExitCode": 0}), "spec.restartPolicy.restartExitCode"),
    ("restart code 256", spec(restartPolicy={"restartExitCode": 256}), "spec.restartPolicy.restartExitCode"),
    ("restart code 1 (the runtime's 'not saved')", spec(restartPolicy={"restartExitCode": 1}),
     "restartExitCode must be between 3 and 125"),
    ("restart code 2 (Python's usage error)", spec(restartPolicy={"restartExitCode": 2}),
     "restartExitCode must be between 3 and 125"),
    ("restart code 127 (command not found)", spec(restartPolicy={"restartExitCode": 127}),
     "restartExitCode must be between 3 and 125"),
    ("restart code 137 (SIGKILL/OOM)", spec(restartPolicy={"restartExitCode": 137}),
     "restartExitCode must be between 3 and 125"),
    ("restart code 143 (SIGTERM)", spec(restartPolicy={"restartExitCode": 143}),
     "restartExitCode must be between 3 and 125"),
    ("negative maxRapidRestarts", spec(restartPolicy={"maxRapidRestarts": -1}),
     "spec.restartPolicy.maxRapidRestarts"),
    ("negative maxFailures", spec(restartPolicy={"maxFailures": -1}), "spec.restartPolicy.maxFailures"),
    ("unknown field", spec(replica=3), 'unknown field "spec.replica"'),
    ("unknown nested field", spec(checkpoint={"uri": "/c", "every": 5}), 'unknown field "spec.checkpoint.every"'),
    ("bad checkpoint scheme", spec(checkpoint={"uri": "http://bucket/x"}), "checkpoint.uri scheme"),
    ("empty checkpoint uri", spec(checkpoint={"uri": ""}), "spec.checkpoint.uri"),
    ("no containers", pod(containers=[]), "spec.template.spec.containers"),
    ("cpu: lots (the embedded PodSpec schema checks quantities)",
     pod(containers=[{"name": "t", "image": "x", "resources": {"requests": {"cpu": "lots"}}}]),
     "spec.template.spec.containers[0].resources.requests.cpu: Invalid value: \"lots\""),
    ("a misspelt field deep in the template (strict field validation)",
     pod(containers=[{"name": "t", "image": "x", "securityContext": {"runAsUsr": 1}}]),
     'unknown field "spec.template.spec.containers[0].securityContext.runAsUsr"'),
    ("a field of the wrong type", pod(containers=[{"name": "t", "image": "x", "ports": [{"containerPort": "http"}]}]),
     "spec.template.spec.containers[0].ports[0].containerPort"),
    ("pod restartPolicy Always", pod(restartPolicy="Always"), "spec.template.spec.restartPolicy"),
    ("coordinator port privileged", spec(coordinatorPort=80), "spec.coordinatorPort"),
    ("grace too long", spec(terminationGracePeriodSeconds=7200), "spec.terminationGracePeriodSeconds"),
    ("unknown signal", spec(preemption={"signals": ["gce-spot"]}), "spec.preemption.signals[0]"),
    ("negative notice override", spec(preemption={"noticeSeconds": {"gke-spot": -5}}),
     "preemption.noticeSeconds values must be between 0 and 86400"),
    ("custom signal of unknown type", spec(preemption={"custom": [{"name": "x", "type": "Annotation", "key": "k"}]}),
     "spec.preemption.custom[0].type"),
    ("spares negative", spec(spares=-1, restartMode="InPlace"), "spec.spares"),
    ("spares more than replicas", spec(spares=3, restartMode="InPlace"), "spares must be at most replicas"),
    ("spares with Recreate", spec(spares=1, restartMode="Recreate"), "spares need restartMode InPlace"),
    ("spares with the image's entrypoint (the default is then Recreate)", entrypoint_spares,
     "spares need restartMode InPlace"),
    ("InPlace without a command", no_command_in_place, "its command must be set"),
    ("memory: both intervals", memory(sizeLimit="1Gi", intervalSteps=5, intervalSeconds=5),
     "spec.checkpoint.memory.intervalSeconds: Invalid value"),
    ("memory: a negative interval", memory(sizeLimit="1Gi", intervalSteps=-1), "spec.checkpoint.memory.intervalSteps"),
    ("memory: a loss rate beside an interval", memory(sizeLimit="1Gi", intervalSeconds=60, lossEverySeconds=600),
     "spec.checkpoint.memory.lossEverySeconds: Invalid value"),
    ("memory: a size that is no quantity", memory(sizeLimit="8GB"), "spec.checkpoint.memory.sizeLimit"),
    ("memory: no size", memory(), "spec.checkpoint.memory.sizeLimit: Required value"),
    ("memory with Recreate", memory("Recreate", sizeLimit="1Gi"), "spec.checkpoint.memory needs restartMode InPlace"),
    ("an unknown restartMode", spec(restartMode="Restart"), "spec.restartMode"),
    ("an exit-code rule on the restart code", spec(restartPolicy={"exitCodeRules": [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137, 42]}}]}),
     "the restart exit code is a saved preemption, never a failure"),
    ("an exit-code rule on a custom restart code", spec(restartPolicy={"restartExitCode": 7, "exitCodeRules": [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [7]}}]}),
     "spec.restartPolicy.exitCodeRules: Invalid value"),
    ("an exit code 0 in a rule", spec(restartPolicy={"exitCodeRules": [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [0]}}]}),
     "spec.restartPolicy.exitCodeRules[0].onExitCodes.values[0]"),
    ("an unknown exit-code action", spec(restartPolicy={"exitCodeRules": [
        {"action": "Retry", "onExitCodes": {"operator": "In", "values": [1]}}]}),
     "spec.restartPolicy.exitCodeRules[0].action: Unsupported value"),
    ("elastic: minReplicas 0", elastic(minReplicas=0), "spec.elastic.minReplicas: Invalid value: 0"),
    ("elastic: minReplicas above replicas", elastic(minReplicas=3),
     "spec.elastic.minReplicas: Invalid value: spec.elastic.minReplicas must be at most spec.replicas"),
    ("elastic: no minReplicas", elastic(), "spec.elastic.minReplicas: Required value"),
    ("elastic with Recreate", elastic("Recreate", minReplicas=1),
     "spec.elastic: Invalid value: spec.elastic needs restartMode InPlace"),
    ("elastic: virtualShards not a multiple of replicas", elastic(minReplicas=1, virtualShards=3),
     "spec.elastic.virtualShards: Invalid value: spec.elastic.virtualShards must be a multiple"),
    ("elastic: a negative unschedulableSeconds", elastic(minReplicas=1, unschedulableSeconds=-1),
     "spec.elastic.unschedulableSeconds"),
    ("elastic: an unknown field", elastic(minReplicas=1, maxReplicas=4), 'unknown field "spec.elastic.maxReplicas"'),
    ("name with a dot", lambda m: m["metadata"].update(name="llama.v2"), "metadata.name must be a DNS-1035 label"),
    ("name too long", lambda m: m["metadata"].update(name="a" * 43), "at most 42 characters"),
]


@pytest.fixture(scope="module")
def refusals(cluster: Any) -> Iterator[str]:
    """One namespace for every refused apply (a refused object is never created, so they cannot meet): two
    kubectl calls per case fewer than a namespace each."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("mutate,needle", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_job_rejected_at_apply(cluster: Any, chart: str, refusals: str, mutate: Mutation,
                                       needle: str) -> None:
    manifest = copy.deepcopy(job_manifest("bad", refusals))
    mutate(manifest)
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert out.returncode != 0, f"accepted: {out.stdout}"
    assert needle in out.stderr, out.stderr


@pytest.mark.parametrize("field,value,message", [
    ("replicas", 3, "replicas is immutable"),
    ("coordinatorPort", 9999, "coordinatorPort is immutable"),
    ("checkpoint", {"uri": "/elsewhere"}, "checkpoint.uri is immutable"),
    ("template", {"spec": {"containers": [{"name": "other", "image": "x"}]}}, "template is immutable"),
    ("restartPolicy", {"restartExitCode": 43}, "restartExitCode is immutable"),
])
def test_immutable_fields(cluster: Any, chart: str, namespace: str, field: str, value: Any, message: str) -> None:
    manifest = job_manifest("imm", namespace, suspend=True)  # suspended: no operator needed, nothing runs
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    manifest["spec"][field] = value
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    # Mutable fields still change.
    manifest = job_manifest("imm", namespace, suspend=False, restartPolicy={"maxFailures": 7})
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def test_restart_mode_cannot_be_set_or_removed_after_creation(cluster: Any, chart: str, namespace: str) -> None:
    """The default is decided at creation (InPlace with a command, else Recreate): adding or dropping the field
    later would change the mode of a running job."""
    manifest = job_manifest("mode", namespace, suspend=True)
    manifest["spec"].pop("restartMode")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    got = json.loads(cluster.kubectl("get", "tj", "mode", "-n", namespace, "-o", "json").stdout)["spec"]
    assert "restartMode" not in got  # no server-side default: the operator decides it from the template
    for later in ("Recreate", "InPlace"):
        manifest["spec"]["restartMode"] = later
        out = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
        assert out.returncode != 0 and "restartMode is immutable" in out.stderr, out.stderr
    explicit = job_manifest("mode2", namespace, suspend=True)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(explicit))
    explicit["spec"].pop("restartMode")
    out = cluster.kubectl("replace", "-f", "-", input=json.dumps({**explicit, "metadata": json.loads(
        cluster.kubectl("get", "tj", "mode2", "-n", namespace, "-o", "json").stdout)["metadata"]}), check=False)
    assert out.returncode != 0 and "restartMode is immutable" in out.stderr, out.stderr


def test_spares_with_a_command_and_no_restart_mode_are_accepted(cluster: Any, chart: str, namespace: str) -> None:
    manifest = job_manifest("sparedflt", namespace, suspend=True, spares=1)
    manifest["spec"].pop("restartMode")  # a command: InPlace by default, so spares are fine
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def test_exit_code_rules_are_accepted_with_the_default_restart_code(cluster: Any, chart: str,
                                                                  namespace: str) -> None:
    """The CEL rule reads restartExitCode after the API server applied its default (42)."""
    manifest = job_manifest("exitrules", namespace, suspend=True)
    manifest["spec"]["restartPolicy"] = {"exitCodeRules": [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}},
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1, 134, 137, 143]}}]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    got = cluster.read("tj", "exitrules", namespace)["spec"]["restartPolicy"]
    assert got["restartExitCode"] == 42 and got["exitCodeRules"] == manifest["spec"]["restartPolicy"]["exitCodeRules"]


def test_defaults_are_applied_by_the_api_server(cluster: Any, chart: str, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job_manifest("dflt", namespace, suspend=True)))
    got = json.loads(cluster.kubectl("get", "tj", "dflt", "-n", namespace, "-o", "json").stdout)["spec"]
    assert got["restartPolicy"] == {"restartExitCode": 42, "maxFailures": 3, "maxRapidRestarts": 5}
    assert got["preemption"] == {"enabled": True, "defaultNoticeSeconds": 30}
    assert got["coordinatorPort"] == 8476 and got["checkpoint"]["keep"] == 3  # docs/contract.toml
    assert "elastic" not in got  # no server-side default: a job without the block stays without it


def test_elastic_defaults_and_the_immutable_shard_count(cluster: Any, chart: str, namespace: str) -> None:
    manifest = job_manifest("elastic", namespace, suspend=True, restartMode="InPlace",
                            elastic={"minReplicas": 1, "virtualShards": 4})
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    got = cluster.read("tj", "elastic", namespace)["spec"]["elastic"]
    assert got == {"minReplicas": 1, "virtualShards": 4, "unschedulableSeconds": 60, "growBack": True,
                   "minResizeIntervalSeconds": 300}
    for shards in ({"virtualShards": 8}, {}):
        manifest["spec"]["elastic"] = {"minReplicas": 1, **shards}
        out = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
        assert out.returncode != 0 and "spec.elastic.virtualShards is immutable" in out.stderr, out.stderr
    manifest["spec"]["elastic"] = {"minReplicas": 2, "virtualShards": 4, "growBack": False}  # the rest may change
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    assert cluster.read("tj", "elastic", namespace)["spec"]["elastic"]["minReplicas"] == 2


def test_the_degraded_goodput_block_survives_the_api_servers_pruning(cluster: Any, chart: str,
                                                                     namespace: str) -> None:
    """status.goodput.degraded as policy.goodput writes it for a job that shrank and grew (docs/goodput.md,
    "Degraded"): the API server's structural schema keeps every field (a field missing from the CRD would be
    pruned without an error)."""
    from reprieve_operator.policy.goodput import Report, fold, status

    raw = None
    for attempt, created, workers, report in [
            (1, 0.0, 4, Report(1, 49, 54.0, 0, 5.0, 1.0)),
            (2, 60.0, 3, Report(2, 124, 163.0, 45, 64.25, 1.25, 1.0)),
            (3, 165.0, 4, Report(3, 199, 242.0, 125, 168.0, 1.0))]:
        acc = fold(raw, now=created, new_attempt=attempt, workers=workers, desired=4)
        assert acc is not None
        acc = fold(acc.to_status(), now=report.time, report=report)
        assert acc is not None
        raw = acc.to_status()
    done = fold(raw, now=243.0, ended=True)
    assert done is not None
    goodput = status(done, 243.0)
    assert goodput["degraded"]["throughputRatio"] == 0.8
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job_manifest("shrunk", namespace, suspend=True)))
    cluster.kubectl("patch", "tj", "shrunk", "-n", namespace, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"goodput": goodput, "desiredWorkers": 4, "currentWorkers": 4}}))
    got = cluster.read("tj", "shrunk", namespace)["status"]
    assert got["goodput"]["degraded"] == goodput["degraded"]
    assert got["goodput"]["accounting"]["throughput"] == goodput["accounting"]["throughput"]
    assert [h["workers"] for h in got["goodput"]["accounting"]["history"]] == [4, 3, 4]
