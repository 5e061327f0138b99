"""reprieve.termination: the container's termination message, one JSON object whose keys each writer sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
