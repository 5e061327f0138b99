"""events.for_status_change: Succeeded with the goodput, CheckpointCommitted throttled except after a notice."""

from __future__ import annotations

import pytest
from op_jobs import make_job
from reprieve_operator.policy.events import COMMIT_EVENT_SECONDS, Event, for_status_change

pytestmark = pytest.mark.unit

NOTICE = {"id": "gke-spot/n/1", "node": "n", "reason": "gke-spot", "deadline": "2026-11-22T03:01:00Z",
          "observedAt": "2026-11-22T03:00:00Z", "attempt": 1}
T = 1_800_000_000.0


def test_checkpoint_events_are_throttled() -> None:
    job = make_job().with_status(phase="Running", attempt=1).model()
    patch = {"lastCheckpointStep": 100, "lastCheckpointTime": "2026-11-22T02:00:00Z"}
    (ev,) = for_status_change(job, patch, T, None)
    assert ev == Event("CheckpointCommitted", "checkpoint of step 100 committed (attempt 1)")
    assert for_status_change(job, patch, T, T - 10) == []
    assert len(for_status_change(job, patch, T, T - COMMIT_EVENT_SECONDS)) == 1


def test_the_agreed_save_after_a_notice_always_gets_its_event() -> None:
    job = make_job().with_status(phase="Preempting", attempt=1, lastNotice=NOTICE).model()
    patch = {"lastCheckpointStep": 120, "lastCheckpointTime": "2026-11-22T03:00:09Z"}
    (ev,) = for_status_change(job, patch, T, T - 1)
    assert ev.message.endswith("after notice gke-spot/n/1")
    before = {"lastCheckpointStep": 100, "lastCheckpointTime": "2026-11-22T02:59:00Z"}  # a periodic one before it
    assert for_status_change(job, before, T, T - 1) == []


def test_succeeded_says_how_it_went() -> None:
    job = make_job().with_status(phase="Running", attempt=2, step=99,
                                 restarts={"preemption": 1, "failure": 0, "disruption": 0}).model()
    gp = {"goodput": 0.8333, "wallSeconds": 120.0, "badputSeconds": {"startup": 7.0, "restore": 2.0,
                                                                      "checkpoint": 0.0, "lost": 0.0,
                                                                      "restartGap": 11.0}}
    (ev,) = for_status_change(job, {"phase": "Succeeded", "goodput": gp}, T, None)
    assert ev.reason == "Succeeded" and ev.type == "Normal"
    assert ev.message == ("finished at step 99 after 2 attempt(s) (restarts: 1 preemption, 0 failure, 0 disruption); "
                          "goodput 83.3% of 120s; badput startup 7s, restore 2s, restartGap 11s")
    done = make_job().with_status(phase="Succeeded", attempt=2).model()
    assert for_status_change(done, {"phase": "Succeeded"}, T, None) == []
