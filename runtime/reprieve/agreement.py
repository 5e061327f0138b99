"""Agreeing on one save step across processes, through the coordination service's key-value store.

Protocol (one *round* per notice that changes the plan; the argument for its safety is in
``docs/notices.md``, "Why every process saves the same step"):

1. A process that learns of a notice claims ``<prefix>/notice/<r>`` for the next round ``r``. The first
   claim wins and that process leads the round; a losing notice is re-offered after the round, and dropped
   if it does not bring the deadline earlier.
2. Every process runs one watcher thread that blocks on that key (``get`` with a timeout, in a loop), so
   the training loop makes no RPC in steady state: it only takes a local lock per step.
3. On seeing round ``r`` a watcher *closes the gate* and, under the same lock, reads ``checked``: the
   highest step its training loop has already decided about (saved or not). It acks
   ``<prefix>/ack/<r>/<pid>`` with that step and its step/save timings. While the gate is closed, the
   loop may not decide about any step beyond ``checked``; it waits (only then, only briefly).
4. The leader waits for every ack (timeout names the processes that did not answer), computes
   ``earliest = max(checked) + 1`` (no process has decided about it, none can until the plan is out) and
   :func:`reprieve.countdown.choose_save_step`, and publishes ``<prefix>/plan/<r>``.
5. Every watcher reads the plan, installs it and opens the gate. All processes save at the plan's steps.

A *re-plan* is a round for the notice in force, asked for by a process whose steps slowed so much since the
plan that the final save would commit too close to the deadline (:func:`reprieve.countdown.behind_plan`):
the leader plans again with the slower step time; the final step can only move earlier. One per plan, and
at most ``MAX_REPLANS`` per attempt.

A *save round* (:meth:`Agreement.request_save`, process 0's time-based interval) runs the same steps with no
notice: its plan is one non-final save at ``earliest``, so every process saves that step and trains on.

Keys are scoped by the job attempt, so a restarted gang never reads a stale round.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .background import Daemon
from .coordination import CoordinationError, CoordinationTimeout, Coordinator, missing_processes
from .countdown import CountdownSettings, SavePlan, behind_plan, choose_save_step
from .notice import Notice

log = logging.getLogger(__name__)

FINAL = "final"
EARLY = "early"
INTERVAL = "interval"  # a save agreed by a save round (time-based interval)
REPLAN = "replan"  # Notice.source of a re-plan round
MAX_REPLANS = 8


class AgreementError(RuntimeError):
    """Agreement failed (a process did not answer in time, or the coordination service failed)."""


@dataclass(frozen=True)
class Target:
    """The plan in force: from round ``round``, led by ``leader``, for ``notice``."""

    round: int
    leader: int
    notice: Notice
    plan: SavePlan
    deadline: float
    deadline_known: bool
    agreed_at: float


def not_before(target: Target, start: int) -> Target:
    """``target`` with no save step before ``start``, the first step of this attempt's loop.

    A notice can arrive while the process is still starting (before the restore tells where the loop begins):
    its round then plans from step 0. Every process restores the same checkpoint and so starts at the same
    step, so moving a stale final step to ``start`` (and dropping a stale early save) is the same on all.
    """
    plan = target.plan
    if plan.final_step >= start and (plan.early_step is None or plan.early_step >= start):
        return target
    if plan.final_step >= start:
        return replace(target, plan=SavePlan(plan.final_step, None, plan.reason))
    return replace(target, plan=SavePlan(start, None, f"{plan.reason}; moved to the first step {start} of the loop"))


class Agreement(Daemon):
    """Per-process side of the protocol. Main-thread API: :meth:`decide`; any thread: :meth:`offer`."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        attempt: int = 1,
        timeout_s: float = 60.0,
        countdown: CountdownSettings | None = None,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        on_target: Callable[[Target], None] | None = None,
        hold_until_loop: bool = False,
    ) -> None:
        super().__init__("reprieve-agreement")
        self.coordinator = coordinator
        self.pid = coordinator.process_id
        self.n = coordinator.num_processes
        self.timeout_s = timeout_s
        self.countdown = countdown or CountdownSettings()
        self.poll_s = poll_s
        self.clock = clock
        self.on_target = on_target
        self.prefix = f"reprieve/{attempt}/agree"
        # reported by the training loop (report(), begin()), read by the watcher when it acks or leads
        self._step_seconds: float | None = None
        self._save_seconds: float | None = None
        self._last_step: int | None = None
        self._saves: set[int] = set()  # steps agreed by save rounds, not yet passed
        self._save_requested = False  # a save round asked for by this process is not yet agreed

        self._cond = threading.Condition()
        self._checked = -1  # highest step the loop has decided about
        self._start = 0  # first step of the loop (after a restore); no save is planned before it
        self._gate: int | None = None  # round acked, plan not yet known
        self._acked = -1
        self._target: Target | None = None
        self._error: AgreementError | None = None
        self._next_round = 0
        self._seen: set[str] = set()
        self._nodes: set[str | None] = set()  # the nodes the notices offered to this process name (None: none)
        self._pending: list[Notice] = []  # lost a claim race: re-offered after the round
        self._retry: list[Notice] = []  # claim failed: re-offered by the watcher every poll
        self._retry_saves: list[str] = []  # save rounds to claim (request_save), claimed by the watcher
        self._replanned: set[int] = set()  # rounds whose plan this process asked to re-plan
        # Notices this process learnt before its loop began (restore still running): offered at the loop's
        # first step, when the ack can carry the step it starts from and the restored checkpoint's timings.
        self._holding = hold_until_loop
        self._held: list[Notice] = []
        self._handled: dict[str, int] = {}  # notice id -> the restored checkpoint that was its agreed save

    # -- lifecycle (start(): the watcher thread, ``_run``) ----------------------------------------------
    def close(self, timeout_s: float = 0.0) -> None:
        """Stop watching. Does not wait out the watcher's pending ``get`` (up to ``poll_s``): shutting the
        client down cancels it, and the watcher then sees the stop flag and leaves quietly. Call
        :meth:`join` after that shutdown: a thread still inside the client at interpreter exit aborts it."""
        self._stop.set()
        self.join(timeout_s)

    def join(self, timeout_s: float) -> None:
        if self._thread is not None and self._thread is not threading.current_thread() and timeout_s > 0:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("agreement watcher of process %d still running after %.1fs", self.pid, timeout_s)

    # -- main thread -----------------------------------------------------------------------------------
    @property
    def target(self) -> Target | None:
        return self._target

    @property
    def last_step(self) -> int | None:
        return self._last_step

    @property
    def noticed_nodes(self) -> frozenset[str | None]:
        """The nodes named by the notices offered to this process (None: a notice that names no node, as SIGTERM's)."""
        with self._cond:
            return frozenset(self._nodes)

    def report(self, *, step_seconds: float | None = None, save_seconds: float | None = None) -> None:
        """The loop's measured step time and save time (what this process acks with). Any thread; each is one
        attribute store, read whole by the watcher."""
        if step_seconds is not None:
            self._step_seconds = step_seconds
        if save_seconds is not None:
            self._save_seconds = save_seconds

    def begin(self, start: int, last_step: int | None = None) -> None:
        """The loop starts at ``start``: steps before it belong to earlier attempts. ``last_step``: the job's
        last step when known (plans never go past it)."""
        with self._cond:
            self._start = start
            self._last_step = last_step
            self._checked = max(self._checked, start - 1)
            if self._target is not None:
                moved = not_before(self._target, start)
                if moved is not self._target:
                    log.info("process %d: agreed save step %d is before the loop's first step %d: saving at %d",
                             self.pid, self._target.plan.final_step, start, moved.plan.final_step)
                self._target = moved
            held = self._release()
        for notice in held:
            self.offer(notice)

    def _release(self) -> list[Notice]:
        """Under the lock: stop holding notices; return the held ones (the caller offers them, unlocked)."""
        if not self._holding:
            return []
        self._holding = False
        held, self._held = self._held, []
        return held

    def decide(self, step: int) -> str | None:
        """Record that the loop decides about ``step`` now; return ``"final"``, ``"early"`` or None.

        Blocks only while a round is being agreed and ``step`` is beyond what this process acked.

        Raises:
            AgreementError: the round failed or did not finish in time.
        """
        with self._cond:
            held = self._release()  # a loop of its own, without Job.steps(), begins at its first decision
            if self._gate is not None and step > self._acked:
                self._wait_gate(step)
            if self._error is not None:
                raise self._error
            self._checked = max(self._checked, step)
            target = self._target
            reached = {s for s in self._saves if s <= step}  # a loop that decides every few steps saves at its next
            interval = bool(reached)
            self._saves -= reached
            if target is not None and target.deadline_known and self._gate is None:
                self._maybe_replan(target, step)
        for notice in held:
            self.offer(notice)
        if target is not None and step == target.plan.final_step:
            return FINAL
        if target is not None and step == target.plan.early_step:
            return EARLY
        return INTERVAL if interval else None

    def quiet(self, step: int) -> bool:
        """:meth:`decide` without the lock for a loop with nothing agreed: records ``step`` as decided and returns
        True when no round is in flight, no plan or save round is in force, no notice is held and nothing failed
        (``decide`` would return None without waiting); False: call :meth:`decide` (it records the step again).

        Safe without the lock because ``step`` is stored before the flags are read, and a watcher closing the gate
        stores ``_gate`` before it reads ``_checked`` (:meth:`_run_round`): under the GIL one of the two sees the
        other's store, so either the ack carries ``step`` or this call sees the gate and returns False."""
        if step > self._checked:  # noqa: PLR1730 - max() is a call, at every step
            self._checked = step
        return (self._gate is None and self._target is None and not self._saves and self._error is None
                and not self._holding)

    def _maybe_replan(self, target: Target, step: int) -> None:
        """Under the lock: queue a re-plan round (the watcher claims it; no RPC here) when the steps slowed so
        much that the final save would commit too close to the deadline. Once per plan."""
        if target.round in self._replanned or len(self._replanned) >= MAX_REPLANS:
            return
        if not behind_plan(now=self.clock(), deadline=target.deadline, step=step,
                           final_step=target.plan.final_step, step_seconds=self._step_seconds,
                           save_seconds=self._save_seconds, settings=self.countdown):
            return
        self._replanned.add(target.round)
        log.warning("process %d: at step %d, %.3fs a step, the agreed save at step %d would commit less than "
                    "%.1fs before the deadline (in %.1fs): asking to plan again", self.pid, step,
                    self._step_seconds or 0.0, target.plan.final_step, self.countdown.margin_seconds / 2,
                    target.deadline - self.clock())
        self._retry.append(replace(target.notice, id=f"{REPLAN}/{target.round}/{target.notice.id}",
                                   source=REPLAN, deadline=target.deadline))

    def _wait_gate(self, step: int) -> None:
        limit = time.monotonic() + 2 * self.timeout_s + self.poll_s
        while self._gate is not None and self._error is None:
            left = limit - time.monotonic()
            if left <= 0:
                self._error = AgreementError(
                    f"process {self.pid}: round {self._gate} did not produce a plan within "
                    f"{2 * self.timeout_s:.0f}s while step {step} waited for it"
                )
                break
            self._cond.wait(min(left, 1.0))

    # -- any thread --------------------------------------------------------------------------------------
    def request_save(self, reason: str) -> bool:
        """Ask every process to agree on one save at the earliest step none has passed (a save round). Claims
        the round at once (one RPC, once per request: the time-based interval asks once per interval).
        Returns False while an earlier request is still being agreed, or its agreed step is not reached yet
        (nothing is done then: one interval, one save)."""
        with self._cond:
            if self._save_requested or self._saves:
                return False
            self._save_requested = True
            round_ = self._next_round
        self._claim_save(round_, reason)
        return True

    def handled(self, notice_id: str, step: int) -> None:
        """The restored checkpoint (``step``) was the agreed save of ``notice_id``: that notice, delivered again
        (still in the notice file, still on a kept pod), is not a new one. Every process restores the same
        checkpoint, so all ignore it alike."""
        with self._cond:
            self._handled[notice_id] = step

    def offer(self, notice: Notice) -> None:
        """Publish ``notice`` to all processes unless it is known or brings nothing new. Not signal-safe."""
        with self._cond:
            if notice.id in self._handled:
                if notice.id not in self._seen:
                    self._seen.add(notice.id)
                    log.info("notice %s (%s) was already saved for: the restored checkpoint, step %d, is its agreed "
                             "save; ignored", notice.id, notice.source, self._handled[notice.id])
                return
            self._nodes.add(notice.node)
            if self._holding:
                if all(n.id != notice.id for n in self._held):
                    self._held.append(notice)
                    log.info("process %d: notice %s held until the training loop begins (nothing can be saved "
                             "before it; the plan then knows the first step and the restored step time)",
                             self.pid, notice.id)
                return
            if notice.id in self._seen:
                log.debug("notice %s already known; ignored", notice.id)
                return
            self._seen.add(notice.id)
            if self._adds_nothing(notice):
                return
            round_ = self._next_round
        record = json.dumps({"leader": self.pid, "notice": notice.to_json()})
        try:
            won = self.coordinator.claim(f"{self.prefix}/notice/{round_}", record)
        except CoordinationError as err:
            log.error("process %d could not publish notice %s (retrying): %s", self.pid, notice.id, err)
            with self._cond:
                self._seen.discard(notice.id)
                self._retry.append(notice)
            return
        if won:
            log.info("process %d leads agreement round %d for notice %s (%s via %s, %.1fs lead)", self.pid,
                     round_, notice.id, notice.reason, notice.source, notice.lead_seconds)
            return
        with self._cond:
            # the watcher re-offers what is pending when the round it lost to ends (under this lock): if that
            # round has ended already, nobody would, and the notice would never be agreed on
            ended = self._next_round > round_
            if ended:
                self._seen.discard(notice.id)
            else:
                self._pending.append(notice)
        if ended:
            self.offer(notice)
        else:
            log.info("process %d: round %d was already claimed; notice %s re-offered after it", self.pid,
                     round_, notice.id)

    def _claim_save(self, round_: int, reason: str) -> None:
        record = json.dumps({"leader": self.pid, "save": reason})
        try:
            won = self.coordinator.claim(f"{self.prefix}/notice/{round_}", record)
        except CoordinationError as err:
            log.error("process %d could not claim a save round (retrying): %s", self.pid, err)
            won = False
        if not won:  # another round came first: ask again after it (the interval is still due)
            with self._cond:
                self._retry_saves.append(reason)

    def _adds_nothing(self, notice: Notice) -> bool:
        target = self._target
        if notice.source == REPLAN:  # only a re-plan of the plan still in force
            if target is None or not notice.id.startswith(f"{REPLAN}/{target.round}/"):
                log.info("re-plan %s: the plan changed since; ignored", notice.id)
                return True
            return False
        if target is None:
            return False
        # a malformed notice counts with its conservative deadline (its arrival): it brings the save forward
        if notice.deadline >= target.deadline - 1.0:
            log.info("notice %s (deadline %+.1fs vs agreed %+.1fs) does not move the agreed save at step %d; "
                     "ignored", notice.id, notice.deadline - self.clock(), target.deadline - self.clock(),
                     target.plan.final_step)
            return True
        return False

    # -- watcher thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        round_ = 0
        while not self._stop.is_set():
            key = f"{self.prefix}/notice/{round_}"
            try:
                raw = self.coordinator.get(key, self.poll_s)
            except CoordinationTimeout:
                with self._cond:
                    retry, self._retry = self._retry, []
                    saves, self._retry_saves = self._retry_saves, []
                for notice in retry:
                    self.offer(notice)
                for reason in saves:
                    self._claim_save(round_, reason)
                continue
            except Exception as err:  # noqa: BLE001 - the service is gone: surface it at the next step
                if not self._stop.is_set():
                    self._fail(AgreementError(f"process {self.pid}: watching {key} failed: {err}"))
                return
            try:
                self._run_round(round_, raw)
            except Exception as err:  # noqa: BLE001 - any failure of a round fails the job, loudly
                self._fail(err if isinstance(err, AgreementError) else AgreementError(
                    f"process {self.pid}: agreement round {round_} failed: {err}"))
                return
            round_ += 1
            with self._cond:
                self._next_round = round_
                pending, self._pending = self._pending, []
                for notice in pending:
                    self._seen.discard(notice.id)
            for notice in pending:
                self.offer(notice)

    def _fail(self, err: AgreementError) -> None:
        log.error("%s", err)
        with self._cond:
            self._error = err
            self._gate = None
            self._cond.notify_all()

    def _run_round(self, round_: int, raw: str) -> None:
        record = json.loads(raw)
        leader = int(record["leader"])
        notice = Notice.from_json(record["notice"]) if "notice" in record else None
        what = f"notice {notice.id}" if notice is not None else f"a save ({record.get('save')})"
        with self._cond:
            self._gate = round_
            self._acked = self._checked
            if notice is not None:
                self._seen.add(notice.id)
        ack = {"checked": self._acked, "stepSeconds": self._step_seconds, "saveSeconds": self._save_seconds}
        self.coordinator.set(f"{self.prefix}/ack/{round_}/{self.pid}", json.dumps(ack), overwrite=True)
        log.info("process %d acked round %d (%s from process %d) at step %d", self.pid, round_, what, leader,
                 self._acked)
        if leader == self.pid:
            acks = self._acks(round_, what)
            plan_record = self._lead(round_, notice, acks) if notice is not None else {
                "save": max(int(a["checked"]) for a in acks.values()) + 1}
            self.coordinator.set(f"{self.prefix}/plan/{round_}", json.dumps(plan_record), overwrite=True)
        else:
            try:
                plan_record = json.loads(self.coordinator.get(f"{self.prefix}/plan/{round_}", self.timeout_s))
            except CoordinationTimeout as err:
                raise AgreementError(
                    f"process {self.pid}: leader process {leader} did not publish the plan of round {round_} "
                    f"within {self.timeout_s:.0f}s; processes {self._not_acked(round_)} had not acked ({err})"
                ) from err
        if notice is None:
            self._install_save(round_, leader, max(int(plan_record["save"]), self._start))
        else:
            self._install_plan(round_, leader, notice, plan_record)

    def _install_save(self, round_: int, leader: int, step: int) -> None:
        with self._cond:
            past_the_end = self._last_step is not None and step > self._last_step
            if not past_the_end:
                self._saves.add(step)
            if leader == self.pid:
                self._save_requested = False
            self._gate = None
            self._cond.notify_all()
        if past_the_end:
            log.info("process %d: round %d (leader %d: time-based interval) asked for step %d, past the job's last "
                     "step %d, which is saved anyway: no interval save", self.pid, round_, leader, step,
                     self._last_step)
            return
        log.info("process %d: agreed save at step %d (round %d, leader %d: time-based interval)", self.pid, step,
                 round_, leader)

    def _install_plan(self, round_: int, leader: int, notice: Notice, plan_record: dict[str, Any]) -> None:
        plan = SavePlan(int(plan_record["final"]), plan_record.get("early"), str(plan_record["reason"]))
        previous = self._target
        deadline, known = notice.deadline, notice.deadline_known
        if previous is not None and previous.deadline_known and (not known or previous.deadline < deadline):
            deadline, known = previous.deadline, True
        with self._cond:
            target = not_before(Target(round_, leader, notice, plan, deadline, known, self.clock()), self._start)
            self._target = target
            self._gate = None
            self._cond.notify_all()
        log.info("process %d: agreed save step %d%s (round %d, leader %d, notice %s, %s)", self.pid,
                 plan.final_step, "" if plan.early_step is None else f" (first save at {plan.early_step})",
                 round_, leader, notice.id, plan.reason)
        if self.on_target is not None:
            self.on_target(target)

    def _acks(self, round_: int, what: str) -> dict[int, dict[str, Any]]:
        acks: dict[int, dict[str, Any]] = {}
        limit = time.monotonic() + self.timeout_s
        for p in range(self.n):
            try:
                acks[p] = json.loads(self.coordinator.get(f"{self.prefix}/ack/{round_}/{p}",
                                                          max(0.001, limit - time.monotonic())))
            except CoordinationTimeout as err:
                raise AgreementError(
                    f"process {self.pid} (leader of round {round_}): processes {self._not_acked(round_) or [p]} did "
                    f"not ack {what} within {self.timeout_s:.0f}s ({err})"
                ) from err
        return acks

    def _not_acked(self, round_: int) -> list[int]:
        """The processes whose ack of ``round_`` is not in the store (for an error after a timeout)."""
        return missing_processes(list(self._safe_dir(f"{self.prefix}/ack/{round_}/")), range(self.n))

    def _lead(self, round_: int, notice: Notice, acks: dict[int, dict[str, Any]]) -> dict[str, Any]:
        checked = {p: int(a["checked"]) for p, a in acks.items()}
        step_s = _max_known(a.get("stepSeconds") for a in acks.values())
        save_s = _max_known(a.get("saveSeconds") for a in acks.values())
        previous = self._target
        deadline = notice.deadline
        if previous is not None and previous.deadline_known and previous.deadline < deadline:
            deadline = previous.deadline
        now = self.clock()
        plan = choose_save_step(
            earliest_step=max(checked.values()) + 1,
            seconds_left=deadline - now,
            step_seconds=step_s,
            save_seconds=save_s,
            settings=self.countdown,
            last_step=self.last_step,
            previous_final=None if previous is None else previous.plan.final_step,
            previous_early=None if previous is None else previous.plan.early_step,
        )
        log.info("round %d plan: final step %d, early %s; inputs: checked=%s, %.1fs to deadline, "
                 "step %s s, save %s s, last step %s, previous final %s", round_, plan.final_step,
                 plan.early_step, checked, deadline - now, _fmt(step_s), _fmt(save_s), self.last_step,
                 None if previous is None else previous.plan.final_step)
        return {"final": plan.final_step, "early": plan.early_step, "reason": plan.reason, "leader": self.pid}

    def _safe_dir(self, prefix: str) -> dict[str, str]:
        try:
            return self.coordinator.dir_get(prefix)
        except CoordinationError:
            return {}


def _max_known(values: Any) -> float | None:
    known = [float(v) for v in values if v is not None]
    return max(known) if known else None


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"
