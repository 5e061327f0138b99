"""Pure parts of the checkpoint package: names, URIs, fencing rule, retention, specs, metadata."""

from __future__ import annotations

import json

import pytest
from reprieve.checkpoint import fencing, layout, retention, spec
from reprieve.checkpoint.layout import CheckpointName as N
from reprieve.checkpoint.metadata import CheckpointCorruptError, CheckpointMeta, LeafMeta

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name,want", [
    ("step_0000000042_a3", N(42, 3, "committed")),
    ("step_0000000042_a3.tmp", N(42, 3, "tmp")),
    ("step_0000000042_a3.deleting", N(42, 3, "deleting")),
    ("step_0000000042_a3/", N(42, 3, "committed")),
    ("step_42_a3", None),
    ("step_0000000042", None),
    ("attempts", None),
    ("step_0000000042_a3.tmp.x", None),
])
def test_parse_name(name: str, want: N | None) -> None:
    assert layout.parse_name(name) == want
    if want is not None:
        assert str(want) == name.rstrip("/")


def test_names_round_trip() -> None:
    assert layout.committed_name(7, 2) == "step_0000000007_a2"
    assert layout.parse_name(layout.tmp_name(7, 2)) == N(7, 2, "tmp")
    assert layout.parse_fence_name(layout.fence_name(12)) == 12
    assert layout.parse_fence_name("attempt_12.json") is None
    with pytest.raises(ValueError, match="step and attempt must be >= 0"):
        layout.committed_name(-1, 1)


@pytest.mark.parametrize("uri,scheme,bucket,path", [
    ("/ck", "file", "", "/ck"),
    ("rel/dir", "file", "", "/work/rel/dir"),
    ("file:///a/b/", "file", "", "/a/b"),
    ("gs://bkt/some/prefix", "gs", "bkt", "some/prefix/"),
    ("s3://bkt", "s3", "bkt", ""),
    ("s3://bkt/p/", "s3", "bkt", "p/"),
    ("./s3:/bucket/x", "file", "", "/work/s3:/bucket/x"),  # a local name with a colon, said as a path
    ("ckpt/run:2", "file", "", "/work/ckpt/run:2"),
])
def test_parse_uri(uri: str, scheme: str, bucket: str, path: str) -> None:
    loc = layout.parse_uri(uri, cwd="/work")
    assert (loc.scheme, loc.bucket, loc.path) == (scheme, bucket, path)


@pytest.mark.parametrize("uri,message", [
    ("", "must not be empty"),
    ("hdfs://x/y", "scheme must be one of"),
    ("gs:///nobucket", "missing bucket"),
    # issue 46: one slash, or none, made a local folder ./s3:/bucket/x/ (exit 0) where a bucket was meant
    ("s3:/bucket/x", (r"starts like a URI \(s3:\) but is not one of the accepted forms: .*s3://bucket/prefix; for a "
                      r"local directory whose name has a colon, write \./s3:/bucket/x")),
    ("gs:bucket", r"starts like a URI \(gs:\)"),
    ("file:relative/x", r"starts like a URI \(file:\) .*file:///abs/path"),
])
def test_parse_uri_errors(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        layout.parse_uri(uri)


# -- fencing ---------------------------------------------------------------------------------------
A1_10, A1_20, A2_30, A1_40 = N(10, 1), N(20, 1), N(30, 2), N(40, 1)


@pytest.mark.parametrize("committed,fences,want", [
    # no fences: everything committed is visible
    ([A1_10, A1_20], {}, [A1_10, A1_20]),
    # attempt 2 started seeing 10 and 20; attempt 1 committed 40 afterwards: fenced out
    ([A1_10, A1_20, A2_30, A1_40], {1: frozenset(), 2: frozenset({"step_0000000010_a1", "step_0000000020_a1"})},
     [A1_10, A1_20, A2_30]),
    # attempt 2 saw only 10 (20 was renamed after the fence was written): 20 invisible forever
    ([A1_10, A1_20], {2: frozenset({"step_0000000010_a1"})}, [A1_10]),
    # the first newer fence decides, even if a later fence lists it (it cannot, but be strict)
    ([A1_20], {2: frozenset(), 3: frozenset({"step_0000000020_a1"})}, []),
    # fences of the checkpoint's own or older attempts do not hide it
    ([A2_30], {1: frozenset(), 2: frozenset()}, [A2_30]),
    # tmp and deleting entries are never visible
    ([N(50, 2, "tmp"), N(60, 2, "deleting")], {}, []),
])
def test_visible(committed: list[N], fences: dict[int, frozenset[str]], want: list[N]) -> None:
    assert fencing.visible(committed, fences) == want
    assert fencing.latest(committed, fences) == (want[-1] if want else None)


def test_same_step_two_attempts_orders_newer_attempt_last() -> None:
    assert fencing.latest([N(5, 2), N(5, 1)], {}) == N(5, 2)


# -- retention -------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps,keep,every,deleted", [
    ([1, 2, 3, 4, 5], 3, None, [1, 2]),
    ([1, 2, 3, 4, 5], 10, None, []),
    ([10, 20, 30, 40, 50], 2, 20, [10, 30]),
    ([5], 1, None, []),
])
def test_select_deletions(steps: list[int], keep: int, every: int | None, deleted: list[int]) -> None:
    got = retention.select_deletions([N(s, 1) for s in steps], [], keep=keep, keep_every=every)
    assert [c.step for c in got] == deleted


def test_retention_deletes_fenced_out_and_validates() -> None:
    assert retention.select_deletions([N(2, 2)], [N(3, 1)], keep=1) == [N(3, 1)]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        retention.select_deletions([], [], keep=0)
    with pytest.raises(ValueError, match="keep_every must be >= 1"):
        retention.select_deletions([], [], keep=1, keep_every=0)


@pytest.mark.parametrize("quarantined,keep,deleted", [
    ([], 3, []),
    ([(1, 1, 1, "a"), (2, 1, 1, "b")], 3, []),
    ([(2, 1, 1, "b"), (1, 1, 1, "a"), (1, 1, 2, "a2"), (3, 2, 1, "c")], 2, ["a", "a2"]),  # oldest steps first
    ([(5, 1, 1700000000002, "r2"), (5, 1, 1700000000001, "r1")], 1, ["r1"]),  # one name quarantined twice
])
def test_select_quarantined_keeps_the_newest(quarantined: list, keep: int, deleted: list[str]) -> None:
    assert retention.select_quarantined(quarantined, keep=keep) == deleted


def test_quarantine_records_and_copies_are_named() -> None:
    assert layout.parse_quarantine_record("step_0000000041_a2-1700000000000.json") == (41, 2, 1700000000000)
    assert layout.parse_quarantine_record("step_0000000041_a2.json") is None
    assert layout.parse_name("step_0000000041_a2.corrupt-3") == N(41, 2, "corrupt", 3)


# -- specs -----------------------------------------------------------------------------------------
def test_kvstore_specs() -> None:
    f = layout.parse_uri("/ck")
    assert spec.kvstore_spec(f, "step_1/arrays/00000") == {"driver": "file", "path": "/ck/step_1/arrays/00000/"}
    assert spec.kvstore_spec(f) == {"driver": "file", "path": "/ck/"}
    g = layout.parse_uri("gs://b/p")
    assert spec.kvstore_spec(g, "x", env={}) == {"driver": "gcs", "bucket": "b", "path": "p/x/"}
    s = layout.parse_uri("s3://b")
    assert spec.kvstore_spec(s, "x", env={}) == {"driver": "s3", "bucket": "b", "path": "x/"}
    assert spec.kvstore_spec(s, "", env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}) == {
        "driver": "s3", "bucket": "b", "path": "", "endpoint": "http://127.0.0.1:9", "aws_region": "us-east-1"}


def test_zarr3_metadata_and_spec() -> None:
    md = spec.zarr3_metadata([8, 4], "bfloat16", [4, 4])
    assert md["data_type"] == "bfloat16"
    assert md["chunk_grid"]["configuration"]["chunk_shape"] == [4, 4]
    assert {"name": "crc32c"} in md["codecs"]
    assert spec.zarr3_metadata([3], "bool", [3])["fill_value"] is False
    s = spec.zarr3_spec({"driver": "file", "path": "/x/"}, md)
    assert s["fill_missing_data_reads"] is False and s["metadata"] == md
    assert spec.chunk_shape_for([0, 5], [0, 5]) == [1, 5]
    with pytest.raises(TypeError, match="dtype 'object' is not supported"):
        spec.zarr_dtype("object")
    with pytest.raises(ValueError, match="different rank"):
        spec.chunk_shape_for([2, 2], [2])


MiB = 1 << 20


@pytest.mark.parametrize(("shard", "itemsize", "cap", "expected"), [
    ([4096, 1024], 4, 16 * MiB, [4096, 1024]),         # exactly at the cap: one chunk
    ([8192, 1024], 4, 16 * MiB, [4096, 1024]),         # 32 MiB: halved along the leading dimension
    ([6000, 1024], 4, 16 * MiB, [3000, 1024]),         # the largest divisor of 6000 rows that fits 4096
    ([7, 1 << 22], 4, 16 * MiB, [1, 1 << 22]),         # 7 rows of 16 MiB: one row per chunk
    ([3, 3, 1 << 21], 4, 16 * MiB, [1, 1, 1 << 21]),   # splits the next dimension when one is not enough
    ([1, 1 << 23], 4, 16 * MiB, [1, 1 << 22]),         # a single row is split too
    ([5, 7], 4, None, [5, 7]),                         # no cap: the shard
    ([0, 5], 4, 8, [1, 1]),                            # empty dimensions keep chunks >= 1
])
def test_chunk_shape_divides_the_shard_under_the_cap(shard: list[int], itemsize: int, cap: int | None,
                                                     expected: list[int]) -> None:
    chunk = spec.chunk_shape_for(shard, shard, itemsize=itemsize, max_chunk_bytes=cap)
    assert chunk == expected
    assert all(max(1, s) % c == 0 for s, c in zip(shard, chunk))  # chunks tile the shard: one owner each


# -- metadata --------------------------------------------------------------------------------------
def test_metadata_round_trip_and_errors() -> None:
    meta = CheckpointMeta(step=3, attempt=2, num_processes=4, extra={"pos": [1, 2]}, leaves=[
        LeafMeta(path="['w']", kind="array", index=0, shape=[4], dtype="float32", chunk_shape=[2], nbytes=16),
        LeafMeta(path="['step']", kind="json", value=3),
    ])
    back = CheckpointMeta.from_json(meta.to_json(), "f")
    assert back == meta and back.array_bytes == 16
    with pytest.raises(CheckpointCorruptError, match="ck/reprieve.json: metadata must be a JSON object, got text that is not JSON"):
        CheckpointMeta.from_json(meta.to_json()[:-10], "ck/reprieve.json")
    with pytest.raises(CheckpointCorruptError, match="format_version must be 1, got 99"):
        CheckpointMeta.from_json(b'{"format_version": 99}', "f")
    with pytest.raises(CheckpointCorruptError, match="missing or unknown field"):
        CheckpointMeta.from_json(b'{"format_version": 1, "leaves": []}', "f")


def test_metadata_from_a_newer_reprieve_of_the_same_format() -> None:
    """A top-level field added later (informational by the format's rule) is ignored, so an older reader does
    not quarantine the checkpoint; an unknown leaf field (how the bytes are stored) is refused."""
    meta = CheckpointMeta(step=3, attempt=2, num_processes=1, leaves=[
        LeafMeta(path="['w']", kind="array", index=0, shape=[4], dtype="float32", chunk_shape=[2], nbytes=16)])
    raw = json.loads(meta.to_json())
    newer = CheckpointMeta.from_json(json.dumps({**raw, "placement_hint": {"zone": "a"}}).encode(), "f")
    assert newer == meta and b"placement_hint" not in newer.to_json()
    raw["leaves"][0]["compression"] = "zstd"
    with pytest.raises(CheckpointCorruptError, match=r"f: metadata has a missing or unknown field .*compression"):
        CheckpointMeta.from_json(json.dumps(raw).encode(), "f")
