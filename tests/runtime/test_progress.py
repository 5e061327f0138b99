"""reprieve.progress: the loop's position read from another thread, and the reporter's throttling."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from localcluster.testing import wait_for
from reprieve.notice import PROGRESS_ANNOTATION
from reprieve.progress import LoopProgress, ProgressReporter, progress_annotation

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class FakeClient:
    """Records patches (the real client is tested against a real API server in test_notice_kube.py)."""

    def __init__(self, fail: bool = False) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def patch_pod_annotations(self, ns: str, pod: str, body: dict[str, str], *, timeout_s: float) -> None:
        if self.fail:
            raise OSError("connection refused")
        with self.lock:
            self.bodies.append(json.loads(body[PROGRESS_ANNOTATION]))


def test_loop_progress_fields() -> None:
    lp = LoopProgress()
    assert lp.fields() == {}
    now = time.perf_counter()
    lp.first = (10, now - 1.0)
    lp.last = (20, now)
    lp.step_seconds, lp.restore_seconds, lp.save_blocking_seconds = 0.1, 2.0, 0.5
    f = lp.fields()
    assert (f["step"], f["firstStep"], f["stepSeconds"], f["restoreSeconds"], f["saveBlockingSeconds"]) == \
        (20, 10, 0.1, 2.0, 0.5)
    assert f["stepAt"] == pytest.approx(time.time(), abs=0.5) and f["stepAt"] - f["firstStepAt"] == pytest.approx(1.0)
    assert "savedStepsAt" not in f  # nothing saved yet


def test_saved_steps_carry_when_the_loop_finished_them_newest_two_of_each_kind() -> None:
    """Where a next attempt may resume (a storage or a memory copy): the operator splits kept from lost time at
    the step it resumes behind (docs/goodput.md)."""
    lp = LoopProgress()
    now = time.perf_counter()
    lp.first, lp.last = (0, now - 10.0), (50, now)
    for step in (10, 20, 30):
        lp.mark_saved(step, "storage", now - 10.0 + step / 5)
    for step in (44, 46, 48):
        lp.mark_saved(step, "memory", now - 10.0 + step / 5)
    f = lp.fields()
    assert [s for s, _ in f["savedStepsAt"]] == [20, 30, 46, 48]
    assert f["savedStepsAt"][0][1] == pytest.approx(f["firstStepAt"] + 4.0, abs=0.002)
    body = json.loads(progress_annotation(50, 30, 1, time.time(), f)[PROGRESS_ANNOTATION])
    assert body["savedStepsAt"] == f["savedStepsAt"]


def test_reporter_sends_live_progress_only_when_the_step_moves() -> None:
    client = FakeClient()
    lp = LoopProgress()
    polls: list[dict[str, Any]] = []  # what the reporter's thread read, one entry per interval

    def source() -> dict[str, Any]:
        fields = lp.fields()
        polls.append(fields)
        return fields

    def polled(times: int) -> None:
        """``times`` more reads: the first may have read the state before the change, and the thread sends
        (or not) before it reads again, so after the last one every earlier read has been acted on."""
        seen = len(polls)
        wait_for(lambda: len(polls) >= seen + times, 10, f"{times} more progress reads", interval=0.01)

    reporter = ProgressReporter(client, "ns", "pod-0", attempt=2, interval_s=0.02)  # type: ignore[arg-type]
    reporter.start(source)
    polled(3)
    assert client.bodies == []  # no step finished yet: nothing to say
    lp.first = lp.last = (0, time.perf_counter())
    polled(3)
    assert [b["step"] for b in client.bodies] == [0]  # read at least twice: sent once
    lp.last = (5, time.perf_counter())
    polled(3)
    reporter.close()
    steps = [b["step"] for b in client.bodies]
    assert steps == [0, 5], steps  # one report per new step, however many intervals passed
    assert sum(p.get("step") == 5 for p in polls) >= 2, polls
    assert all(b["attempt"] == 2 and b["committedStep"] == -1 and b["firstStep"] == 0 for b in client.bodies)


def test_the_first_step_is_reported_at_once_not_an_interval_later() -> None:
    """A pod cut off the network seconds into its attempt has still said where the attempt started: without it
    the operator counted the steps the attempt lost as start-up (the 30-minute soak's fault 7: a partition of
    process 0 in an 8.5 s old attempt, operator 0 lost steps, step log 5)."""
    client = FakeClient()
    lp = LoopProgress()
    reporter = ProgressReporter(client, "ns", "pod-0", attempt=3, interval_s=60)  # type: ignore[arg-type]
    reporter.start(lp.fields)
    lp.first = lp.last = (7, time.perf_counter())
    reporter.first_step()
    wait_for(lambda: len(client.bodies) == 1, 10, "the first step's report")
    assert (client.bodies[0]["step"], client.bodies[0]["firstStep"], client.bodies[0]["attempt"]) == (7, 7, 3)
    t0 = time.monotonic()
    reporter.close()  # the thread waits up to 60 s for its next interval: close wakes it
    assert time.monotonic() - t0 < 5
    assert len(client.bodies) == 1


def test_commit_reports_are_rate_limited_and_carry_the_live_fields() -> None:
    client = FakeClient()
    lp = LoopProgress()
    lp.first, lp.last = (0, time.perf_counter()), (30, time.perf_counter())
    reporter = ProgressReporter(client, "ns", "pod-0", attempt=1, interval_s=0, min_interval_s=60)  # type: ignore[arg-type]
    reporter.start(lp.fields)
    reporter.report(29, 20)
    reporter.report(30, 25)  # within min_interval_s: dropped
    time.sleep(0.2)
    reporter.report(31, 30, force=True)  # the exit path: always, synchronously
    assert [(b["step"], b["committedStep"]) for b in client.bodies] == [(30, 20), (31, 30)]
    assert client.bodies[0]["firstStep"] == 0
    reporter.close()


def test_a_failing_api_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    lp = LoopProgress()
    lp.first = lp.last = (0, time.perf_counter())
    reporter = ProgressReporter(FakeClient(fail=True), "ns", "pod-0", attempt=1, interval_s=0.02)  # type: ignore[arg-type]
    reporter.start(lp.fields)
    reporter.report(1, 1, force=True)
    time.sleep(0.1)
    reporter.close()
    assert "could not patch progress annotation of pod ns/pod-0" in caplog.text and reporter.patches == 0


@pytest.mark.parametrize("api_down", [False, True])
def test_the_exit_report_is_left_in_the_termination_message_too(tmp_path: Any, api_down: bool) -> None:
    """A job that ends while the API server is down still tells the operator its last steps: the kubelet copies
    the termination message into the pod's status when it can (reprieve.termination). Other keys stay."""
    log = tmp_path / "termination-log"
    log.write_text(json.dumps({"peerLost": [1]}))
    client = FakeClient(fail=api_down)
    reporter = ProgressReporter(client, "ns", "p", 3, clock=lambda: 1_700_000_000.0,  # type: ignore[arg-type]
                                termination_log=str(log)).start(lambda: {"step": 99})
    reporter.report(99, 99, force=True)
    reporter.close()
    left = json.loads(log.read_text())
    assert left["peerLost"] == [1]
    assert (left["progress"]["attempt"], left["progress"]["step"], left["progress"]["committedStep"]) == (3, 99, 99)
    assert client.bodies == ([] if api_down else [left["progress"]])


def test_the_exit_report_is_left_at_once_and_patched_beside_the_teardown(tmp_path: Any) -> None:
    """``final``: the termination message is written before it returns, the patch goes in the thread it returns
    (the teardown closes the rest meanwhile and joins it before the process leaves)."""
    log = tmp_path / "termination-log"
    log.write_text("{}")  # the kubelet's file
    landed = threading.Event()
    gate = threading.Event()

    class Slow(FakeClient):
        def patch_pod_annotations(self, ns: str, pod: str, body: dict[str, str], *, timeout_s: float) -> None:
            assert gate.wait(10)
            super().patch_pod_annotations(ns, pod, body, timeout_s=timeout_s)
            landed.set()

    client = Slow()
    reporter = ProgressReporter(client, "ns", "p", 3, clock=lambda: 1_700_000_000.0,  # type: ignore[arg-type]
                                termination_log=str(log)).start(lambda: {"step": 99})
    thread = reporter.final(98, 97, timeout_s=2.0)
    left = json.loads(log.read_text())["progress"]
    assert (left["step"], left["committedStep"]) == (99, 97)  # the loop's newer step wins, as in report()
    assert thread.is_alive() and client.bodies == []  # the patch is still on its way
    gate.set()
    thread.join(10)
    reporter.close()
    assert landed.is_set() and client.bodies == [left] and reporter.patches == 1
