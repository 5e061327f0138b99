"""What ``reprieve-supervisor`` decides next (pure): the supervisor's state machine.

``docs/contract.md``, "In-place restarts and the supervisor", is the protocol; :mod:`.process` is the shell that
does the I/O (processes, signals, the Kubernetes API) and :mod:`.contract` the formats it reads and writes.
Everything here is a function of its inputs: :func:`step` takes the supervisor's :class:`State` and one event
and returns the new state and the actions to carry out, so ``tests/runtime/test_supervisor_protocol.py`` can
play whole restarts as tables.

The rules, in the order :func:`decide` applies them:

1. Stopping (SIGTERM or SIGINT to the supervisor, or an assignment in a contract it does not speak): the warm
   process is killed, the trainer gets SIGTERM and, ``grace`` later, SIGKILL; once nothing runs the supervisor
   exits with the trainer's code (143 if none ran; 2 for a contract it does not speak). In a local run
   (``reprieve run``) SIGINT is the terminal's Ctrl-C, a deliberate stop: the trainer gets SIGINT (the runtime
   saves at the next step and exits), a second SIGINT or SIGTERM kills it at once, and the loop exits
   :data:`INTERRUPTED_EXIT` unless the trainer failed or finished on its own.
2. The trainer of the newest assignment exited 0: the warm process is killed and the supervisor exits 0.
   Without an assignment source (outside a cluster) any exit of the one trainer ends the supervisor with its code.
3. A trainer whose attempt is older than the newest assignment (superseded) gets SIGTERM, ``grace`` later
   SIGKILL; nothing of the next attempt starts before it is reaped (and the shell kills what it left behind).
   When that assignment grows the gang and lists this pod (its node stays), a trainer past its first step gets
   :data:`.contract.RESIZE_SIGNAL` instead (:func:`stop_signal`): the runtime saves the agreed step to the memory
   tier alone, since no node goes away.
   A trainer that announces its decided exit code (``exiting``: checkpoint committed, signals ignored) has it
   reported at once, so the next assignment is usually there when it ends; its exit is reported again only
   if the code differs.
4. No trainer, and the newest assignment lists this pod with an attempt newer than every attempt run: a warm
   process in ``reprieve.init()`` takes it over, parked or past its imports (it said ``warming``: it then skips
   what is left of its warm-up, :data:`.trainer.ASSIGNMENT_WAIT_S`); one still importing is waited for until it
   says ``warming``, up to :data:`WARM_START_S` after its own start (a cold process started now would repeat the
   imports it is doing, so it gets there sooner unless it hangs); then it is killed and a cold process starts.
5. A warm process for the next attempt starts once pre-warming can help and cannot hurt: the command is known to
   reach ``reprieve.init()`` (a trainer said so, or none ran yet: a spare), the trainer has made its first step
   (or ``prewarm_delay`` passed since it started), and none exists. A warm process that refuses (devices touched
   before ``reprieve.init()``), dies, or is not parked within ``ready_timeout`` turns pre-warming off for the
   supervisor's life: every later attempt starts cold.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import DEFAULT_RESTART_EXIT_CODE, RESTART_CODE_MAX, RESTART_CODE_MIN
from ..env import Env
from ..restarts import classify_exit, describe_exit, local_next
from .contract import NO_TRAINER_EXIT, RESIZE_GROW, RESIZE_SIGNAL, SPAWN_FAILED_EXIT, Assignment

INTERRUPTED_EXIT = 128 + signal.SIGINT  # a local run stopped by Ctrl-C (a shell's code for it)
# How long after a warm process's start rule 4 waits for it to get past its imports: a pod made for the restart
# starts its warm process as it starts, and the assignment, written once the pod runs, comes 0.1-0.7 s later (six
# of the soak's cold starts killed such a process and did its imports again, both competing for the CPU). Its
# interpreter and imports took 2.5 s there (a cold start's first 2.5 s of 2.6-3.3 s to the first step; 5.2 s in the
# restart that killed a warm process 2.7 s into its start); this bounds what one that hangs costs. Past its imports
# it is handed the attempt at once and skips its warm-up (the trace and lowering ahead, 0.5-1 s there).
WARM_START_S = 5.0


@dataclass(frozen=True)
class Settings:
    """Knobs (``docs/runtime.md``, "Running under reprieve-supervisor")."""

    grace_s: float = 30.0  # REPRIEVE_TERMINATION_GRACE_SECONDS: SIGTERM -> SIGKILL
    prewarm: bool = True  # REPRIEVE_PREWARM
    # REPRIEVE_PREWARM_DELAY_SECONDS: only for a trainer that never reports its first step. The report is the
    # trigger: a warm process importing JAX beside a first step that compiles slows the compile (measured: the
    # first step after a restart took ~65 s with a warm process started 30 s in, on 2 shared cores).
    prewarm_delay_s: float = 300.0
    ready_timeout_s: float = 300.0  # REPRIEVE_PREWARM_READY_TIMEOUT_SECONDS: import time allowed
    handover_timeout_s: float = 10.0  # a warm process confirms its assignment within this
    restart_code: int = DEFAULT_RESTART_EXIT_CODE  # REPRIEVE_RESTART_EXIT_CODE: tells a saved exit (reprieve.restarts)
    max_restarts: int | None = None  # the local loop's --max-restarts (None: no limit)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Raises ConfigError (a ValueError) naming the variable."""
        r = Env(env)
        return cls(grace_s=r.number("REPRIEVE_TERMINATION_GRACE_SECONDS", cls.grace_s, minimum=0.0),
                   restart_code=r.integer("REPRIEVE_RESTART_EXIT_CODE", DEFAULT_RESTART_EXIT_CODE,
                                          minimum=RESTART_CODE_MIN, maximum=RESTART_CODE_MAX),
                   prewarm=r.flag("REPRIEVE_PREWARM", cls.prewarm),
                   prewarm_delay_s=r.number("REPRIEVE_PREWARM_DELAY_SECONDS", cls.prewarm_delay_s, minimum=0.0),
                   ready_timeout_s=r.number("REPRIEVE_PREWARM_READY_TIMEOUT_SECONDS", cls.ready_timeout_s,
                                            minimum=0.0))


@dataclass(frozen=True)
class Trainer:
    pid: int
    assignment: Assignment
    started_at: float
    warm: bool = False  # taken over by a warm process
    confirmed: bool = True  # a warm process confirms (its reprieve.init() took the assignment)
    init_seen: bool = False  # it reported reprieve.init()
    first_step_at: float | None = None
    term_at: float | None = None  # SIGTERM (for a Ctrl-C of a local run SIGINT, for a grow RESIZE_SIGNAL) sent
    term_sig: int = signal.SIGTERM  # which of them
    kill_sent: bool = False
    refused: str | None = None  # a warm process refused the assignment: why
    previous_highest: int = 0  # highest_run before this one (a refused take-over is not a run)
    announced: int | None = None  # the exit code it announced (and that was reported) before it ended
    peer_lost: tuple[int, ...] = ()  # the processes it last reported silent (``peerLost``): named in its exit report
    peer_gone: tuple[int, ...] = ()  # ... of them, those whose pulse did not answer (``gone``): ``peerGone``
    last_step: tuple[int, float] | None = None  # its newest last finished step and when (``peerLost``'s step, stepAt)


@dataclass(frozen=True)
class Warm:
    pid: int
    started_at: float
    ready: bool = False  # parked in reprieve.init(), waiting for its assignment
    kill_sent: bool = False
    warming: bool = False  # in reprieve.init(): its imports are done, its warm-up before parking is not
    awaited_since: float | None = None  # an assignment has waited for it to get past its imports since then (rule 4)


@dataclass(frozen=True)
class State:
    env_assignment: Assignment
    settings: Settings = field(default_factory=Settings)
    wanted: Assignment | None = None  # the newest assignment (None: not known yet)
    wanted_at: float = 0.0  # when it arrived
    highest_run: int = 0  # the newest attempt a trainer was started for
    trainer: Trainer | None = None
    warm: Warm | None = None
    pending: bool = False  # a start is being carried out (its Spawned/SpawnFailed comes next)
    stop_since: float | None = None
    stop_code: int | None = None  # exit with this instead of the trainer's (a refused contract: 2)
    finished: bool = False  # the trainer of the newest attempt exited 0
    last_code: int | None = None
    saw_init: bool = False  # a trainer reported reprieve.init(): the command reaches it
    prewarm_off: str | None = None  # why pre-warming is off (None: on)
    topology: str | None = None  # the devices the latest trainer reported with its first step (JSON), for warm ones
    landing: int | None = None  # the bytes the latest trainer's restore landed (its first step's report), for warm ones
    owned: int | None = None  # and copied into memory XLA allocates (the same report), for warm ones
    static: bool = False  # no assignment source (outside a cluster): the first trainer's exit ends it all
    local: bool = False  # `reprieve run`: a static supervisor that restarts a saved exit (reprieve.restarts)
    restarts: int = 0  # local restarts done
    force_kill: bool = False  # a second SIGINT/SIGTERM while stopping a local run: SIGKILL now
    interrupted: bool = False  # a local run stopped by SIGINT (Ctrl-C): the trainer gets SIGINT, the loop ends 130

    def replace(self, **changes: Any) -> State:
        return dataclasses.replace(self, **changes)


# events
@dataclass(frozen=True)
class AssignmentSeen:
    assignment: Assignment | None  # None: the ConfigMap does not exist


@dataclass(frozen=True)
class Refuse:
    reason: str  # the assignment is in a contract this supervisor does not speak


@dataclass(frozen=True)
class Spawned:
    pid: int
    role: str  # "trainer" | "warm"
    assignment: Assignment | None = None


@dataclass(frozen=True)
class SpawnFailed:
    role: str
    error: str
    assignment: Assignment | None = None


@dataclass(frozen=True)
class ChildMessage:
    pid: int
    message: Mapping[str, Any]


@dataclass(frozen=True)
class ChildExited:
    pid: int
    code: int


@dataclass(frozen=True)
class Terminate:
    signal: str


@dataclass(frozen=True)
class Tick:
    pass


Event = AssignmentSeen | Refuse | Spawned | SpawnFailed | ChildMessage | ChildExited | Terminate | Tick


# actions
@dataclass(frozen=True)
class Signal:
    pid: int
    sig: int
    why: str


@dataclass(frozen=True)
class StartTrainer:
    assignment: Assignment
    why: str


@dataclass(frozen=True)
class StartWarm:
    why: str
    topology: str | None = None  # passed on in EXPECTED_TOPOLOGY_ENV
    landing: int | None = None  # passed on in LANDING_BYTES_ENV
    owned: int | None = None  # passed on in OWNED_BYTES_ENV


@dataclass(frozen=True)
class HandOver:
    pid: int
    assignment: Assignment
    why: str


@dataclass(frozen=True)
class Report:
    attempt: int
    code: int
    agreed: bool | None = None  # for the restart code: was it announced (a saved exit)? None for other codes
    peer_lost: tuple[int, ...] = ()  # a failed exit after the trainer reported these processes silent
    last_step: tuple[int, float] | None = None  # the trainer's last finished step and when, if it said (lastStep)
    peer_gone: tuple[int, ...] = ()  # of peer_lost, those whose pulse did not answer (node gone or cut off)


@dataclass(frozen=True)
class Exit:
    code: int
    why: str


@dataclass(frozen=True)
class Note:
    text: str
    debug: bool = False
    loud: bool = False  # logged as an error: something the user must hear about


Action = Signal | StartTrainer | StartWarm | HandOver | Report | Exit | Note


def step(state: State, event: Event, now: float) -> tuple[State, list[Action]]:
    """Apply ``event`` (at time ``now``), then :func:`decide`: the new state and every action to carry out."""
    state, notes = _apply(state, event, now)
    state, actions = decide(state, now)
    return state, notes + actions


def _apply(s: State, ev: Event, now: float) -> tuple[State, list[Action]]:
    if isinstance(ev, AssignmentSeen):
        a = ev.assignment
        if a is None:
            if s.wanted is None:
                e = s.env_assignment
                where = "a local run" if s.local else "no assignment ConfigMap"
                return s.replace(wanted=e, wanted_at=now), [Note(f"{where}: {e.describe()}")]
            return s, [Note("the assignment ConfigMap is gone; keeping the last assignment", debug=True)]
        e = s.env_assignment
        if s.wanted is None and e.listed and (a.attempt, a.process_id, a.num_processes) == (
                e.attempt, e.process_id, e.num_processes):
            # The attempt this pod was created for: its environment holds the same assignment, and it is the one
            # to run (a platform may have resolved the coordinator's name in it, as the local process kubelet
            # does; the ConfigMap cannot be).
            return s.replace(wanted=e, wanted_at=now), [Note(f"assignment: {e.describe()}, as the ConfigMap's")]
        if s.wanted is None or a.attempt > s.wanted.attempt:
            return s.replace(wanted=a, wanted_at=now), [Note(f"assignment: {a.describe()}")]
        if a.attempt < s.wanted.attempt:
            return s, [Note(f"ignoring an older assignment ({a.describe()}); the newest is attempt "
                            f"{s.wanted.attempt}")]
        return s, []
    if isinstance(ev, Refuse):
        if s.stop_code is None:
            return s.replace(stop_code=2, stop_since=s.stop_since or now), [Note(ev.reason)]
        return s, []
    if isinstance(ev, Terminate):
        if s.stop_since is None:
            if s.local and ev.signal == "SIGINT":
                return s.replace(stop_since=now, interrupted=True), [Note(
                    "SIGINT (Ctrl-C): stopping: the trainer saves at its next step and exits, and the loop ends "
                    f"with code {INTERRUPTED_EXIT}; a second Ctrl-C kills it without saving")]
            return s.replace(stop_since=now), [Note(f"{ev.signal}: stopping (the trainer gets SIGTERM)")]
        if s.local and s.trainer is not None and not s.force_kill:
            return s.replace(force_kill=True), []  # said by the SIGKILL's line, with the time since the first
        return s, []
    if isinstance(ev, Spawned):
        if ev.role == "warm":
            return s.replace(pending=False, warm=Warm(ev.pid, now)), []
        assert ev.assignment is not None
        t = Trainer(ev.pid, ev.assignment, now, previous_highest=s.highest_run)
        return s.replace(pending=False, trainer=t, highest_run=ev.assignment.attempt), []
    if isinstance(ev, SpawnFailed):
        if ev.role == "warm":
            return s.replace(pending=False, prewarm_off=f"the warm process could not start: {ev.error}"), []
        assert ev.assignment is not None
        attempt = ev.assignment.attempt
        return (s.replace(pending=False, highest_run=attempt, last_code=SPAWN_FAILED_EXIT),
                [Note(f"attempt {attempt}: the command could not start: {ev.error}"),
                 Report(attempt, SPAWN_FAILED_EXIT)])
    if isinstance(ev, ChildMessage):
        return _message(s, ev, now)
    if isinstance(ev, ChildExited):
        return _exited(s, ev, now)
    return s, []


def _message(s: State, ev: ChildMessage, now: float) -> tuple[State, list[Action]]:
    kind = str(ev.message.get("event", ""))
    t, w = s.trainer, s.warm
    if t is not None and ev.pid == t.pid:
        a = t.assignment.attempt
        if kind == "init":
            notes: list[Action] = []
            if not t.confirmed:
                notes.append(Note(f"attempt {a}: the warm process (pid {t.pid}) took over "
                                  f"{now - s.wanted_at:.2f}s after the assignment"))
            return s.replace(trainer=dataclasses.replace(t, init_seen=True, confirmed=True), saw_init=True), notes
        if kind == "step" and t.first_step_at is None:
            mode = "warm" if t.warm else "cold"
            topology = ev.message.get("topology")
            if isinstance(topology, dict):
                s = s.replace(topology=json.dumps(topology, sort_keys=True))
            for key in ("landing", "owned"):
                nbytes = ev.message.get(key)
                if isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes > 0:
                    s = s.replace(**{key: nbytes})
            return (s.replace(trainer=dataclasses.replace(t, first_step_at=now)),
                    [Note(f"attempt {a}: first step done {now - t.started_at:.2f}s after the {mode} start, "
                          f"{now - s.wanted_at:.2f}s after the assignment arrived")])
        if kind == "error" and not t.confirmed:
            why = str(ev.message.get("message", "no reason given"))
            return (s.replace(trainer=dataclasses.replace(t, refused=why), prewarm_off=why),
                    [Note(f"attempt {a}: the warm process refused its assignment: {why}")])
        if kind == "peerLost":
            lost = _processes(ev.message.get("processes"))
            gone = tuple(p for p in _processes(ev.message.get("gone")) if p in lost)
            last = _newer_step(t.last_step, ev.message.get("step"), ev.message.get("stepAt"))
            return s.replace(trainer=dataclasses.replace(t, peer_lost=lost, peer_gone=gone, last_step=last)), [
                Note(f"attempt {a}: the trainer reports process(es) {', '.join(map(str, lost))} silent" if lost else
                     f"attempt {a}: the trainer hears from every process again")]
        code = ev.message.get("code")
        if kind == "exiting" and t.confirmed and t.announced is None and type(code) is int and 0 <= code <= 255:
            # Reported now, not at the exit: the operator decides the next attempt while this process leaves the
            # job and ends. Nothing of the next attempt starts here before it is reaped (rule 3).
            return (s.replace(trainer=dataclasses.replace(t, announced=code)),
                    [Note(f"attempt {a}: the trainer (pid {t.pid}) is exiting with code {code}: reported before "
                          "it ends"), Report(a, code, _agreed(s, code, code), last_step=t.last_step)])
        return s, []
    if w is not None and ev.pid == w.pid:
        if kind == "warming" and not w.ready:
            return s.replace(warm=dataclasses.replace(w, warming=True)), []
        if kind == "ready" and not w.ready:
            return (s.replace(warm=dataclasses.replace(w, ready=True)),
                    [Note(f"warm process (pid {w.pid}) parked in reprieve.init() after {now - w.started_at:.2f}s")])
        if kind == "error":
            why = str(ev.message.get("message", "no reason given"))
            return s.replace(prewarm_off=why), [Note(f"the warm process (pid {w.pid}) refused: {why}")]
    return s, []


def _processes(raw: object) -> tuple[int, ...]:
    """A list of process indices from a trainer's message, sorted, without duplicates (anything else: none)."""
    return tuple(sorted({p for p in raw if type(p) is int and p >= 0})) if isinstance(raw, list) else ()


def _newer_step(known: tuple[int, float] | None, step: Any, at: Any) -> tuple[int, float] | None:
    """The newer of ``known`` and a trainer's (``step``, ``at``) (the loop moves on while a peer is heard from
    again: the highest step wins); malformed values change nothing."""
    if type(step) is not int or step < 0 or type(at) not in (int, float) or at < 0:
        return known
    return (step, float(at)) if known is None or step > known[0] else known


def _exited(s: State, ev: ChildExited, now: float) -> tuple[State, list[Action]]:
    t, w = s.trainer, s.warm
    if t is not None and ev.pid == t.pid:
        a = t.assignment.attempt
        if not t.confirmed:  # a warm process that did not take over: no run, no report; start cold
            off = s.prewarm_off or (f"the warm process exited with code {ev.code} before taking over attempt {a}")
            return (s.replace(trainer=None, highest_run=t.previous_highest, prewarm_off=off),
                    [Note(f"attempt {a}: the warm process (pid {t.pid}) did not take over (exit {ev.code}); "
                          "starting it cold")])
        superseded = s.wanted is not None and s.wanted.attempt > a
        finished = ev.code == 0 and not superseded
        note = Note(f"attempt {a}: trainer (pid {t.pid}) exited with code {ev.code} after "
                    f"{now - t.started_at:.1f}s" + (" (superseded)" if superseded else ""))
        if t.announced is not None and t.announced != ev.code:
            note = Note(note.text + f", not the {t.announced} it announced: reporting {ev.code}")
        # announced and reported already: not again
        lost = t.peer_lost if ev.code not in (0, t.announced) else ()
        gone = t.peer_gone if lost else ()
        if lost:
            note = Note(note.text + f", after process(es) {', '.join(map(str, lost))} went silent: reported as "
                                    "lost with them")
        notes: list[Action] = [note, *([] if t.announced == ev.code else [Report(a, ev.code, _agreed(s, ev.code,
                                                                                                  t.announced),
                                                                                   lost, t.last_step, gone)])]
        exit_kind = classify_exit(ev.code, t.announced, s.settings.restart_code)
        if exit_kind == "unagreed":
            notes.append(Note(f"attempt {a}: {describe_exit(exit_kind, ev.code, s.settings.restart_code)}",
                              loud=True))
        s = s.replace(trainer=None, last_code=ev.code, finished=s.finished or finished)
        if s.local and s.stop_since is None and not superseded:
            restart, why = local_next(exit_kind, s.restarts, s.settings.max_restarts)
            notes.append(Note(f"attempt {a}: {describe_exit(exit_kind, ev.code, s.settings.restart_code)}; {why}"))
            if restart:
                nxt = dataclasses.replace(t.assignment, attempt=a + 1, source="local restart")
                s = s.replace(wanted=nxt, wanted_at=now, restarts=s.restarts + 1)
        return s, notes
    if w is not None and ev.pid == w.pid:
        if w.kill_sent:
            return s.replace(warm=None), []
        where = "while parked in reprieve.init()" if w.ready else "before it reached reprieve.init()"
        off = s.prewarm_off or f"the warm process exited with code {ev.code} {where}"
        return s.replace(warm=None, prewarm_off=off), [Note(f"warm process (pid {w.pid}): {off}")]
    return s, [Note(f"reaped orphan pid {ev.pid} (exit {ev.code})", debug=True)]


def decide(s: State, now: float) -> tuple[State, list[Action]]:
    """The level-triggered part: what to do now (the module docstring lists the rules). Idempotent: what it
    starts or signals is recorded in the returned state, so calling it again does not repeat it."""
    if s.pending:
        return s, []
    if s.stop_since is not None:
        s, acts = _stop_children(s, now, "stopping")
        if s.trainer is None and s.warm is None:
            code = s.stop_code if s.stop_code is not None else (
                s.last_code if s.last_code is not None else NO_TRAINER_EXIT)
            why = "stopping: nothing runs any more"
            if s.interrupted and s.stop_code is None and interrupted_code(s.last_code, s.settings.restart_code):
                code, why = INTERRUPTED_EXIT, "stopped by Ctrl-C"
            acts.append(Exit(code, why))
        return s, acts
    if s.finished:
        s, acts = _kill_warm(s, "training finished")
        if s.trainer is None and s.warm is None:
            acts.append(Exit(0, "training finished (the trainer exited 0)"))
        return s, acts
    if (s.static and s.highest_run > 0 and s.trainer is None
            and not (s.wanted is not None and s.wanted.attempt > s.highest_run)):  # a local restart is wanted
        s, acts = _kill_warm(s, "no further attempt can be assigned")
        if s.warm is None:
            code = s.last_code if s.last_code is not None else NO_TRAINER_EXIT
            acts.append(Exit(code, "no assignment source (not in a cluster): passing on the trainer's code"))
        return s, acts
    acts = []
    w = s.warm
    if w is not None and not w.kill_sent:
        if s.prewarm_off is not None:
            s, acts = _kill_warm(s, f"pre-warming is off: {s.prewarm_off}")
        elif not w.ready and now >= w.started_at + s.settings.ready_timeout_s:
            off = f"the warm process did not reach reprieve.init() within {s.settings.ready_timeout_s:.0f}s"
            s, acts = _kill_warm(s.replace(prewarm_off=off), off)
    t = s.trainer
    if t is not None:
        a = t.assignment.attempt
        superseded = s.wanted is not None and s.wanted.attempt > a
        if not t.confirmed:
            late = now >= t.started_at + s.settings.handover_timeout_s
            if not t.kill_sent and (t.refused or late or superseded):
                why = t.refused or ("superseded" if superseded else
                                    f"no confirmation within {s.settings.handover_timeout_s:.0f}s")
                s = s.replace(trainer=dataclasses.replace(t, kill_sent=True),
                              prewarm_off=s.prewarm_off or f"a warm process failed to take over: {why}")
                acts.append(Signal(t.pid, signal.SIGKILL, f"attempt {a}: warm take-over failed ({why})"))
            return s, acts
        if superseded:
            assert s.wanted is not None
            sig = stop_signal(s.wanted, t)
            s, more = _terminate(s, t, now, f"attempt {a} superseded by attempt {s.wanted.attempt}"
                                 + (" (a grow: save to the memory tier)" if sig == RESIZE_SIGNAL else ""), sig)
            return s, acts + more
        if _prewarm_due(s, now):
            return s.replace(pending=True), acts + [StartWarm(f"pre-warming the attempt after {a}", s.topology,
                                                              s.landing, s.owned)]
        return s, acts
    wanted = s.wanted
    if wanted is not None and wanted.listed and wanted.attempt > s.highest_run:
        w = s.warm
        if w is not None and not w.kill_sent and (w.ready or w.warming):
            trainer = Trainer(w.pid, wanted, now, warm=True, confirmed=False, previous_highest=s.highest_run)
            where = "" if w.ready else f", past its imports {now - w.started_at:.2f}s into its start (no warm-up)"
            return (s.replace(warm=None, trainer=trainer, highest_run=wanted.attempt),
                    acts + [HandOver(w.pid, wanted, f"attempt {wanted.attempt}: handing process "
                                                    f"{wanted.process_id}/{wanted.num_processes} to the warm "
                                                    f"process (pid {w.pid}){where}")])
        if w is not None and not w.kill_sent:
            until = w.started_at + WARM_START_S
            if now < until:  # it gets past its imports sooner than a cold process started now would
                notes: list[Action] = [] if w.awaited_since is not None else [Note(
                    f"attempt {wanted.attempt}: waiting up to {until - now:.2f}s for the warm process (pid {w.pid}): "
                    f"it is still importing, {now - w.started_at:.2f}s into its start")]
                return s.replace(warm=dataclasses.replace(w, awaited_since=now if w.awaited_since is None else w.awaited_since)), acts + notes
            why = f"it did not reach reprieve.init() within {WARM_START_S:g}s of its start"
            s, more = _kill_warm(s, f"{why}; starting cold")
            acts += more
        return s.replace(pending=True), acts + [StartTrainer(wanted, f"attempt {wanted.attempt}: starting "
                                                                     f"process {wanted.process_id}/"
                                                                     f"{wanted.num_processes} cold")]
    if _prewarm_due(s, now):
        return s.replace(pending=True), acts + [StartWarm("pre-warming the next attempt", s.topology, s.landing,
                                                          s.owned)]
    return s, acts


def stop_signal(wanted: Assignment, trainer: Trainer) -> int:
    """The signal that stops a trainer ``wanted`` supersedes (pure): :data:`.contract.RESIZE_SIGNAL` when
    ``wanted`` grows the gang and lists this pod (the node stays: the agreed step need not reach storage) and the
    trainer made its first step (its handler is installed long before: a process before ``reprieve.init()``
    would die of the signal unsaved); SIGTERM otherwise."""
    if wanted.resize == RESIZE_GROW and wanted.listed and trainer.first_step_at is not None:
        return RESIZE_SIGNAL
    return signal.SIGTERM


def _prewarm_due(s: State, now: float) -> bool:
    if s.prewarm_off is not None or not s.settings.prewarm or s.warm is not None or s.wanted is None:
        return False
    t = s.trainer
    if t is None:
        return s.saw_init or s.highest_run == 0  # idle between attempts, or a spare that never ran one
    if not t.confirmed or t.term_at is not None or not t.init_seen:
        return False
    return t.first_step_at is not None or now >= t.started_at + s.settings.prewarm_delay_s


def interrupted_code(last_code: int | None, restart_code: int) -> bool:
    """Whether a local run stopped by Ctrl-C ends with :data:`INTERRUPTED_EXIT` (pure): the trainer saved and
    exited with the restart code, was ended by a signal (``>= 128``: the second Ctrl-C's SIGKILL), or none ran; a
    trainer that failed (1) or finished (0) on its own passes its code on."""
    return last_code is None or last_code == restart_code or last_code >= 128


def _terminate(s: State, t: Trainer, now: float, why: str, sig: int = signal.SIGTERM) -> tuple[State, list[Action]]:
    if t.term_at is None:
        return (s.replace(trainer=dataclasses.replace(t, term_at=now, term_sig=sig)),
                [Signal(t.pid, sig, why)])
    if t.kill_sent:
        return s, []
    waited, sent = now - t.term_at, signal.Signals(t.term_sig).name
    if s.force_kill:
        return (s.replace(trainer=dataclasses.replace(t, kill_sent=True)),
                [Signal(t.pid, signal.SIGKILL, f"{why}: a second stop signal {waited:.1f}s after the {sent}: "
                                               "killing the trainer")])
    if now >= t.term_at + s.settings.grace_s:
        return (s.replace(trainer=dataclasses.replace(t, kill_sent=True)),
                [Signal(t.pid, signal.SIGKILL, f"{why}: still running {waited:.1f}s after {sent} (grace "
                                               f"{s.settings.grace_s:g}s, REPRIEVE_TERMINATION_GRACE_SECONDS)")])
    return s, []


def _agreed(s: State, code: int, announced: int | None) -> bool | None:
    """The exit report's ``agreed``: for the restart code, whether the runtime announced it (a saved exit)."""
    return None if code != s.settings.restart_code else classify_exit(code, announced, code) == "saved"


def _kill_warm(s: State, why: str) -> tuple[State, list[Action]]:
    w = s.warm
    if w is None or w.kill_sent:
        return s, []
    return (s.replace(warm=dataclasses.replace(w, kill_sent=True)),
            [Signal(w.pid, signal.SIGKILL, f"{why}: ending the pre-warmed process")])


def _stop_children(s: State, now: float, why: str) -> tuple[State, list[Action]]:
    s, acts = _kill_warm(s, why)
    t = s.trainer
    if t is not None:
        if s.interrupted:
            s, more = _terminate(s, t, now, "Ctrl-C", signal.SIGINT)
        else:
            s, more = _terminate(s, t, now, f"{why}: forwarding SIGTERM to the trainer")
        acts += more
    return s, acts
