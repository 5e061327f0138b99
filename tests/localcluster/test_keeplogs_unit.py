"""keeplogs: the soak's copies of pod logs that outlive their pods (a real node's kubelet removes a deleted pod's
logs; issue #25's notice-during-restart lost the killed spare's trainer log with its pod)."""

from __future__ import annotations

from pathlib import Path

import pytest
from localcluster.keeplogs import LogKeeper, copy_new, real_node_logs

pytestmark = pytest.mark.unit

# (the source's content or None: gone, the offset copied before, the copy's content before)
#   -> (the new offset, the copy's content after)
ROWS = {
    "a new file: all of it": (b"a\nb\n", 0, None, 4, b"a\nb\n"),
    "grown: only what it gained": (b"a\nb\nc\n", 4, b"a\nb\n", 6, b"a\nb\nc\n"),
    "unchanged: nothing": (b"a\nb\n", 4, b"a\nb\n", 4, b"a\nb\n"),
    "gone (its pod deleted): the copy stays as it was": (None, 4, b"a\nb\n", 4, b"a\nb\n"),
    "shorter than copied: another file in its place, copied from its start": (b"x\n", 4, b"a\nb\n", 2,
                                                                               b"a\nb\nx\n"),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_copy_new(name: str, tmp_path: Path) -> None:
    content, offset, before, new_offset, after = ROWS[name]
    src, dst = tmp_path / "src.log", tmp_path / "kept" / "dst.log"
    if content is not None:
        src.write_bytes(content)
    if before is not None:
        dst.parent.mkdir(parents=True)
        dst.write_bytes(before)
    assert copy_new(src, dst, offset) == new_offset
    assert (dst.read_bytes() if dst.exists() else None) == after


def test_a_deleted_pods_log_is_kept_up_to_the_last_copy(tmp_path: Path) -> None:
    work = tmp_path / "cluster"
    logs = work / "realnodes" / "w-1" / "pod-logs" / "soak_soak-spare-x_uid1" / "trainer"
    logs.mkdir(parents=True)
    (logs / "0.log").write_text("supervisor: attempt 3 starting\n")
    other = work / "realnodes" / "w-1" / "pod-logs" / "free_free-0_uid2" / "trainer"  # another namespace
    other.mkdir(parents=True)
    (other / "0.log").write_text("not kept\n")
    keeper = LogKeeper(lambda: real_node_logs(work, "soak"), tmp_path / "kept")
    keeper.copy_once()
    with open(logs / "0.log", "a") as f:
        f.write("attempt 3: trainer exited with code 137\n")
    keeper.copy_once()
    (logs / "0.log").unlink()  # the pod deleted: the kubelet removes its logs
    keeper.stop()
    kept = tmp_path / "kept" / "w-1" / "soak_soak-spare-x_uid1" / "trainer" / "0.log"
    assert kept.read_text() == "supervisor: attempt 3 starting\nattempt 3: trainer exited with code 137\n"
    assert [p.name for p in (tmp_path / "kept").rglob("*.log")] == ["0.log"]
