"""reprieve.peers: which peer went quiet, said before JAX's heartbeat timeout ends the process (a fake clock; the
real thing, a SIGKILLed peer of a real 2-process job, is in test_startup_and_peers.py)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from reprieve.agreement import AgreementError
from reprieve.coordination import CoordinationError, LocalCoordinator
from reprieve.peers import (
    Liveness,
    PeerWatch,
    lost_line,
    silent_line,
    termination_message,
    write_termination_message,
)
from reprieve.pulse import BEAT, BYE, DEAD, GONE

from tests.runtime.test_collective_error import CLOSED, DEVICES, STORE

GLOO = STORE  # the gloo records of a real 2-process job (process 1 listened on 127.0.0.1:39215)

pytestmark = pytest.mark.unit


def test_a_peer_whose_record_stops_changing_is_silent_once_then_back() -> None:
    live = Liveness([1, 2], threshold_s=5.0, now=0.0)
    assert live.observe({1: 1, 2: 1}, 1.0) == []
    assert live.observe({1: 2, 2: 1}, 3.0) == []  # 2 unchanged for 2 s: not yet
    assert live.observe({1: 3, 2: 1}, 6.5) == [("silent", 2, 5.5)]
    assert live.silent == (2,)
    assert live.observe({1: 4, 2: 1}, 9.0) == []  # said once
    assert live.observe({1: 5, 2: 2}, 10.0) == [("back", 2, 9.0)]
    assert live.silent == ()
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


def test_the_line_for_a_lost_peer_says_how_it_was_found_and_what_follows() -> None:
    dead = lost_line(2, 3, "job-w2", DEAD, ("10.1.0.7", 40111), 0.0, 10, None)
    assert dead.startswith("process 2 of 3 (pod job-w2) has ended without leaving the job: its link to this "
                           "process closed and its pulse at 10.1.0.7:40111 refuses")
    gone = lost_line(2, 3, None, GONE, ("10.1.0.7", 40111), 1.9, 10, 120)
    assert gone.startswith("process 2 of 3 has not been heard from for 1.9 s and its pulse at 10.1.0.7:40111 does "
                           "not answer within 1.5 s")
    assert all("rather than at JAX's heartbeat timeout (10 s)" in line for line in (dead, gone))
    assert dead.endswith("from its start: there is no checkpoint yet")
    assert gone.endswith("from the last committed checkpoint, step 120")


class _Links:
    """Process 0's pulse links, faked: ``lost`` decides which linked process gets which verdict."""

    def __init__(self, lost: dict[int, str]) -> None:
        self.lost = lost
        self.beat_s = 0.01
        self.targets: dict[int, tuple[str, int]] = {}
        self.closed = False

    def __call__(self, lost_s: float, clock: Callable[[], float]) -> _Links:
        return self

    def link(self, targets: dict[int, tuple[str, int]]) -> list[tuple[str, int, float]]:
        new = {p: a for p, a in targets.items() if p not in self.targets}
        self.targets.update(new)
        return [(self.lost[p], p, 0.4) for p in sorted(new) if p in self.lost]

    def settled(self, processes: int) -> bool:
        return len(self.targets) >= processes

    def listen(self, seconds: float, stop: threading.Event) -> list[tuple[str, int, float]]:
        stop.wait(0.01)
        return []

    def wake(self) -> None:
        pass  # listen waits on ``stop`` itself

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("kind", [DEAD, GONE])
def test_process_0_ends_once_a_peer_s_pulse_finds_it_lost_and_not_before(kind: str) -> None:
    """Process 0 links to every pulse its peers' records name; a verdict of loss is reported, published and ends
    process 0 at once with the line that says why; a peer whose pulse is not linked yet is not judged."""
    shared = LocalCoordinator()
    reports: list[tuple[int, ...]] = []
    ended: list[str] = []
    links = _Links({2: kind})
    shared.set("reprieve/2/alive/1", json.dumps({"n": 1, "pod": "w1", "ip": "10.0.0.9", "pulse": 40001}),
               overwrite=True)
    watch = PeerWatch(_As(shared, 0, 3), attempt=2, pod="w0", heartbeat_s=4.0, on_lost=reports.append,
                      ip="10.0.0.8", links=links, end=ended.append).start()
    try:
        _passes(shared, 2)
        _until(lambda: links.targets == {1: ("10.0.0.9", 40001)}, f"process 1 linked: {links.targets}")
        assert ended == [] and reports == []
        shared.set("reprieve/2/alive/2", json.dumps({"n": 1, "pod": "w2", "ip": "10.0.0.7", "pulse": 40002}),
                   overwrite=True)
        _until(lambda: bool(ended), "the early end")
        assert reports[:1] == [(2,)], reports
        assert json.loads(shared.dir_get("reprieve/2/silent/")["reprieve/2/silent/set"]) == [2]
        assert ended[0] == lost_line(2, 3, "w2", kind, ("10.0.0.7", 40002), 0.4, 4.0, None)
        # a pulse that did not answer is named gone (the operator counts it lost without a probe); a refused one not
        assert watch.gone == ((2,) if kind == GONE else ())
        _until(lambda: links.closed, "the links closed with the watch")
    finally:
        watch.close()


def test_no_links_without_end_and_a_record_without_a_pulse_is_not_linked() -> None:
    shared = LocalCoordinator()
    made: list[float] = []

    def factory(lost_s: float, clock: Callable[[], float]) -> _Links:
        made.append(lost_s)
        return _Links({})

    shared.set("reprieve/2/alive/1", json.dumps({"n": 1, "pod": "w1", "ip": "10.0.0.9"}), overwrite=True)
    shared.set("reprieve/3/alive/1", json.dumps({"n": 1, "pod": "w1", "ip": "10.0.0.9"}), overwrite=True)
    quiet = PeerWatch(_As(shared, 0, 2), attempt=2, pod="w0", heartbeat_s=4.0, links=factory).start()  # no end
    links = _Links({1: GONE})
    ending = PeerWatch(_As(shared, 0, 2), attempt=3, pod="w0", heartbeat_s=4.0, links=links,
                       end=lambda why: made.append(-1.0)).start()
    try:
        _passes(shared, 2)
        _passes(shared, 2, attempt=3)
        assert made == [] and links.targets == {}  # an older runtime's record: no pulse to link
    finally:
        quiet.close()
        ending.close()


def test_a_process_s_record_names_its_pulse_which_says_bye_when_it_leaves() -> None:
    shared = LocalCoordinator()
    watch = PeerWatch(_As(shared, 1, 2), attempt=5, pod="w1", heartbeat_s=4.0, ip="127.0.0.1").start()
    try:
        _until(lambda: "reprieve/5/alive/1" in shared.dir_get("reprieve/5/alive/"), "process 1's record")
        record = json.loads(shared.dir_get("reprieve/5/alive/")["reprieve/5/alive/1"])
        assert record["ip"] == "127.0.0.1" and type(record["pulse"]) is int
        with socket.create_connection(("127.0.0.1", record["pulse"]), timeout=2.0) as link:
            link.settimeout(5.0)
            assert link.recv(1) == BEAT
            watch.close()
            heard = b""
            while chunk := link.recv(64):
                heard += chunk
            assert heard.endswith(BYE)
        # and it recorded that it left, before its pulse closed (a link made after that is refused)
        assert shared.dir_get("reprieve/5/left/") == {"reprieve/5/left/1": "1"}
    finally:
        watch.close()


@pytest.mark.parametrize("kind,record,lost", [(DEAD, "1", False), (DEAD, "0", True), (DEAD, None, True),
                                              (GONE, "1", True)])
def test_a_peer_that_left_the_job_before_it_was_linked_is_not_lost(kind: str, record: str | None, lost: bool,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A short job: process 1 has finished and left (its pulse refuses) before process 0 links to it. Its record of
    leaving says so: no loss, no early end. A refused pulse without the record is lost at once; so is a pulse that
    does not answer, record or not (the record is not asked for: that process may be the service's host, cut off)."""
    caplog.set_level(logging.INFO, logger="reprieve.peers")
    shared = LocalCoordinator()
    ended: list[str] = []
    links = _Links({1: kind})
    if record is not None:
        shared.set("reprieve/2/left/1", record, overwrite=True)  # "1": what PeerWatch.close wrote in process 1
    shared.set("reprieve/2/alive/1", json.dumps({"n": 1, "pod": "w1", "ip": "10.0.0.9", "pulse": 40001}),
               overwrite=True)
    watch = PeerWatch(_As(shared, 0, 2), attempt=2, pod="w0", heartbeat_s=4.0, ip="10.0.0.8", links=links,
                      end=ended.append).start()
    try:
        _until(lambda: 1 in links.targets, "process 1 linked")
        if lost:
            _until(lambda: bool(ended), "the early end")
            assert ended[0].startswith("process 1 of 2 (pod w1) has "), ended
        else:
            _passes(shared, 2)
            assert ended == [] and "process 1 of 2 left the job before this process linked to its pulse" in caplog.text
    finally:
        watch.close()



def _passes(shared: LocalCoordinator, n: int, pid: int = 0, attempt: int = 2) -> None:
    """Wait until process ``pid``'s watch has written its record ``n`` more times: it made ``n`` more passes (each
    pass writes the record, then decides), so what did not happen in them did not happen at all."""
    key = f"reprieve/{attempt}/alive/{pid}"

    def count() -> int:
        raw = shared.dir_get(f"reprieve/{attempt}/alive/").get(key)
        return int(json.loads(raw)["n"]) if raw else 0

    target = count() + n
    _until(lambda: count() >= target + 1, f"{n} more passes of process {pid}'s watch")


def test_a_knock_that_finds_the_service_gone_ends_a_process_but_not_one_already_closed() -> None:
    ended: list[str] = []
    reports: list[tuple[int, ...]] = []
    watch = PeerWatch(_As(LocalCoordinator(), 1, 2), attempt=1, pod="w1", heartbeat_s=2.0,
                      on_lost=reports.append, end=ended.append)
    watch._service_gone_for_sure("a knock at 10.0.0.8:8476 found no service: timed out")
    # reported, then again just before the end (with the newest finished step), then ended
    assert reports == [(0,), (0,)] and len(ended) == 1 and "the coordination service is gone" in ended[0]
    closed = PeerWatch(_As(LocalCoordinator(), 1, 2), attempt=1, pod="w1", heartbeat_s=2.0, end=ended.append)
    closed.close()
    closed._service_gone_for_sure("refused")
    assert len(ended) == 1


class _As(LocalCoordinator):
    """One process's view of a key-value store shared by the gang (``broken``: the service is gone)."""

    def __init__(self, shared: LocalCoordinator, pid: int, n: int) -> None:
        self._shared, self.process_id, self.num_processes, self.broken = shared, pid, n, False

    def set(self, key: str, value: str, *, overwrite: bool = False) -> None:
        if self.broken:
            raise CoordinationError("the coordination service is unavailable")
        self._shared.set(key, value, overwrite=overwrite)

    def dir_get(self, prefix: str) -> dict[str, str]:
        return self._shared.dir_get(prefix)

    def dir_get_bytes(self, prefix: str) -> dict[str, bytes]:
        if self.broken:
            raise CoordinationError("the coordination service is unavailable")
        return {k: v for k, v in GLOO.items() if k.startswith(prefix)}


def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def test_every_process_learns_which_peer_went_silent_before_jax_ends_it() -> None:
    """Process 0 finds process 2 silent and publishes it; process 1 reads it; both report it to ``on_lost`` (the
    supervisor's exit report, the termination message), and report ``()`` once 2 is heard from again."""
    shared, now = LocalCoordinator(), [0.0]
    reports: dict[int, list[tuple[int, ...]]] = {0: [], 1: []}
    watches = [PeerWatch(_As(shared, pid, 3), attempt=4, pod=f"w{pid}", heartbeat_s=2.0, clock=lambda: now[0],
                         on_lost=reports[pid].append) for pid in (0, 1)]
    for w in watches:
        w.start()
    try:
        _until(lambda: "reprieve/4/alive/1" in shared.dir_get("reprieve/4/alive/"), "process 1's record")
        now[0] = 5.0  # process 2 never wrote: silent past the threshold (1 s)
        _until(lambda: reports[0] == [(2,)] and reports[1] == [(2,)], f"both report process 2: {reports}")
        assert watches[1].lost == (2,) and watches[1].wait_lost() == (2,)  # known: no wait
        shared.set("reprieve/4/alive/2", '{"n": 1}', overwrite=True)  # heard from again
        _until(lambda: reports[0][-1:] == [()] and reports[1][-1:] == [()], f"both report none: {reports}")
    finally:
        for w in watches:
            w.close()


def test_a_process_that_loses_the_coordination_service_reports_process_0() -> None:
    shared = LocalCoordinator()
    coord = _As(shared, 1, 2)
    coord.broken = True
    reports: list[tuple[int, ...]] = []
    PeerWatch(coord, attempt=1, pod="w1", heartbeat_s=2.0, on_lost=reports.append).start()
    _until(lambda: reports == [(0,)], f"process 0 reported: {reports}")


def test_the_service_gone_names_process_0_unless_another_process_is_named_already() -> None:
    """JAX ending process 0 for another peer's loss takes the service with it: that peer stays the one named."""
    reports: list[tuple[int, ...]] = []
    PeerWatch(_As(LocalCoordinator(), 1, 3), attempt=1, pod="w1", heartbeat_s=2.0,
              on_lost=reports.append).service_gone("refused")
    assert reports == [(0,)]
    shared = LocalCoordinator()
    shared.set("reprieve/1/silent/set", "[2]")  # process 0 published process 2 silent
    watch = PeerWatch(_As(shared, 1, 3), attempt=1, pod="w1", heartbeat_s=2.0, on_lost=reports.append).start()
    try:
        _until(lambda: reports == [(0,), (2,)], f"process 2 reported: {reports}")
        watch.service_gone("refused")
        assert watch.lost == (2,) and reports == [(0,), (2,)]
    finally:
        watch.close()
    own: list[tuple[int, ...]] = []
    PeerWatch(_As(LocalCoordinator(), 0, 3), attempt=1, pod="w0", heartbeat_s=2.0,
              on_lost=own.append).service_gone("refused")
    assert own == []  # process 0 never names itself


def test_the_termination_message_names_the_silent_peers(tmp_path: Path) -> None:
    assert json.loads(termination_message((1, 3))) == {"peerLost": [1, 3]} and termination_message(()) == ""
    log = tmp_path / "termination-log"
    write_termination_message((2,), str(log))  # no file: the kubelet mounted none, nothing written
    assert not log.exists()
    log.touch()
    write_termination_message((2,), str(log))
    assert json.loads(log.read_text()) == {"peerLost": [2]}
    write_termination_message((), str(log))
    assert log.read_text() == ""
    write_termination_message((2,), str(log), attempt=4, last=(41, 1764000054.2501))  # with its last step
    assert json.loads(log.read_text()) == {"peerLost": [2], "attempt": 4, "lastStep": 41, "lastStepAt": 1764000054.25}
    write_termination_message((0, 2), str(log), gone=(2, 3))  # whose pulse did not answer, of those lost
    assert json.loads(log.read_text())["peerGone"] == [2]
    assert json.loads(termination_message((1,), gone=(1,))) == {"peerLost": [1], "peerGone": [1]}


def test_a_failed_collective_waits_for_the_peer_watch_to_name_the_silent_peer(caplog: pytest.LogCaptureFixture) -> None:
    """A peer's process that died on a node that still answers resets its connections: the collective fails at
    once (a JAX runtime error), long before JAX's heartbeat timeout. The job waits for the watch to name the silent
    peer before it ends, so its exit is reported as that loss; so does a failed agreement (the service gone with
    process 0); any other error does not wait."""
    from reprieve.job import Job
    from reprieve.teardown import ending_at_exit

    calls: list[int] = []
    errors: list[str] = []
    stub = SimpleNamespace(_wait_lost_peer=lambda error: errors.append(error) or calls.append(1) or (1,), process_id=0)

    class JaxRuntimeError(RuntimeError):
        pass

    with caplog.at_level(logging.WARNING, logger="reprieve.job"):
        assert Job._await_lost_peer(stub, JaxRuntimeError("Connection reset by peer"),  # type: ignore[arg-type]
                                    then=ending_at_exit(41)) == (1,)
    assert calls == [1] and "process(es) 1 went silent: this exit is their loss; this process ends at its exit " \
        "(SIGABRT, as JAX's heartbeat timeout would, before JAX's own shutdown, which would wait for the lost peer " \
        "and abort with a stack trace) and the job restarts from the last checkpoint, step 41" in caplog.text
    assert ending_at_exit(None).endswith("restarts from its start: there is no checkpoint yet")
    assert errors == ["Connection reset by peer"]  # the error's text: the peer it names is reported at once
    Job._await_lost_peer(stub, ValueError("a bug of the program's"))  # type: ignore[arg-type]
    Job._await_lost_peer(stub, None)  # type: ignore[arg-type]
    assert calls == [1]
    Job._await_lost_peer(stub, AgreementError("get failed: UNAVAILABLE"))  # type: ignore[arg-type]
    assert calls == [1, 1]  # the service gone (process 0): the watch names it before this process exits 1


def test_wait_lost_gives_up_after_the_time_it_takes_to_find_a_peer_silent() -> None:
    watch = PeerWatch(_As(LocalCoordinator(), 1, 2), attempt=1, pod="w1", heartbeat_s=2.0)
    assert watch.wait_lost() == ()  # nothing heard: it gives up (bounded), the exit stays this process's own


def test_a_failed_collective_that_names_its_peer_reports_it_at_once_and_the_watch_never_takes_it_back() -> None:
    """The survivor's collective failed naming the dead peer's gloo address: the peer is reported before any
    silence threshold passed (JAX's abort may come first on a loaded machine), process 0 publishes it, and the
    watch finding no one silent does not clear it. An error that names no process for sure reports nothing."""
    shared, now = LocalCoordinator(), [0.0]
    reports: list[tuple[int, ...]] = []
    watch = PeerWatch(_As(shared, 0, 2), attempt=3, pod="w0", heartbeat_s=2.0, on_lost=reports.append,
                      clock=lambda: now[0], device_processes=lambda: dict(DEVICES))
    assert watch.blame("Gloo AllGather failed: timed out") == () and reports == []
    watch.start()
    try:
        assert watch.blame(CLOSED) == (1,) and reports == [(1,)] and watch.lost == (1,) and watch.found == ()
        _until(lambda: shared.dir_get("reprieve/3/silent/").get("reprieve/3/silent/set") == "[1]",
               "process 0 publishes the blamed process")
        now[0] = 5.0  # the watch finds it silent too (what ends a failed collective's wait): reported once
        _until(lambda: watch.found == (1,), "the watch's own finding")
        assert watch.wait_lost() == (1,) and reports == [(1,)]
    finally:
        watch.close()
    # process 1 of 3 blames process 0; process 0 publishes no one silent: it stays reported
    reads = [0]
    coord = _As(shared, 1, 3)
    coord.dir_get = lambda prefix: reads.__setitem__(0, reads[0] + 1) or shared.dir_get(prefix)  # type: ignore
    other: list[tuple[int, ...]] = []
    shared.set("reprieve/3/silent/set", "[]", overwrite=True)
    watch = PeerWatch(coord, attempt=3, pod="w1", heartbeat_s=2.0, on_lost=other.append,
                      device_processes=lambda: dict(DEVICES)).start()
    try:
        assert watch.blame("Read error [127.0.0.1]:42301: Connection reset by peer") == (0,)
        seen = reads[0]
        _until(lambda: reads[0] >= seen + 2, "the watch read the (empty) silent set again")
        assert watch.lost == (0,) and other == [(0,)]
    finally:
        watch.close()


def test_blame_without_the_coordination_service_names_no_one() -> None:
    coord = _As(LocalCoordinator(), 1, 2)
    coord.broken = True
    reports: list[tuple[int, ...]] = []
    watch = PeerWatch(coord, attempt=1, pod="w1", heartbeat_s=2.0, on_lost=reports.append,
                      device_processes=lambda: dict(DEVICES))
    assert watch.blame(CLOSED) == () and reports == []


def test_report_again_tells_on_lost_the_same_processes_once_more_and_nothing_when_none_are_lost() -> None:
    """On the exit path the runtime reports the lost peers again: what it sends with them (its last finished
    step) may have moved since the first report."""
    reports: list[tuple[int, ...]] = []
    watch = PeerWatch(_As(LocalCoordinator(), 1, 2), attempt=1, pod="w1", heartbeat_s=2.0, on_lost=reports.append)
    watch.report_again()
    assert reports == []
    watch.service_gone("closed")
    watch.report_again()
    assert reports == [(0,), (0,)]


def test_a_gone_peer_ends_a_training_process_but_not_one_already_leaving_the_job() -> None:
    """``bootstrap.end_unless_leaving``: once the exit code is decided (a terminal phase: the teardown under way),
    that exit stands; before it the process ends."""
    from reprieve.bootstrap import end_unless_leaving
    from reprieve.lifecycle import Phase

    ended: list[str] = []
    for phase in Phase:
        job = SimpleNamespace(phase=phase)
        assert end_unless_leaving(job, phase.value, ended.append) is (not phase.terminal), phase
    assert ended == ["ready", "training"]


def test_a_process_but_0_never_calls_a_peer_silent_itself(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 48: every process but 0 logged "process 0 of 2 has not been heard from for 5.1 s ..." once per start,
    at the threshold (it reads no records, so its own liveness found every peer silent), while process 0 was only
    compiling. Only process 0 judges the records; the others hear its published set."""
    shared, now = LocalCoordinator(), [0.0]
    reports: list[tuple[int, ...]] = []
    watch = PeerWatch(_As(shared, 1, 3), attempt=1, pod="w1", heartbeat_s=2.0, clock=lambda: now[0],
                      on_lost=reports.append).start()
    try:
        _passes(shared, 1, pid=1, attempt=1)
        now[0] = 60.0  # far past the threshold
        _passes(shared, 2, pid=1, attempt=1)
        assert "has not been heard from" not in caplog.text and reports == []
        shared.set("reprieve/1/silent/set", json.dumps([2]), overwrite=True)  # what process 0 finds, it hears
        _until(lambda: reports == [(2,)], f"process 0's set heard: {reports}")
    finally:
        watch.close()


@pytest.mark.parametrize("kind", [DEAD, GONE])
def test_a_process_but_0_links_to_process_0_s_pulse_and_ends_when_it_is_lost(kind: str) -> None:
    """Process 0 publishes its pulse; every other process links to it in a thread of its own (a call to the
    coordination service hangs while process 0's host is stopped or cut off) and, when it is found lost, reports
    process 0 and ends, as process 0 does for them."""
    shared = LocalCoordinator()
    reports: list[tuple[int, ...]] = []
    ended: list[str] = []
    links = _Links({0: kind})
    first = PeerWatch(_As(shared, 0, 2), attempt=6, pod="w0", heartbeat_s=4.0, ip="127.0.0.1").start()
    try:
        _until(lambda: "reprieve/6/pulse/0" in shared.dir_get("reprieve/6/pulse/"), "process 0's pulse published")
        pulse = json.loads(shared.dir_get("reprieve/6/pulse/")["reprieve/6/pulse/0"])
        watch = PeerWatch(_As(shared, 1, 2), attempt=6, pod="w1", heartbeat_s=4.0, on_lost=reports.append,
                          ip="127.0.0.1", links=links, end=ended.append).start()
        try:
            _until(lambda: bool(ended), "the early end")
            assert links.targets == {0: ("127.0.0.1", pulse["pulse"])}
            assert reports[:1] == [(0,)], reports
            assert ended[0].startswith("process 0 of 2 (pod w0) ")
        finally:
            watch.close()
    finally:
        first.close()


def test_a_survivor_says_its_peers_lost_even_when_its_finished_steps_cannot_be_read(
        caplog: pytest.LogCaptureFixture) -> None:
    """The program's own code met the failed collective (``loss.block_until_ready()`` outside ``job.save``), so the
    interpreter is shutting down, JAX's client with it, when the peer watch reports: reading the finished steps
    raises. The report goes out with the loop's position (CI: the termination message was empty, the operator's
    lost steps were those of the last progress report, 5 where the step log said 27); with the finished steps
    readable, those."""
    from reprieve.bootstrap import _last_step_said

    class Broken:
        noted = 70

        def last(self) -> tuple[int, float]:
            raise RuntimeError("the backend is gone (emulated)")

    loop = SimpleNamespace(last=(66, 10.0), wall_offset=1000.0)
    with caplog.at_level(logging.WARNING, logger="reprieve.bootstrap"):
        assert _last_step_said(SimpleNamespace(loop=loop, finished=Broken())) == (66, 1010.0)  # type: ignore[arg-type]
    assert "could not be read (RuntimeError: the backend is gone (emulated))" in caplog.text
    finished = SimpleNamespace(noted=70, last=lambda: (64, 9.0))
    assert _last_step_said(SimpleNamespace(loop=loop, finished=finished)) == (64, 1009.0)  # type: ignore[arg-type]
