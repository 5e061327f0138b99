"""Per-job goodput accounting (pure): where every second of a TrainingJob's wall time went.

Definitions follow ml-goodput-measurement (productive, preserved step time over wall time) and the step-log
analysis of ``hack/localcluster/goodput.py``; ``docs/goodput.md`` states them. The operator folds three kinds
of facts into an ``Accounting`` it keeps in ``status.goodput`` (so an operator restart loses nothing):

* an attempt was created at ``t`` (``attempt_created``);
* the runtime's progress report (``docs/contract.md``, "Progress"): the attempt, its first step and when that
  step finished, the last finished step and when, the typical step time, the restore time and the seconds the
  loop was blocked by saves (``progress``);
* a process's last finished step of an attempt and when (``last_step``): the exit reports and termination
  messages of processes that outlived a lost peer (``lastStep``, ``lastStepAt``; ``docs/contract.md``);
* the job ended at ``t`` (``finished``).

Each attempt's span, from its creation to the next attempt's creation (or the job's end), splits into:

| bucket | what |
|---|---|
| ``startup`` | pod scheduling, image pull, process start, imports, ``jax.distributed``, compile: creation -> start of the first step, minus the restore |
| ``restore`` | reading the checkpoint (reported by the runtime) |
| ``checkpoint`` | the training loop blocked by saves (reported) |
| ``productive`` | step time of steps whose result was kept (a later attempt did not redo them) |
| ``lost`` | step time of steps a later attempt computed again (not checkpointed in time) |
| ``restartGap`` | last finished step -> next attempt's creation: the agreed save, exit, teardown, the decision |

The buckets of an attempt add up to its span exactly. Reports come every few seconds, so steps after the last
report of an attempt that died without one (a hard kill) would fall into ``restartGap``, not ``lost``; a
surviving process's last step (training is synchronous: the gang's) raises the attempt's report to it, so they
are lost steps, as the step log counts them. Only where no process outlived the loss long enough to say (the
whole gang killed at once) do they stay in ``restartGap``; both are badput.
Lost steps are known once a later attempt reports the step it started from: the first later one that reported (an
attempt replaced before its first step, as in a double fault, resumed nothing and is all start-up). Kept and lost
step time are split where that attempt resumed: at the reported finish time of that step when
the report carries it (``savedStepsAt``: the newest saved steps, the places a next attempt resumes from), else
interpolated between the nearest reported steps. Steps are not equally long (those beside a save's background
write are slower), so an even split by step count would misplace seconds between the two.

Restores are also counted by where they read (``restores``: count and seconds per tier): ``memory`` (every
process from its own or a peer's memory), ``mixed`` (some from storage) and ``storage``, from the report's
``restoredFrom.tier`` (the memory tier); a restore without it (no memory tier) is a storage restore.

Elastic jobs (``docs/elastic-operator.md``): the operator records each attempt's size when it creates it (the
workers it trains on and the workers the job asks for; ``attempt_created``). The ``productive`` time of an attempt
with fewer workers than desired is also counted as **degraded** (``policy.throughput``): productive, at reduced
throughput, with its kept steps, beside the kept time and steps of full-size attempts, so the status says the
steps per second while degraded against those at full size. Degraded time is a part of ``productive`` (it adds no
time and takes none from a badput bucket); an attempt without a recorded size counts as neither (a job that never
shrank, or one before the wiring, reports nothing new).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .restores import TIERS
from .throughput import Throughput

BUCKETS = ("startup", "restore", "checkpoint", "productive", "lost", "restartGap")
BADPUT = ("startup", "restore", "checkpoint", "lost", "restartGap")
RESTORE_TIERS = tuple(TIERS)  # where a restore read (``policy.restores``; an unknown tier is not trusted: storage)
HISTORY = 20  # closed attempts kept (for the timeline of ``reprieve_operator.timeline``); older ones only in totals


@dataclass(frozen=True)
class Report:
    """One progress report of an attempt (times in epoch seconds)."""

    attempt: int
    step: int  # last finished step
    time: float  # when it finished
    first_step: int  # the first step this attempt computed
    first_step_time: float  # when that one finished
    step_seconds: float  # typical (mean) step time, first step excluded
    restore_seconds: float = 0.0
    save_blocking_seconds: float = 0.0  # cumulative in this attempt
    restore_tier: str | None = None  # restoredFrom.tier: memory, mixed or storage (None: not said)
    # (step, when it finished) of steps whose finish time is known: savedStepsAt (the newest saved steps) and, once
    # a last step raised the report (``last_step``), the step the report had
    saved_at: tuple[tuple[int, float], ...] = ()

    def finished_at(self, step: int) -> float:
        """When this attempt finished ``step``: a reported time where there is one, else interpolated between
        the nearest reported steps (the loop's start for the step before the first; clamped to the report)."""
        known = {self.first_step - 1: self.first_step_time - self.step_seconds, self.first_step: self.first_step_time,
                 **{s: t for s, t in self.saved_at if self.first_step <= s <= self.step}, self.step: self.time}
        points = sorted(known.items())
        if step <= points[0][0]:
            return points[0][1]
        for (s0, t0), (s1, t1) in itertools.pairwise(points):
            if step <= s1:
                return t0 + (t1 - t0) * (step - s0) / (s1 - s0)
        return points[-1][1]

    @property
    def restored_from(self) -> str | None:
        """Where this attempt's restore read (a tier of ``RESTORE_TIERS``); None: it started from scratch."""
        if self.restore_tier in RESTORE_TIERS:
            return self.restore_tier
        return "storage" if self.restore_seconds > 0 else None


@dataclass(frozen=True)
class Attempt:
    attempt: int
    created: float
    ended: float | None = None
    report: Report | None = None
    workers: int | None = None  # the workers it trains on (None: not recorded)
    desired: int | None = None  # the workers the job asked for then (degraded: workers < desired)


@dataclass(frozen=True)
class Accounting:
    closed: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    lost_steps: int = 0
    open: tuple[Attempt, ...] = ()  # attempts whose lost steps are not known yet (until a later one reports)
    history: tuple[tuple[tuple[str, Any], ...], ...] = ()  # the last HISTORY closed attempts (sorted items)
    restores: tuple[tuple[str, int, float], ...] = ()  # closed attempts' restores: (tier, count, seconds)
    # closed attempts of a known size: kept time and steps, full size and degraded (``policy.throughput``)
    throughput: Throughput = field(default_factory=Throughput)

    def to_status(self) -> dict[str, Any]:
        out = {"closed": {k: round(v, 3) for k, v in self.closed.items()}, "lostSteps": self.lost_steps,
               "open": [_attempt_dict(a) for a in self.open], "history": [dict(h) for h in self.history]}
        if self.restores:
            out["restores"] = {t: {"count": n, "seconds": round(sec, 3)} for t, n, sec in self.restores}
        if self.throughput != Throughput():
            out["throughput"] = self.throughput.to_status()
        return out

    @classmethod
    def from_status(cls, raw: dict[str, Any] | None) -> Accounting:
        if not raw:
            return cls()
        closed = dict.fromkeys(BUCKETS, 0.0)
        closed.update({k: float(v) for k, v in (raw.get("closed") or {}).items() if k in closed})
        restores = tuple((t, int(v.get("count") or 0), float(v.get("seconds") or 0.0))
                         for t, v in sorted((raw.get("restores") or {}).items()) if t in RESTORE_TIERS)
        return cls(closed, int(raw.get("lostSteps") or 0), tuple(_attempt(a) for a in raw.get("open") or []),
                   tuple(tuple(sorted(h.items())) for h in raw.get("history") or []), restores,
                   Throughput.from_status(raw.get("throughput")))


def _count_restore(restores: tuple[tuple[str, int, float], ...], a: Attempt) -> tuple[tuple[str, int, float], ...]:
    """``restores`` with attempt ``a``'s restore added (sorted by tier; unchanged if it restored nothing)."""
    tier = a.report.restored_from if a.report is not None else None
    if tier is None:
        return restores
    assert a.report is not None
    tally = {t: (n, sec) for t, n, sec in restores}
    n, sec = tally.get(tier, (0, 0.0))
    tally[tier] = (n + 1, sec + a.report.restore_seconds)
    return tuple((t, n, sec) for t, (n, sec) in sorted(tally.items()))


def _closed(a: Attempt, end: float, buckets: dict[str, float], lost: int) -> tuple[tuple[str, Any], ...]:
    """A closed attempt as the timeline needs it (JSON-able)."""
    out: dict[str, Any] = {"attempt": a.attempt, "created": a.created, "ended": end, "lostSteps": lost,
                           "restartGap": round(buckets["restartGap"], 3), "startup": round(buckets["startup"], 3)}
    if a.report is not None:
        out.update(firstStep=a.report.first_step, firstStepTime=a.report.first_step_time, step=a.report.step,
                   time=a.report.time)
    out.update(_size_dict(a))
    return tuple(sorted(out.items()))


def _size_dict(a: Attempt) -> dict[str, int]:
    """The attempt's recorded size (``workers``, ``desired``), only the parts that were recorded."""
    return {k: v for k, v in (("workers", a.workers), ("desired", a.desired)) if v is not None}


def _attempt_dict(a: Attempt) -> dict[str, Any]:
    out: dict[str, Any] = {"attempt": a.attempt, "created": a.created, **_size_dict(a)}
    if a.ended is not None:
        out["ended"] = a.ended
    if a.report is not None:
        r = a.report
        out["report"] = {"step": r.step, "time": r.time, "firstStep": r.first_step,
                         "firstStepTime": r.first_step_time, "stepSeconds": r.step_seconds,
                         "restoreSeconds": r.restore_seconds, "saveBlockingSeconds": r.save_blocking_seconds}
        if r.restore_tier is not None:
            out["report"]["restoreTier"] = r.restore_tier
        if r.saved_at:
            out["report"]["savedStepsAt"] = [[step, t] for step, t in r.saved_at]
    return out


def _attempt(raw: dict[str, Any]) -> Attempt:
    rep = raw.get("report")
    report = None
    if rep:
        report = Report(int(raw["attempt"]), int(rep["step"]), float(rep["time"]), int(rep["firstStep"]),
                        float(rep["firstStepTime"]), float(rep["stepSeconds"]), float(rep.get("restoreSeconds", 0)),
                        float(rep.get("saveBlockingSeconds", 0)), rep.get("restoreTier"),
                        _saved_at(rep.get("savedStepsAt")))
    return Attempt(int(raw["attempt"]), float(raw["created"]), raw.get("ended"), report,
                   _count(raw.get("workers")), _count(raw.get("desired")))


def _count(raw: Any) -> int | None:
    """A recorded worker count; None when absent or not a positive integer (evidence, never a reason to fail)."""
    try:
        n = int(raw)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _saved_at(raw: Any) -> tuple[tuple[int, float], ...]:
    """``savedStepsAt`` ([[step, unix seconds], ...]) -> sorted pairs; malformed entries are dropped (a report
    is evidence, never a reason to fail the accounting)."""
    out = []
    for item in raw if isinstance(raw, list) else ():
        try:
            step, t = item
            out.append((int(step), float(t)))
        except (TypeError, ValueError):
            continue
    return tuple(sorted(set(out)))


def split(a: Attempt, end: float, next_first_step: int | None) -> tuple[dict[str, float], int]:
    """The buckets of attempt ``a`` over ``[a.created, end]`` and its lost steps (``next_first_step``: the step
    the next attempt that reported started from, :func:`resumed_at`; None if there is none)."""
    span = max(0.0, end - a.created)
    out = dict.fromkeys(BUCKETS, 0.0)
    r = a.report
    if r is None:  # never reached its first step: all start-up (a crash, a teardown before training)
        out["startup"] = span
        return out, 0
    loop_start = max(a.created, min(end, r.first_step_time - r.step_seconds))
    restore = min(r.restore_seconds, loop_start - a.created)
    out["restore"] = restore
    out["startup"] = loop_start - a.created - restore
    last = min(end, max(loop_start, r.time))
    training = last - loop_start
    checkpoint = min(r.save_blocking_seconds, training)
    out["checkpoint"] = checkpoint
    steps = r.step - r.first_step + 1
    lost = 0 if next_first_step is None else max(0, min(steps, r.step - next_first_step + 1))
    # time after the step the next attempt resumed behind was lost; the save waits are spread over both parts
    kept_until = last if lost == 0 else min(last, max(loop_start, r.finished_at(r.step - lost)))
    lost_share = (last - kept_until) / training if training > 0 else 0.0
    out["lost"] = (training - checkpoint) * lost_share
    out["productive"] = training - checkpoint - out["lost"]
    out["restartGap"] = end - last
    return out, lost


def attempt_created(acc: Accounting, attempt: int, t: float, workers: int | None = None,
                    desired: int | None = None) -> Accounting:
    """Attempt ``attempt`` was created at ``t`` (on ``workers`` of the ``desired`` workers, when known: a size
    without ``workers`` is not recorded): the attempt before it ends there."""
    if any(a.attempt >= attempt for a in acc.open):
        return acc
    opened = tuple(replace(a, ended=t) if a.ended is None else a for a in acc.open)
    size = (workers, desired) if workers is not None and desired is not None else (None, None)
    return _settle(replace(acc, open=(*opened, Attempt(attempt, t, None, None, *size))))


def progress(acc: Accounting, report: Report) -> Accounting:
    """Fold a progress report into its (open) attempt; reports of unknown or closed attempts are ignored."""
    if not any(a.attempt == report.attempt for a in acc.open):
        return acc
    opened = tuple(replace(a, report=report) if a.attempt == report.attempt and
                   (a.report is None or report.time >= a.report.time) else a for a in acc.open)
    return _settle(replace(acc, open=opened))


def last_step(acc: Accounting, attempt: int, step: int, t: float) -> Accounting:
    """A process of ``attempt`` said its last finished step was ``step``, at ``t``: the attempt's report is raised
    to it (its finish time known from then on: the step the report had stays a known point). Never lowers a
    report; no effect on an attempt without a report (it never reported a first step) or one closed already."""
    opened = []
    for a in acc.open:
        r = a.report
        if a.attempt == attempt and r is not None and step > r.step:
            known = tuple(sorted({*r.saved_at, (r.step, r.time)}))
            a = replace(a, report=replace(r, step=step, time=max(t, r.time), saved_at=known))
        opened.append(a)
    return replace(acc, open=tuple(opened))


def _close(acc: Accounting, a: Attempt, end: float, nxt: int | None) -> Accounting:
    """``acc`` with attempt ``a`` (over ``[a.created, end]``, the next that reported resumed at ``nxt``) added to
    the closed buckets, lost steps, history, restores and throughput (``a`` is not removed from ``open``)."""
    buckets, n = split(a, end, nxt)
    kept = 0 if a.report is None else a.report.step - a.report.first_step + 1 - n
    return replace(acc, closed={k: acc.closed[k] + buckets[k] for k in BUCKETS}, lost_steps=acc.lost_steps + n,
                   history=(*acc.history, _closed(a, end, buckets, n))[-HISTORY:],
                   restores=_count_restore(acc.restores, a),
                   throughput=acc.throughput.add(a.workers, a.desired, buckets["productive"], max(0, kept)))


def finished(acc: Accounting, t: float) -> Accounting:
    """The job ended at ``t`` (Succeeded, Failed or Suspended): every open attempt closes, nothing is lost after
    the last one."""
    done = replace(acc, open=())
    for i, a in enumerate(acc.open):
        done = _close(done, a, a.ended if a.ended is not None else t, resumed_at(acc.open[i + 1:]))
    return done


def resumed_at(later: Iterable[Attempt]) -> int | None:
    """The step the first of the ``later`` attempts that reported started from (None: none reported yet).

    An attempt replaced before its first step (a double fault: a worker and its replica holder lost one after
    the other) resumed nothing: the steps an earlier attempt lost are those the next attempt that trained
    computed again."""
    return next((a.report.first_step for a in later if a.report is not None), None)


def _settle(acc: Accounting) -> Accounting:
    """Close every ended attempt once a later one has reported where it started (its lost steps are known)."""
    open_ = acc.open
    while len(open_) >= 2 and open_[0].ended is not None and (nxt := resumed_at(open_[1:])) is not None:
        acc = _close(acc, open_[0], open_[0].ended, nxt)
        open_ = open_[1:]
    return replace(acc, open=open_)


def summary(acc: Accounting, start: float | None, now: float) -> dict[str, Any]:
    """``status.goodput``'s visible part at ``now``: goodput and the badput buckets in seconds, the open
    attempts counted as if nothing of them were lost (provisional until the next attempt reports)."""
    done = finished(acc, now) if acc.open else acc
    totals = dict(done.closed)
    wall = sum(totals.values()) if start is None else max(now - start, sum(totals.values()))
    out: dict[str, Any] = {
        "goodput": round(totals["productive"] / wall, 4) if wall > 0 else None,
        "wallSeconds": round(wall, 1),
        "productiveSeconds": round(totals["productive"], 1),
        "badputSeconds": {k: round(totals[k], 1) for k in BADPUT},
        "lostSteps": done.lost_steps,
        "restores": {t: {"count": n, "seconds": round(sec, 1)} for t, n, sec in done.restores},
    }
    degraded = done.throughput.summary()
    if degraded is not None:
        out["degraded"] = degraded
    return out


def report_of(prog: dict[str, Any] | None) -> Report | None:
    """The progress annotation (``docs/contract.md``, "Progress") -> a :class:`Report`; None without the live
    fields (a runtime older than them, or no step finished yet) or when malformed."""
    if not prog or "firstStepAt" not in prog or "stepAt" not in prog:
        return None
    try:
        source = prog.get("restoredFrom")
        tier = source.get("tier") if isinstance(source, dict) else None
        return Report(int(prog["attempt"]), int(prog["step"]), float(prog["stepAt"]), int(prog["firstStep"]),
                      float(prog["firstStepAt"]), float(prog.get("stepSeconds") or 0.0),
                      float(prog.get("restoreSeconds") or 0.0), float(prog.get("saveBlockingSeconds") or 0.0),
                      str(tier) if tier in RESTORE_TIERS else None, _saved_at(prog.get("savedStepsAt")))
    except (KeyError, TypeError, ValueError):
        return None


def fold(raw: dict[str, Any] | None, *, now: float, new_attempt: int | None = None, created_at: float | None = None,
         report: Report | None = None, ended: bool = False, last_steps: Iterable[tuple[int, int, float]] = (),
         workers: int | None = None, desired: int | None = None) -> Accounting | None:
    """One reconcile's facts folded into the stored accounting (``status.goodput.accounting``); None when
    nothing changed (no status write needed). ``new_attempt`` was created at ``created_at`` (default ``now``), on
    ``workers`` of the ``desired`` workers when they are known (its degraded time counts only then).
    ``last_steps``: (attempt, step, when) a process said was its last finished step; folded first, while their
    attempts are open (an attempt closes once the next one reports)."""
    acc = before = Accounting.from_status(raw)
    for attempt, step, t in last_steps:
        acc = last_step(acc, attempt, step, t)
    if new_attempt is not None:
        acc = attempt_created(acc, new_attempt, now if created_at is None else created_at, workers, desired)
    if report is not None:
        acc = progress(acc, report)
    if ended and acc.open:
        acc = finished(acc, now)
    return None if acc == before else acc


def status(acc: Accounting, now: float) -> dict[str, Any]:
    """``status.goodput`` for ``acc`` at ``now``. A running attempt is counted up to its last report, so the
    figures move with the reports (not with the time the operator happened to look)."""
    last = acc.open[-1] if acc.open else None
    if last is not None and last.ended is None and last.report is not None:
        now = max(last.report.time, last.created)
    s = summary(acc, None, now)
    out = {"goodput": s["goodput"], "wallSeconds": s["wallSeconds"], "productiveSeconds": s["productiveSeconds"],
           "badputSeconds": s["badputSeconds"], "lostSteps": s["lostSteps"], "restores": s["restores"],
           "accounting": acc.to_status()}
    if "degraded" in s:
        out["degraded"] = s["degraded"]
    return out
