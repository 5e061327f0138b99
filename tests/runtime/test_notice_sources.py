"""Notice sources in this process: a real SIGTERM, a real downward-API file, a user callable, watch events."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

import pytest
from localcluster.testing import wait_for
from reprieve.background import backoff_delays, failure_log_level
from reprieve.kube import PodWatchSource
from reprieve.notice import NOTICE_ANNOTATION, PROGRESS_ANNOTATION, Notice
from reprieve.notice_sources import NoticeFile, NoticeHub, PollingSource, SigtermSource, UserCallable
from reprieve.progress import progress_annotation

from tests.runtime.helpers_agreement import write_notice_file

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Sink:
    def __init__(self) -> None:
        self.notices: list[Notice] = []
        self.event = threading.Event()

    def __call__(self, notice: Notice) -> None:
        self.notices.append(notice)
        self.event.set()

    def wait(self, count: int = 1, timeout: float = 5.0) -> list[Notice]:
        limit = time.monotonic() + timeout
        while len(self.notices) < count:
            assert time.monotonic() < limit, f"only {len(self.notices)} notice(s) arrived"
            time.sleep(0.01)
        return self.notices


class Recorded:
    """A poll function that records what each call returned: the poller's own view of the source, so a test
    knows the state it set up was read (and what came of it) instead of sleeping and hoping it was."""

    def __init__(self, poll: Callable[[], Notice | None]) -> None:
        self._poll = poll
        self.results: list[Notice | None] = []

    def __call__(self) -> Notice | None:
        result = self._poll()
        self.results.append(result)
        return result

    def polled(self, times: int) -> list[Notice | None]:
        """Wait until ``times`` more polls have returned (the first may have begun before the caller's change);
        return every result so far."""
        seen = len(self.results)
        wait_for(lambda: len(self.results) >= seen + times, 5, f"{times} more polls", interval=0.005)
        return list(self.results)


@pytest.fixture
def hub() -> Iterator[tuple[NoticeHub, Sink]]:
    sink = Sink()
    h = NoticeHub(sink, idle_s=0.05).start()
    yield h, sink
    h.close()


@pytest.fixture
def restore_sigterm() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_sigterm_becomes_a_notice_and_chains_the_previous_handler(hub: tuple[NoticeHub, Sink],
                                                                   restore_sigterm: None) -> None:
    h, sink = hub
    calls: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    source = SigtermSource(h, grace_seconds=25, pod="job-0", process_id=0)
    assert source.install()
    before = time.time()
    os.kill(os.getpid(), signal.SIGTERM)
    notices = sink.wait()
    assert calls == [signal.SIGTERM]
    assert notices[0].reason == "sigterm" and notices[0].deadline == pytest.approx(before + 25, abs=2)
    source.uninstall()
    os.kill(os.getpid(), signal.SIGTERM)  # the previous handler is back
    time.sleep(0.05)
    assert calls == [signal.SIGTERM] * 2


def test_default_sigterm_disposition_is_not_chained(hub: tuple[NoticeHub, Sink], restore_sigterm: None) -> None:
    h, sink = hub
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    source = SigtermSource(h, grace_seconds=5, pod=None, process_id=3)
    source.install()
    os.kill(os.getpid(), signal.SIGTERM)  # would kill pytest if SIG_DFL were "chained"
    assert sink.wait()[0].id == "sigterm/local/3"
    source.uninstall()


@pytest.mark.parametrize("supervised", [True, False])
def test_the_supervisors_resize_signal_becomes_a_resize_notice_only_under_a_supervisor(
        hub: tuple[NoticeHub, Sink], restore_sigterm: None, supervised: bool) -> None:
    """A grow (issue 47): the supervisor stops its trainer with SIGUSR1; the runtime takes it as a notice to save at
    the earliest step (no deadline to train towards) for a resize. Outside a supervisor SIGUSR1 stays the user's."""
    from reprieve.supervisor.contract import RESIZE_SIGNAL

    h, sink = hub
    calls: list[int] = []
    signal.signal(RESIZE_SIGNAL, lambda signum, frame: calls.append(signum))
    source = SigtermSource(h, grace_seconds=25, pod="job-1", process_id=1, resize=supervised)
    assert source.install()
    try:
        os.kill(os.getpid(), RESIZE_SIGNAL)
        if supervised:
            notice = sink.wait()[0]
            assert (notice.id, notice.reason, notice.deadline_known) == ("resize/job-1/1", "resize", False)
        else:
            wait_for(lambda: calls, timeout=5, what="the user's SIGUSR1 handler")
            time.sleep(0.1)
            assert sink.notices == []
        assert calls == [RESIZE_SIGNAL]  # the handler installed before is chained (or left alone)
    finally:
        source.uninstall()
        signal.signal(RESIZE_SIGNAL, signal.SIG_DFL)


def test_replaced_handler_is_reported_once(hub: tuple[NoticeHub, Sink], restore_sigterm: None,
                                           caplog: pytest.LogCaptureFixture) -> None:
    h, _ = hub
    source = SigtermSource(h, grace_seconds=5, pod=None, process_id=0)
    source.install()
    with caplog.at_level(logging.WARNING, logger="reprieve.notice_sources"):
        source.check()
        assert not caplog.records
        signal.signal(signal.SIGTERM, lambda *a: None)
        source.check()
        source.check()
    assert len(caplog.records) == 1 and "was replaced" in caplog.records[0].getMessage()


def test_the_runtimes_own_exit_path_is_not_reported_as_a_replaced_handler(
        hub: tuple[NoticeHub, Sink], restore_sigterm: None, caplog: pytest.LogCaptureFixture) -> None:
    """Defect (issue 23): once the restart code is decided the job ignores SIGTERM itself; the hub's check then
    read SIG_IGN as a user's handler and warned "the SIGTERM handler of reprieve was replaced by SIG_IGN:
    SIGTERM will not trigger a checkpoint" at every committed exit (the demo's Recreate run showed it)."""
    from reprieve.notice_sources import ignore_termination_signals as _ignore_termination_signals

    h, _ = hub
    others = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)}
    source = SigtermSource(h, grace_seconds=5, pod=None, process_id=0)
    source.install()
    try:
        with caplog.at_level(logging.WARNING, logger="reprieve.notice_sources"):
            _ignore_termination_signals()  # what the job's restart teardown does, before it closes the sources
            source.check()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        assert caplog.records == []
    finally:
        for sig, handler in others.items():
            signal.signal(sig, handler)


def test_the_same_notice_again_is_said_to_be_in_force(caplog: pytest.LogCaptureFixture) -> None:
    """A second SIGTERM during a countdown was ignored without a word."""
    sink = Sink()
    state: list[str | None] = [None]
    h = NoticeHub(sink, idle_s=0.05, in_force=lambda: state[0]).start()
    try:
        with caplog.at_level(logging.INFO, logger="reprieve.notice_sources"):
            notice = Notice(id="sigterm/local/0", source="sigterm", reason="sigterm", deadline=time.time() + 30,
                            received_at=time.time())
            h.put(notice)
            sink.wait(1)
            state[0] = "agreed save at step 12, deadline in 29.0s"
            h.put(notice)
            sink.wait(2)
    finally:
        h.close()
    again = [r.getMessage() for r in caplog.records if "again" in r.getMessage()]
    assert again == [("notice sigterm/local/0 via sigterm again: notice already in force (agreed save at step 12, "
                     "deadline in 29.0s); nothing changes")]


def test_install_off_the_main_thread_is_refused(hub: tuple[NoticeHub, Sink]) -> None:
    h, _ = hub
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(SigtermSource(h, grace_seconds=1, pod=None,
                                                                    process_id=0).install()))
    t.start()
    t.join()
    assert result == [False]


def test_notice_file_is_polled(tmp_path: Path, hub: tuple[NoticeHub, Sink]) -> None:
    h, sink = hub
    path = tmp_path / "annotations"
    reader = Recorded(NoticeFile(str(path)))
    poller = PollingSource("notice-file", reader, h, 0.02).start()
    try:
        assert reader.polled(3) == [None] * len(reader.results)  # missing file: nothing
        path.write_text('other.io/a="b"')
        assert reader.polled(3) == [None] * len(reader.results)  # no notice annotation: nothing
        assert sink.notices == []
        write_notice_file(path, {"id": "n-1", "reason": "gke-spot", "deadline": "2030-01-01T00:00:00Z"})
        notice = sink.wait()[0]
        assert (notice.id, notice.source, notice.reason) == ("n-1", "notice-file", "gke-spot")
    finally:
        poller.close()


def test_malformed_notice_file_means_save_now(tmp_path: Path, hub: tuple[NoticeHub, Sink]) -> None:
    h, sink = hub
    path = tmp_path / "annotations"
    path.write_text(f'{NOTICE_ANNOTATION}="{{\\"id\\": broken"')
    poller = PollingSource("notice-file", NoticeFile(str(path)), h, 0.02).start()
    try:
        notice = sink.wait()[0]
        assert notice.reason == "malformed" and not notice.deadline_known
        assert notice.deadline <= time.time()
    finally:
        poller.close()


def test_user_callable_that_raises_does_not_stop_polling(hub: tuple[NoticeHub, Sink],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    h, sink = hub
    answers = iter([RuntimeError("metadata server down"), None, ("maintenance", time.time() + 60)])

    def fn() -> object:
        answer = next(answers, None)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with caplog.at_level(logging.WARNING, logger="reprieve.notice_sources"):
        poller = PollingSource("callable", UserCallable(fn, default_grace_seconds=30), h, 0.02).start()
        try:
            assert sink.wait()[0].reason == "maintenance"
        finally:
            poller.close()
    assert any("metadata server down" in r.getMessage() for r in caplog.records)


def test_pod_watch_events() -> None:
    got: list[Notice] = []
    source = PodWatchSource(client=None, namespace="ns", pod="p", put=got.append)  # type: ignore[arg-type]
    value = json.dumps({"id": "a", "reason": "gke-spot", "deadline": "2030-01-01T00:00:00Z"})
    pod = {"metadata": {"annotations": {NOTICE_ANNOTATION: value}}}
    source.handle_event({"type": "ADDED", "object": {"metadata": {}}})
    source.handle_event({"type": "MODIFIED", "object": pod})
    source.handle_event({"type": "MODIFIED", "object": pod})  # same value: no new notice
    source.handle_event({"type": "DELETED", "object": pod})
    source.handle_event({"type": "ERROR", "object": {"code": 410}})
    assert [n.id for n in got] == ["a"] and got[0].source == "annotation"


def test_pod_watch_ignores_a_notice_of_another_attempt() -> None:
    got: list[Notice] = []
    source = PodWatchSource(client=None, namespace="ns", pod="p", put=got.append,  # type: ignore[arg-type]
                            attempt=3)
    for i, attempt in enumerate([2, 3]):
        value = json.dumps({"id": f"n{i}", "reason": "gke-spot", "deadline": "2030-01-01T00:00:00Z",
                            "attempt": attempt})
        source.handle_event({"type": "MODIFIED", "object": {"metadata": {"annotations": {NOTICE_ANNOTATION: value}}}})
    assert [n.id for n in got] == ["n1"]


def test_notice_file_ignores_a_notice_of_another_attempt(tmp_path: Path, hub: tuple[NoticeHub, Sink]) -> None:
    h, sink = hub
    path = tmp_path / "annotations"
    write_notice_file(path, {"id": "old", "reason": "gke-spot", "deadline": "2030-01-01T00:00:00Z", "attempt": 1})
    reader = Recorded(NoticeFile(str(path), attempt=2))
    poller = PollingSource("notice-file", reader, h, 0.02).start()
    try:
        # the previous attempt's notice, still on the kept pod: read several times, never a notice
        assert reader.polled(3) == [None] * len(reader.results)
        assert sink.notices == []
        write_notice_file(path, {"id": "new", "reason": "gke-spot", "deadline": "2030-01-01T00:00:00Z",
                                 "attempt": 2})
        assert [n.id for n in sink.wait()] == ["new"]
    finally:
        poller.close()


def test_notice_file_parses_a_notice_once_while_other_annotations_change(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A pod kept across an in-place restart carries the previous attempt's notice, its deadline long past,
    while the progress heartbeat rewrites the file every few seconds: the notice is logged as ignored once, and
    its past deadline not at all (it used to be warned about at every heartbeat for the rest of the attempt)."""
    from localcluster.downward import format_map

    path = tmp_path / "annotations"
    old = json.dumps({"id": "kept-pod-old", "reason": "gke-spot", "deadline": "2020-01-01T00:00:00Z", "attempt": 1})
    past = json.dumps({"id": "kept-pod-past", "reason": "gke-spot", "deadline": "2020-01-01T00:00:00Z", "attempt": 2})
    read = NoticeFile(str(path), attempt=2)
    with caplog.at_level(logging.INFO, logger="reprieve.notice"):
        for beat in range(3):
            path.write_text(format_map({NOTICE_ANNOTATION: old, PROGRESS_ANNOTATION: f'{{"step": {beat}}}'}))
            assert read() is None
        ignored = [r for r in caplog.records if "ignored" in r.getMessage()]
        assert len(ignored) == 1 and not [r for r in caplog.records if "past" in r.getMessage()], caplog.text
        for beat in range(3):  # a notice that counts, its deadline past: warned once, returned at every poll
            path.write_text(format_map({NOTICE_ANNOTATION: past, PROGRESS_ANNOTATION: f'{{"step": {beat}}}'}))
            notice = read()
            assert notice is not None and notice.id == "kept-pod-past"
        assert len([r for r in caplog.records if "already" in r.getMessage()]) == 1, caplog.text
        path.write_text(format_map({PROGRESS_ANNOTATION: '{"step": 9}'}))
        assert read() is None  # the notice annotation removed


def test_a_notice_file_left_from_an_earlier_run_does_not_count(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Defect (issue 23): on a laptop the attempt is always 1, so a notice file left behind by an earlier run
    (its deadline long past when this process started) made every restart save one step and exit 1 ("committed
    AFTER the deadline"). Without an ``attempt`` it is a leftover: logged once as stale and ignored. A notice the
    operator delivered to this very attempt still counts, but a deadline that passed before the process started
    is not this attempt's to miss: it saves at once and is never late."""
    path = tmp_path / "annotations"
    started = time.time()
    write_notice_file(path, {"id": "left", "reason": "test", "deadline": "2020-01-01T00:00:00Z"})
    read = NoticeFile(str(path), attempt=1, started_at=started)
    with caplog.at_level(logging.INFO, logger="reprieve.notice"):
        assert read() is None and read() is None
    stale = [r.getMessage() for r in caplog.records if "before this process started" in r.getMessage()]
    assert len(stale) == 1 and "left" in stale[0] and "ignored" in stale[0], caplog.text
    write_notice_file(path, {"id": "ours", "reason": "test", "deadline": "2020-01-01T00:00:00Z", "attempt": 1})
    notice = read()
    assert notice is not None and notice.id == "ours" and not notice.deadline_known
    future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started + 120))
    write_notice_file(path, {"id": "new", "reason": "test", "deadline": future})  # written while it runs
    notice = read()
    assert notice is not None and notice.id == "new" and notice.deadline_known


def test_progress_annotation_follows_the_contract() -> None:
    body = progress_annotation(120, 100, 3, 1_795_000_000.0)
    value = json.loads(body[PROGRESS_ANNOTATION])
    assert value == {"step": 120, "committedStep": 100, "attempt": 3, "time": "2026-11-18T11:06:40Z"}
    live = {"step": 7, "stepAt": 1_795_000_000.12345, "stepSeconds": 0.0101234567, "firstStep": 1,
            "firstStepAt": 1_794_999_990.5, "restoreSeconds": 1.23456, "saveBlockingSeconds": 0.5, "other": 1}
    value = json.loads(progress_annotation(120, -1, 3, 1_795_000_000.0, live)[PROGRESS_ANNOTATION])
    assert value == {"step": 120, "committedStep": -1, "attempt": 3, "time": "2026-11-18T11:06:40Z",
                     "stepAt": 1_795_000_000.123, "stepSeconds": 0.010123, "firstStep": 1,
                     "firstStepAt": 1_794_999_990.5, "restoreSeconds": 1.235, "saveBlockingSeconds": 0.5}


def test_backoff_delays() -> None:
    assert list(islice(backoff_delays(1, 30), 7)) == [1, 2, 4, 8, 16, 30, 30]


def test_failure_log_level() -> None:
    loud = [n for n in range(1, 301) if failure_log_level(n) == logging.WARNING]
    assert loud == [1, 10, 100, 200, 300]
