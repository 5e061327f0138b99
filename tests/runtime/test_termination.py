"""reprieve.termination: the container's termination message, one JSON object whose keys each writer sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reprieve import termination
from reprieve.termination import MAX_BYTES, merged, write

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("current,fields,want", [
    ("", {"peerLost": [1]}, {"peerLost": [1]}),
    ('{"peerLost": [1]}', {"progress": {"step": 9}}, {"peerLost": [1], "progress": {"step": 9}}),
    ('{"peerLost": [1], "progress": {"step": 9}}', {"peerLost": []}, {"progress": {"step": 9}}),
    ('{"progress": {"step": 9}}', {"progress": {"step": 12}}, {"progress": {"step": 12}}),
    ("Terminating: another task died", {"peerLost": [0]}, {"peerLost": [0]}),  # not ours: replaced
    ("[1, 2]", {"peerLost": [0]}, {"peerLost": [0]}),
])
def test_merged(current: str, fields: dict, want: dict) -> None:
    assert json.loads(merged(current, fields)) == want


def test_nothing_left_is_an_empty_message() -> None:
    assert merged('{"peerLost": [1]}', {"peerLost": None}) == ""


def test_a_part_too_big_for_the_kubelet_is_left_out_and_the_rest_kept() -> None:
    text = merged('{"peerLost": [1]}', {"progress": {"savedStepsAt": [[i, 1.5e9] for i in range(400)]}})
    assert len(text.encode()) <= MAX_BYTES and json.loads(text) == {"peerLost": [1]}


def test_written_only_where_the_kubelet_mounted_the_file(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    write({"peerLost": [2]}, str(log))
    assert not log.exists()
    log.touch()
    write({"peerLost": [2]}, str(log))
    write({"progress": {"step": 5}}, str(log))
    assert json.loads(log.read_text()) == {"peerLost": [2], "progress": {"step": 5}}


def test_a_write_is_over_the_old_message_never_a_truncated_file_and_the_same_report_is_not_rewritten(
        tmp_path: Path) -> None:
    """CI: the exit path repeated the peer watch's report while the watch aborted the process; the repeat had
    truncated the file and the abort came before its bytes: an empty message, the last step lost. A report equal
    to what is there is not rewritten; a write goes over the old text and cuts it to length; ``end_process`` takes
    the writers' lock before it aborts."""
    log = tmp_path / "termination-log"
    log.write_text("")
    termination.write({"peerLost": [1], "lastStep": 61}, str(log))
    before = log.stat()
    termination.write({"peerLost": [1], "lastStep": 61}, str(log))
    assert log.stat().st_mtime_ns == before.st_mtime_ns and log.stat().st_ino == before.st_ino
    termination.write({"lastStep": None}, str(log))  # shorter: cut to length
    assert json.loads(log.read_text()) == {"peerLost": [1]}


def test_end_process_aborts_only_once_no_termination_message_is_being_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import threading
    import time

    from reprieve import peers

    released = threading.Event()
    aborted: list[bool] = []  # whether the write had ended when the abort came
    monkeypatch.setattr(os, "abort", lambda: aborted.append(released.is_set()))

    def writer() -> None:  # another thread in the middle of a write
        with termination.held():
            time.sleep(0.3)
            released.set()

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(0.05)
    peers.end_process("a peer is gone (test)")
    t.join()
    assert aborted == [True], "the abort came in the middle of the write"
