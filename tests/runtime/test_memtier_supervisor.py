"""reprieve-supervisor serves the pod's memory copies (local cluster: real kube-apiserver, process kubelet): the replica
server outlives the trainer (a peer's copy lands while no trainer runs and the next attempt's trainer finds it),
trainers learn its address from ``REPRIEVE_MEMORY_SERVER``, and the assignment's ``memoryPeers`` becomes the next
attempt's ``REPRIEVE_MEMORY_PEER``."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from localcluster.inplace import SupervisedPod
from localcluster.testing import container_exit_code, wait_for
from reprieve.memtier import wire
from reprieve.memtier.layout import CopyName
from reprieve.memtier.store import MemoryDir

from tests.runtime.helpers_agreement import free_port
from tests.runtime.test_memtier_server import put, write_copy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

POD = "job-0"
TRAINER = """
    import json, os, pathlib, sys
    from reprieve.memtier import wire
    out = pathlib.Path(os.environ["OUT"])
    attempt = int(os.environ["REPRIEVE_ATTEMPT"])
    server = os.environ.get("REPRIEVE_MEMORY_SERVER")
    listing = wire.Client(server, timeout_s=10).list() if server else {"holdings": []}
    record = {"attempt": attempt, "pid": os.getpid(), "server": server, "peer": os.environ.get("REPRIEVE_MEMORY_PEER"),
              "holdings": [h["name"] for h in listing["holdings"]]}
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\\n")
    sys.exit(42 if attempt == 1 else 0)
"""


@pytest.fixture
def worker(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[SupervisedPod]:
    with SupervisedPod.under(cluster, namespace, tmp_path, pod=POD) as w:
        yield w


def runs(w: SupervisedPod, count: int) -> list[dict[str, Any]]:
    path = w.out / "runs.jsonl"

    def read() -> list[dict[str, Any]] | None:
        got = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return got if len(got) >= count else None

    return wait_for(read, 90, f"{count} trainer run(s)", describe=lambda: w.log()[-3000:])


def test_the_replica_server_outlives_the_trainer_and_the_pairing_follows_the_assignment(
        worker: SupervisedPod, tmp_path: Path) -> None:
    worker.start(["python", "-c", textwrap.dedent(TRAINER)],
                 env={"REPRIEVE_MEMORY_DIR": "/out/mem", "REPRIEVE_MEMORY_PORT": str(free_port())})
    assert worker.wait_exit_report(1)["code"] == 42
    (first,) = runs(worker, 1)
    assert first["server"] and first["holdings"] == [] and first["peer"] is None
    # no trainer runs in the pod now: a peer's copy still lands, checked and committed by reprieve-supervisor
    writer = MemoryDir(str(tmp_path / "writer"))
    name = CopyName(20, 1, 1)
    write_copy(writer, name, b"x" * 10_000)
    put(wire.Client(first["server"]), writer, name)
    assert [p.name for p in (worker.out / "mem" / "peer").iterdir()] == [str(name)]

    body = {"metadata": {"name": "job-assignment"},
            "data": {"contract": "1", "attempt": "2", "numProcesses": "1", "coordinator": "127.0.0.1:1",
                     "processes": json.dumps({POD: 0}), "memoryPeers": json.dumps({"0": "10.1.2.3:8477"})}}
    core = client.CoreV1Api(worker.cluster.api_client())
    try:
        core.create_namespaced_config_map(worker.ns, body)
    finally:
        core.api_client.close()
    done = worker.wait_phase("Succeeded", timeout=90)
    assert container_exit_code(done) == 0
    _, second = runs(worker, 2)
    assert second["server"] == first["server"] and second["pid"] != first["pid"]
    assert second["peer"] == "10.1.2.3:8477"
    assert second["holdings"] == [str(name)]
