"""``Job.save`` asks each save target's policy (reprieve.policy, reprieve.targets): one job, a fake checkpointer
(the storage target's), a fake memory tier (the memory target's), a fake agreement and a fake clock, and every
save decision a step can meet: periodic, time-based, forced, agreed, the memory schedule, and the agreed final
step with its memory copy beside it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from reprieve import teardown
from reprieve.agreement import FINAL
from reprieve.config import RuntimeConfig
from reprieve.coordination import LocalCoordinator
from reprieve.deferred import DeferredState
from reprieve.finished import FinishedSteps
from reprieve.job import Job
from reprieve.notice import Notice
from reprieve.policy import SavePolicy

from tests.runtime.helpers_memtier import FakeTier

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Checkpointer:
    """The storage target's checkpointer: every save commits at once."""

    last_save_seconds: float | None = None

    def __init__(self) -> None:
        self.saves: list[tuple[int, str]] = []
        self.closed = False

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None:
        assert extra is not None and extra["user"] == "x" and extra["reprieve"]["step"] == step
        self.saves.append((step, extra["reprieve"]["kind"]))
        self.last_save_seconds = 0.5

    def wait(self) -> None:
        pass

    def latest_step(self) -> int | None:
        return self.saves[-1][0] if self.saves else None

    def restore(self, abstract_state: Any, *, step: int | None = None) -> tuple[int, Any, dict[str, Any]]:
        raise FileNotFoundError

    def close(self) -> None:
        self.closed = True


class Agreement:
    """Every process agreed ``agreed[step]`` for a step; ``requests``: what process 0 asked to agree on."""

    poll_s = 0.0
    noticed_nodes: frozenset[str | None] = frozenset({"node-b"})  # the nodes the notices offered here name

    def __init__(self, agreed: dict[int, str], reason: str = "maintenance", node: str | None = None) -> None:
        self.agreed, self.reason, self.node = agreed, reason, node
        self.requests: list[tuple[int, str]] = []
        self.step = -1
        self.target: Any = None
        self.decided: list[int] = []  # the steps decide() was asked about

    def quiet(self, step: int) -> bool:
        """Nothing agreed at ``step`` (the real one: no round, plan or save round in force)."""
        self.step = step
        return self.target is None and step not in self.agreed

    def decide(self, step: int) -> str | None:
        self.step = step
        self.decided.append(step)
        kind = self.agreed.get(step)
        if kind == FINAL:
            notice = Notice(id="n-1", source="user", reason=self.reason, deadline=None, received_at=0.0,
                            node=self.node)
            self.target = SimpleNamespace(notice=notice, deadline=None, deadline_known=False,
                                          plan=SimpleNamespace(final_step=step))
        return kind

    def request_save(self, reason: str) -> bool:
        self.requests.append((self.step, reason))
        return True

    def report(self, **_: Any) -> None:
        pass

    def begin(self, start: int, last_step: int | None = None) -> None:
        pass

    def handled(self, notice_id: str, step: int) -> None:
        pass

    def close(self, timeout_s: float = 0.0) -> None:
        pass

    def join(self, timeout_s: float) -> None:
        pass


class Hub:
    def close(self) -> None:
        pass


class Exited(Exception):
    pass


def _exit(code: int) -> None:
    raise Exited(code)


def test_each_target_saves_what_its_policy_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teardown, "ignore_termination_signals", lambda: None)  # the test process keeps its handlers
    clock, ckpt, tier = Clock(), Checkpointer(), FakeTier(due_at=frozenset({1, 4, 6}))
    agreement = Agreement({6: "interval", 9: FINAL})
    job = Job(RuntimeConfig(), LocalCoordinator(), ckpt, agreement, Hub(),  # type: ignore[arg-type]
              policy=SavePolicy(interval_steps=4, interval_seconds=10.0), exit_fn=_exit, memory=tier, clock=clock)
    started: dict[int, bool] = {}
    with pytest.raises(Exited) as exited:
        for step in job.steps(0, 20):
            if step == 5:
                clock.now += 10.0  # the time-based interval falls due: process 0 asks every process to save
            started[step] = job.save(step, {"w": step}, extra={"user": "x"}, force=step == 7)
    assert exited.value.args == (job.config.restart_exit_code,)
    assert ckpt.saves == [(3, "periodic"), (6, "interval"), (7, "forced"), (9, "final")]
    assert agreement.requests == [(5, "interval")]  # once: the interval's save at step 6 restarts its clock
    # the memory schedule's steps, but never an agreed one (step 6); the final step's copy beside its storage save
    assert tier.saves == [(1, "memory"), (4, "memory"), (9, "memory")]
    assert tier.capped_by == (4, 10.0)  # the storage interval caps the memory schedule
    assert [s for s, on in started.items() if on] == [3, 6, 7]  # storage saves started (the final one exits)
    assert job.committed_step == 9 and ckpt.closed
    m = job.metrics
    assert [m.get("reprieve_saves_total", kind=k) for k in ("periodic", "interval", "forced", "final", "memory")] \
        == [1, 1, 1, 1, 3]


@pytest.mark.parametrize("probing", [False, True], ids=["one-process", "probing"])
def test_a_deferred_state_is_built_only_at_the_steps_a_target_saves(monkeypatch: pytest.MonkeyPatch,
                                                                    probing: bool) -> None:
    """``reprieve.keras`` hands ``job.save`` a ``DeferredState`` after every batch (the dict of every Keras variable
    costs ~57 µs a batch at 1000 variables): the same decisions as with the state itself, the tree built once at each
    saved step (storage and memory share it) and at the first step's check; the probe's leaf looked at every step
    where the finished-step probe looks (a job of several processes), never in a job of one."""
    monkeypatch.setattr(teardown, "ignore_termination_signals", lambda: None)
    clock, tier = Clock(), FakeTier(due_at=frozenset({1, 4, 6}))
    written: list[Any] = []

    class Recording(Checkpointer):
        def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None:
            written.append(state)
            super().save(step, state, extra=extra)

    ckpt = Recording()
    job = Job(RuntimeConfig(), LocalCoordinator(), ckpt, Agreement({6: "interval", 9: FINAL}), Hub(),  # type: ignore[arg-type]
              policy=SavePolicy(interval_steps=4, interval_seconds=10.0), exit_fn=_exit, memory=tier, clock=clock)
    job.finished = FinishedSteps(probe=probing)
    built: list[int] = []
    probed: list[int] = []

    def deferred(step: int) -> DeferredState:
        def build() -> dict[str, int]:
            built.append(step)
            return {"w": step}

        def probe() -> dict[str, int]:
            probed.append(step)
            return {"w": step}

        return DeferredState(build, probe)

    with pytest.raises(Exited):
        for step in job.steps(0, 20):
            if step == 5:
                clock.now += 10.0
            job.save(step, deferred(step), extra={"user": "x"}, force=step == 7)
    assert ckpt.saves == [(3, "periodic"), (6, "interval"), (7, "forced"), (9, "final")]
    assert tier.saves == [(1, "memory"), (4, "memory"), (9, "memory")]
    assert written == [{"w": 3}, {"w": 6}, {"w": 7}, {"w": 9}]  # the built tree, never the DeferredState
    assert built == [0, 1, 3, 4, 6, 7, 9]  # the first step's state check, then once per saved step
    assert probed == (list(range(10)) if probing else [])


def test_idle_step_decides_a_step_with_nothing_due_and_sends_every_other_to_save(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``reprieve.keras`` asks ``idle_step`` before ``save`` at every batch: the same saves as ``save`` alone makes
    (the first test's, without the memory tier), ``idle_step`` True only at steps before the interval's next one
    with nothing agreed in flight and process 0's time-based interval not due, and a step it decided is not decided
    again by ``steps()``. With the memory tier on (its schedule measures every step) it sends every step to save."""
    monkeypatch.setattr(teardown, "ignore_termination_signals", lambda: None)
    clock, ckpt = Clock(), Checkpointer()
    agreement = Agreement({6: "interval", 9: FINAL})
    job = Job(RuntimeConfig(), LocalCoordinator(), ckpt, agreement, Hub(),  # type: ignore[arg-type]
              policy=SavePolicy(interval_steps=4, interval_seconds=10.0), exit_fn=_exit, clock=clock)
    idle: list[int] = []
    with pytest.raises(Exited):
        for step in job.steps(0, 20):
            if step == 5:
                clock.now += 10.0
            if step != 7 and job.idle_step(step, {"w": step}):
                idle.append(step)
                continue
            job.save(step, {"w": step}, extra={"user": "x"}, force=step == 7)
    assert ckpt.saves == [(3, "periodic"), (6, "interval"), (7, "forced"), (9, "final")]
    assert agreement.requests == [(5, "interval")]
    assert idle == [1, 2, 4, 8]  # 0: the first step's check; 3: the interval's; 5: the clock's; 6, 9: agreed
    assert agreement.decided == [0, 3, 5, 6, 7, 9]  # each step decided once: by save, or by idle_step alone
    assert job.finished.noted == 9
    memory = Job(RuntimeConfig(), LocalCoordinator(), Checkpointer(), Agreement({}), Hub(),  # type: ignore[arg-type]
                 policy=SavePolicy(interval_steps=4), exit_fn=_exit, memory=FakeTier(due_at=frozenset({2})))
    steps = memory.steps(0, 6)
    answers = []
    for step in steps:
        answers.append(memory.idle_step(step, {"w": step}))
        memory.save(step, {"w": step}, extra={"user": "x"})
    assert answers == [False] * 6


def test_the_loops_last_step_is_saved_as_last_not_periodic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's real last step was recorded (and counted) as ``periodic``, beside a notice's save as ``final``:
    ``reprieve ls`` could not tell the run's end from an interval's save. An interval's save round that falls on
    the last step is the last step too; a notice's early save keeps its kind."""
    monkeypatch.setattr(teardown, "ignore_termination_signals", lambda: None)
    ckpt = Checkpointer()
    job = Job(RuntimeConfig(), LocalCoordinator(), ckpt, Agreement({2: "early"}), Hub(),  # type: ignore[arg-type]
              policy=SavePolicy(interval_steps=4), exit_fn=_exit)
    for step in job.steps(0, 6):
        job.save(step, {"w": step}, extra={"user": "x"})
    assert ckpt.saves == [(2, "early"), (3, "periodic"), (5, "last")]
    assert job.metrics.get("reprieve_saves_total", kind="last") == 1


@pytest.mark.parametrize(("reason", "node", "tier", "storage", "memory", "to_memory"), [
    ("resize", None, FakeTier(), [], [(4, "memory")], True),  # a grow: every process holds it in memory, no storage
    ("resize", None, FakeTier(busy=True), [(4, "final")], [], True),  # the copy in flight never ends: storage
    ("resize", None, FakeTier(broken=True), [(4, "final")], [], True),  # the copy fails: storage
    ("resize", None, None, [(4, "final")], [], True),  # no memory tier: storage
    # a notice naming no node: storage, a copy beside it
    ("maintenance", None, FakeTier(node="node-a", peer_node="node-c"), [(4, "final")], [(4, "memory")], True),
    # a notice naming node-b (noticed here too): this pod's node and its peer's outlive it: memory alone
    ("maintenance", "node-b", FakeTier(node="node-a", peer_node="node-c"), [], [(4, "memory")], True),
    # this pod goes with node-b, its peer's node stays: memory alone (the restart reads the peer's copy)
    ("maintenance", "node-b", FakeTier(node="node-b", peer_node="node-a"), [], [(4, "memory")], True),
    # this pod's node (node-a, the agreed notice's) and its peer's (node-b, noticed here) both go: storage (no copy
    # started for memory alone), the copy beside it
    ("maintenance", "node-a", FakeTier(node="node-a", peer_node="node-b"), [(4, "final")], [(4, "memory")], True),
    # the peer's node is not known: storage, with the copy beside it
    ("maintenance", "node-b", FakeTier(node="node-b"), [(4, "final")], [(4, "memory")], True),
    # the copy in flight never ends: storage
    ("maintenance", "node-b", FakeTier(node="node-a", peer_node="node-c", busy=True), [(4, "final")], [], True),
    # this pod stays (node-a) and its peer goes with node-b: the copy is kept here, not sent: memory alone
    ("maintenance", "node-b", FakeTier(node="node-a", peer_node="node-b"), [], [(4, "memory")], True),
    # REPRIEVE_NOTICE_TO_MEMORY not set (the default): storage, the copy beside it, however safe memory would be
    ("maintenance", "node-b", FakeTier(node="node-a", peer_node="node-c"), [(4, "final")], [(4, "memory")], False),
], ids=["resize", "resize-busy", "resize-broken", "resize-no-tier", "notice-no-node", "notice-both-stay",
        "notice-peer-stays", "notice-both-go", "notice-peer-unknown", "notice-busy", "notice-peer-goes",
        "notice-by-default"])
def test_an_agreed_step_goes_to_memory_alone_where_every_copy_outlives_the_notice_else_to_storage(
        monkeypatch: pytest.MonkeyPatch, reason: str, node: str | None, tier: FakeTier | None,
        storage: list[tuple[int, str]], memory: list[tuple[int, str]], to_memory: bool) -> None:
    from reprieve import job as job_mod

    monkeypatch.setattr(teardown, "ignore_termination_signals", lambda: None)
    monkeypatch.setattr(job_mod, "RESIZE_MEMORY_WAIT_S", 0.01)
    ckpt = Checkpointer()
    config = RuntimeConfig(notice_to_memory=to_memory)
    job = Job(config, LocalCoordinator(), ckpt, Agreement({4: FINAL}, reason, node), Hub(),  # type: ignore[arg-type]
              exit_fn=_exit, memory=tier)
    with pytest.raises(Exited) as exited:
        for step in job.steps(0, 20):
            job.save(step, {"w": step}, extra={"user": "x"})
    assert exited.value.args == (job.config.restart_exit_code,)  # a saved exit either way
    assert ckpt.saves == storage
    assert (tier.saves if tier is not None else []) == memory
    if tier is not None:  # the exit waits only for what the restart reads: the tier is told the noticed nodes
        assert tier.left == (4, {"node-b", node}), tier.left  # the notices' nodes (the fake's may name none)
        if memory:
            assert tier.notices[4] == "n-1"  # the agreed step's copy records its notice, as storage's would
        # a pod that stays does not send the agreed step's copy to a noticed peer
        assert tier.kept_here == (4 if node == "node-b" and tier.cfg.node == "node-a" and tier.peer_node == "node-b"
                                  else None)


@pytest.mark.parametrize(("agreed", "forced", "last", "kind"), [
    (None, False, False, "periodic"), (None, True, False, "forced"), ("interval", False, False, "interval"),
    ("early", False, False, "early"), (None, False, True, "last"), (None, True, True, "last"),
    ("interval", False, True, "last"), ("early", False, True, "early"), ("final", False, True, "final"),
])
def test_save_kind(agreed: str | None, forced: bool, last: bool, kind: str) -> None:
    from reprieve.targets import save_kind

    assert save_kind(agreed, forced=forced, last=last) == kind


def test_the_capabilities_of_both_checkpointers_are_seen_once_and_a_plain_one_has_none() -> None:
    """``Capabilities.of``: the one place a checkpointer is asked what it offers (reprieve.capabilities)."""
    from reprieve.capabilities import Capabilities
    from reprieve.checkpoint.manager import CheckpointManager
    from reprieve.orbax import OrbaxCheckpointer

    manager = Capabilities.of(object.__new__(CheckpointManager))  # the class's methods: no storage opened
    assert None not in (manager.commit_callback, manager.restore_check, manager.process_extra,
                        manager.deferred_retention, manager.state_check, manager.host_landing)
    orbax = Capabilities.of(object.__new__(OrbaxCheckpointer))
    assert None not in (orbax.commit_callback, orbax.restore_check, orbax.process_extra, orbax.state_check)
    assert orbax.deferred_retention is None
    assert orbax.host_landing is None  # Orbax reads into buffers of its own: no landing memory populated for it
    assert Capabilities.of(Checkpointer()) == Capabilities()
