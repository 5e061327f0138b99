"""reprieve-supervisor's decisions as tables (pure: no processes, no cluster). Each scenario plays timed events
through ``protocol.step`` and compares the actions, written short: ``start 2`` (a cold trainer for attempt 2),
``warm`` (start a warm process), ``hand 21>2`` (warm pid 21 takes attempt 2), ``TERM 11`` / ``KILL 11``,
``report 1:42`` (exit report: attempt 1, code 42), ``exit 0``."""

from __future__ import annotations

import dataclasses
import json
import signal
from typing import Any

import pytest
from reprieve.supervisor import protocol as sv
from reprieve.supervisor.contract import Assignment, exit_annotation
from reprieve.supervisor.protocol import (
    AssignmentSeen,
    ChildExited,
    ChildMessage,
    Refuse,
    Settings,
    Spawned,
    SpawnFailed,
    State,
    Terminate,
    Tick,
)

pytestmark = pytest.mark.unit

POD = "job-1"
ENV_A = Assignment(1, 1, 2, "10.0.0.1:1234", source="environment")
SETTINGS = Settings(grace_s=5, prewarm=True, prewarm_delay_s=30, ready_timeout_s=60, handover_timeout_s=10)


def cm(attempt: int, index: int | None = 1, count: int = 2, resize: str | None = None) -> Assignment:
    return Assignment(attempt, index, count, "10.0.0.9:1234", resize=resize)


def short(action: sv.Action) -> str | None:
    match action:
        case sv.StartTrainer(assignment=a):
            return f"start {a.attempt}"
        case sv.StartWarm():
            return "warm"
        case sv.HandOver(pid=pid, assignment=a):
            return f"hand {pid}>{a.attempt}"
        case sv.Signal(pid=pid, sig=sig):
            return f"{signal.Signals(sig).name.removeprefix('SIG')} {pid}"
        case sv.Report(attempt=a, code=c):
            return f"report {a}:{c}"
        case sv.Exit(code=c):
            return f"exit {c}"
    return None


def play(events: list[tuple[float, sv.Event]], state: State | None = None) -> tuple[State, list[str]]:
    state = state or State(ENV_A, SETTINGS)
    out: list[str] = []
    for now, event in events:
        state, actions = sv.step(state, event, now)
        out += [f"{now:g}: {s}" for s in map(short, actions) if s]
    return state, out


def started(pid: int, attempt: int, *, init: bool = True, step_at: float | None = None,
            t: float = 0) -> list[tuple[float, sv.Event]]:
    """Events of a cold trainer ``pid`` of ``attempt`` started at ``t`` (reaching init, optionally a step)."""
    a = ENV_A if attempt == 1 else cm(attempt)
    evs: list[tuple[float, sv.Event]] = [(t, Spawned(pid, "trainer", a))]
    if init:
        evs.append((t + 1, ChildMessage(pid, {"event": "init", "attempt": attempt})))
    if step_at is not None:
        evs.append((step_at, ChildMessage(pid, {"event": "step", "step": 0})))
    return evs


SCENARIOS = {
    # the first attempt comes from the environment when no ConfigMap exists
    "first attempt from the env": (
        [(0, AssignmentSeen(None))],
        ["0: start 1"]),
    "a ConfigMap that exists wins over the env": (
        [(0, AssignmentSeen(cm(4)))],
        ["0: start 4"]),
    "the ConfigMap of the pod's own attempt: the environment's copy runs (its coordinator)": (
        [(0, AssignmentSeen(cm(1)))],
        ["0: start 1"]),
    "a spare (not listed) runs nothing, only a warm process": (
        [(0, AssignmentSeen(cm(4, index=None)))],
        ["0: warm"]),
    "nothing before the assignment source is known": (
        [(0, Tick()), (5, Tick())],
        []),
    "exit 42, then the next attempt starts in place": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (50, ChildExited(11, 42)),
         (60, AssignmentSeen(cm(2))), (60, Spawned(12, "trainer", cm(2))), (70, ChildExited(12, 0))],
        ["0: start 1", "50: report 1:42", "60: start 2", "70: report 2:0", "70: exit 0"]),
    "an older or equal assignment changes nothing": (
        [(0, AssignmentSeen(cm(3))), (0, Spawned(11, "trainer", cm(3))), (5, AssignmentSeen(cm(2))),
         (6, AssignmentSeen(cm(3)))],
        ["0: start 3"]),
    "a superseded trainer gets SIGTERM, SIGKILL after the grace, then the next starts": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, AssignmentSeen(cm(2))), (12, Tick()),
         (15, Tick()), (15.5, ChildExited(11, 137)), (15.5, Spawned(12, "trainer", cm(2)))],
        ["0: start 1", "10: TERM 11", "15: KILL 11", "15.5: report 1:137", "15.5: start 2"]),
    # a grow (issue 47): the node stays, so the trainer is asked to save to the memory tier (USR1), not SIGTERM
    "a grow's trainer past its first step gets the resize signal, SIGKILL after the grace, then the next starts": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=2), (2, Spawned(21, "warm", None)),
         (10, AssignmentSeen(cm(2, count=3, resize="grow"))), (15, Tick()), (15.5, ChildExited(11, 137)), (15.5, Spawned(12, "trainer", cm(2, count=3, resize="grow")))],
        ["0: start 1", "2: warm", "10: USR1 11", "15: KILL 11", "15.5: report 1:137", "15.5: KILL 21",
         "15.5: start 2"]),
    "a grow's trainer that saved and exited 42: the next attempt starts": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=2), (2, Spawned(21, "warm", None)),
         (10, AssignmentSeen(cm(2, count=3, resize="grow"))), (11, ChildExited(11, 42))],
        ["0: start 1", "2: warm", "10: USR1 11", "11: report 1:42", "11: KILL 21", "11: start 2"]),
    "a grow's trainer before its first step gets SIGTERM (no handler for the resize signal yet)": (
        [(0, AssignmentSeen(None)), *started(11, 1), (10, AssignmentSeen(cm(2, count=3, resize="grow")))],
        ["0: start 1", "10: TERM 11"]),
    "a grow that drops this pod (it stands by) stops its trainer with SIGTERM": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=2), (2, Spawned(21, "warm", None)),
         (10, AssignmentSeen(cm(2, None, 3, "grow")))],
        ["0: start 1", "2: warm", "10: TERM 11"]),
    "a superseded trainer exiting 0 does not end the supervisor": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, AssignmentSeen(cm(2))),
         (11, ChildExited(11, 0))],
        ["0: start 1", "10: TERM 11", "11: report 1:0", "11: start 2"]),
    "an assignment that drops this pod stops its trainer and starts nothing": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, AssignmentSeen(cm(2, index=None))),
         (11, ChildExited(11, 42)), (12, Tick())],
        ["0: start 1", "10: TERM 11", "11: report 1:42"]),
    "SIGTERM is forwarded and the trainer's code passed on": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, Terminate("SIGTERM")), (11, Tick()),
         (12, ChildExited(11, 42))],
        ["0: start 1", "10: TERM 11", "12: report 1:42", "12: exit 42"]),
    "SIGTERM: a trainer that ignores it is killed after the grace": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, Terminate("SIGTERM")),
         (15, Tick()), (15.1, ChildExited(11, 137))],
        ["0: start 1", "10: TERM 11", "15: KILL 11", "15.1: report 1:137", "15.1: exit 137"]),
    "SIGTERM with no trainer running: the last trainer's code": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (5, ChildExited(11, 42)),
         (10, Terminate("SIGTERM"))],
        ["0: start 1", "5: report 1:42", "10: exit 42"]),
    "SIGTERM before any trainer ran: 143": (
        [(0, Terminate("SIGTERM"))],
        ["0: exit 143"]),
    "a second SIGTERM is not forwarded twice": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, Terminate("SIGTERM")),
         (11, Terminate("SIGTERM"))],
        ["0: start 1", "10: TERM 11"]),
    "an assignment in another contract: stop, exit 2": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, Refuse("contract 2")),
         (11, ChildExited(11, 143))],
        ["0: start 1", "10: TERM 11", "11: report 1:143", "11: exit 2"]),
    "the command cannot start: reported as 127, next attempt still possible": (
        [(0, AssignmentSeen(None)), (0, SpawnFailed("trainer", "not found", ENV_A)), (5, AssignmentSeen(cm(2)))],
        ["0: start 1", "0: report 1:127", "5: start 2"]),
    # pre-warming
    "warm after the trainer's first step, handed the next attempt": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=8), (8, Spawned(21, "warm")),
         (12, ChildMessage(21, {"event": "ready"})), (40, ChildExited(11, 42)), (41, AssignmentSeen(cm(2))),
         (41.01, ChildMessage(21, {"event": "init", "attempt": 2})), (45, ChildExited(21, 0))],
        ["0: start 1", "8: warm", "40: report 1:42", "41: hand 21>2", "45: report 2:0", "45: exit 0"]),
    "no warm before the first step (or the delay)": (
        [(0, AssignmentSeen(None)), *started(11, 1), (10, Tick()), (29, Tick()), (30, Tick())],
        ["0: start 1", "30: warm"]),
    "no warm for a trainer that never reached reprieve.init()": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (100, Tick()), (101, ChildExited(11, 42)),
         (102, Tick())],
        ["0: start 1", "101: report 1:42"]),
    "a warm process that touched devices: cold start, pre-warming off": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (7, ChildMessage(21, {"event": "error", "message": "backend initialised"})), (7.1, ChildExited(21, 1)),
         (40, ChildExited(11, 42)), (41, AssignmentSeen(cm(2))), (41, Spawned(12, "trainer", cm(2))),
         (42, ChildMessage(12, {"event": "init"})), (43, ChildMessage(12, {"event": "step"})), (200, Tick())],
        ["0: start 1", "5: warm", "7: KILL 21", "40: report 1:42", "41: start 2"]),
    "a warm process refusing its assignment: killed, the attempt starts cold, no report": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "ready"})), (40, ChildExited(11, 42)), (41, AssignmentSeen(cm(2))),
         (41.1, ChildMessage(21, {"event": "error", "message": "backend initialised"})),
         (41.2, ChildExited(21, 1)), (41.2, Spawned(12, "trainer", cm(2)))],
        ["0: start 1", "5: warm", "40: report 1:42", "41: hand 21>2", "41.1: KILL 21", "41.2: start 2"]),
    "a warm process that never confirms is killed after the hand-over timeout": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "ready"})), (40, ChildExited(11, 42)), (41, AssignmentSeen(cm(2))),
         (50, Tick()), (51, Tick()), (51.1, ChildExited(21, 137))],
        ["0: start 1", "5: warm", "40: report 1:42", "41: hand 21>2", "51: KILL 21", "51.1: start 2"]),
    "a warm process still importing 5 s after its start when the assignment comes: killed, cold start": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (10, ChildExited(11, 42)), (10.5, AssignmentSeen(cm(2))), (10.6, ChildExited(21, 137)),
         (10.6, Spawned(12, "trainer", cm(2))), (11, ChildMessage(12, {"event": "init"})),
         (12, ChildMessage(12, {"event": "step"}))],
        ["0: start 1", "5: warm", "10: report 1:42", "10.5: KILL 21", "10.5: start 2", "12: warm"]),
    # a pod made for the restart: its warm process starts with it, the assignment comes 0.1-0.7 s later (the soak)
    "a new pod's warm process still importing when the assignment comes is waited for, and takes over once past its imports": (
        [(0, AssignmentSeen(cm(4, index=None))), (0, Spawned(21, "warm")), (0.4, AssignmentSeen(cm(5))),
         (1, Tick()), (2.5, ChildMessage(21, {"event": "warming"})), (3, Tick()),
         (3.2, ChildMessage(21, {"event": "ready"})), (3.3, ChildMessage(21, {"event": "init", "attempt": 5}))],
        ["0: warm", "2.5: hand 21>5"]),
    "a new pod's warm process that does not park within 5 s of its start is killed: cold start": (
        [(0, AssignmentSeen(cm(4, index=None))), (0, Spawned(21, "warm")), (0.4, AssignmentSeen(cm(5))),
         (4.9, Tick()), (5, Tick()), (5.1, ChildExited(21, 137)), (5.1, Spawned(12, "trainer", cm(5)))],
        ["0: warm", "5: KILL 21", "5: start 5"]),
    # the soak's double faults: a cold start 2.7 s into a warm process's start took 5.2 s to its first step; a warm
    # process past its imports takes the attempt at once and skips its warm-up (its trace and lowering ahead)
    "a warm process past its imports when the assignment comes takes it over at once, before it parks": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "warming"})), (6.5, ChildExited(11, 42)), (7, AssignmentSeen(cm(2))),
         (7.25, Tick()), (7.3, ChildMessage(21, {"event": "ready"})),
         (7.4, ChildMessage(21, {"event": "init", "attempt": 2})), (20, Tick())],
        ["0: start 1", "5: warm", "6.5: report 1:42", "7: hand 21>2"]),
    "a warm process handed the attempt past its imports that never confirms is killed after the hand-over timeout": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "warming"})), (8.5, ChildExited(11, 42)), (9, AssignmentSeen(cm(2))),
         (18.9, Tick()), (19, Tick()), (19.1, ChildExited(21, 137)), (19.1, Spawned(12, "trainer", cm(2)))],
        ["0: start 1", "5: warm", "8.5: report 1:42", "9: hand 21>2", "19: KILL 21", "19.1: start 2"]),
    "a warm process past its imports is handed the attempt once the trainer it supersedes has ended": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "warming"})), (7, AssignmentSeen(cm(2))), (9.5, ChildExited(11, 42)),
         (11, ChildMessage(21, {"event": "ready"}))],
        ["0: start 1", "5: warm", "7: TERM 11", "9.5: report 1:42", "9.5: hand 21>2"]),
    "a warm process that dies after it was handed the attempt past its imports: cold start": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "warming"})), (6.5, ChildExited(11, 42)), (7, AssignmentSeen(cm(2))),
         (7.5, ChildExited(21, 1))],
        ["0: start 1", "5: warm", "6.5: report 1:42", "7: hand 21>2", "7.5: start 2"]),
    "a warm process that dies while parked turns pre-warming off": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "ready"})), (9, ChildExited(21, 137)), (20, Tick()),
         (40, ChildExited(11, 42)), (41, AssignmentSeen(cm(2)))],
        ["0: start 1", "5: warm", "40: report 1:42", "41: start 2"]),
    "a warm process not parked within the ready timeout is killed": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")), (64, Tick()),
         (65, Tick())],
        ["0: start 1", "5: warm", "65: KILL 21"]),
    "between attempts (after init was seen) a warm process starts at once": (
        [(0, AssignmentSeen(None)), *started(11, 1), (3, ChildExited(11, 42)), (3, Spawned(21, "warm")),
         (4, ChildMessage(21, {"event": "ready"})), (9, AssignmentSeen(cm(2)))],
        ["0: start 1", "3: report 1:42", "3: warm", "9: hand 21>2"]),
    "finishing kills the warm process, then exits 0": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (50, ChildExited(11, 0)), (50.1, ChildExited(21, 137))],
        ["0: start 1", "5: warm", "50: report 1:0", "50: KILL 21", "50.1: exit 0"]),
    "SIGTERM kills the warm process and forwards to the trainer": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (10, Terminate("SIGTERM")), (10.1, ChildExited(21, 137)), (12, ChildExited(11, 42))],
        ["0: start 1", "5: warm", "10: KILL 21", "10: TERM 11", "12: report 1:42", "12: exit 42"]),
    # the decided exit code, announced before the trainer ends
    "an announced exit is reported at once; the next attempt waits for the process to end": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (6, ChildMessage(21, {"event": "ready"})), (40, ChildMessage(11, {"event": "exiting", "code": 42})),
         (40.2, AssignmentSeen(cm(2))), (40.3, ChildExited(11, 42))],
        ["0: start 1", "5: warm", "40: report 1:42", "40.2: TERM 11", "40.3: hand 21>2"]),
    "an announced exit that ends with another code is reported again": (
        [(0, AssignmentSeen(None)), *started(11, 1), (40, ChildMessage(11, {"event": "exiting", "code": 42})),
         (40.3, ChildExited(11, 139))],
        ["0: start 1", "40: report 1:42", "40: warm", "40.3: report 1:139"]),
    "only the first announcement counts; malformed ones and a warm process's are ignored": (
        [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
         (30, ChildMessage(21, {"event": "exiting", "code": 42})),
         (31, ChildMessage(11, {"event": "exiting", "code": "42"})),
         (32, ChildMessage(11, {"event": "exiting", "code": 300})),
         (40, ChildMessage(11, {"event": "exiting", "code": 42})),
         (41, ChildMessage(11, {"event": "exiting", "code": 1})), (41.5, ChildExited(11, 42))],
        ["0: start 1", "5: warm", "40: report 1:42"]),
    "orphans are reaped and otherwise ignored": (
        [(0, AssignmentSeen(None)), *started(11, 1, init=False), (3, ChildExited(999, 0))],
        ["0: start 1"]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str) -> None:
    events, expected = SCENARIOS[name]
    _, got = play(events)
    assert got == expected


def test_prewarm_off_by_setting() -> None:
    state = State(ENV_A, SETTINGS, prewarm_off="REPRIEVE_PREWARM=0")
    _, got = play([(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (100, Tick())], state)
    assert got == ["0: start 1"]


def test_static_mode_passes_the_code_on_and_never_prewarms() -> None:
    state = State(ENV_A, SETTINGS, prewarm_off="not in a cluster", static=True)
    _, got = play([(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (50, ChildExited(11, 3))], state)
    assert got == ["0: start 1", "50: report 1:3", "50: exit 3"]


def _local(max_restarts: int | None = None) -> State:
    settings = dataclasses.replace(SETTINGS, max_restarts=max_restarts)
    return State(ENV_A, settings, prewarm_off="a local run", static=True, local=True)


def exiting(pid: int, code: int, t: float) -> tuple[float, sv.Event]:
    return (t, ChildMessage(pid, {"event": "exiting", "code": code}))


def trainer(pid: int, attempt: int, t: float) -> list[tuple[float, sv.Event]]:
    return [(t, Spawned(pid, "trainer", dataclasses.replace(ENV_A, attempt=attempt, source="local restart")))]


# (events, expected actions) of `reprieve run`: restart on a saved exit, stop on anything else
LOCAL = {
    "a saved exit starts the next attempt; an exit 0 ends the loop": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), exiting(11, 42, 10), (11, ChildExited(11, 42)),
         *trainer(12, 2, 11), exiting(12, 42, 20), (21, ChildExited(12, 42)), *trainer(13, 3, 21),
         (30, ChildExited(13, 0))],
        ["0: start 1", "10: report 1:42", "11: start 2", "20: report 2:42", "21: start 3", "30: report 3:0",
         "30: exit 0"]),
    "the restart code without the announcement (sys.exit(42) in user code) is not restarted": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), (5, ChildExited(11, 42))],
        ["0: start 1", "5: report 1:42", "5: exit 42"]),
    "a failure ends the loop with its code": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), (5, ChildExited(11, 1))],
        ["0: start 1", "5: report 1:1", "5: exit 1"]),
    "Ctrl-C: the trainer gets SIGINT (a stop: it saves at its next step), the loop stops with 130": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), (5, Terminate("SIGINT")), exiting(11, 42, 6),
         (7, ChildExited(11, 42))],
        ["0: start 1", "5: INT 11", "6: report 1:42", "7: exit 130"]),
    "a second Ctrl-C kills the trainer at once; still a deliberate stop": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), (5, Terminate("SIGINT")), (6, Terminate("SIGINT")),
         (6.5, ChildExited(11, 137))],
        ["0: start 1", "5: INT 11", "6: KILL 11", "6.5: report 1:137", "6.5: exit 130"]),
    "Ctrl-C while the trainer fails on its own: its code": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), (5, Terminate("SIGINT")), (6, ChildExited(11, 1))],
        ["0: start 1", "5: INT 11", "6: report 1:1", "6: exit 1"]),
    "Ctrl-C as the trainer finishes: 0": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), (5, Terminate("SIGINT")), (6, ChildExited(11, 0))],
        ["0: start 1", "5: INT 11", "6: report 1:0", "6: exit 0"]),
    "SIGTERM to a local run is a notice: the trainer gets SIGTERM, the loop passes its code on": (
        [(0, AssignmentSeen(None)), *trainer(11, 1, 0), (5, Terminate("SIGTERM")), exiting(11, 42, 6),
         (7, ChildExited(11, 42))],
        ["0: start 1", "5: TERM 11", "6: report 1:42", "7: exit 42"]),
}


def _texts(events: list[tuple[float, sv.Event]], state: State) -> list[str]:
    out: list[str] = []
    for now, event in events:
        state, actions = sv.step(state, event, now)
        out += [a.why if isinstance(a, sv.Signal) else a.text for a in actions if isinstance(a, sv.Signal | sv.Note)]
    return out


def test_a_second_ctrl_c_says_the_real_time_since_the_first() -> None:
    """It said "still running 30s after SIGTERM" 3 s after the first Ctrl-C (issue 46)."""
    got = _texts([(0, AssignmentSeen(None)), *trainer(11, 1, 0), (100.0, Terminate("SIGINT")),
                  (103.2, Terminate("SIGINT"))], _local())
    assert got[-1] == "Ctrl-C: a second stop signal 3.2s after the SIGINT: killing the trainer", got
    assert not any("30s" in line for line in got), got


def test_the_grace_kill_says_the_time_it_waited() -> None:
    got = _texts([(0, AssignmentSeen(None)), *trainer(11, 1, 0), (100.0, Terminate("SIGTERM")), (105.6, Tick())],
                 _local())
    assert got[-1] == ("stopping: forwarding SIGTERM to the trainer: still running 5.6s after SIGTERM (grace 5s, "
                       "REPRIEVE_TERMINATION_GRACE_SECONDS)"), got



@pytest.mark.parametrize("name", list(LOCAL))
def test_local_loop(name: str) -> None:
    events, expected = LOCAL[name]
    _, got = play(events, _local())
    assert got == expected


def test_local_loop_sets_the_next_attempt_and_stops_at_max_restarts() -> None:
    state, got = play([(0, AssignmentSeen(None)), *trainer(11, 1, 0), exiting(11, 42, 10), (11, ChildExited(11, 42))],
                      _local(max_restarts=1))
    assert state.wanted == dataclasses.replace(ENV_A, attempt=2, source="local restart") and state.restarts == 1
    state, got = play([*trainer(12, 2, 11), exiting(12, 42, 20), (21, ChildExited(12, 42))], state)
    assert got == ["20: report 2:42", "21: exit 42"]


def test_an_unagreed_restart_code_is_said_loudly_and_reported_as_not_agreed() -> None:
    """In a pod: the operator cannot tell sys.exit(42) from a saved preemption by the code; the report says it."""
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1, init=True)])
    state, actions = sv.step(state, ChildExited(11, 42), 5)
    loud = [a.text for a in actions if isinstance(a, sv.Note) and a.loud]
    assert len(loud) == 1 and "WITHOUT an agreed save" in loud[0] and "sys.exit(42)" in loud[0]
    assert [a for a in actions if isinstance(a, sv.Report)] == [sv.Report(1, 42, agreed=False)]
    _, actions = sv.step(play([(0, AssignmentSeen(None)), *started(11, 1)])[0],
                         ChildMessage(11, {"event": "exiting", "code": 42}), 5)
    assert [a for a in actions if isinstance(a, sv.Report)] == [sv.Report(1, 42, agreed=True)]
    assert json.loads(exit_annotation(1, 42, 0.0, False)["reprieve.dev/exit"])["agreed"] is False


@pytest.mark.parametrize("code,announced,kind", [
    (0, None, "finished"), (0, 0, "finished"), (42, 42, "saved"), (42, None, "unagreed"), (42, 1, "unagreed"),
    (1, None, "failed"), (137, None, "failed"), (43, 43, "failed"),
])
def test_classify_exit(code: int, announced: int | None, kind: str) -> None:
    from reprieve.restarts import classify_exit

    assert classify_exit(code, announced, 42) == kind


@pytest.mark.parametrize("kind,restarts,max_restarts,restart", [
    ("saved", 0, None, True), ("saved", 5, 5, False), ("saved", 4, 5, True), ("unagreed", 0, None, False),
    ("failed", 0, None, False), ("finished", 0, None, False),
])
def test_local_next(kind: str, restarts: int, max_restarts: int | None, restart: bool) -> None:
    from reprieve.restarts import local_next

    assert local_next(kind, restarts, max_restarts)[0] is restart  # type: ignore[arg-type]


def test_decide_is_idempotent() -> None:
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1, init=False), (10, AssignmentSeen(cm(2)))])
    for now in (10, 11, 14.9):
        state, actions = sv.decide(state, now)
        assert [short(a) for a in actions if short(a)] == []


def test_pending_start_is_not_repeated() -> None:
    state, actions = sv.step(State(ENV_A, SETTINGS), AssignmentSeen(None), 0)
    assert [short(a) for a in actions] == [None, "start 1"]
    state, actions = sv.step(state, Tick(), 0.1)  # Spawned not fed yet: nothing again
    assert [short(a) for a in actions if short(a)] == []


def test_first_step_note_names_both_delays() -> None:
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1)])
    _, actions = sv.step(state, ChildMessage(11, {"event": "step", "step": 0}), 4.5)
    notes = [a.text for a in actions if isinstance(a, sv.Note)]
    assert notes == ["attempt 1: first step done 4.50s after the cold start, 4.50s after the assignment arrived"]


TOPOLOGY = {"platform": "cpu", "device_kind": "cpu", "num_cores": None, "num_processes": 2, "device_count": 4}


def test_the_warm_process_is_told_the_devices_the_trainer_reported_with_its_first_step() -> None:
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1)])
    state, actions = sv.step(state, ChildMessage(11, {"event": "step", "step": 0, "topology": TOPOLOGY}), 4.5)
    warm = [a for a in actions if isinstance(a, sv.StartWarm)]
    assert len(warm) == 1 and warm[0].topology is not None and json.loads(warm[0].topology) == TOPOLOGY
    # kept for later warm processes (the next attempt's, a replacement after one died)
    assert state.topology == warm[0].topology


@pytest.mark.parametrize("key", ["landing", "owned"])
@pytest.mark.parametrize("nbytes,told", [(1 << 30, 1 << 30), (None, None), (0, None), (-5, None), ("1", None),
                                         (True, None)])
def test_the_warm_process_is_told_the_bytes_the_trainers_restore_landed_and_copied(key: str, nbytes: object,
                                                                                     told: int | None) -> None:
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1)])
    event = {"event": "step", "step": 0, "topology": TOPOLOGY, **({} if nbytes is None else {key: nbytes})}
    state, actions = sv.step(state, ChildMessage(11, event), 4.5)
    other = "owned" if key == "landing" else "landing"
    assert [(getattr(a, key), getattr(a, other)) for a in actions if isinstance(a, sv.StartWarm)] == [(told, None)]
    assert (getattr(state, key), getattr(state, other)) == (told, None)  # kept for later warm processes


@pytest.mark.parametrize("topology", [None, "not an object", [1, 2]])
def test_a_first_step_without_a_topology_starts_a_warm_process_without_a_hint(topology: object) -> None:
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1)])
    _, actions = sv.step(state, ChildMessage(11, {"event": "step", "step": 0, "topology": topology}), 4.5)
    assert [a.topology for a in actions if isinstance(a, sv.StartWarm)] == [None]


@pytest.mark.parametrize("env,expected", [
    ({}, Settings()),
    ({"REPRIEVE_PREWARM": "0", "REPRIEVE_TERMINATION_GRACE_SECONDS": "7"}, Settings(grace_s=7.0, prewarm=False)),
    ({"REPRIEVE_PREWARM_DELAY_SECONDS": "2.5"}, Settings(prewarm_delay_s=2.5)),
])
def test_settings(env: dict, expected: Settings) -> None:
    assert Settings.from_env(env) == expected


@pytest.mark.parametrize("env,message", [
    ({"REPRIEVE_PREWARM": "maybe"}, "REPRIEVE_PREWARM must be 1 or 0, got 'maybe'"),
    ({"REPRIEVE_PREWARM_DELAY_SECONDS": "-1"}, "REPRIEVE_PREWARM_DELAY_SECONDS must be >= 0, got '-1'"),
    ({"REPRIEVE_TERMINATION_GRACE_SECONDS": "soon"}, "REPRIEVE_TERMINATION_GRACE_SECONDS must be a number"),
])
def test_settings_errors(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)


def test_the_pods_own_attempt_runs_with_the_environments_coordinator() -> None:
    """The operator writes the first attempt's ConfigMap with the same index; the environment (which a platform
    may have resolved, as the process kubelet does for service names) is what runs. Another attempt or index: the
    ConfigMap's."""
    state, _ = play([(0, AssignmentSeen(cm(1)))])
    assert state.wanted == ENV_A
    state, _ = play([(0, AssignmentSeen(cm(1, index=0)))])
    assert state.wanted == cm(1, index=0)
    spare = State(Assignment(1, None, 2, None, source="environment"), SETTINGS)
    state, actions = play([(0, AssignmentSeen(cm(1)))], spare)
    assert state.wanted == cm(1) and actions == ["0: start 1"]


def test_an_exit_after_the_trainer_reported_silent_peers_names_them_in_the_report() -> None:
    """JAX ends a trainer whose peer died (SIGABRT, 134): the report says which peers it lost (``peerLost``), so
    the operator counts their loss, not a failure of this pod. Heard from again: nothing named; exit 0: nothing."""
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1, step_at=2)])
    state, actions = sv.step(state, ChildMessage(11, {"event": "peerLost", "processes": [1, "x", 1]}), 5)
    assert any(isinstance(a, sv.Note) and "process(es) 1 silent" in a.text for a in actions), actions
    _, actions = sv.step(state, ChildExited(11, 134), 9)
    assert [a for a in actions if isinstance(a, sv.Report)] == [sv.Report(1, 134, None, (1,))]
    value = json.loads(exit_annotation(1, 134, 0.0, None, (1,))["reprieve.dev/exit"])
    assert value["peerLost"] == [1] and "agreed" not in value
    assert "peerLost" not in json.loads(exit_annotation(1, 1, 0.0)["reprieve.dev/exit"])
    back, _ = sv.step(state, ChildMessage(11, {"event": "peerLost", "processes": []}), 6)
    _, actions = sv.step(back, ChildExited(11, 134), 9)
    assert [a for a in actions if isinstance(a, sv.Report)] == [sv.Report(1, 134, None, ())]
    _, actions = sv.step(state, ChildExited(11, 0), 9)
    assert [a for a in actions if isinstance(a, sv.Report)] == [sv.Report(1, 0, None, ())]


# (case, the trainer's peerLost events' step fields, the last step its exit report carries)
LAST_STEPS = [
    ("none said (a runtime before lastStep, or no step finished yet)", [{}], None),
    ("said", [{"step": 41, "stepAt": 1764000054.25}], (41, 1764000054.25)),
    ("the loop moved on (a peer heard from again, then lost): the newest", [
        {"step": 41, "stepAt": 54.0}, {"step": 44, "stepAt": 57.0}], (44, 57.0)),
    ("never lower", [{"step": 44, "stepAt": 57.0}, {"step": 41, "stepAt": 58.0}], (44, 57.0)),
    ("malformed ones change nothing", [{"step": 41, "stepAt": 54}, {"step": "45", "stepAt": 58.0},
                                       {"step": 46, "stepAt": None}, {"step": True, "stepAt": 58.0},
                                       {"step": -1, "stepAt": 58.0}], (41, 54.0)),
]


@pytest.mark.parametrize("said,expected", [r[1:] for r in LAST_STEPS], ids=[r[0] for r in LAST_STEPS])
def test_the_exit_report_carries_the_last_step_the_trainer_said_with_peer_lost(
        said: list[dict[str, Any]], expected: tuple[int, float] | None) -> None:
    """A surviving trainer says its last finished step with ``peerLost`` (the gang's: training is synchronous);
    the exit report carries it (``lastStep``, ``lastStepAt``) so the operator counts the steps after process 0's
    last progress report as lost (docs/goodput.md)."""
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1, step_at=2)])
    for i, fields in enumerate(said):
        state, _ = sv.step(state, ChildMessage(11, {"event": "peerLost", "processes": [0], **fields}), 5 + i)
    _, actions = sv.step(state, ChildExited(11, 134), 9)
    assert [a for a in actions if isinstance(a, sv.Report)] == [sv.Report(1, 134, None, (0,), expected)]
    value = json.loads(exit_annotation(1, 134, 0.0, None, (0,), expected)["reprieve.dev/exit"])
    if expected is None:
        assert "lastStep" not in value and "lastStepAt" not in value
    else:
        assert (value["lastStep"], value["lastStepAt"]) == expected


def test_the_exit_report_names_the_lost_peers_whose_pulse_did_not_answer() -> None:
    """``gone`` (of the processes said lost, those whose pulse did not answer) goes into the exit report as
    ``peerGone``, so the operator counts them lost without probing them; one not said lost is left out."""
    state, _ = play([(0, AssignmentSeen(None)), *started(11, 1, step_at=2)])
    state, _ = sv.step(state, ChildMessage(11, {"event": "peerLost", "processes": [2, 0], "gone": [2, 3, "x"]}), 5)
    _, actions = sv.step(state, ChildExited(11, 134), 9)
    report = next(a for a in actions if isinstance(a, sv.Report))
    assert (report.peer_lost, report.peer_gone) == ((0, 2), (2,)), report
    value = json.loads(exit_annotation(1, 134, 0.0, None, report.peer_lost, None, report.peer_gone)["reprieve.dev/exit"])
    assert (value["peerLost"], value["peerGone"]) == ([0, 2], [2]), value
    plain = json.loads(exit_annotation(1, 134, 0.0, None, (0,))["reprieve.dev/exit"])
    assert "peerGone" not in plain, plain


def test_a_finished_run_says_it_ends_the_pre_warmed_process_not_the_trainer() -> None:
    """It logged "training finished: sending SIGKILL to pid N", N the warm process (issue 46)."""
    state = State(ENV_A, SETTINGS)
    events = [(0, AssignmentSeen(None)), *started(11, 1, step_at=5), (5, Spawned(21, "warm")),
              (50, ChildExited(11, 0))]
    for now, event in events:
        state, actions = sv.step(state, event, now)
    assert [(a.pid, a.sig, a.why) for a in actions if isinstance(a, sv.Signal)] == [
        (21, signal.SIGKILL, "training finished: ending the pre-warmed process")]
