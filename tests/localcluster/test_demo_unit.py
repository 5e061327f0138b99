"""``make demo``'s decisions (hack/demo.py), table-tested: when the unwarned node loss fires, and how a restart's
restore source reads in the comparison table. The demo itself runs by hand (``make demo``); its goodput and
restore-source arithmetic is tested in test_goodput_unit.py and test_restores_unit.py."""

from __future__ import annotations

import pytest
from demo import hard_kill_due, source_at
from localcluster.restores import Restore

pytestmark = pytest.mark.unit

READY = {"after_checkpoint": 50, "notice_node_deleted": True, "phase": "Running", "attempt": 2, "notice_attempt": 1,
         "step": 650, "checkpoint_step": 600}


@pytest.mark.parametrize(("change", "due"), [
    ({}, True),                                   # the preemption's restart done, 50 steps past the checkpoint
    ({"step": 649}, False),                       # not yet 50 steps past it
    ({"step": 700, "checkpoint_step": 700}, False),  # a newer periodic checkpoint: count again from it
    ({"notice_node_deleted": False}, False),      # the noticed node still stands (its restart is not done)
    ({"attempt": 1}, False),                      # still the attempt the notice hit
    ({"phase": "Restarting"}, False),             # the gang is not running yet
    ({"checkpoint_step": None}, False),           # no checkpoint reported yet
    ({"after_checkpoint": 0}, False),             # --hard-kill-after-checkpoint 0: no unwarned loss
    ({"spares": "1/1"}, True),                    # in place: the used spare's replacement is ready
    ({"spares": "0/1"}, False),                   # ... not yet: the lost worker would wait for its pod
])
def test_hard_kill_due(change: dict, due: bool) -> None:
    assert hard_kill_due(**{**READY, **change}) is due


@pytest.mark.parametrize(("sources", "i", "cell"), [
    ([Restore(600, {0: "memory", 1: "peer"})], 0, "own+peer memory"),
    ([Restore(600, {0: "peer", 1: "peer"})], 0, "peer memory"),
    ([Restore(600, {})], 0, "storage"),
    ([Restore(600, {0: "storage", 1: "peer"})], 0, "mixed"),
    ([None], 0, "?"),
    ([], 1, "-"),
])
def test_source_at(sources: list, i: int, cell: str) -> None:
    assert source_at(sources, i) == cell
