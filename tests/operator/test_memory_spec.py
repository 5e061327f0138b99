"""spec.checkpoint.memory (the memory tier's CRD block): what the model accepts and what it refuses, naming the
field and what to change. The API server's side of the same rules (CEL) is in test_crd_validation_integration."""

from __future__ import annotations

from typing import Any

import pytest
from op_jobs import make_job
from pydantic import ValidationError
from reprieve_operator.models import quantity_bytes

pytestmark = pytest.mark.unit
COMMAND = ["python", "train.py"]


def job(memory: dict[str, Any] | None, mode: str | None = "InPlace", command: bool = True) -> Any:
    body = make_job(checkpoint={"uri": "/ckpt", **({"memory": memory} if memory is not None else {})},
                    **({"restartMode": mode} if mode else {}))
    if command:
        body.with_command(*COMMAND)
    return body.model()


def test_a_memory_tier_with_its_defaults() -> None:
    m = job({"sizeLimit": "8Gi"}).spec.checkpoint.memory
    assert m is not None and m.enabled and (m.interval_steps, m.interval_seconds) == (0, 0)
    assert m.limit_bytes == 8 * 2**30


def test_no_memory_block_is_no_memory_tier() -> None:
    assert job(None).spec.checkpoint.memory is None


def test_the_default_mode_with_a_command_is_in_place_and_takes_a_memory_tier() -> None:
    assert job({"sizeLimit": "1Gi"}, mode=None).spec.checkpoint.memory is not None


def test_a_disabled_memory_tier_is_allowed_with_recreate() -> None:
    assert job({"sizeLimit": "1Gi", "enabled": False}, mode="Recreate").spec.checkpoint.memory is not None


REFUSED: list[tuple[str, dict[str, Any], str | None, bool, str]] = [
    ("both intervals", {"sizeLimit": "1Gi", "intervalSteps": 5, "intervalSeconds": 5}, "InPlace", True,
     "spec.checkpoint.memory: give intervalSteps or intervalSeconds, not both"),
    ("a negative interval", {"sizeLimit": "1Gi", "intervalSteps": -1}, "InPlace", True,
     "checkpoint.memory.intervalSteps"),
    ("a negative seconds interval", {"sizeLimit": "1Gi", "intervalSeconds": -1}, "InPlace", True,
     "checkpoint.memory.intervalSeconds"),
    ("a loss rate beside an interval", {"sizeLimit": "1Gi", "intervalSteps": 5, "lossEverySeconds": 600}, "InPlace",
     True, "lossEverySeconds spaces memory saves only when no interval is given"),
    ("a negative loss rate", {"sizeLimit": "1Gi", "lossEverySeconds": -1}, "InPlace", True,
     "checkpoint.memory.lossEverySeconds"),
    ("no size", {}, "InPlace", True, "checkpoint.memory.sizeLimit"),
    ("a size that is no quantity", {"sizeLimit": "8GB"}, "InPlace", True, "checkpoint.memory.sizeLimit"),
    ("a size below 1Mi", {"sizeLimit": "1000k"}, "InPlace", True,
     "spec.checkpoint.memory.sizeLimit must be at least 1Mi, got '1000k'"),
    ("Recreate", {"sizeLimit": "1Gi"}, "Recreate", True, "spec.checkpoint.memory needs restartMode InPlace"),
    ("the image's entrypoint (the default is then Recreate)", {"sizeLimit": "1Gi"}, None, False,
     "spec.checkpoint.memory needs restartMode InPlace"),
    ("an unknown field", {"sizeLimit": "1Gi", "replicas": 2}, "InPlace", True, "checkpoint.memory.replicas"),
]


@pytest.mark.parametrize(("what", "memory", "mode", "command", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused(what: str, memory: dict[str, Any], mode: str | None, command: bool, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        job(memory, mode=mode, command=command)
    assert message in str(err.value)


@pytest.mark.parametrize(("text", "size"), [("1Gi", 2**30), ("500Mi", 500 * 2**20), ("2G", 2 * 10**9),
                                            ("1048576", 2**20), ("3Ti", 3 * 2**40), ("64k", 64_000)])
def test_quantity_bytes(text: str, size: int) -> None:
    assert quantity_bytes(text) == size


@pytest.mark.parametrize("text", ["8GB", "1.5Gi", "-1Gi", "", "Gi"])
def test_quantity_bytes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="must be a memory quantity such as 8Gi"):
        quantity_bytes(text)


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_the_worker_pod_gets_a_memory_volume_and_the_memory_environment() -> None:
    import tomllib
    from pathlib import Path

    from reprieve.memtier.config import MemoryConfig
    from reprieve_operator.policy.builders import MEMORY_DIR, build_worker_pod

    table = tomllib.loads((Path(__file__).resolve().parents[2] / "docs/contract.toml").read_text())["memory"]
    pod = build_worker_pod(job({"sizeLimit": "6Gi", "intervalSteps": 10}), 1, 3)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["reprieve-memory"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "6Gi"}
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["reprieve-memory"] == MEMORY_DIR
    env = _env(pod)
    memory_names = {n for n in env if n in table["operator_sets"]}
    # the peer's node is not known before the pods are scheduled: later attempts get it with the assignment; the
    # loss rate is set only when the spec gives one (test_a_loss_rate_reaches_the_runtime_in_place_of_the_budget)
    assert memory_names == set(table["operator_sets"]) - {"REPRIEVE_MEMORY_PEER_NODE",
                                                          "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS"}
    assert env["REPRIEVE_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["REPRIEVE_MEMORY_TOKEN"] == {"secretKeyRef": {"name": "llama" + table["token_secret_suffix"],
                                                             "key": table["token_secret_key"]}}
    assert env["REPRIEVE_MEMORY_PEER"] == "llama-0.llama.default.svc:8477"  # the first attempt's ring: 1 -> 0
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    cfg = MemoryConfig.from_env({**plain, "REPRIEVE_NODE_NAME": "n1", "REPRIEVE_MEMORY_TOKEN": "t"},
                                pod_ip="10.0.0.1")  # the runtime reads them
    assert cfg is not None and (cfg.directory, cfg.limit_bytes, cfg.interval_steps, cfg.port, cfg.peer) == (
        MEMORY_DIR, 6 * 2**30, 10, table["defaults"]["port"], "llama-0.llama.default.svc:8477")


def test_a_loss_rate_reaches_the_runtime_in_place_of_the_budget() -> None:
    from reprieve.memtier.config import MemoryConfig
    from reprieve_operator.policy.builders import build_worker_pod

    env = _env(build_worker_pod(job({"sizeLimit": "6Gi", "lossEverySeconds": 1800}), 1, 3))
    assert env["REPRIEVE_MEMORY_LOSS_EVERY_SECONDS"] == "1800"
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    cfg = MemoryConfig.from_env({**plain, "REPRIEVE_NODE_NAME": "n1"}, pod_ip="10.0.0.1")
    assert cfg is not None and cfg.auto and cfg.loss_every_seconds == 1800


FIRST_PEER_ROWS: list[tuple[str, int, str | None, int, str | None]] = [
    # (what, replicas, pod name or None for the index's own name, index, REPRIEVE_MEMORY_PEER)
    ("process 0 of 3: the next pod's stable name", 3, None, 0, "llama-1.llama.default.svc:8477"),
    ("the last process wraps to process 0", 3, None, 2, "llama-0.llama.default.svc:8477"),
    ("a one-process job has no peer in its first attempt", 1, None, 0, None),
    ("a replacement pod (generated name) waits for its assignment", 3, "llama-1-", 1, None),
    ("a spare waits for its assignment", 3, "llama-spare-", -1, None),
]


@pytest.mark.parametrize(("what", "replicas", "name", "index", "peer"), FIRST_PEER_ROWS,
                         ids=[r[0] for r in FIRST_PEER_ROWS])
def test_the_first_attempts_peer(what: str, replicas: int, name: str | None, index: int, peer: str | None) -> None:
    from reprieve_operator.policy.builders import build_worker_pod

    body = make_job(replicas=replicas, checkpoint={"uri": "/ckpt", "memory": {"sizeLimit": "1Gi"}},
                    restartMode="InPlace")
    body.with_command(*COMMAND)
    pod = build_worker_pod(body.model(), index, 1, name=name, role="spare" if index < 0 else "worker")
    assert _env(pod).get("REPRIEVE_MEMORY_PEER") == peer


def test_the_memory_secret_is_owned_by_the_job_and_holds_the_token_the_pods_read() -> None:
    from reprieve_operator.policy.builders import build_memory_secret, build_worker_pod

    j = job({"sizeLimit": "1Gi"})
    secret = build_memory_secret(j, "s3cret")
    assert secret["metadata"]["name"] == "llama-memory" and secret["stringData"] == {"token": "s3cret"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    ref = _env(build_worker_pod(j, 0, 1))["REPRIEVE_MEMORY_TOKEN"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], "token")


def test_no_memory_tier_no_memory_volume_nor_environment() -> None:
    from reprieve_operator.policy.builders import build_worker_pod

    for spec in (None, {"sizeLimit": "1Gi", "enabled": False}):
        pod = build_worker_pod(job(spec), 0, 1)
        assert "reprieve-memory" not in {v["name"] for v in pod["spec"]["volumes"]}
        assert not [n for n in _env(pod) if n.startswith("REPRIEVE_MEMORY_") or n == "REPRIEVE_NODE_NAME"]


def test_the_assignments_memory_peers_reach_each_process_and_survive_an_operator_restart() -> None:
    """builders.build_assignment -> reprieve-supervisor's parser (the runtime's side of the contract), and back through the
    operator's own parser (what a restarted operator reads as the previous pairing)."""
    from reprieve.supervisor import contract
    from reprieve_operator.assignment import parse_assignment
    from reprieve_operator.policy.builders import build_assignment

    j = job({"sizeLimit": "1Gi"})
    cm = build_assignment(j, 3, {"llama-0": 0, "llama-1": 1}, "10.0.0.1:8476", {0: "10.0.0.2:8477", 1: None},
                          {0: "node-b"})
    got = {pod: contract.parse_assignment(cm["data"], pod, configmap="default/llama-assignment")
           for pod in ("llama-0", "llama-1")}
    assert {p: a.memory_peer for p, a in got.items()} == {"llama-0": "10.0.0.2:8477", "llama-1": ""}  # "": nobody
    env = got["llama-0"].env()
    assert (env["REPRIEVE_MEMORY_PEER"], env["REPRIEVE_MEMORY_PEER_NODE"]) == ("10.0.0.2:8477", "node-b")
    assert contract.parse_assignment_line(got["llama-0"].line())["REPRIEVE_MEMORY_PEER_NODE"] == "node-b"
    back = parse_assignment(cm)
    assert back is not None and dict(back.memory_peers) == {0: "10.0.0.2:8477"}
    assert dict(back.memory_peer_nodes) == {0: "node-b"}
    assert "memoryPeers" not in build_assignment(j, 3, {"llama-0": 0}, "x")["data"]
