"""reprieve.peers: which peer went quiet, said before JAX's heartbeat timeout ends the process (a fake clock; the
real thing, a SIGKILLed peer of a real 2-process job, is in test_startup_and_peers.py)."""

from __future__ import annotations

import pytest
from reprieve.peers import Liveness, silent_line

pytestmark = pytest.mark.unit


def test_a_peer_whose_record_stops_changing_is_silent_once_then_back() -> None:
    live = Liveness([1, 2], threshold_s=5.0, now=0.0)
    assert live.observe({1: 1, 2: 1}, 1.0) == []
    assert live.observe({1: 2, 2: 1}, 3.0) == []  # 2 unchanged for 2 s: not yet
    assert live.observe({1: 3, 2: 1}, 6.5) == [("silent", 2, 5.5)]
    assert live.observe({1: 4, 2: 1}, 9.0) == []  # said once
    assert live.observe({1: 5, 2: 2}, 10.0) == [("back", 2, 9.0)]
    assert live.observe({1: 6, 2: 3}, 11.0) == []


def test_a_peer_that_never_wrote_counts_from_the_start() -> None:
    live = Liveness([1], threshold_s=2.0, now=10.0)
    assert live.observe({}, 11.0) == []
    assert live.observe({}, 12.5) == [("silent", 1, 2.5)]


def test_the_line_names_the_process_its_pod_and_what_follows() -> None:
    line = silent_line(1, 2, "job-w1", 5.2, 10, 120)
    assert line.startswith("process 1 of 2 (pod job-w1) has not been heard from for 5.2 s")
    assert "JAX ends this process within about 5 s" in line and "step 120" in line
    assert "(pod" not in silent_line(1, 2, None, 1, 10, None)
