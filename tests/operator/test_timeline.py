"""timeline: the timeline of a job from its status and Events (pure), drawn as SVG and HTML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from reprieve_operator.timeline import html, svg, timeline, write

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def ev(t: float, reason: str, message: str, type_: str = "Normal") -> dict[str, Any]:
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(T0 + t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"reason": reason, "message": message, "type": type_, "lastTimestamp": stamp}


def preempted_job() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Attempt 1 trains steps 0-49, a notice at 50 s, saves step 50, attempt 2 resumes at 51 and finishes."""
    hist = [{"attempt": 1, "created": T0, "ended": T0 + 60, "firstStep": 0, "firstStepTime": T0 + 5, "step": 50,
             "time": T0 + 55, "lostSteps": 0, "restartGap": 5.0, "startup": 4.0},
            {"attempt": 2, "created": T0 + 60, "ended": T0 + 120, "firstStep": 51, "firstStepTime": T0 + 70,
             "step": 99, "time": T0 + 119, "lostSteps": 0, "restartGap": 1.0, "startup": 9.0}]
    job = {"metadata": {"name": "llama", "namespace": "team-a"},
           "status": {"phase": "Succeeded", "attempt": 2, "completionTime": "2027-01-15T08:02:00Z",
                      "goodput": {"goodput": 0.83, "wallSeconds": 120.0, "productiveSeconds": 100.0,
                                  "badputSeconds": {"startup": 13.0, "restore": 0.0, "checkpoint": 0.0, "lost": 0.0,
                                                    "restartGap": 6.0}, "lostSteps": 0,
                                  "accounting": {"closed": {}, "lostSteps": 0, "open": [], "history": hist}}}}
    events = [ev(0, "AttemptStarted", "attempt 1: created 2 worker pod(s)"),
              ev(50, "PreemptionNotice", "node n1 will go away (gke-spot) by 2027-01-15T08:01:20Z; notice "
                                         "gke-spot/n1/1 delivered to attempt 1", "Warning"),
              ev(56, "CheckpointCommitted", "checkpoint of step 50 committed (attempt 1) after notice gke-spot/n1/1"),
              ev(58, "GangRestart", "attempt 1 saved and exited with the restart code (preemption)"),
              ev(60, "AttemptStarted", "attempt 2: created 2 worker pod(s)"),
              ev(120, "Succeeded", "finished at step 99 after 2 attempt(s)")]
    return job, events


def test_timeline_of_a_noticed_preemption() -> None:
    job, events = preempted_job()
    tl = timeline(job, events, T0 + 500)
    assert [r.attempt for r in tl.rows] == [1, 2] and tl.start == T0 and tl.end == pytest.approx(120, abs=1)
    assert (tl.rows[0].first_step, tl.rows[0].last_step, tl.rows[0].end) == (0, 50, 60.0)
    kinds = [m.kind for m in tl.marks]
    assert kinds == ["notice", "deadline", "commit", "restart", "succeeded"], tl.marks
    deadline = next(m for m in tl.marks if m.kind == "deadline")
    assert deadline.t == pytest.approx(80.0, abs=1)  # 08:01:20 is 80 s after T0 (08:00:00)


def test_svg_and_html_render_and_parse(tmp_path: Path) -> None:
    job, events = preempted_job()
    tl = timeline(job, events, T0 + 500)
    root = ET.fromstring(svg(tl))
    ns = "{http://www.w3.org/2000/svg}"
    classes = [e.get("class") for e in root.iter(f"{ns}rect")] + [e.get("class") for e in root.iter(f"{ns}line")]
    assert classes.count("train") == 2 and "gap" in classes and "mark notice" in classes
    page = html(tl, svg(tl))
    assert "<svg" in page and "team-a/llama: Succeeded" in page and "PreemptionNotice" in page
    svg_path, html_path = write(tl, tmp_path)
    assert svg_path.read_text().startswith("<svg") and html_path.stat().st_size > 1000


def test_hard_kill_shows_lost_steps_and_a_failure_shows_its_reason() -> None:
    hist = [{"attempt": 1, "created": T0, "ended": T0 + 60, "firstStep": 0, "firstStepTime": T0 + 5, "step": 49,
             "time": T0 + 54, "lostSteps": 10}]
    job = {"metadata": {"name": "lost", "namespace": "ns"}, "status": {"phase": "Failed", "goodput": {
        "accounting": {"history": hist, "open": [{"attempt": 2, "created": T0 + 60}]}}}}
    events = [ev(59, "GangRestart", "worker lost without notice (disruption)", "Warning"),
              ev(90, "TooManyFailures", "attempt 2: worker exited with code 1; maxFailures=0", "Warning")]
    tl = timeline(job, events, T0 + 100)
    assert tl.rows[0].lost_steps == 10 and tl.rows[1].last_step is None
    assert [m.kind for m in tl.marks] == ["restart", "failure"] and tl.marks[1].label == "TooManyFailures"
    root = ET.fromstring(svg(tl))
    assert any(e.get("class") == "lost" for e in root.iter("{http://www.w3.org/2000/svg}rect"))


def test_a_memory_restore_is_marked_with_its_tier_and_a_pairing_warning_is_no_failure() -> None:
    job, events = preempted_job()
    events += [ev(65, "Restored", "attempt 2 restored step 50 from the memory tier: own memory: process 0; a "
                                  "peer's memory: process 1"),
               ev(66, "MemoryPairingProblem", "process 0 (pod llama-0 on node n1) has no memory-tier peer",
                  "Warning")]
    tl = timeline(job, events, T0 + 500)
    restore = [m for m in tl.marks if m.kind == "restore"]
    assert [m.label for m in restore] == ["restored from memory"] and restore[0].t == pytest.approx(65, abs=1)
    assert "failure" not in [m.kind for m in tl.marks]
    assert "mark restore" in svg(tl)
