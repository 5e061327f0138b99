"""reprieve.checkpoint.catalog: the reprieve command's words (table tests, no storage)."""

from __future__ import annotations

import pytest
from reprieve.checkpoint.catalog import (
    Target,
    describe,
    describe_orbax,
    format_inspect,
    format_ls,
    format_verify,
    human_bytes,
    kind_label,
    latest,
    orbax_rows,
    parse_target,
    rows,
)
from reprieve.checkpoint.layout import CheckpointName as N
from reprieve.checkpoint.metadata import CheckpointMeta, LeafMeta

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text,target", [
    ("./ckpt", Target("./ckpt")),
    ("gs://b/run@120", Target("gs://b/run", 120)),
    ("s3://b/run/@7", Target("s3://b/run/", 7)),
    ("/ck/step_0000000120_a3", Target("/ck", 120, 3)),
    ("/ck/step_0000000120_a3/", Target("/ck", 120, 3)),
    ("gs://b/run/step_0000000005_a1@5", Target("gs://b/run", 5, 1)),
    ("/data/user@host/ckpt", Target("/data/user@host/ckpt")),  # an '@' inside a path is not a step
    ("step_0000000001_a1", Target(".", 1, 1)),
])
def test_parse_target(text: str, target: Target) -> None:
    assert parse_target(text) == target


@pytest.mark.parametrize("text,words", [
    ("", "a checkpoint URI is needed"),
    ("./ckpt@latest", "the step after '@' must be a non-negative integer, got 'latest'"),
    ("./ckpt@-1", "must be a non-negative integer"),
    ("/ck/step_0000000120_a3@7", "is the checkpoint of step 120, not of step 7"),
])
def test_parse_target_errors(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_target(text)


@pytest.mark.parametrize("n,text", [(None, "-"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                    (5 << 30, "5.0 GiB")])
def test_human_bytes(n: int | None, text: str) -> None:
    assert human_bytes(n) == text


def _meta(step: int, attempt: int = 1, kind: str = "periodic", run: str | None = "r") -> CheckpointMeta:
    leaves = [LeafMeta("['w']", "array", 0, [4, 3], "float32", [4, 3], 48,
                       {"type": "NamedSharding", "mesh": {"d": 2}, "spec": "PartitionSpec('d',)"}),
              LeafMeta("['key']", "array", 1, [2], "uint32", [2], 8, None, key_impl="threefry2x32"),
              LeafMeta("['epoch']", "json", value=3)]
    return CheckpointMeta(step, attempt, 2, leaves, extra={"note": "hi", "reprieve": {
        "kind": kind, "run": {"id": run, "tree": "abc", "leaves": 3}, "stepSeconds": 0.1}},
        versions={"reprieve": "0.1.0"}, created_unix=1_800_000_000.0, process_extra=[{"pos": 1}, {"pos": 2}])


def test_rows_say_what_each_entry_is() -> None:
    entries = [N(5, 1), N(3, 1), N(6, 1, "tmp"), N(2, 1, "deleting"), N(1, 1, "corrupt"), N(4, 1), N(7, 1)]
    fences = {2: frozenset({"step_0000000003_a1", "step_0000000005_a1"})}  # 4 was committed after attempt 2 began
    metas = {"step_0000000003_a1": _meta(3), "step_0000000005_a1": _meta(5, kind="final"),
             "step_0000000004_a1": _meta(4), "step_0000000007_a1": "reprieve.json is missing"}
    got = rows(entries, fences, metas, {"step_0000000001_a1.corrupt": "crc32c mismatch"})
    assert [(r["step"], r["state"]) for r in got] == [(1, "corrupt"), (2, "deleting"), (3, "complete"),
                                                       (4, "fenced"), (5, "complete"), (6, "tmp"), (7, "fenced")]
    assert got[4]["kind"] == "final" and got[4]["bytes"] == 56 and got[4]["run_id"] == "r"
    assert got[0]["reason"] == "crc32c mismatch"
    assert latest(got)["name"] == "step_0000000005_a1"  # type: ignore[index]
    text = format_ls("/ck", got, fences)
    assert "a restore takes step 5 (step_0000000005_a1)" in text
    assert "quarantined step_0000000001_a1.corrupt: crc32c mismatch" in text
    assert "fenced out (a stale attempt's: never restored)" in text and "attempts started here: 2" in text
    assert format_ls("/ck", [], {}) == "/ck: no checkpoints"


def test_a_checkpoint_whose_metadata_cannot_be_read_is_never_the_latest() -> None:
    got = rows([N(1, 1), N(2, 1)], {}, {"step_0000000001_a1": _meta(1), "step_0000000002_a1": "bad JSON"}, {})
    assert latest(got)["step"] == 1  # type: ignore[index]
    assert "unreadable: bad JSON" in format_ls("/ck", got, {})


def test_describe_and_inspect() -> None:
    d = describe("gs://b/run", "step_0000000009_a2", _meta(9, attempt=2))
    assert (d["step"], d["attempt"], d["kind"], d["processes"], d["bytes"]) == (9, 2, "periodic", 2, 56)
    assert d["run"] == {"id": "r", "tree": "abc", "leaves": 3} and d["extra"] == {"note": "hi"}
    assert d["data_positions"] == [{"pos": 1}, {"pos": 2}] and d["timings"] == {"stepSeconds": 0.1}
    text = format_inspect(d)
    assert text.startswith("gs://b/run/step_0000000009_a2\n  step 9, attempt 2, kind periodic")
    assert "run: r, state structure abc (3 leaves)" in text
    assert "data position of process 1: {'pos': 2}" in text
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("['")}
    assert lines["['w']"][1:4] == ["array", "4x3", "float32"] and "mesh" not in text  # d=2 shown as such
    assert "d=2" in text and lines["['key']"][2:4] == ["()", "key<threefry2x32>"]
    assert lines["['epoch']"][-1] == "3"


def test_format_verify() -> None:
    ok = {"uri": "/ck", "name": "step_0000000001_a1", "ok": True, "chunks": 3, "bytes": 2048, "problems": []}
    assert format_verify(ok) == "/ck/step_0000000001_a1: OK (3 chunk(s), 2.0 KiB read, every checksum checked)"
    bad = {**ok, "ok": False, "problems": ["leaf ['w'] (arrays/00000), chunk [(0, 2)]: DATA_LOSS"]}
    assert format_verify(bad).splitlines() == [
        "/ck/step_0000000001_a1: CORRUPT (3 chunk(s), 2.0 KiB read, every checksum checked)",
        "  leaf ['w'] (arrays/00000), chunk [(0, 2)]: DATA_LOSS"]


# -- issue 46 ----------------------------------------------------------------------------------------------------


def test_a_damaged_checkpoint_is_not_called_complete_and_not_what_a_restore_takes() -> None:
    """`reprieve ls` called a checkpoint with a truncated chunk `complete` and said a restore takes it."""
    metas = {"step_0000000001_a1": _meta(1), "step_0000000002_a1": _meta(2)}
    damage = {"step_0000000002_a1": "leaf ['w']: chunk step_0000000002_a1/arrays/00000/c/0/0 holds 20 bytes, 52 "
                                    "expected (truncated or not fully written)"}
    got = rows([N(1, 1), N(2, 1)], {}, metas, {}, damage)
    assert [(r["step"], r["state"]) for r in got] == [(1, "complete"), (2, "damaged")]
    assert latest(got)["step"] == 1  # type: ignore[index]
    text = format_ls("/ck", got, {})
    assert "damaged (a restore quarantines it and falls back)" in text
    assert f"damaged step_0000000002_a1: {damage['step_0000000002_a1']}" in text
    assert "a restore takes step 1 (step_0000000001_a1) unless a chunk fails its checksum: its chunk files have the " \
           "sizes reprieve.json implies; `reprieve verify /ck@1` reads every chunk" in text
    unverified = format_ls("gs://b/ck", rows([N(1, 1)], {}, metas, {}), {}, sizes_checked=False)
    assert "unverified: its chunks are not read here" in unverified


@pytest.mark.parametrize("kind,label", [
    ("final", "preemption"),  # the agreed save of a notice: it read as the run's last step
    ("early", "preemption (early)"),
    ("periodic", "periodic"), ("interval", "interval"), ("forced", "forced"), ("last", "last step"),
    ("something-newer", "something-newer"), (None, None),
])
def test_kind_labels_say_what_each_save_is(kind: str | None, label: str | None) -> None:
    assert kind_label(kind) == label


def test_ls_and_inspect_show_the_agreed_save_as_a_preemption() -> None:
    got = rows([N(5, 1)], {}, {"step_0000000005_a1": _meta(5, kind="final")}, {})
    assert got[0]["kind"] == "final"  # the JSON keeps the recorded kind (the metric's label)
    line = next(line for line in format_ls("/ck", got, {}).splitlines() if line.startswith("5 "))
    assert line.split()[2] == "preemption" and "final" not in line
    assert "kind preemption," in format_inspect(describe("/ck", "step_0000000005_a1", _meta(5, kind="final")))


ORBAX_ITEM = {"attempt": 2, "step": 3, "extra": {"note": 1, "reprieve": {"kind": "final", "run": {"id": "r1"},
                                                                         "notice": "n-1"}},
              "process_extra": [{"pos": 3}, {"pos": 4}],
              "orbax": {"item_handlers": {"state": "orbax.x.StandardCheckpointHandler",
                                          "reprieve": "orbax.x.JsonCheckpointHandler"},
                        "commit_timestamp_nsecs": 1_800_000_000_000_000_000}}


def test_orbax_rows_and_inspect() -> None:
    """The reprieve command refused reprieve.orbax's roots (exit 2, "use Orbax's tools": Orbax has none)."""
    steps = {1: {**ORBAX_ITEM, "attempt": 1, "step": 1}, 3: ORBAX_ITEM, 4: "no reprieve item (4/reprieve/metadata "
                                                                            "is missing)"}
    got = orbax_rows(steps, {2: frozenset()})  # attempt 2 started seeing nothing: step 1 (attempt 1) is fenced
    assert [(r["name"], r["attempt"], r["state"], r["kind"], r["run_id"], r["processes"]) for r in got] == [
        ("1", 1, "fenced", "final", "r1", 2), ("3", 2, "complete", "final", "r1", 2), ("4", None, "complete", None,
                                                                                        None, None)]
    assert latest(got)["name"] == "3"  # type: ignore[index]
    text = format_ls("/ob", got, {2: frozenset()}, orbax=True)
    assert text.startswith("/ob: reprieve.orbax.OrbaxCheckpointer's checkpoints (Orbax's format)")
    assert "a restore takes step 3" in text and "unreadable: no reprieve item" in text
    d = describe_orbax("/ob", 3, ORBAX_ITEM)
    assert (d["step"], d["attempt"], d["kind"], d["data_positions"], d["extra"]) == (3, 2, "final", [{"pos": 3},
                                                                                                    {"pos": 4}],
                                                                                      {"note": 1})
    text = format_inspect(d)
    assert "step 3, attempt 2, kind preemption" in text and "the agreed save of notice n-1" in text
    assert "items: reprieve (JsonCheckpointHandler), state (StandardCheckpointHandler)" in text
    assert "data position of process 1: {'pos': 4}" in text
