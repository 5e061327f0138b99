"""The chaos soak's accounting, pure: a record per fault from what was injected, what the harness saw of the
TrainingJob (polled observations) and the step log's interruptions; the totals; the table.

How a fault is matched to the step log (``docs/soak.md``, "How faults are counted"):

* an interruption (attempt ``a`` ends, ``a+1`` resumes: :mod:`localcluster.goodput`) is *caused* by the first
  interrupting fault injected while ``a`` trained (after the previous interruption's resume, no later than
  ``SLACK_S`` after ``a``'s last step record, unless the job's status already showed the next attempt when it was
  injected); its lost steps and gap go to that fault. Later faults of the same
  span share it (a kill landing while the workers save for a notice: the notice set the restart in motion);
* an interrupting fault injected while that restart was under way (after the last step, before the first step of
  the next attempt) shares the interruption: it is counted "during restart", with no lost steps or gap of its own;
* a fault that needs no restart (a spare or the operator leader killed) is recovered when the harness saw the
  replacement (a new spare, another leader); a storage fault, when a checkpoint newer than any before it was seen
  committed after the fault ended (the next due save retried);
* an ``apiserver-restart`` ends no attempt either: it is recovered when the operator was seen writing the job's
  status after it (a newer ``lastCheckpointStep``, or the final phase) and the job trained after it; a restart it
  caused anyway is one "no fault explains";
* a fault is *recovered* when the job trained again after it (a step record after it, or after the restart it
  caused), or, for the kinds above, the replacement was seen. Everything else is unrecovered, and said why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .faults import REGISTRY, Injected, Observation, Seen
from .goodput import Interruption, StepRecord
from .restores import PLAIN, TIERED

NOT_INJECTED = "not injected: "
SLACK_S = 3.0  # a kill lands mid-step: the last record of the attempt it ends is up to a step before it


@dataclass
class FaultRecord:
    kind: str
    target: str
    injected_at: float                  # seconds after the soak began
    detected_at: float | None = None    # seconds after the soak began; None: never seen
    lost_steps: int = 0
    gap_seconds: float = 0.0
    recovery: str = ""
    recovered: bool = False
    note: str = ""
    operator_lost_steps: int | None = None  # the operator's status.goodput.lostSteps grew by this over the restart
    restore_seconds: float | None = None  # the restart it caused: process 0's restore (None: not logged)
    first_step_wait: float | None = None  # ... and how long its first step waited for the step's compile


@dataclass
class Totals:
    injected: int
    recovered: int
    goodput: float
    goodput_fault_free: float
    committed_lost: list[int] = field(default_factory=list)
    sha256_equal: bool | None = None
    lost_steps: int = 0
    badput_by_kind: dict[str, float] = field(default_factory=dict)  # gap seconds, by fault kind
    not_injected: int = 0        # planned faults the injector could not carry out (no target at that moment)
    unexplained: list[str] = field(default_factory=list)  # interruptions no fault caused: "attempt a->b at step s"
    lost_compared: int = 0  # faults that caused a restart with the operator's lost steps read
    lost_differ: list[str] = field(default_factory=list)  # of those, where the operator's differ: "#i op X vs log Y (why)"

    @property
    def goodput_ratio(self) -> float:
        return self.goodput / self.goodput_fault_free if self.goodput_fault_free > 0 else 0.0


def detected(fault: Injected, obs: Sequence[Observation]) -> float | None:
    """Wall time the operator was first seen to act on ``fault`` (its kind's ``detected``: the notice recorded on
    the job, the next attempt, the spare gone from the job's spares, another Lease holder, a status write)."""
    return REGISTRY[fault.kind].detected(fault, obs)


def how_restarted(last_restart: Mapping[str, Any] | None, restore: str = "") -> str:
    """``status.lastRestart`` of the attempt a restart began (and where it restored from) in words."""
    if not last_restart:
        parts = ["all pods new"]
    else:
        parts = []
        if last_restart.get("inPlace"):
            parts.append(f"{last_restart['inPlace']} in place")
        for r in last_restart.get("replaced") or []:
            new = str(r.get("new") or "")
            parts.append(f"{r.get('index')}->{'spare' if '-spare-' in new else 'new pod'}")
        parts = parts or ["all pods new"]
    return ", ".join(parts) + (f"; {restore}" if restore else "")


def operator_lost(obs: Sequence[Observation], since: float, until: float) -> int | None:
    """How much ``status.goodput.lostSteps`` grew from the last poll before ``since`` to the last before ``until``
    (the operator counts an attempt's lost steps once the next attempt reports where it resumed)."""
    before = [o.operator_lost_steps for o in obs if o.t <= since and o.operator_lost_steps is not None]
    after = [o.operator_lost_steps for o in obs if o.t <= until and o.operator_lost_steps is not None]
    if not after:
        return None
    return after[-1] - (before[-1] if before else 0)


def attribute(faults: Sequence[Injected], interruptions: Sequence[Interruption]) -> dict[int, tuple[int, str]]:
    """fault index -> (interruption index, "cause" | "shared" | "during restart"), as the module docstring says.

    An interruption no fault of its span explains takes the first fault injected during the restart before it
    (a notice delivered to an attempt that had not stepped yet ends that attempt, not the one before), or else
    a fault that shared the restart before it but came after that attempt's last step."""
    out: dict[int, tuple[int, str]] = {}
    order = [k for k in sorted(range(len(faults)), key=lambda k: faults[k].at)
             if REGISTRY[faults[k].kind].interrupts and not faults[k].error]
    for j, intr in enumerate(interruptions):
        since = interruptions[j - 1].next_t if j > 0 else float("-inf")
        # a fault injected once the job's status already showed the next attempt is that attempt's, slack or not
        during = [k for k in order if k not in out and since < faults[k].at <= intr.last_t + SLACK_S
                  and not faults[k].attempt > intr.from_attempt]
        if not during:
            during = [k for k in order if out.get(k) == (j - 1, "during restart")][:1]
        if not during and j > 0:  # a second fault injected after the attempt before had stepped its last (within
            # the slack, with the status not yet showing the next attempt) reached the next attempt: it is its cause
            during = [k for k in order if out.get(k) == (j - 1, "shared")
                      and faults[k].at > interruptions[j - 1].last_t][:1]
        for i, k in enumerate(during):
            out[k] = (j, "shared" if i else "cause")
        for k in order:
            if k not in out and faults[k].at <= intr.next_t and (intr.last_t + SLACK_S < faults[k].at or (
                    intr.last_t < faults[k].at and faults[k].attempt > intr.from_attempt)):
                out[k] = (j, "during restart")
    return out


def second_halves(faults: Sequence[Injected], interruptions: Sequence[Interruption],
                  matched: Mapping[int, tuple[int, str]]) -> dict[int, int]:
    """fault index -> the interruption its second half caused: a kind that may cause two restarts
    (``notice-during-restart``: a kill ending attempt ``a`` and a notice delivered to the next attempt, which ends
    it too) owns that next interruption when no fault of its own span caused it."""
    caused = {j for j, role in matched.values() if role == "cause"}
    return {k: j + 1 for k, (j, role) in matched.items() if role == "cause" and REGISTRY[faults[k].kind].restarts > 1
            and j + 1 < len(interruptions) and j + 1 not in caused}


def unexplained(faults: Sequence[Injected], interruptions: Sequence[Interruption]) -> list[Interruption]:
    """Interruptions no injected fault caused: restarts the soak did not ask for (a crash, a spurious notice)."""
    matched = attribute(faults, interruptions)
    caused = {j for j, role in matched.values() if role == "cause"} | \
        set(second_halves(faults, interruptions, matched).values())
    return [intr for j, intr in enumerate(interruptions) if j not in caused]


def records(faults: Sequence[Injected], obs: Sequence[Observation], interruptions: Sequence[Interruption],
            steps: Sequence[StepRecord], *, t0: float, starts: Mapping[int, AttemptStart] | None = None,
            ended: Mapping[float, float] | None = None) -> list[FaultRecord]:
    """A :class:`FaultRecord` per injected fault (times relative to ``t0``, the soak's start). ``starts``: what each
    attempt's process 0 logged of its start (:func:`starts_by_attempt`); ``ended``: when each storage fault or
    partition (by its injection time) was undone."""
    starts = starts or {}
    matched = attribute(faults, interruptions)
    seconds = second_halves(faults, interruptions, matched)
    judge = Seen(obs, max((r.t for r in steps), default=0.0), ended or {})
    by_attempt = {o.attempt: o.last_restart for o in obs if o.last_restart and o.last_restart.get("attempt") == o.attempt}
    restores = {**{a: r for o in obs if (a := _attempt_of(o.last_restore)) and (r := restore_in_words(o.last_restore))},
                **{a: st.restored for a, st in starts.items() if st.restored}}
    out = []
    for k, f in enumerate(faults):
        seen = detected(f, obs)
        rec = FaultRecord(f.kind, f.target, round(f.at - t0, 2), None if seen is None else round(seen - t0, 2))
        if f.error:
            rec.note = f"{NOT_INJECTED}{f.error}"
            out.append(rec)
            continue
        if k in matched:
            j, role = matched[k]
            intr = interruptions[j]
            attempt = next((s.attempt for s in steps if s.t >= intr.next_t), intr.from_attempt + 1)
            rec.recovery = how_restarted(by_attempt.get(attempt), restores.get(attempt, ""))
            rec.recovered = True
            if role == "cause":
                rec.lost_steps, rec.gap_seconds = intr.lost_steps, round(intr.gap_seconds, 2)
                start = starts.get(attempt, AttemptStart())
                rec.restore_seconds, rec.first_step_wait = start.restore_seconds, start.first_step_wait
                until = interruptions[j + 1].last_t if j + 1 < len(interruptions) else float("inf")
                rec.operator_lost_steps = operator_lost(obs, intr.last_t, until)
                if k in seconds:  # its notice's restart too
                    nxt = interruptions[seconds[k]]
                    rec.lost_steps += nxt.lost_steps
                    rec.gap_seconds = round(rec.gap_seconds + nxt.gap_seconds, 2)
                    until = interruptions[seconds[k] + 1].last_t if seconds[k] + 1 < len(interruptions) else until
                    rec.operator_lost_steps = operator_lost(obs, intr.last_t, until)
                    rec.note = "two restarts: the kill's and the notice's"
            elif role == "shared":
                rec.note = "shares the restart of an earlier fault of the same attempt"
            else:
                rec.note = "during restart: shares the restart of the fault before it"
        else:  # no restart booked to it: its kind says whether it recovered
            back = REGISTRY[f.kind].recovered(f, judge)
            rec.recovered, rec.recovery, rec.note = back.recovered, back.recovery, back.note
        out.append(rec)
    return out


_START = re.compile(r"process (?P<process>\d+)/\d+ starting at step \d+ of \d+ \(attempt (?P<attempt>\d+)\)")
# "compiled step ahead in 0.89s beside the restore, lowered before the devices (the first step waited 0.26s for it)":
# what comes between the restore and the wait varies with how the step got its program
_COMPILED = re.compile(r"compiled .* ahead in [0-9.]+s .*beside the restore.* \(the first step waited (?P<wait>[0-9.]+)s")


@dataclass(frozen=True)
class AttemptStart:
    """What an attempt's process 0 logged of its start: where it restored from ("memory tier: 0=memory, 1=peer"
    per process, or "storage"; "" when it restored nothing), how long its restore took, and how long its first step
    waited for the step compiled beside the restore (the longest wait when several were compiled); None where the
    log does not say."""

    restored: str = ""
    restore_seconds: float | None = None
    first_step_wait: float | None = None


def starts_by_attempt(logs: Iterable[Iterable[str]]) -> dict[int, AttemptStart]:
    """:class:`AttemptStart` by attempt, from the trainer logs of the job's pods (one line sequence per log file, in
    order: a pod restarted in place logs its attempts one after the other). The restore's lines come before the
    attempt's "starting at step" line, the compile's after it."""
    out: dict[int, AttemptStart] = {}
    for lines in logs:
        restored, seconds, attempt = "", None, None
        for line in lines:
            if (m := TIERED.search(line)) and m[2] == "0":  # process 0's line names every process's source
                restored, seconds = f"memory tier: {m[4]}", float(m[3])
            elif (m := PLAIN.search(line)) and not restored:
                restored, seconds = "storage", None if m[3] is None else float(m[3])
            elif m := _START.search(line):
                attempt = int(m["attempt"]) if m["process"] == "0" else None
                if attempt is not None:
                    out[attempt] = AttemptStart(restored, seconds if restored else None)
                restored, seconds = "", None
            elif attempt is not None and (m := _COMPILED.search(line)):
                wait = max(float(m["wait"]), out[attempt].first_step_wait or 0.0)
                out[attempt] = replace(out[attempt], first_step_wait=wait)
    return out


def _attempt_of(raw: Mapping[str, Any] | None) -> int:
    try:
        return int((raw or {}).get("attempt") or 0)
    except (TypeError, ValueError):
        return 0


def restore_in_words(last_restore: Mapping[str, Any] | None) -> str:
    """``status.lastRestore`` (the operator's view of process 0's report) as :func:`starts_by_attempt`'s words:
    "memory tier: 0=memory, 1=peer" (sources per process), "storage", or "" when it says nothing."""
    if not last_restore:
        return ""
    sources = [str(s) for s in last_restore.get("sources") or []]
    if last_restore.get("tier") == "storage" or (sources and all(s == "storage" for s in sources)):
        return "storage"
    if sources:
        return "memory tier: " + ", ".join(f"{i}={src}" for i, src in enumerate(sources))
    return str(last_restore.get("tier") or "")


def committed_lost(committed_seen: Iterable[int], present: Iterable[int], keep: int) -> list[int]:
    """Steps seen committed (``status.lastCheckpointStep``) that should still be on storage but are not.

    Retention keeps the newest ``keep`` committed checkpoints, so a seen step is expected only while it is among
    the newest ``keep`` of every committed step known: the ones seen *and* the ones on storage (``present``:
    complete and visible). The status can miss commits: progress reports sent while the API server is away are
    dropped, and a job that ends then never reports its last commits (docs/soak.md); retention rightly deleted
    the seen steps those newer checkpoints replaced."""
    have = set(present)
    expected = sorted(set(committed_seen) | have)[-keep:] if keep > 0 else []
    return [s for s in expected if s not in have]


def totals(recs: Sequence[FaultRecord], *, goodput: float, goodput_fault_free: float, lost: list[int],
           sha256_equal: bool | None, unexplained: Sequence[Interruption] = ()) -> Totals:
    badput: dict[str, float] = {}
    for r in recs:
        badput[r.kind] = round(badput.get(r.kind, 0.0) + r.gap_seconds, 2)
    missed = sum(r.note.startswith(NOT_INJECTED) for r in recs)
    compared, differ = lost_agreement(recs)
    return Totals(len(recs) - missed, sum(r.recovered for r in recs), goodput, goodput_fault_free, lost,
                  sha256_equal, sum(r.lost_steps for r in recs), badput, missed,
                  [f"attempt {i.from_attempt} at step {i.last_step} (gap {i.gap_seconds:.1f} s, "
                   f"{i.lost_steps} lost)" for i in unexplained], compared, differ)


@dataclass(frozen=True)
class KindCost:
    """What one kind of fault cost over a soak (issue #48's per-kind table): ``faults`` injected, ``restarts`` that
    caused a restart of their own (the rest shared one, or need none); the restart gap (last step before to first
    step after) per restart caused, its mean and worst, and per fault injected; the steps lost; the seconds from
    injection to the operator seen acting, and of the restarts caused, process 0's restore and its first step's
    wait for the compile (means over the faults that have them; None: none has)."""

    kind: str
    faults: int
    restarts: int
    gap_per_restart: float
    gap_max: float
    gap_per_fault: float
    lost_steps: int
    detect: float | None
    restore: float | None
    first_step_wait: float | None


ALL_KINDS = "all kinds"


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 2) if known else None


def kind_cost(kind: str, recs: Sequence[FaultRecord]) -> KindCost:
    caused = [r for r in recs if r.gap_seconds > 0 or r.lost_steps > 0]
    gaps = [r.gap_seconds for r in caused]
    return KindCost(kind, len(recs), len(caused), round(sum(gaps) / len(gaps), 2) if gaps else 0.0,
                    max(gaps, default=0.0), round(sum(gaps) / len(recs), 2) if recs else 0.0,
                    sum(r.lost_steps for r in recs),
                    _mean([None if r.detected_at is None else r.detected_at - r.injected_at for r in recs]),
                    _mean([r.restore_seconds for r in caused]), _mean([r.first_step_wait for r in caused]))


def by_kind(recs: Sequence[FaultRecord]) -> list[KindCost]:
    """One :class:`KindCost` per kind injected (costliest restart first), then every kind together
    (``ALL_KINDS``); faults that could not be injected are left out."""
    injected = [r for r in recs if not r.note.startswith(NOT_INJECTED)]
    kinds: dict[str, list[FaultRecord]] = {}
    for r in injected:
        kinds.setdefault(r.kind, []).append(r)
    rows = sorted((kind_cost(k, rs) for k, rs in kinds.items()), key=lambda c: (-c.gap_per_restart, c.kind))
    return [*rows, kind_cost(ALL_KINDS, injected)] if injected else []


def kind_table(rows: Sequence[KindCost]) -> str:
    """The per-kind table, as Markdown (benchmarks/RESULTS.md takes it as printed)."""
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    out = [("| kind | faults | restarts | gap s / restart (max) | gap s / fault | lost steps | detect s | restore s "
            "| first step waited s |"), "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in rows:
        name = f"**{c.kind}**" if c.kind == ALL_KINDS else c.kind
        out.append(f"| {name} | {c.faults} | {c.restarts} | {c.gap_per_restart:.2f} ({c.gap_max:.2f}) | "
                   f"{c.gap_per_fault:.2f} | {c.lost_steps} | {num(c.detect)} | {num(c.restore)} | "
                   f"{num(c.first_step_wait)} |")
    return "\n".join(out)


def lost_agreement(recs: Sequence[FaultRecord]) -> tuple[int, list[str]]:
    """How many faults that caused a restart have the operator's lost steps beside the step log's, and where they
    differ, each with the one cause known to remain: where no process restarted in place, none may have outlived
    the loss to say the gang's last finished step, and the steps after process 0's last progress report (every
    5 s) stay restart gap in the operator's count (docs/goodput.md)."""
    compared, differ = 0, []
    for i, r in enumerate(recs, 1):
        if r.operator_lost_steps is None or not r.recovery or r.recovery.startswith("no restart"):
            continue
        compared += 1
        if r.operator_lost_steps != r.lost_steps:
            why = "" if " in place" in r.recovery else " (no process restarted in place: none may have survived to say its last step)"
            differ.append(f"#{i} {r.kind}: op {r.operator_lost_steps} vs log {r.lost_steps}{why}")
    return compared, differ


def table(recs: Sequence[FaultRecord], tot: Totals) -> str:
    """The terminal table: one row per fault, then the totals."""
    head = (f"{'#':>3} {'kind':34} {'target':22} {'inject':>7} {'detect':>7} {'lost':>5} {'(op)':>5} {'gap s':>6}"
            "  recovery")
    rows = [head, "-" * len(head)]
    for i, r in enumerate(recs, 1):
        det = "-" if r.detected_at is None else f"{r.detected_at:.1f}"
        flag = "" if r.recovered or r.note.startswith(NOT_INJECTED) else "  UNRECOVERED"  # nothing to recover
        op = "-" if r.operator_lost_steps is None else str(r.operator_lost_steps)
        rows.append(f"{i:>3} {r.kind:34} {r.target[:22]:22} {r.injected_at:>7.1f} {det:>7} {r.lost_steps:>5} {op:>5} "
                    f"{r.gap_seconds:>6.1f}  {r.recovery}{flag}{'  (' + r.note + ')' if r.note else ''}")
    total_gap = sum(tot.badput_by_kind.values()) or 1.0
    share = ", ".join(f"{k} {v / total_gap:.0%}" for k, v in sorted(tot.badput_by_kind.items(), key=lambda x: -x[1])
                      if v > 0)
    sha = {True: "equal", False: "DIFFERENT", None: "not compared"}[tot.sha256_equal]
    missed = f" ({tot.not_injected} more could not be injected)" if tot.not_injected else ""
    rows += ["", f"faults injected {tot.injected}, recovered {tot.recovered}{missed}; lost steps {tot.lost_steps}",
             (f"goodput {tot.goodput:.1%} vs fault-free {tot.goodput_fault_free:.1%} "
             f"({tot.goodput_ratio:.1%} of fault-free)"),
             f"committed checkpoints lost: {len(tot.committed_lost)}"
             + (f" (steps {tot.committed_lost})" if tot.committed_lost else ""),
             f"final parameters' sha256 vs fault-free: {sha}",
             f"restarts no fault explains: {len(tot.unexplained)}"
             + (f" ({'; '.join(tot.unexplained)})" if tot.unexplained else ""),
             f"restart gap by kind: {share or 'none'}",
             f"operator's lost steps equal to the step log's: {tot.lost_compared - len(tot.lost_differ)} of "
             f"{tot.lost_compared}" + (f" ({'; '.join(tot.lost_differ)})" if tot.lost_differ else "")]
    return "\n".join(rows)


def as_json(recs: Sequence[FaultRecord], tot: Totals, **meta: Any) -> dict[str, Any]:
    return {**meta, "faults": [asdict(r) for r in recs],
            "totals": {**asdict(tot), "goodput_ratio": tot.goodput_ratio},
            "by_kind": [asdict(c) for c in by_kind(recs)]}
