"""The chaos soak's pure core (hack/localcluster/chaos.py, faults.py, soakrecord.py), table-tested: the fault
registry (every kind with its four methods and its docs row), the seeded schedule and the CI smoke's rotation dealt
from the registry, validation before anything starts, and the per-fault accounting against the step log."""

from __future__ import annotations

import inspect
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from localcluster import chaos, faults
from localcluster.chaos import Capabilities, SoakConfigError
from localcluster.faults import REAL_NODES, SPARE, during_restart_node, two_doomed_nodes
from localcluster.goodput import StepRecord, analyse
from localcluster.injectors import (
    PodView,
    Proc,
    assigned_pods,
    netns_holder,
    partition_rules,
    pick,
    split_roles,
)
from localcluster.soakrecord import (
    ALL_KINDS,
    NOT_INJECTED,
    AttemptStart,
    FaultRecord,
    Injected,
    KindCost,
    Observation,
    as_json,
    by_kind,
    committed_lost,
    how_restarted,
    kind_table,
    lost_agreement,
    records,
    restore_in_words,
    starts_by_attempt,
    table,
    totals,
    unexplained,
)
from reprieve_operator.policy.signals import BUILTIN_SIGNALS

pytestmark = pytest.mark.unit

ALL = Capabilities(frozenset({REAL_NODES, SPARE, faults.OPERATOR_DEPLOYMENT, faults.ROOT, faults.IPTABLES}))
PROCESS = Capabilities(frozenset({SPARE, faults.ROOT}), "process nodes: real nodes cannot start here")


def test_every_builtin_signal_is_a_notice_kind_with_its_own_window() -> None:
    for sig in BUILTIN_SIGNALS:
        kind = chaos.KINDS[f"notice-{sig.name}"]
        assert kind.signal == sig and kind.interrupts and kind.implemented
    issue_kinds = {"node-lost", "kill-trainer", "kill-supervisor", "kill-spare", "kill-operator-leader",
                   "apiserver-restart", "partition", "storage-unavailable", "storage-full",
                   "notice-during-restart", "two-nodes-doomed"}
    assert issue_kinds <= set(chaos.KINDS)


@pytest.mark.parametrize(("text", "expected"), [("1", 1), (" 42 ", 42), ("-3", -3), ("12345678901234567890",
                                                                                   12345678901234567890)])
def test_seed_parses_whole_numbers(text: str, expected: int) -> None:
    assert chaos.parse_seed(text) == expected


@pytest.mark.parametrize("text", ["abc", "1.5", "", "0x10"])
def test_a_seed_that_is_not_a_number_is_refused_with_its_value(text: str) -> None:
    with pytest.raises(SoakConfigError, match=r"--seed must be a whole number .*got " + repr(text).replace(".", r"\.")):
        chaos.parse_seed(text)


def test_unknown_fault_kind_names_the_known_ones() -> None:
    with pytest.raises(SoakConfigError) as err:
        chaos.parse_kinds("node-lost,meteor")
    assert "unknown fault kind(s) meteor" in str(err.value)
    for name in ("node-lost", "notice-gke-spot", "kill-trainer", "partition"):
        assert name in str(err.value)


def test_default_kinds_are_every_implemented_one_and_duplicates_collapse() -> None:
    assert chaos.parse_kinds(None) == [k.name for k in chaos.KINDS.values() if k.implemented]
    assert chaos.parse_kinds("node-lost, node-lost,kill-trainer") == ["node-lost", "kill-trainer"]


@pytest.mark.parametrize(("faults", "caps", "minutes", "every", "message"), [
    ("partition", PROCESS, 3, 30, r"partition needs real nodes and iptables-restore on PATH .*, which this cluster lacks .process nodes"),
    ("partition", Capabilities(frozenset({REAL_NODES})), 3, 30, r"partition needs iptables-restore on PATH \(Debian"),
    ("storage-full", Capabilities(frozenset({SPARE})), 3, 30, r"storage-full needs root \(the soak mounts"),
    ("kill-trainer", PROCESS, 3, 30, "kill-trainer needs real nodes, which this cluster lacks .process nodes"),
    ("kill-spare", Capabilities(frozenset({REAL_NODES})), 3, 30, r"kill-spare needs a warm spare"),
    ("node-lost", ALL, 0, 30, "--minutes must be > 0"),
    ("node-lost", ALL, 3, 1, "--fault-every must be >= 5"),
    ("node-lost", ALL, 0.2, 30, "shorter than one --fault-every"),
])
def test_validation_refuses_before_anything_starts(faults: str, caps: Capabilities, minutes: float, every: float,
                                                   message: str) -> None:
    with pytest.raises(SoakConfigError, match=message):
        chaos.validate(chaos.parse_kinds(faults), caps, minutes=minutes, fault_every=every)


def test_default_schedule_on_process_nodes_drops_what_they_cannot_do_and_says_which() -> None:
    kinds = chaos.parse_kinds(None)
    chosen = chaos.validate(kinds, PROCESS, minutes=3, fault_every=30, explicit=False)
    assert "kill-trainer" not in chosen and "node-lost" in chosen and "notice-gke-spot" in chosen
    assert set(chaos.dropped(kinds, PROCESS)) == {"kill-trainer", "kill-supervisor", "kill-spare",
                                                  "kill-operator-leader", "partition"}


def test_schedule_is_reproducible_from_its_seed_and_covers_every_kind_each_cycle() -> None:
    kinds = ["node-lost", "kill-trainer", "notice-gke-spot", "notice-cordon"]
    a = chaos.schedule(kinds, minutes=10, fault_every=30, seed=7)
    assert a == chaos.schedule(kinds, minutes=10, fault_every=30, seed=7)
    assert a != chaos.schedule(kinds, minutes=10, fault_every=30, seed=8)
    assert len(a) == 20
    for cycle in range(5):
        assert sorted(p.kind for p in a if p.cycle == cycle) == sorted(kinds)
    times = [p.at for p in a]
    assert times == sorted(times) and times[0] >= 1.0
    for i, p in enumerate(a):  # about every 30 s: within a quarter either side
        assert abs(p.at - (i + 1) * 30) <= 7.5 + 1e-9


def test_a_short_schedule_still_draws_kinds_in_cycles() -> None:
    plan = chaos.schedule(["a", "b", "c"], minutes=1, fault_every=30, seed=1)
    assert len(plan) == 2 and len({p.kind for p in plan}) == 2  # two of the first cycle, no repeat


@pytest.mark.parametrize(("signal", "kind", "value", "delete_after"), [
    ("gke-spot", "Taint", "true", 15.0),
    ("gke-maintenance-ongoing", "Label", "ONGOING", 30.0),
    ("aks-scheduled-event", "Condition", "True", 15.0),
    ("cordon", "Unschedulable", "true", 30.0),
    ("out-of-service", "Taint", "true", 0.0),
])
def test_notice_patch_puts_the_signal_and_deletes_at_its_window(signal: str, kind: str, value: str,
                                                                 delete_after: float) -> None:
    sig = chaos.KINDS[f"notice-{signal}"].signal
    assert sig is not None
    got = faults.notice_patch(sig, 1000.0)
    assert (got[0], got[2], got[3]) == (kind, value, delete_after)


def test_an_epoch_label_carries_its_own_deadline() -> None:
    sig = chaos.KINDS["notice-gke-scheduled-maintenance"].signal
    assert sig is not None
    assert faults.notice_patch(sig, 1000.4) == ("LabelEpoch", sig.key, "1030", pytest.approx(29.6))


# -- accounting ----------------------------------------------------------------------------------------------

def steps(attempt: int, rng: range, t0: float) -> list[StepRecord]:
    return [StepRecord(attempt, s, t0 + i) for i, s in enumerate(rng)]


def test_records_match_faults_to_interruptions_and_share_a_restart_hit_twice() -> None:
    # attempt 1 steps 0-19 at t=100..119; a hard kill at 119.5 loses 5 steps (resumed at 15) at t=140;
    # a notice at 130, during that restart, shares it; a noticed preemption at 160 (agreed save, nothing lost).
    log = steps(1, range(20), 100) + steps(2, range(15, 40), 140) + steps(3, range(40, 60), 190)
    intr = analyse(log, start=100, end=210).interruptions
    faults = [Injected("kill-trainer", "lm-1", 119.5, 1), Injected("notice-during-restart", "node-b", 130, 1),
              Injected("notice-gke-spot", "node-a", 160, 2), Injected("kill-spare", "lm-spare-x", 170, 3)]
    obs = [Observation(101, 1, spares=("lm-spare-x",)), Observation(121, 2, last_restart={"attempt": 2, "inPlace": 2}),
           Observation(161, 2, notice_id="gke-spot/node-a/1", notice_node="node-a"),
           Observation(175, 3, spares=(), last_restart={"attempt": 3, "inPlace": 1, "replaced": [
               {"index": 0, "old": "lm-0", "new": "lm-spare-x", "reason": "node"}]}),
           Observation(185, 3, spares=("lm-spare-y",))]
    obs = [Observation(o.t, o.attempt, notice_id=o.notice_id, notice_node=o.notice_node, spares=o.spares,
                       last_restart=o.last_restart, operator_lost_steps=lost)
           for o, lost in zip(obs, [0, 0, 3, 3, 3], strict=True)]
    recs = records(faults, obs, intr, log, t0=100, starts={2: AttemptStart("storage", 1.5, 0.25)})
    kill, during, notice, spare = recs
    assert (kill.lost_steps, kill.recovered, kill.detected_at) == (5, True, 21)
    assert kill.recovery == "2 in place; storage" and kill.gap_seconds == pytest.approx(20.0)
    assert kill.operator_lost_steps == 3  # the operator's count grew by 3 where the step log says 5
    assert (kill.restore_seconds, kill.first_step_wait) == (1.5, 0.25)  # the restart it caused (attempt 2)
    assert (during.restore_seconds, notice.restore_seconds) == (None, None)  # shared, or attempt 3 said nothing
    assert notice.operator_lost_steps == 0
    assert during.recovered and during.lost_steps == 0 and "during restart" in during.note
    assert (notice.lost_steps, notice.detected_at, notice.recovered) == (0, 61, True)
    assert notice.recovery == "1 in place, 0->spare"
    assert spare.recovered and spare.recovery == "spare replaced" and spare.detected_at == 75
    tot = totals(recs, goodput=0.8, goodput_fault_free=0.9, lost=[], sha256_equal=True)
    assert (tot.injected, tot.recovered, tot.lost_steps) == (4, 4, 5)
    assert tot.goodput_ratio == pytest.approx(0.8 / 0.9)
    assert (tot.lost_compared, tot.lost_differ) == (2, ["#1 kill-trainer: op 3 vs log 5"])  # the notice's agree
    assert "faults injected 4, recovered 4" in table(recs, tot)
    assert "operator's lost steps equal to the step log's: 1 of 2 (#1 kill-trainer: op 3 vs log 5)" in table(recs, tot)


def test_a_difference_where_no_process_restarted_in_place_says_none_may_have_survived() -> None:
    lost = FaultRecord("node-lost", "node-a", 10.0, 12.0, lost_steps=21, recovery="0->spare, 1->new pod; storage",
                       recovered=True, operator_lost_steps=0)
    kept = FaultRecord("kill-trainer", "lm-1", 40.0, 41.0, lost_steps=2, recovery="2 in place", recovered=True,
                       operator_lost_steps=2)
    spare = FaultRecord("kill-spare", "lm-spare-x", 50.0, 51.0, recovery="spare replaced", recovered=True)
    assert lost_agreement([lost, kept, spare]) == (2, [
        "#1 node-lost: op 0 vs log 21 (no process restarted in place: none may have survived to say its last step)"])


def test_a_fault_after_which_nothing_trained_is_unrecovered_and_a_failed_injection_is_not_recovered() -> None:
    log = steps(1, range(10), 0)
    faults = [Injected("node-lost", "node-a", 20, 1), Injected("kill-trainer", "lm-0", 5, 1, error="no trainer")]
    recs = records(faults, [Observation(21, 1)], [], log, t0=0)
    assert not recs[0].recovered and recs[0].detected_at is None and "no step after it" in recs[0].note
    assert not recs[1].recovered and recs[1].note == "not injected: no trainer"
    tot = totals(recs, goodput=0.1, goodput_fault_free=0.0, lost=[30], sha256_equal=False)
    assert (tot.injected, tot.not_injected, tot.recovered) == (1, 1, 0)
    text = table(recs, tot)
    assert "faults injected 1, recovered 0 (1 more could not be injected)" in text
    assert "UNRECOVERED" in text and "DIFFERENT" in text and "(steps [30])" in text


@pytest.mark.parametrize(("last_restart", "restore", "expected"), [
    (None, "", "all pods new"),
    ({"attempt": 2, "inPlace": 1, "replaced": [{"index": 1, "new": "lm-1"}]}, "", "1 in place, 1->new pod"),
    ({"attempt": 2, "inPlace": 2}, "memory tier: 0=memory, 1=memory", "2 in place; memory tier: 0=memory, 1=memory"),
])
def test_how_a_restart_recovered_in_words(last_restart: dict | None, restore: str, expected: str) -> None:
    assert how_restarted(last_restart, restore) == expected


def test_each_attempts_start_from_the_trainer_log_its_source_restore_seconds_and_compile_wait() -> None:
    lines = ["process 0/2 starting at step 0 of 100 (attempt 1)",
             "compiled train_step ahead in 2.10s beside the restore (the first step waited 1.90s for it)",
             "restored step 20 from /ckpt/checkpoints in 0.84s: resuming at step 21 (saved by attempt 1)",
             "process 0/2 starting at step 21 of 100 (attempt 2)",
             "compiled train_step ahead in 0.40s beside the restore (the first step waited 0.10s for it)",
             "compiled flat_params ahead in 0.50s beside the restore (the first step waited 0.30s for it)",
             "restored step 40 on process 0 from its own pod's memory in 0.1s (gang: 0=memory, 1=peer)",
             "restored step 40 from /ckpt/checkpoints: resuming at step 41 (saved by attempt 2)",
             "process 0/2 starting at step 41 of 100 (attempt 3)",
             ("compiled step ahead in 0.89s beside the restore, lowered before the devices (the first step waited "
              "0.26s for it)")]
    other = ["restored step 20 from /ckpt/checkpoints in 0.90s: resuming at step 21 (saved by attempt 1)",
             "process 1/2 starting at step 21 of 100 (attempt 2)",
             "compiled train_step ahead in 9.00s beside the restore (the first step waited 9.00s for it)",
             "restored step 60 from /ckpt/checkpoints: resuming at step 61 (saved by attempt 3)",
             "process 1/2 starting at step 61 of 100 (attempt 4)"]
    assert starts_by_attempt([lines, other]) == {
        1: AttemptStart("", None, 1.9),
        2: AttemptStart("storage", 0.84, 0.3),  # process 0's; the longest of its waits; process 1's are not
        3: AttemptStart("memory tier: 0=memory, 1=peer", 0.1, 0.26),  # the step lowered before the devices
    }


def test_the_cost_of_each_kind_over_the_restarts_it_caused() -> None:
    def rec(kind: str, at: float, gap: float = 0.0, lost: int = 0, restore: float | None = None,
            wait: float | None = None, note: str = "") -> FaultRecord:
        return FaultRecord(kind, "n", at, at + 0.5, lost_steps=lost, gap_seconds=gap, recovered=True, note=note,
                           restore_seconds=restore, first_step_wait=wait)

    recs = [rec("node-lost", 10, gap=6.0, lost=3, restore=0.4, wait=0.2),
            rec("node-lost", 40, gap=2.0, lost=1, restore=0.6),
            rec("node-lost", 70, note="during restart: shares the restart of the fault before it"),
            rec("notice-gke-spot", 100, gap=1.0, restore=0.2, wait=0.1),
            rec("kill-spare", 130),
            FaultRecord("partition", "n", 160, None, note=f"{NOT_INJECTED}no target")]
    rows = by_kind(recs)
    assert [c.kind for c in rows] == ["node-lost", "notice-gke-spot", "kill-spare", ALL_KINDS]  # costliest first
    lost = rows[0]
    assert (lost.faults, lost.restarts, lost.gap_per_restart, lost.gap_max, lost.gap_per_fault) == (3, 2, 4.0, 6.0,
                                                                                                   2.67)
    assert (lost.lost_steps, lost.detect, lost.restore, lost.first_step_wait) == (4, 0.5, 0.5, 0.2)
    assert rows[2] == KindCost("kill-spare", 1, 0, 0.0, 0.0, 0.0, 0, 0.5, None, None)
    every = rows[-1]  # the partition never injected: in no row
    assert (every.faults, every.restarts, every.gap_per_restart, every.gap_max, every.lost_steps) == (5, 3, 3.0, 6.0, 4)
    text = kind_table(rows)
    assert "| node-lost | 3 | 2 | 4.00 (6.00) | 2.67 | 4 | 0.50 | 0.50 | 0.20 |" in text
    assert "| kill-spare | 1 | 0 | 0.00 (0.00) | 0.00 | 0 | 0.50 | - | - |" in text
    assert "| **all kinds** | 5 | 3 | 3.00 (6.00) | 1.80 | 4 | 0.50 | 0.40 | 0.15 |" in text
    assert by_kind([]) == [] and as_json(recs, totals(recs, goodput=1, goodput_fault_free=1, lost=[],
                                                      sha256_equal=True))["by_kind"][0]["kind"] == "node-lost"


@pytest.mark.parametrize(("seen", "present", "keep", "lost"), [
    ({10, 20, 30, 40}, {20, 30, 40}, 3, []),       # 10 deleted by retention
    ({10, 20, 30, 40}, {20, 40}, 3, [30]),
    ({10}, set(), 3, [10]),
    (set(), {5}, 3, []),
    # issue #25: 79 and 99 committed while the API server was away (never seen); retention rightly deleted 39, 59
    ({19, 39, 59}, {79, 99}, 2, []),
    ({19, 39, 59}, {19, 79}, 2, [59]),             # one newer commit unseen: 59 is still among the newest two
    ({39, 59}, {79}, 2, [59]),
    ({39, 59}, {59, 79, 99}, 2, []),               # retention lags (deletes after a commit): an extra one is fine
    ({39, 59}, set(), 2, [39, 59]),                # storage emptied: every seen one of the newest is lost
    ({10, 20}, {30}, 0, []),
])
def test_committed_checkpoints_lost_allow_for_retention(seen: set[int], present: set[int], keep: int,
                                                       lost: list[int]) -> None:
    assert committed_lost(seen, present, keep) == lost


def test_badput_by_kind_sums_gaps() -> None:
    log = steps(1, range(10), 0) + steps(2, range(10, 20), 20) + steps(3, range(20, 30), 40)
    intr = analyse(log, start=0, end=50).interruptions
    faults = [Injected("node-lost", "a", 9.5, 1), Injected("node-lost", "b", 29.5, 2)]
    tot = totals(records(faults, [], intr, log, t0=0), goodput=0.5, goodput_fault_free=0.6, lost=[],
                 sha256_equal=None)
    assert Counter(tot.badput_by_kind) == Counter({"node-lost": pytest.approx(20.0)})


@pytest.mark.parametrize(("procs", "role", "expected"), [
    # supervisor (inner pid 1), trainer (started first), warm process (started later): the trainer is the oldest child
    ([Proc(100, 90, 1, 5), Proc(120, 100, 7, 50), Proc(110, 100, 6, 10)], "trainer", 110),
    ([Proc(100, 90, 1, 5), Proc(120, 100, 7, 50), Proc(110, 100, 6, 10)], "supervisor", 100),
    # a grandchild (the trainer's own child) is never picked
    ([Proc(100, 90, 1, 5), Proc(130, 110, 9, 1), Proc(110, 100, 6, 10)], "trainer", 110),
    ([Proc(100, 90, 1, 5)], "trainer", None),     # between attempts: no trainer
    # found by the soak on real nodes: the pod's sandbox ("pause") is a PID 1 in the pod's cgroup too, and was
    # picked as the supervisor (killing the sandbox; no trainer found under it)
    ([Proc(90, 80, 1, 3, "pause"), Proc(100, 80, 1, 5, "reprieve-supervisor"), Proc(110, 100, 6, 10, "python")],
     "trainer", 110),
    ([Proc(90, 80, 1, 3, "pause"), Proc(100, 80, 1, 5, "reprieve-supervisor")], "supervisor", 100),
    ([Proc(90, 80, 1, 3, "pause")], "supervisor", None),
    ([Proc(120, 100, 7, 50)], "supervisor", None),  # no PID 1 seen
])
def test_pick_finds_the_supervisor_and_the_trainer(procs: list[Proc], role: str, expected: int | None) -> None:
    got = pick(role, procs)
    assert (got.pid if got else None) == expected


W0, W1 = PodView("lm-0", "worker", "n0", True), PodView("lm-1", "worker", "n1", True)
S_TOOK = PodView("lm-spare-a", "spare", "n2", True)     # a spare that took over index 0: name and label kept
S_FREE = PodView("lm-spare-b", "spare", "n3", True)
GONE = PodView("lm-spare-c", "spare", "n4", False)


@pytest.mark.parametrize(("pods", "assigned", "workers", "spares"), [
    ([W0, W1, S_FREE], {"lm-0", "lm-1"}, ["lm-0", "lm-1"], ["lm-spare-b"]),
    # found by the first soak on real nodes: after a spare took over, every pod was named and labelled a spare,
    # and the injectors found no worker to kill
    ([S_TOOK, W1, S_FREE, GONE], {"lm-spare-a", "lm-1"}, ["lm-spare-a", "lm-1"], ["lm-spare-b"]),
    ([W0, W1, S_FREE], None, ["lm-0", "lm-1"], ["lm-spare-b"]),   # no assignment (yet): by the label
    ([W0, GONE], {"lm-0", "lm-spare-c"}, ["lm-0"], []),          # not running: neither
])
def test_workers_are_the_assigned_pods_not_the_ones_named_worker(pods: list[PodView], assigned: set[str] | None,
                                                                 workers: list[str], spares: list[str]) -> None:
    got = split_roles(pods, assigned)
    assert ([p.name for p in got[0]], [p.name for p in got[1]]) == (workers, spares)


@pytest.mark.parametrize(("data", "expected"), [
    ({"attempt": "3", "processes": '{"lm-spare-a": 0, "lm-1": 1}'}, {"lm-spare-a", "lm-1"}),
    ({"attempt": "3"}, None),
    (None, None),
    ({"processes": "not json"}, None),
])
def test_assigned_pods_from_the_assignment_configmap(data: dict | None, expected: set[str] | None) -> None:
    assert assigned_pods(data) == expected


@pytest.mark.parametrize(("last_restore", "expected"), [
    ({"attempt": 3, "sources": ["memory", "peer"], "step": 102, "tier": "memory"}, "memory tier: 0=memory, 1=peer"),
    ({"attempt": 2, "sources": ["storage", "storage"], "step": 77, "tier": "storage"}, "storage"),
    ({"attempt": 2, "tier": "mixed"}, "mixed"),
    (None, ""),
])
def test_restore_in_words_from_the_status(last_restore: dict | None, expected: str) -> None:
    assert restore_in_words(last_restore) == expected


def test_the_status_restore_fills_in_where_the_trainer_logs_are_gone() -> None:
    log = steps(1, range(10), 0) + steps(2, range(8, 20), 20)
    intr = analyse(log, start=0, end=40).interruptions
    obs = [Observation(21, 2, last_restart={"attempt": 2, "inPlace": 2},
                       last_restore={"attempt": 2, "sources": ["memory", "memory"], "tier": "memory"})]
    (rec,) = records([Injected("node-lost", "n0", 9.5, 1)], obs, intr, log, t0=0)
    assert rec.recovery == "2 in place; memory tier: 0=memory, 1=memory"
    (rec,) = records([Injected("node-lost", "n0", 9.5, 1)], obs, intr, log, t0=0, starts={2: AttemptStart("storage")})
    assert rec.recovery == "2 in place; storage"  # the trainer log, where there is one, wins


def test_a_kill_landing_while_the_workers_save_for_a_notice_shares_the_notices_restart() -> None:
    # found by the soak on real nodes: an AWS spot notice at 181 (the workers saved and exited at 195), a
    # supervisor killed at 197 during that exit; the step log shows one interruption. The notice set it in motion:
    # it was recorded "no restart" and the kill took the gap.
    log = steps(1, range(96), 100) + steps(2, range(96, 120), 210)
    intr = analyse(log, start=100, end=240).interruptions
    faults = [Injected("notice-aws-spot-itn", "w-2", 181, 1), Injected("kill-supervisor", "lm-spare-a", 197, 1)]
    notice, kill = records(faults, [Observation(205, 2)], intr, log, t0=100)
    assert (notice.recovered, notice.lost_steps, notice.gap_seconds, notice.note) == (True, 0, pytest.approx(14), "")
    assert kill.recovered and kill.gap_seconds == 0 and "shares the restart" in kill.note


def test_a_notice_during_a_restart_causes_the_next_interruption_and_a_restart_no_fault_caused_is_said() -> None:
    # found by the soak on real nodes: two nodes doomed at 38 (attempt 1 ends at 43, attempt 2 steps from 65);
    # a cordon notice at 58, during that restart, reached attempt 2, which trained 5 steps, saved and exited:
    # the second interruption had no cause, and its 23 s gap was nobody's
    log = steps(1, range(44), 0) + steps(2, range(44, 49), 65) + steps(3, range(49, 60), 92) + \
        steps(4, range(55, 70), 120)
    intr = analyse(log, start=0, end=140).interruptions
    faults = [Injected("two-nodes-doomed", "w-1+w-3", 38, 1), Injected("notice-cordon", "w-0", 58, 1)]
    doomed, cordon = records(faults, [], intr, log, t0=0)
    assert doomed.gap_seconds == pytest.approx(21) and doomed.note == ""
    assert cordon.gap_seconds == pytest.approx(22) and cordon.note == ""
    left = unexplained(faults, intr)
    assert [i.from_attempt for i in left] == [3]   # attempt 3's end (5 steps lost): no fault explains it
    tot = totals([doomed, cordon], goodput=0.5, goodput_fault_free=0.9, lost=[], sha256_equal=True, unexplained=left)
    assert "restarts no fault explains: 1 (attempt 3 at step 59" in table([doomed, cordon], tot)


def test_a_notice_injected_just_after_an_attempts_last_step_causes_the_next_restart_not_that_one() -> None:
    # found by the 30-minute soak on real nodes (seed 1, fault 11): a cluster-autoscaler notice ended attempt 6
    # (its last step at 49); an AKS notice at 50, 0.6 s after attempt 7 was created but with the status still
    # saying attempt 6, fell within the slack of attempt 6's end and was counted as sharing its restart; attempt 7
    # stepped, saved for it and exited, and its restart was listed as one no fault explains
    log = steps(6, range(3650, 3700), 0) + steps(7, range(3700, 3708), 53) + steps(8, range(3708, 3720), 64)
    intr = analyse(log, start=0, end=80).interruptions
    faults = [Injected("notice-cluster-autoscaler", "n1", 35, 6), Injected("notice-aks-remediator", "n4", 50, 6)]
    first, second = records(faults, [], intr, log, t0=0)
    assert (first.note, first.gap_seconds) == ("", pytest.approx(3))
    assert (second.note, second.gap_seconds) == ("", pytest.approx(3)), second
    assert unexplained(faults, intr) == []
    # a second fault injected before the attempt's last step still shares its restart, and a restart after it
    # with no fault of its own stays unexplained
    faults[1] = Injected("notice-aks-remediator", "n4", 48.5, 6)
    assert "shares the restart" in records(faults, [], intr, log, t0=0)[1].note
    assert [i.from_attempt for i in unexplained(faults, intr)] == [7]


def test_notice_during_restart_owns_both_restarts_it_causes() -> None:
    # found by the soak on real nodes: the kill ended attempt 2, the notice (on the other worker's node) reached
    # attempt 3, which saved and exited; the second interruption was listed as one no fault explains
    log = steps(1, range(30), 0) + steps(2, range(28, 40), 40) + steps(3, range(40, 50), 70)
    intr = analyse(log, start=0, end=80).interruptions
    (rec,) = records([Injected("notice-during-restart", "lm-0+w-2", 29.5, 1)], [], intr, log, t0=0)
    assert (rec.lost_steps, rec.gap_seconds) == (2, pytest.approx(10 + 18))
    assert rec.note == "two restarts: the kill's and the notice's"
    assert unexplained([Injected("notice-during-restart", "lm-0+w-2", 29.5, 1)], intr) == []
    # any other kind leaves the second interruption unexplained
    assert len(unexplained([Injected("kill-trainer", "lm-0", 29.5, 1)], intr)) == 1


@pytest.mark.parametrize(("holders", "detected"), [
    # the standby took the Lease: seen when the killed holder's identity went (the Lease empty), recovered at op-b's
    (("op-a_1", "", "op-b_1"), 12),
    # found by the soak on real nodes: the killed operator container restarted in its pod and took the Lease
    # back before the standby; the holder's pod name stayed the same and the fault was recorded unrecovered
    (("op-a_1", "op-a_1", "op-a_7"), 30),
])
def test_the_operator_leader_is_recovered_when_another_identity_holds_the_lease(holders: tuple[str, ...],
                                                                               detected: float) -> None:
    obs = [Observation(t, 1, leader=h) for t, h in zip((9, 12, 30), holders, strict=True)]
    (rec,) = records([Injected("kill-operator-leader", "op-a", 10, 1)], obs, [], steps(1, range(40), 0), t0=0)
    assert (rec.detected_at, rec.recovered, rec.recovery) == (detected, True, "new leader")


@pytest.mark.parametrize(("after", "recovered", "detected"), [
    # the 30-minute soak on real nodes: the operator is pid 1 in its container, so the restarted container holds
    # the Lease under the very identity it had ("reprieve-...-dmx6r_1"); both kills were recorded unrecovered
    (Observation(20, 1, leader="op-a_1", leader_restarts=1, leader_renewed=19.5), True, 20),
    (Observation(20, 1, leader="op-a_1", leader_restarts=1, leader_renewed=9.5), False, 20),  # not renewed since
    (Observation(20, 1, leader="op-a_1", leader_restarts=0, leader_renewed=19.5), False, None),  # missed
])
def test_a_leader_restarted_under_the_same_identity_is_recovered_once_it_renews(after: Observation, recovered: bool,
                                                                                detected: float | None) -> None:
    faults = [Injected("kill-operator-leader", "op-a", 10, 1)]
    obs = [Observation(9, 1, leader="op-a_1", leader_renewed=8.0),
           Observation(12, 1, leader="op-a_1", leader_renewed=9.5), after]
    (rec,) = records(faults, obs, [], steps(1, range(40), 0), t0=0)
    assert (rec.recovered, rec.detected_at) == (recovered, detected)


def test_apiserver_restart_is_implemented_ends_no_attempt_and_is_down_5_to_15_seconds() -> None:
    kind = chaos.KINDS["apiserver-restart"]
    assert kind.implemented and not kind.interrupts and kind.needs == ()
    assert chaos.validate(["apiserver-restart"], PROCESS, minutes=3, fault_every=30) == ["apiserver-restart"]
    import random

    drawn = [faults.apiserver_down_seconds(random.Random(seed)) for seed in range(200)]
    assert all(5.0 <= d <= 15.0 for d in drawn) and max(drawn) - min(drawn) > 8  # spread over the range
    assert drawn == [faults.apiserver_down_seconds(random.Random(seed)) for seed in range(200)]


@pytest.mark.parametrize(("obs", "last_step", "recovered", "detected", "note"), [
    # the operator reconnected: a newer lastCheckpointStep after the restart, and the job trained on
    ([Observation(9, 1, checkpoint_step=10), Observation(25, 1, checkpoint_step=10),
      Observation(31, 1, checkpoint_step=20)], 40, True, 31, ""),
    # the job's final status written after it counts too
    ([Observation(9, 1, checkpoint_step=10), Observation(30, 1, phase="Succeeded", checkpoint_step=10)], 29,
     True, 30, ""),
    # the harness read the job again, but the operator never wrote its status after the restart
    ([Observation(9, 1, checkpoint_step=10), Observation(40, 1, checkpoint_step=10)], 40, False, None,
     "the operator wrote no status after it"),
    # status written, but not a step after the fault
    ([Observation(9, 1), Observation(12, 1, checkpoint_step=5)], 9, False, 12, "no step after it"),
])
def test_an_apiserver_restart_is_recovered_when_the_operator_writes_status_after_it_and_the_job_trains_on(
        obs: list[Observation], last_step: int, recovered: bool, detected: float | None, note: str) -> None:
    log = steps(1, range(last_step + 1), 0)
    (rec,) = records([Injected("apiserver-restart", "kube-apiserver (7.0s down)", 10, 1)], obs, [], log, t0=0)
    assert (rec.recovered, rec.detected_at, rec.note) == (recovered, detected, note)
    assert rec.recovery == ("no restart" if recovered else "") and rec.lost_steps == 0


def test_a_restart_after_an_apiserver_restart_is_one_no_fault_explains() -> None:
    # the soak expects no gang restart from it: one that follows is listed apart, not booked to the fault
    log = steps(1, range(20), 0) + steps(2, range(15, 30), 40)
    intr = analyse(log, start=0, end=60).interruptions
    faults = [Injected("apiserver-restart", "kube-apiserver (9.0s down)", 12, 1)]
    (rec,) = records(faults, [Observation(50, 2, checkpoint_step=20)], intr, log, t0=0)
    assert rec.recovered and rec.lost_steps == 0
    assert [i.from_attempt for i in unexplained(faults, intr)] == [1]


def test_storage_faults_are_implemented_end_no_attempt_and_last_10_to_20_seconds() -> None:
    import random

    storage = ["storage-unavailable", "storage-full"]
    assert [k.name for k in chaos.KINDS.values() if k.tmpfs] == storage
    for name in storage:
        kind = chaos.KINDS[name]
        assert kind.implemented and not kind.interrupts and kind.needs == (faults.ROOT,)
    assert chaos.validate(storage, PROCESS, minutes=2, fault_every=25) == storage
    assert faults.StorageUnavailable.seconds(random.Random(1)) == 10.0
    full = [faults.StorageFull.seconds(random.Random(seed)) for seed in range(200)]
    assert all(10.0 <= d <= 20.0 for d in full) and max(full) - min(full) > 8


@pytest.mark.parametrize(("kinds", "needed"), [
    ([], False),
    (["node-lost", "kill-trainer", "apiserver-restart"], False),
    (["storage-full"], True),
    (["notice-gke-spot", "storage-unavailable"], True),
])
def test_the_storage_tmpfs_is_mounted_only_when_a_storage_fault_is_planned(kinds: list[str], needed: bool) -> None:
    assert chaos.storage_tmpfs_needed(kinds) is needed


@pytest.mark.parametrize(("sizes", "keep", "expected"), [
    ([40_960, 45_056, 40_960], 3, 5 * 45_056 + (1 << 20)),  # keep + 2 of the largest, and the slack
    ([4_097], 1, 3 * 4_097 + (1 << 20) + 4_093),  # whole pages
])
def test_the_storage_tmpfs_holds_keep_plus_two_checkpoints(sizes: list[int], keep: int, expected: int) -> None:
    assert chaos.storage_tmpfs_bytes(sizes, keep) == expected


def test_a_storage_tmpfs_without_a_measured_checkpoint_is_refused() -> None:
    with pytest.raises(SoakConfigError, match="no checkpoint to size"):
        chaos.storage_tmpfs_bytes([], 3)


@pytest.mark.parametrize(("committed", "seen"), [
    # the next save after the fault (10..20) committed: seen at 24
    ([(5.0, 10), (12.0, 10), (18.0, 10), (24.0, 30)], 24.0),
    # a step reported during the fault was committed before it: only a report after the fault counts
    ([(5.0, 10), (15.0, 20), (22.0, 20), (30.0, 40)], 30.0),
    # nothing newer ever committed (the job failed, or ended before its next save)
    ([(5.0, 10), (25.0, 10)], None),
    # no checkpoint before the fault: any commit after it
    ([(5.0, None), (21.0, 0)], 21.0),
])
def test_a_storage_fault_is_recovered_when_a_newer_checkpoint_commits_after_it(
        committed: list[tuple[float, int | None]], seen: float | None) -> None:
    assert faults.storage_recovered(20.0, committed) == seen


def test_goodput_counts_to_the_jobs_own_end_not_to_when_the_soak_saw_it(tmp_path: Path) -> None:
    """An API server down at the job's end: the soak sees the end late; the job's result.json says when it was."""
    import os

    from tests.benchmark_module import load_benchmark

    soak = load_benchmark("soak")
    assert soak.job_end(tmp_path, 1000.0) == 1000.0  # no result (a failed job): what the soak saw
    (tmp_path / "result.json").write_text("{}")
    os.utime(tmp_path / "result.json", (980.0, 980.0))
    assert soak.job_end(tmp_path, 1000.0) == 980.0
    assert soak.job_end(tmp_path, 970.0) == 970.0  # never later than seen


def test_the_table_flags_only_faults_that_did_not_recover_not_those_never_injected() -> None:
    from localcluster.soakrecord import NOT_INJECTED, FaultRecord, Totals

    tot = Totals(injected=1, recovered=0, goodput=0.5, goodput_fault_free=1.0, not_injected=1)
    rows = table([FaultRecord("node-lost", "w-1", 10.0), FaultRecord("two-nodes-doomed", "", 20.0,
                                                                     note=f"{NOT_INJECTED}one live node")], tot)
    lines = rows.splitlines()
    assert "UNRECOVERED" in next(line for line in lines if "node-lost" in line)
    assert "UNRECOVERED" not in next(line for line in lines if "two-nodes-doomed" in line)
    assert "not injected: one live node" in rows


def test_a_notice_injected_once_the_status_shows_the_next_attempt_is_that_attempts_even_within_the_slack() -> None:
    # found by the soak on real nodes (seed 11): an AWS rebalance notice 1.4 s after attempt 7's last step, the
    # status at attempt 8 already; delivered to attempt 8, which it ended. It was taken as sharing attempt 7's
    # restart (within SLACK_S) and attempt 8's end was listed as one no fault explains.
    log = steps(1, range(30), 0) + steps(2, range(28, 36), 40) + steps(3, range(36, 50), 70)
    intr = analyse(log, start=0, end=90).interruptions
    faults = [Injected("notice-gke-spot", "w-1", 20, 1), Injected("notice-aws-rebalance", "w-2", 29 + 1.4, 2)]
    spot, rebalance = records(faults, [], intr, log, t0=0)
    assert unexplained(faults, intr) == []
    assert rebalance.note == "" and rebalance.gap_seconds > 0, rebalance
    assert spot.note == "" and spot.gap_seconds == pytest.approx(intr[0].gap_seconds), spot
    # the same notice while the status still showed attempt 1 (the status lags the operator by up to a poll) is
    # attempt 2's too: it came after attempt 1's last step, and attempt 2's end has no other cause (the 30-minute
    # soak's fault 11, below)
    late = [faults[0], Injected("notice-aws-rebalance", "w-2", 30.4, 1)]
    assert unexplained(late, intr) == [] and records(late, [], intr, log, t0=0)[1].note == ""


def test_a_storage_fault_is_recorded_recovered_with_no_restart_once_the_next_save_commits() -> None:
    log = steps(1, range(40), 0)
    intr = analyse(log, start=0, end=45).interruptions
    obs = [Observation(5, 1, checkpoint_step=10), Observation(15, 1, checkpoint_step=10),
           Observation(27, 1, checkpoint_step=30)]
    faults = [Injected("storage-full", "ckpt full for 10s", 12, 1), Injected("storage-unavailable", "ro", 30, 1)]
    full, ro = records(faults, obs, intr, log, t0=0, ended={12: 22.0, 30: 40.0})
    assert (full.recovered, full.recovery, full.note) == (True, "no restart",
                                                          "the next checkpoint committed 5.0s after it ended")
    assert (ro.recovered, ro.note) == (False, "no newer checkpoint seen committed after it")


# -- partition ------------------------------------------------------------------------------------------------

def test_partition_is_implemented_ends_an_attempt_needs_real_nodes_and_iptables_and_lasts_10_to_30_seconds() -> None:
    import random

    kind = chaos.KINDS["partition"]
    assert kind.implemented and kind.interrupts and kind.needs == (REAL_NODES, faults.IPTABLES)
    assert chaos.validate(["partition"], ALL, minutes=2, fault_every=25) == ["partition"]
    drawn = [faults.partition_seconds(random.Random(seed)) for seed in range(200)]
    assert all(10.0 <= d <= 30.0 for d in drawn) and max(drawn) - min(drawn) > 15
    assert drawn == [faults.partition_seconds(random.Random(seed)) for seed in range(200)]


@pytest.mark.parametrize(("cut", "expected"), [
    (True, ["*filter", ":REPRIEVE-SOAK-PARTITION - [0:0]", "-A REPRIEVE-SOAK-PARTITION -j DROP",
            "-I INPUT 1 ! -i lo -j REPRIEVE-SOAK-PARTITION", "-I OUTPUT 1 ! -o lo -j REPRIEVE-SOAK-PARTITION",
            "COMMIT"]),
    (False, ["*filter", "-D INPUT ! -i lo -j REPRIEVE-SOAK-PARTITION", "-D OUTPUT ! -o lo -j REPRIEVE-SOAK-PARTITION",
             "-F REPRIEVE-SOAK-PARTITION", "-X REPRIEVE-SOAK-PARTITION", "COMMIT"]),
])
def test_partition_rules_drop_all_but_loopback_in_a_chain_of_their_own(cut: bool, expected: list[str]) -> None:
    assert partition_rules(cut).splitlines() == expected


@pytest.mark.parametrize(("procs", "expected"), [
    ([Proc(10, 1, 1, 5, "pause"), Proc(20, 1, 1, 6, "reprieve-supervisor")], 10),   # the sandbox holds the pod's netns
    ([Proc(20, 1, 1, 6, "reprieve-supervisor"), Proc(10, 1, 1, 5, "pause")], 10),
    ([Proc(20, 1, 1, 6, "reprieve-supervisor"), Proc(21, 20, 7, 9, "python")], 20),  # no sandbox seen: any of the pod's
    ([], None),
])
def test_the_pods_network_namespace_is_found_through_its_sandbox(procs: list[Proc], expected: int | None) -> None:
    holder = netns_holder(procs)
    assert (holder.pid if holder else None) == expected


@pytest.mark.parametrize(("last_step_t", "healed_at", "recovered", "note"), [
    # stalled while cut off, stepped again once healed, no restart: recovered in place
    (45.0, 38.0, True, "the step log shows no restart after it"),
    # a step logged after the cut but none after the heal: not recovered
    (15.0, 38.0, False, "the step log shows no restart after it; no step after it was healed either"),
])
def test_a_partition_that_ends_no_attempt_is_recovered_once_the_job_steps_after_the_heal(
        last_step_t: float, healed_at: float, recovered: bool, note: str) -> None:
    log = steps(1, range(int(last_step_t) + 1), 0)
    (rec,) = records([Injected("partition", "lm-1 cut off for 28.0s", 10, 1)], [Observation(20, 1)], [], log, t0=0,
                     ended={10: healed_at})
    assert (rec.recovered, rec.note, rec.lost_steps) == (recovered, note, 0)


def test_a_partition_that_ends_the_attempt_is_booked_its_restart() -> None:
    # cut at 19.5 (the last step of attempt 1 at 19); the gang restarts; attempt 2 resumes at step 10 at t=60
    log = steps(1, range(20), 0) + steps(2, range(10, 30), 60)
    intr = analyse(log, start=0, end=80).interruptions
    (rec,) = records([Injected("partition", "lm-1 cut off for 25.0s", 19.5, 1)],
                     [Observation(50, 2, last_restart={"attempt": 2, "inPlace": 2})], intr, log, t0=0,
                     ended={19.5: 44.5})
    assert (rec.recovered, rec.lost_steps, rec.recovery, rec.detected_at) == (True, 10, "2 in place", 50)
    assert unexplained([Injected("partition", "lm-1", 19.5, 1)], intr) == []


def test_the_ci_smokes_rotation_injects_every_kind_the_soak_knows() -> None:
    """Over chaos.SMOKE_ROTATION's seeds, the smoke's schedules (the pure schedule, as benchmarks/soak.py draws it)
    inject every kind in the catalogue, each seed's kinds exactly once: a kind added to the catalogue and to no
    seed's group, or a group grown past one cycle of the smoke's schedule, fails here."""
    injected: Counter[str] = Counter()
    for seed, kinds in chaos.SMOKE_ROTATION:
        got, plan = chaos.smoke_plan(seed)
        assert got == list(kinds)
        assert sorted(f.kind for f in plan) == sorted(kinds), f"seed {seed}: one cycle of its kinds, each once"
        injected.update(f.kind for f in plan)
    assert set(injected) == {k.name for k in chaos.KINDS.values()}
    assert max(injected.values()) == 1, "each kind in one seed's group only"
    assert len({s for s, _ in chaos.SMOKE_ROTATION}) == len(chaos.SMOKE_ROTATION)


N_SEEDS = len(chaos.SMOKE_ROTATION)  # 5 with today's 25 kinds: grows by one for every 5 kinds registered


@pytest.mark.parametrize(("env", "day", "seed"), [
    (None, 0, 1), (None, N_SEEDS - 1, N_SEEDS), (None, N_SEEDS + 2, 3), ("", 2 * N_SEEDS + 1, 2), (" 4 ", 0, 4),
    ("2", 9, 2)])
def test_the_ci_smokes_seed_rotates_by_the_utc_day_unless_asked(env: str | None, day: int, seed: int) -> None:
    assert chaos.smoke_seed(env, day) == seed


@pytest.mark.parametrize(("env", "message"), [(str(N_SEEDS + 1), "the CI smoke's seeds are 1, 2, 3, 4, 5"),
                                              ("x", "whole number")])
def test_a_ci_smoke_seed_outside_the_rotation_is_refused(env: str, message: str) -> None:
    with pytest.raises(SoakConfigError, match=message):
        chaos.smoke_seed(env, 0)


def _faults_table_kinds() -> list[str]:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "soak.md").read_text()
    section = doc.split("## The faults", 1)[1].split("\n## ", 1)[0]
    return [line.split("|")[1].strip().split("`")[1] for line in section.splitlines() if line.startswith("| `")]


def test_docs_soak_has_one_row_per_registered_kind_and_no_copy_of_the_rotation() -> None:
    """One docs row per kind (the notice kinds share ``notice-<signal>``: they are generated from the operator's
    signals); the CI section explains the rotation's rule instead of listing its groups."""
    rows = _faults_table_kinds()
    expected = ["notice-<signal>", *(n for n, k in chaos.KINDS.items() if not isinstance(k, faults.SignalNotice))]
    assert sorted(rows) == sorted(expected)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "soak.md").read_text()
    ci = doc.split("## In CI", 1)[1].split("\n## ", 1)[0]
    assert not [line for line in ci.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert "notice-aws-rebalance" not in doc  # no copy of the signal list either


class _NewKind(faults.Irreversible, faults.EndsAttempt):
    name = "kill-containerd"
    what = "SIGKILL of a worker node's containerd"
    needs = (REAL_NODES,)

    def inject(self, env: faults.Env, at: float) -> str:
        return env.worker_node()


def test_the_rotation_is_dealt_from_the_registry_so_a_registered_kind_is_in_it() -> None:
    assert chaos.SMOKE_ROTATION == chaos.smoke_rotation(chaos.KINDS.values())
    grown = faults.Registry(chaos.KINDS.values())
    grown.register(_NewKind())
    rotation = chaos.smoke_rotation(grown.values())
    kinds = [k for _, group in rotation for k in group]
    assert sorted(kinds) == sorted(grown) and "kill-containerd" in kinds
    assert [s for s, _ in rotation] == list(range(1, len(rotation) + 1))
    assert len(rotation) == -(-len(grown) // chaos.SMOKE_FAULTS)
    assert all(0 < len(group) <= chaos.SMOKE_FAULTS for _, group in rotation)
    for seed, group in rotation:  # a group smaller than SMOKE_FAULTS is still one cycle: each kind once
        plan = chaos.schedule(list(group), minutes=chaos.smoke_minutes(group), fault_every=chaos.SMOKE_FAULT_EVERY,
                              seed=seed)
        assert sorted(f.kind for f in plan) == sorted(group)
    with pytest.raises(ValueError, match="'kill-containerd' is registered already"):
        grown.register(_NewKind())


def test_the_rotation_spreads_costly_long_held_and_storage_kinds() -> None:
    """What the hand-kept groups were made for, now a property of the dealt ones: at most one costly kind a seed
    (one on every seed while there are as many), the storage kinds on different seeds, at most two notices a seed
    whose node stays 30 s; each of these spread evenly (the counts of two seeds differ by one at most)."""
    tiers = {"costly": lambda k: k.costly, "long-held": lambda k: k.holds_node_seconds >= chaos.LONG_HOLD_SECONDS,
             "tmpfs": lambda k: k.tmpfs}
    for tier, of in tiers.items():
        counts = [sum(of(chaos.KINDS[k]) for k in group) for _, group in chaos.SMOKE_ROTATION]
        assert max(counts) - min(counts) <= 1, (tier, counts)
        assert max(counts) <= {"costly": 1, "long-held": 2, "tmpfs": 1}[tier], (tier, counts)
    assert {k.name for k in chaos.KINDS.values() if k.costly} == {
        "partition", "notice-during-restart", "two-nodes-doomed", "node-lost", "apiserver-restart"}


def _pod(name: str, node: str) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(name=name), spec=SimpleNamespace(node_name=node))


class FakeEnv:
    """A cluster that records what a kind asks of it (:class:`localcluster.faults.Env`)."""

    def __init__(self) -> None:
        self.rng, self.doomed, self.calls, self.now = random.Random(1), set[str](), list[tuple[str, ...]](), 1

    def attempt(self) -> int:
        return self.now

    def workers(self) -> list[Any]:
        return [_pod("lm-0", "n0"), _pod("lm-1", "n1")]

    def spares(self) -> list[Any]:
        return [_pod("lm-spare-a", "n2")]

    def choose(self, items: list[Any], what: str) -> Any:
        return items[0]

    def worker_node(self) -> str:
        return "n0"

    def kill(self, pod: Any, role: str) -> None:
        self.calls.append(("kill", pod.metadata.name, role))
        self.now += 1  # the attempt ends

    def kill_leader(self) -> str:
        self.calls.append(("kill-leader",))
        return "op-a"

    def notice(self, node: str, sig: Any) -> None:
        self.calls.append(("notice", node, sig.name))

    def delete_node(self, node: str) -> None:
        self.calls.append(("delete", node))

    def restart_apiserver(self, down_seconds: float) -> float:
        self.calls.append(("apiserver", f"{down_seconds:g}"))
        return down_seconds + 1

    def partition(self, at: float, seconds: Any) -> str:
        self.calls.append(("partition", f"{seconds(self.rng):g}"))
        return "lm-0 cut off"

    def storage_unwritable(self, at: float, seconds: Any) -> str:
        self.calls.append(("unwritable", f"{seconds(self.rng):g}"))
        return "not writable"

    def storage_full(self, at: float, seconds: Any) -> str:
        self.calls.append(("full", f"{seconds(self.rng):g}"))
        return "full"

    def remove_signals(self) -> list[str]:
        return ["signals removed"]

    def heal_partitions(self) -> list[str]:
        return ["partitions healed"]

    def end_storage_fault(self) -> list[str]:
        return ["storage back"]


@pytest.mark.parametrize("name", list(chaos.KINDS))
def test_every_registered_kind_injects_undoes_detects_and_judges_recovery(name: str) -> None:
    """Each kind is one class with the four methods, each doing something of its own: inject acts on the cluster
    and names a target, undo returns what it took back, detected and recovered read the polls."""
    kind = chaos.KINDS[name]
    assert isinstance(kind, faults.FaultKind) and not inspect.isabstract(type(kind))
    assert kind.name == name and kind.what and kind.implemented
    env = FakeEnv()
    target = kind.inject(env, 10.0)
    assert target and env.calls, f"{name}: inject acted on nothing"
    assert isinstance(kind.undo(env), list)
    fault = faults.Injected(name, target, 10.0, 1)
    assert kind.detected(fault, []) is None  # nothing seen yet
    judged = kind.recovered(fault, faults.Seen([], last_step_t=5.0))
    assert not judged.recovered and judged.note, f"{name}: recovered with nothing seen after it"


def test_a_kind_that_leaves_something_pending_undoes_it() -> None:
    env = FakeEnv()
    undone = {name: kind.undo(env) for name, kind in chaos.KINDS.items()}
    assert undone["notice-gke-spot"] == undone["two-nodes-doomed"] == ["signals removed"]
    assert undone["partition"] == ["partitions healed"]
    assert undone["storage-full"] == undone["storage-unavailable"] == ["storage back"]
    assert undone["node-lost"] == undone["kill-trainer"] == undone["apiserver-restart"] == []


@pytest.mark.parametrize(("argv", "refused"), [
    (["--require-real-nodes"], False), (["--require-real-nodes", "--process-nodes"], True), ([], False)])
def test_require_real_nodes_is_a_flag_that_process_nodes_contradict(argv: list[str], refused: bool,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--require-real-nodes`` (the CI smoke): real nodes that cannot start end the soak with exit 2 instead of
    falling back to process nodes, which cannot do its kill-* and partition kinds."""
    from tests.benchmark_module import load_benchmark

    soak = load_benchmark("soak")
    argv = [*argv, "--faults", "node-lost", "--minutes", "1", "--fault-every", "15"]
    if refused:
        with pytest.raises(SystemExit):
            soak.parse_args(argv)
        assert "contradict" in capsys.readouterr().err
    else:
        args, _, _ = soak.parse_args(argv)
        assert args.require_real_nodes == ("--require-real-nodes" in argv)


@pytest.mark.parametrize(("argv", "error"), [
    (["--reference-step-sleep", "-0.1"], "--reference-step-sleep must be >= 0, got -0.1"),
    (["--devices-per-process", "0"], "--devices-per-process must be >= 1, got 0"),
    (["--reference-step-sleep", "0", "--devices-per-process", "1"], None)])
def test_the_reference_runs_sleep_and_the_devices_are_checked(argv: list[str], error: str | None,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The CI smoke's fault-free run sleeps 0 s a step and its trainers have one device each; nonsense is refused."""
    from tests.benchmark_module import load_benchmark

    soak = load_benchmark("soak")
    argv = [*argv, "--faults", "node-lost", "--minutes", "1", "--fault-every", "15"]
    if error:
        with pytest.raises(SystemExit):
            soak.parse_args(argv)
        assert error in capsys.readouterr().err
    else:
        args, _, _ = soak.parse_args(argv)
        assert (args.reference_step_sleep, args.devices_per_process) == (0.0, 1)


@pytest.mark.parametrize(("error", "waited", "retry"), [
    ("no target: a running worker pod on a node not already doomed was needed and none is there", 0.0, True),
    ("no target: a running spare pod was needed and none is there", 9.0, True),
    ("no target: a running worker pod on a node not already doomed was needed and none is there", 59.0, True),
    ("no target: a running worker pod was needed and none is there", 60.0, False),
    ("no operator pod holds the leader Lease", 0.0, False),
    ("fault kind x has no injector", 0.0, False)])
def test_a_fault_with_no_target_now_is_tried_again_for_a_while(error: str, waited: float, retry: bool) -> None:
    assert chaos.retry_for_target(error, waited) is retry


def test_two_nodes_doomed_without_two_live_nodes_is_tried_again() -> None:
    """The error two-nodes-doomed raises is the one the retry recognises (its text and the retry's had drifted
    apart, so that fault was recorded failed at once instead of waiting for the restart to place the pods)."""
    import random

    from localcluster import faults

    with pytest.raises(RuntimeError) as err:
        faults.two_doomed_nodes(["w-1"], [], random.Random(0))
    assert chaos.retry_for_target(str(err.value), 3.0) is True


DIFFER = "the final parameters differ from the fault-free run's"


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, []),
    ({"unrun": 12}, ["12 planned faults never ran (the job ended first)"]),  # the 30-minute run that passed at 48
    ({"recovered": 58}, ["2 of 60 faults not recovered"]),
    ({"not_injected": 1}, ["1 faults found no target"]),
    ({"lost": 1, "sha": False}, ["1 committed checkpoints lost", DIFFER]),
    ({"phase": "Failed", "sha": None}, ["the job ended Failed", "no final parameters to compare"]),
    ({"interrupted": True}, ["interrupted"]),
])
def test_a_soak_fails_on_each_thing_it_must_prove(changes: dict, expected: list[str]) -> None:
    from tests.benchmark_module import load_benchmark

    soak = load_benchmark("soak")
    run = {"interrupted": False, "phase": "Succeeded", "injected": 60, "recovered": 60, "not_injected": 0,
           "unrun": 0, "lost": 0, "sha": True, **changes}
    assert soak.failures(**run) == expected


def test_the_soaks_goodput_window_gives_the_last_fault_its_interval_and_no_fault_free_tail() -> None:
    from tests.benchmark_module import load_benchmark

    soak = load_benchmark("soak")
    plan = chaos.schedule(["node-lost", "kill-trainer"], minutes=30, fault_every=30.0, seed=1)
    assert soak.fault_window_end(1000.0, plan, 30.0) == pytest.approx(1000.0 + plan[-1].at + 30.0)
    assert soak.fault_window_end(1000.0, [], 30.0) == pytest.approx(1030.0)


def test_notice_during_restart_and_two_nodes_doomed_still_run_when_the_workers_share_a_node() -> None:
    """The 30-minute soak at f25d4b8: after two notices moved both workers at once, the scheduler put the new pod
    beside the other worker (soak-n9); notice-during-restart found "no other worker on another live node" for its
    10 s and was not injected (59 of 60). Now a shared node takes the notice (it dooms both workers), and
    two-nodes-doomed takes that node and a spare's."""
    rng = random.Random(1)
    assert during_restart_node("n1", ["n1", "n2"], rng) == "n2"
    assert during_restart_node("n1", ["n1", "n1"], rng) == "n1"
    assert {during_restart_node("n1", ["n1", "n2", "n3"], random.Random(i)) for i in range(20)} == {"n2", "n3"}
    assert sorted(two_doomed_nodes(["n1", "n2"], ["n3"], rng)) == ["n1", "n2"]
    assert two_doomed_nodes(["n9", "n9"], ["n9", "n4"], rng) == ["n9", "n4"]
    with pytest.raises(RuntimeError, match="on two live nodes: workers on \\['n9'\\], spares on \\['n9'\\]"):
        two_doomed_nodes(["n9", "n9"], ["n9"], rng)
    with pytest.raises(RuntimeError, match="workers on \\[\\]"):
        two_doomed_nodes([], ["n4"], rng)
