"""Restore sources read back from trainer logs (hack/localcluster/restores.py), table-tested."""

from __future__ import annotations

import pytest
from localcluster.restores import Restore, for_resume, parse

pytestmark = pytest.mark.unit

PREFIX = "2026-11-26 05:40:01,123 INFO reprieve.memtier.restore_round: "
TIERED_0 = PREFIX + ("restored step 339 on process 0 from its own pod's memory in 0.120s (gang: 0=memory, "
                     "1=peer)")
TIERED_1 = PREFIX + ("restored step 339 on process 1 from a peer's memory over the network in 0.310s (gang: "
                     "0=memory, 1=peer)")
PLAIN = ("2026-11-26 05:40:01,500 INFO reprieve.job: restored step 339 from /ckpt/checkpoints: resuming at step 340 "
         "(saved by attempt 3)")
STORAGE_ONLY = ("2026-11-26 05:41:01,500 INFO reprieve.job: restored step 300 from /ckpt/checkpoints: resuming at "
                "step 301 (saved by attempt 2 of run 'x')")


@pytest.mark.parametrize(("lines", "step", "sources", "kind", "uri"), [
    # the memory tier's per-process lines and the job's line: sources per process, the URI kept
    ([TIERED_0, TIERED_1, PLAIN], 339, {0: "memory", 1: "peer"}, "memory", "/ckpt/checkpoints"),
    # the job's line alone (no memory tier): storage for every process
    ([STORAGE_ONLY], 300, {}, "storage", "/ckpt/checkpoints"),
    # a memory-tier restore that the round sent to storage: the gang says so
    ([PREFIX + "restored step 300 on process 1 from storage in 0.5s (gang: 0=storage, 1=storage)"], 300,
     {0: "storage", 1: "storage"}, "storage", None),
    # mixed: one process read its part from storage
    ([PREFIX + "restored step 300 on process 0 from storage in 0.5s (gang: 0=storage, 1=memory)"], 300,
     {0: "storage", 1: "memory"}, "mixed", None),
])
def test_parse_reads_each_restores_sources(lines: list[str], step: int, sources: dict[int, str], kind: str,
                                          uri: str | None) -> None:
    got = parse(lines)
    assert list(got) == [step]
    r = got[step]
    assert (r.sources, r.kind, r.uri) == (sources, kind, uri)


def test_the_slowest_process_is_the_restores_time_and_unrelated_lines_are_ignored() -> None:
    got = parse(["starting at step 0", TIERED_1, "restored nothing", TIERED_0])
    assert got[339].seconds == pytest.approx(0.31)


def test_a_storage_restore_says_how_long_its_read_took() -> None:
    line = STORAGE_ONLY.replace("/ckpt/checkpoints: resuming", "s3://bucket/run/checkpoints in 1.25s: resuming")
    (r,) = parse([line]).values()
    assert (r.step, r.uri, r.seconds, r.kind) == (300, "s3://bucket/run/checkpoints", 1.25, "storage")
    assert r.describe() == "step 300: storage (all processes) in 1.25s"
    assert parse([STORAGE_ONLY])[300].seconds is None  # a runtime before the seconds were logged


def test_an_interruption_finds_the_restore_it_resumed_from() -> None:
    restores = parse([TIERED_0, STORAGE_ONLY])
    assert for_resume(restores, 340) == restores[339]
    assert for_resume(restores, 301) == restores[300]
    assert for_resume(restores, 5) is None


@pytest.mark.parametrize(("restore", "text"), [
    (Restore(339, {0: "memory", 1: "peer"}, seconds=0.31),
     "step 339: process 0 from own memory, 1 from peer's memory in 0.31s"),
    (Restore(300, {}, "/ckpt"), "step 300: storage (all processes)"),
])
def test_describe(restore: Restore, text: str) -> None:
    assert restore.describe() == text
