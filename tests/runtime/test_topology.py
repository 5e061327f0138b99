"""reprieve.topology and reprieve.trace_ahead: the devices an attempt ran on, recorded in every checkpoint
(real CheckpointManager, real files) and read back before ``reprieve.init()``: from the supervisor's hint first, else the latest visible
checkpoint; an AbstractMesh built from it is the one JAX derives from the real mesh (so a trace made ahead is
found again)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reprieve
from jax.sharding import Mesh
from reprieve.checkpoint import CheckpointManager, layout
from reprieve.topology import Topology, TopologyError, current, current_if_initialised
from reprieve.trace_ahead import (
    TraceAhead,
    expected_topology,
    parse_topology_record,
    record_topology,
    topology_record,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GOOD = {"platform": "cpu", "device_kind": "cpu", "num_cores": None, "num_processes": 2, "device_count": 4}


# -- the record (pure) ------------------------------------------------------------------------------------------
def test_a_topology_round_trips_through_json() -> None:
    topology = Topology.from_json(json.loads(json.dumps(GOOD)))
    assert topology.to_json() == GOOD


@pytest.mark.parametrize("change,named", [
    ({"platform": ""}, "platform"),
    ({"device_kind": 3}, "device_kind"),
    ({"num_cores": 0}, "num_cores"),
    ({"num_processes": 0}, "num_processes"),
    ({"device_count": "4"}, "device_count"),
    ({"device_count": True}, "device_count"),
    ({"extra": 1}, "unknown fields ['extra']"),
])
def test_a_malformed_topology_is_refused_naming_the_field(change: dict, named: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(named)):
        Topology.from_json({**GOOD, **change})


def test_a_topology_lacking_a_field_is_refused_naming_it() -> None:
    with pytest.raises(TopologyError, match=re.escape("lacks ['device_count']")):
        Topology.from_json({k: v for k, v in GOOD.items() if k != "device_count"})
    with pytest.raises(TopologyError, match="JSON object"):
        Topology.from_json([1, 2])


# -- against the installed JAX ----------------------------------------------------------------------------------
def test_the_abstract_mesh_is_the_one_jax_derives_from_the_real_mesh() -> None:
    topology = current()
    assert topology.device_count == len(jax.devices()) == 4 and topology.num_processes == 1
    for shape, names in [((4,), ("data",)), ((2, 2), ("data", "model"))]:
        real = Mesh(np.array(jax.devices()).reshape(shape), names).abstract_mesh
        assert topology.abstract_mesh(shape, names) == real


def test_an_abstract_mesh_that_does_not_cover_the_devices_is_refused() -> None:
    topology = Topology.from_json(GOOD)
    with pytest.raises(TopologyError, match="make 2 devices; this topology has 4"):
        topology.abstract_mesh((2,), ("data",))
    with pytest.raises(TopologyError, match="differ in length"):
        topology.abstract_mesh((2, 2), ("data",))


def test_a_step_traced_under_the_abstract_mesh_is_found_by_the_call_under_the_real_mesh(
        caplog: pytest.LogCaptureFixture) -> None:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    traces = []

    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        traces.append(1)
        return w + (x @ w).sum()

    jitted = jax.jit(step)
    topology = current()
    amesh = topology.abstract_mesh((4,), ("data",))
    with jax.sharding.use_abstract_mesh(amesh):
        jitted.trace(jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(amesh, P())),
                     jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(amesh, P("data"))))
    assert traces == [1]
    mesh = Mesh(np.array(jax.devices()), ("data",))
    with jax.set_mesh(mesh):
        w = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P()))
        x = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("data")))
        jitted(w, x).block_until_ready()
    assert traces == [1], "the call under the real mesh traced the step again"


# -- recorded in checkpoints, read back before init -------------------------------------------------------------
def _save(root: Path, step: int, attempt: int = 1) -> None:
    with CheckpointManager(str(root), attempt=attempt) as mgr:
        mgr.save(step, {"w": jnp.arange(8.0)})
        mgr.wait()


def test_every_checkpoint_records_the_topology_and_expected_topology_reads_the_latest(tmp_path: Path) -> None:
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}
    assert expected_topology(env) is None  # a first start: nothing to go by
    _save(tmp_path, 5)
    meta = json.loads((tmp_path / layout.committed_name(5, 1) / layout.METADATA_FILE).read_text())
    assert meta["topology"] == current().to_json()
    assert expected_topology(env) == current()
    assert reprieve.expected_topology is expected_topology


def test_expected_topology_follows_fencing(tmp_path: Path) -> None:
    _save(tmp_path, 5, attempt=1)
    CheckpointManager(str(tmp_path), attempt=2).close()  # attempt 2 fenced the directory (step 5 visible)
    # then a stale writer of attempt 1 commits step 9, recording other devices: invisible, as for a restore
    stale = tmp_path / layout.committed_name(9, 1)
    shutil.copytree(tmp_path / layout.committed_name(5, 1), stale)
    meta = json.loads((stale / layout.METADATA_FILE).read_text())
    (stale / layout.METADATA_FILE).write_text(json.dumps({**meta, "step": 9, "topology": {**GOOD, "device_count": 64}}))
    assert expected_topology({"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}) == current()
    (tmp_path / "attempts" / "attempt_0000000002.json").unlink()  # the fence is what hides it: without it step 9 is latest
    assert expected_topology({"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}) == Topology.from_json(
        {**GOOD, "device_count": 64})


def test_the_supervisors_hint_comes_first_and_a_bad_one_falls_back_to_the_checkpoint(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _save(tmp_path, 5)
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}
    assert expected_topology({**env, "REPRIEVE_EXPECTED_TOPOLOGY": json.dumps(GOOD)}) == Topology.from_json(GOOD)
    with caplog.at_level(logging.WARNING, logger="reprieve.trace_ahead"):
        assert expected_topology({**env, "REPRIEVE_EXPECTED_TOPOLOGY": "{not json"}) == current()
    assert "ignoring REPRIEVE_EXPECTED_TOPOLOGY" in caplog.text


def test_a_checkpoint_without_a_topology_or_with_a_bad_one_means_unknown(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _save(tmp_path, 5)
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}
    path = tmp_path / layout.committed_name(5, 1) / layout.METADATA_FILE
    meta = json.loads(path.read_text())
    del meta["topology"]  # written before topologies were recorded
    path.write_text(json.dumps(meta))
    assert expected_topology(env) is None
    path.write_text(json.dumps({**meta, "topology": {**GOOD, "device_count": -1}}))
    with caplog.at_level(logging.WARNING, logger="reprieve.trace_ahead"):
        assert expected_topology(env) is None
    assert "device_count must be a positive integer" in caplog.text
    path.write_text("{truncated")
    assert expected_topology(env) is None


def test_trace_ahead_calls_once_when_the_topology_is_known_and_survives_a_failing_callback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[Topology] = []
    ahead = TraceAhead(calls.append, {"REPRIEVE_CHECKPOINT_URI": str(tmp_path)})
    ahead.attempt()
    assert calls == [] and not ahead.done  # nothing known yet: tried again later
    _save(tmp_path, 5)
    ahead.attempt()
    ahead.attempt()
    assert calls == [current()] and ahead.done

    def broken(topology: Topology) -> None:
        raise ValueError("model does not fit")

    failing = TraceAhead(broken, {"REPRIEVE_EXPECTED_TOPOLOGY": json.dumps(GOOD)})
    with caplog.at_level(logging.WARNING, logger="reprieve.trace_ahead"):
        failing.attempt()
    assert failing.done and "trace_ahead for" in caplog.text and "model does not fit" in caplog.text


def test_trace_ahead_stops_asking_once_the_latest_checkpoint_records_no_topology(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spare waiting on a checkpoint written before topologies were recorded: one reading of it says so, and the
    storage is not listed again every POLL_SECONDS for the rest of its wait (as before no checkpoint it is)."""
    from reprieve import trace_ahead

    reads: list[str] = []
    real = trace_ahead.latest_metadata

    def counted(*args: object) -> object:
        reads.append("read")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(trace_ahead, "latest_metadata", counted)
    calls: list[Topology] = []
    ahead = TraceAhead(calls.append, {"REPRIEVE_CHECKPOINT_URI": str(tmp_path)})
    ahead.attempt()
    assert not ahead.done and reads == ["read"]  # no checkpoint yet: asked again
    _save(tmp_path, 5)
    path = tmp_path / layout.committed_name(5, 1) / layout.METADATA_FILE
    meta = json.loads(path.read_text())
    del meta["topology"]  # written before topologies were recorded
    path.write_text(json.dumps(meta))
    ahead.attempt()
    ahead.attempt()
    assert ahead.done and calls == [] and reads == ["read", "read"]


@pytest.mark.parametrize("raw,named", [
    (b"{truncated", "Expecting property name"),
    (b'{"attempt": 2}', "topology must be a JSON object"),
    (b'{"attempt": true, "topology": GOOD}'.replace(b"GOOD", json.dumps(GOOD).encode()), "attempt must be"),
    (b'{"attempt": -1, "topology": GOOD}'.replace(b"GOOD", json.dumps(GOOD).encode()), "attempt must be"),
    (b'{"attempt": 2, "topology": GOOD}'.replace(b"GOOD", json.dumps({**GOOD, "device_count": 0}).encode()),
     "device_count must be a positive integer"),
])
def test_a_malformed_topology_record_is_refused_naming_the_file_and_the_problem(raw: bytes, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as err:
        parse_topology_record(raw, "/ckpt/topology.json")
    assert str(err.value).startswith("/ckpt/topology.json: ")
    assert parse_topology_record(topology_record(7, GOOD), "x") == (7, Topology.from_json(GOOD))


def test_before_the_first_checkpoint_the_running_attempts_record_is_the_expected_topology(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What a spare parked before the job's first checkpoint reads: the record process 0 wrote after its first step
    (real files); a checkpoint, once there, comes first; a bad record means unknown, said."""
    jax.devices()
    env = {"REPRIEVE_CHECKPOINT_URI": str(tmp_path)}
    assert record_topology(str(tmp_path / "absent"), 3, 2) is not None  # no root: logged by the thread, not raised
    CheckpointManager(str(tmp_path), attempt=3).close()  # the root and attempt 3's fence, no checkpoint
    assert expected_topology(env) is None
    thread = record_topology(str(tmp_path), 3, 2)
    assert thread is not None
    thread.join(10)
    here = current()
    written = json.loads((tmp_path / layout.TOPOLOGY_FILE).read_text())
    assert written == {"attempt": 3, "topology": {**here.to_json(), "num_processes": 2}}
    with caplog.at_level(logging.INFO, logger="reprieve.trace_ahead"):
        assert expected_topology(env) == Topology.from_json(written["topology"])
    assert "no checkpoint yet; attempt 3 recorded" in caplog.text
    calls: list[Topology] = []
    ahead = TraceAhead(calls.append, env)
    ahead.attempt()
    ahead.attempt()
    assert calls == [Topology.from_json(written["topology"])] and ahead.done
    assert [e.name for e in os.scandir(tmp_path) if e.name.startswith("step_")] == []  # never taken for a checkpoint
    _save(tmp_path, 5, attempt=4)  # a checkpoint is there: it comes first (it records one process)
    assert expected_topology(env) == here
    shutil.rmtree(tmp_path / layout.committed_name(5, 4))
    (tmp_path / layout.TOPOLOGY_FILE).write_text('{"attempt": 3, "topology": {"platform": "cpu"}}')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="reprieve.trace_ahead"):
        assert expected_topology(env) is None
    assert "the topology record under" in caplog.text and "lacks" in caplog.text


def test_the_current_topology_is_reported_only_once_a_backend_exists() -> None:
    jax.devices()
    assert current_if_initialised() == current()
