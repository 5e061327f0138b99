"""A memory copy's names, manifest, schedule and settings (pure): round trips, and every way they are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reprieve.checkpoint.layout import parse_fence_name
from reprieve.config import ConfigError
from reprieve.memtier import schedule
from reprieve.memtier.config import MemoryConfig
from reprieve.memtier.layout import CopyName, aligned, parse_name
from reprieve.memtier.manifest import CopyCorruptError, Manifest, Shard, crc32c
from reprieve.memtier.tier import limit_problem, required_bytes

pytestmark = pytest.mark.unit

LEAVES = [{"path": "['w']", "kind": "array", "index": 0, "shape": [8, 4], "dtype": "float32", "chunk_shape": [4, 4],
           "nbytes": 128},
          {"path": "['n']", "kind": "json", "value": 3, "nbytes": 0}]


def manifest(**kw: object) -> Manifest:
    fields: dict[str, object] = {"writer": 1, "num_processes": 2, "step": 40, "attempt": 3, "leaves": LEAVES,
                                     "shards": [Shard(0, ((4, 8), (0, 4)), 0, 64, 123)], "data_bytes": 64,
                                     "extra": {"reprieve": {"kind": "memory"}}, "process_extra": {"pos": 7},
                                     "base": (30, 2)}
    fields.update(kw)
    return Manifest(**fields)  # type: ignore[arg-type]


def test_names_round_trip_and_anything_else_is_not_a_copy() -> None:
    n = CopyName(120, 3, 1)
    assert str(n) == "s0000000120_a3_p1" and parse_name(str(n)) == n
    assert parse_name(str(n.in_flight)) == n.in_flight and str(n.in_flight).endswith(".tmp")
    for other in ("s120_a3_p1", "s0000000120_a3_p1.old", "step_0000000120_a3", "s0000000120_a0_p1", ".lock"):
        assert parse_name(other) is None, other
    assert parse_fence_name("attempt_0000000004.json") == 4 and parse_fence_name("attempt_4.json") is None
    assert [aligned(x) for x in (0, 1, 64, 65)] == [0, 64, 64, 128]


def test_manifest_round_trip() -> None:
    m = manifest()
    back = Manifest.from_bytes(m.to_bytes(), "here")
    assert back == m and back.problems(m.name) == []


def test_a_manifest_records_its_storage_root_and_the_states_structure() -> None:
    """What a restore checks before it reads a copy (issue #46, 1): the root the copy belongs to, and the leaves
    and shapes the identity check compares (a field a newer reprieve adds to a leaf record does not get in the
    way)."""
    m = manifest(root="/ckpt/run-a", leaves=[{**LEAVES[0], "added_later": 1}, *LEAVES[1:]])
    back = Manifest.from_bytes(m.to_bytes(), "here")
    assert back.root == "/ckpt/run-a" and Manifest.from_bytes(manifest().to_bytes(), "here").root is None
    assert back.structure() == [(leaf["path"], None if leaf["kind"] == "json" else tuple(leaf["shape"]))
                                for leaf in LEAVES]


def test_a_flipped_or_torn_manifest_is_corrupt() -> None:
    raw = manifest().to_bytes()
    flipped = raw.replace(b'"step":40', b'"step":41')
    with pytest.raises(CopyCorruptError, match="fails its checksum"):
        Manifest.from_bytes(flipped, "here")
    with pytest.raises(CopyCorruptError, match="no checksum line"):
        Manifest.from_bytes(raw[: len(raw) // 2], "here")
    with pytest.raises(CopyCorruptError, match="malformed"):
        Manifest.from_bytes(raw.rsplit(b"crc32c=", 1)[0] + b"crc32c=zz\n", "here")


def test_a_manifest_of_another_format_or_with_a_missing_field_is_corrupt() -> None:
    def sealed(body: bytes) -> bytes:
        return body + b"\ncrc32c=" + f"{crc32c(body):08x}".encode()

    with pytest.raises(CopyCorruptError, match="format_version must be 1"):
        Manifest.from_bytes(sealed(b'{"format_version": 2}'), "here")
    with pytest.raises(CopyCorruptError, match="missing or malformed field"):
        Manifest.from_bytes(sealed(b'{"format_version": 1}'), "here")


PROBLEMS = [
    ("another step than the name", {"step": 41}, "manifest step 41 disagrees"),
    ("a writer beyond the process count", {"writer": 2, "num_processes": 2}, "not below num_processes"),
    ("a shard of a leaf that does not exist", {"shards": [Shard(5, ((0, 8), (0, 4)), 0, 128, 0)], "data_bytes": 128},
     "no such leaf"),
    ("a shard of a JSON leaf", {"shards": [Shard(1, ((0, 1),), 0, 4, 0)]}, "not an array"),
    ("a region outside the array", {"shards": [Shard(0, ((4, 9), (0, 4)), 0, 80, 0)], "data_bytes": 80},
     "outside leaf"),
    ("bytes that do not match the region", {"shards": [Shard(0, ((4, 8), (0, 4)), 0, 60, 0)]}, "needs 64"),
    ("bytes beyond data.bin", {"data_bytes": 32}, "beyond data.bin"),
    ("overlapping shards", {"shards": [Shard(0, ((0, 4), (0, 4)), 0, 64, 0), Shard(0, ((4, 8), (0, 4)), 32, 64, 0)],
                                "data_bytes": 128}, "overlap"),
    ("an unaligned shard", {"shards": [Shard(0, ((4, 8), (0, 4)), 8, 64, 0)], "data_bytes": 72}, "aligned"),
]


@pytest.mark.parametrize(("fields", "problem"), [r[1:] for r in PROBLEMS], ids=[r[0] for r in PROBLEMS])
def test_manifest_problems(fields: dict[str, object], problem: str) -> None:
    got = manifest(**fields).problems(CopyName(40, 3, fields.get("writer", 1)))  # type: ignore[arg-type]
    assert any(problem in p for p in got), got


# -- schedule -----------------------------------------------------------------------------------------------------
EVERY = [
    ("a save costing 1 % of a step: every step", {"cost_s": 0.01, "step_s": 1.0}, 1),
    ("a save costing one step: every 100 steps", {"cost_s": 0.5, "step_s": 0.5}, 100),
    ("rounding up: the budget is a ceiling", {"cost_s": 0.101, "step_s": 1.0}, 11),
    ("a given interval in seconds wins over the budget", {"cost_s": 10.0, "step_s": 0.5, "interval_s": 5.0}, 10),
    ("an interval shorter than a step: every step", {"cost_s": 0.0, "step_s": 2.0, "interval_s": 0.5}, 1),
    ("another budget", {"cost_s": 0.5, "step_s": 0.5, "budget": 0.05}, 20),
]


@pytest.mark.parametrize(("kw", "every"), [r[1:] for r in EVERY], ids=[r[0] for r in EVERY])
def test_choose_every(kw: dict[str, float], every: int) -> None:
    assert schedule.choose_every(**kw) == every


def test_schedule_due_and_round_trip() -> None:
    s = schedule.Schedule(every=5, start=12)
    assert [k for k in range(30) if s.due(k)] == [12, 17, 22, 27]
    assert schedule.Schedule.from_json(s.to_json()) == s
    with pytest.raises(ValueError, match="every >= 1"):
        schedule.Schedule.from_json('{"every": 0, "from": 3}')
    assert schedule.start_after(100, 0.01) == 200 and schedule.start_after(100, 10.0) == 103


# -- settings -----------------------------------------------------------------------------------------------------
def test_off_without_a_directory_and_defaults_with_one() -> None:
    assert MemoryConfig.from_env({}) is None
    cfg = MemoryConfig.from_env({"REPRIEVE_MEMORY_DIR": "/dev/shm/x"})
    assert cfg is not None and cfg.auto and (cfg.port, cfg.peer, cfg.limit_bytes) == (8477, None, None)


BAD_ENV = [
    ("a negative interval", {"REPRIEVE_MEMORY_INTERVAL_STEPS": "-1"}, "REPRIEVE_MEMORY_INTERVAL_STEPS must be >= 0, got '-1'"),
    ("a negative interval in seconds", {"REPRIEVE_MEMORY_INTERVAL_SECONDS": "-5"}, "REPRIEVE_MEMORY_INTERVAL_SECONDS must be >= 0, got '-5'"),
    ("both intervals", {"REPRIEVE_MEMORY_INTERVAL_STEPS": "5", "REPRIEVE_MEMORY_INTERVAL_SECONDS": "5"}, "give one"),
    ("a loss rate beside an interval", {"REPRIEVE_MEMORY_INTERVAL_STEPS": "5", "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS": "600"},
     "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS=600 and REPRIEVE_MEMORY_INTERVAL_STEPS=5 are both set"),
    ("a loss rate below a second", {"REPRIEVE_MEMORY_LOSS_EVERY_SECONDS": "0.5"},
     "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS must be 0 \\(not known\\) or at least 1 s of training between losses, got 0.5"),
    ("a negative loss rate", {"REPRIEVE_MEMORY_LOSS_EVERY_SECONDS": "-1"},
     "REPRIEVE_MEMORY_LOSS_EVERY_SECONDS must be >= 0, got '-1'"),
    ("a zero limit", {"REPRIEVE_MEMORY_LIMIT_BYTES": "0"}, "REPRIEVE_MEMORY_LIMIT_BYTES must be >= 1, got '0'"),
    ("a peer that is no address", {"REPRIEVE_MEMORY_PEER": "pod-1"}, "REPRIEVE_MEMORY_PEER must be host:port"),
    ("the own pod as peer", {"REPRIEVE_POD_IP": "10.0.0.1", "REPRIEVE_MEMORY_PEER": "10.0.0.1:8477"},
     "this pod's own replica server"),
    ("a peer on the own node", {"REPRIEVE_MEMORY_PEER": "10.0.0.2:8477", "REPRIEVE_NODE_NAME": "n1",
                                "REPRIEVE_MEMORY_PEER_NODE": "n1"}, "runs on node n1, this pod's node"),
]


@pytest.mark.parametrize(("env", "message"), [r[1:] for r in BAD_ENV], ids=[r[0] for r in BAD_ENV])
def test_bad_settings_are_refused_naming_what_to_change(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MemoryConfig.from_env({"REPRIEVE_MEMORY_DIR": "/dev/shm/x", **env}, pod_ip=env.get("REPRIEVE_POD_IP"))


def test_memory_settings_without_a_directory_are_refused() -> None:
    with pytest.raises(ConfigError, match="REPRIEVE_MEMORY_DIR is not"):
        MemoryConfig.from_env({"REPRIEVE_MEMORY_INTERVAL_STEPS": "5"})


def test_the_limit_must_hold_the_own_copy_the_peers_and_one_in_flight() -> None:
    assert required_bytes(1 << 30) == 3 << 30
    assert limit_problem(1 << 30, 3 << 30) is None and limit_problem(1 << 30, None) is None
    problem = limit_problem(1 << 30, 2 << 30)
    assert problem is not None
    assert "1.00 GiB" in problem and "3.00 GiB" in problem and "2.00 GiB" in problem and "raise the limit" in problem


@pytest.mark.parametrize("kind", ["bytes", "readonly mmap", "writable mmap", "numpy"])
def test_crc32c_reads_any_buffer_in_place_and_agrees_with_the_library(tmp_path: Path, kind: str) -> None:
    """A read-only mapping (the own-memory restore's source) is checked where it lies: it was copied whole first
    (a fresh allocation the size of the shard: most of an own restore's time on the test VM)."""
    import mmap
    import tracemalloc

    import google_crc32c
    import numpy as np

    payload = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    path = tmp_path / "data.bin"
    path.write_bytes(payload)
    with open(path, "r+b") as f:
        data: Any = {"bytes": payload, "numpy": np.frombuffer(payload, np.uint8).copy(),
                     "readonly mmap": mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ),
                     "writable mmap": mmap.mmap(f.fileno(), 0)}[kind]
    tracemalloc.start()
    try:
        got = crc32c(data, 4096, 4096 + (4 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == google_crc32c.value(payload[4096:4096 + (4 << 20)])
    assert peak < 1 << 20, f"crc32c of {kind} allocated {peak} bytes: a copy of the 4 MiB it reads"
    if isinstance(data, mmap.mmap):
        data.close()  # every view released


@pytest.mark.parametrize("threads", [1, 4])
def test_verify_checks_every_shard_on_threads_and_names_the_lowest_corrupt_one(threads: int) -> None:
    """Above VERIFY_PARALLEL_BYTES the shards are checked on several threads; the verdict is one thread's: every
    shard checked, and of several corrupt ones the lowest index named."""
    import numpy as np
    from reprieve.memtier import store

    n, size = 8, store.VERIFY_PARALLEL_BYTES // 4  # 8 shards of 16 MiB: 128 MiB, the parallel path
    data = np.random.default_rng(1).integers(0, 256, n * size, dtype=np.uint8)
    shards = [Shard(0, ((k * 4, k * 4 + 4), (0, 4)), k * size, size, crc32c(data, k * size, (k + 1) * size))
              for k in range(n)]
    m = Manifest(step=1, attempt=1, writer=0, num_processes=1, leaves=[LEAVES[0]], shards=shards, data_bytes=n * size)
    store.verify(data, m, where="copy", threads=threads)  # intact: silent
    data[5 * size + 7] ^= 1
    data[2 * size + 3] ^= 1
    with pytest.raises(CopyCorruptError, match=r"copy: shard 2 "):
        store.verify(data, m, where="copy", threads=threads)
    with pytest.raises(CopyCorruptError, match=r"copy: shard 5 "):
        store.verify(data, m, [4, 5, 6, 7], where="copy", threads=threads)
