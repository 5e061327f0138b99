"""decide_restart: one row per case of the gang lifecycle."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from op_jobs import make_job
from reprieve_operator.policy.restart import WorkerPod, decide_restart

pytestmark = pytest.mark.unit

NOTICE = {"id": "gke-spot/n1/1", "node": "n1", "reason": "gke-spot", "deadline": "x", "observedAt": "x"}


def pods(attempt: int, *states: Any) -> list[WorkerPod]:
    """states: a phase string, an int exit code, or a dict of WorkerPod fields."""
    out = []
    for i, s in enumerate(states):
        if isinstance(s, int):
            kw: dict[str, Any] = {"phase": "Succeeded" if s == 0 else "Failed", "exit_code": s}
        elif isinstance(s, str):
            kw = {"phase": s}
        else:
            kw = dict(s)
        out.append(WorkerPod(name=f"llama-{i}", index=i, attempt=kw.pop("attempt", attempt), node=f"n{i}", **kw))
    return out


def job(status: dict[str, Any] | None = None, **spec: Any) -> Any:
    return make_job(replicas=2, **spec).with_status(**(status or {})).model()


RUNNING = {"phase": "Running", "attempt": 1}
# (case, status, spec, pods, notice nodes, expected plan fields)
ROWS: list[tuple[str, dict[str, Any], dict[str, Any], list[WorkerPod], list[str], dict[str, Any]]] = [
    ("new job creates attempt 1", {}, {}, [], [],
     {"phase": "Pending", "attempt": 1, "create": (0, 1), "new_attempt": True, "cause": None}),
    ("new job avoids the nodes placement names", {}, {}, [], ["n3", "n9"],
     {"create": (0, 1), "exclude_nodes": ("n3", "n9")}),
    ("pods running", RUNNING, {}, pods(1, "Running", "Running"), ["n0"],
     {"phase": "Running", "ready": 2, "create": (), "delete": (), "cause": None, "exclude_nodes": ()}),
    ("one pod pending", RUNNING, {}, pods(1, "Running", "Pending"), [], {"phase": "Pending", "ready": 1}),
    ("notice delivered -> Preempting", {**RUNNING, "lastNotice": {**NOTICE, "attempt": 1}}, {},
     pods(1, "Running", "Running"), [], {"phase": "Preempting", "cause": None}),
    ("old notice does not count", {**RUNNING, "attempt": 2, "lastNotice": {**NOTICE, "attempt": 1}}, {},
     pods(2, "Running", "Running"), [], {"phase": "Running"}),
    ("all exit 42 -> preemption restart", RUNNING, {}, pods(1, 42, 42), [],
     {"phase": "Restarting", "cause": "preemption", "restarting_from": 1, "delete": ("llama-0", "llama-1")}),
    ("one 42 one still running -> wait", RUNNING, {}, pods(1, 42, "Running"), [],
     {"phase": "Pending", "cause": None, "delete": ()}),
    ("custom restart code", RUNNING, {"restartPolicy": {"restartExitCode": 7}}, pods(1, 7, 7), [],
     {"cause": "preemption"}),
    ("42 is a failure under a custom code", RUNNING, {"restartPolicy": {"restartExitCode": 7}}, pods(1, 42, 7), [],
     {"cause": "failure", "phase": "Restarting"}),
    ("mixed 0 and 42 -> preemption restart", RUNNING, {}, pods(1, 0, 42), [], {"cause": "preemption"}),
    ("all exit 0 -> Succeeded", RUNNING, {}, pods(1, 0, 0), [], {"phase": "Succeeded", "delete": ()}),
    ("one exits 0, other running -> wait", RUNNING, {}, pods(1, 0, "Running"), [], {"phase": "Pending"}),
    ("exit 1 -> failure restart", RUNNING, {}, pods(1, 1, "Running"), [],
     {"phase": "Restarting", "cause": "failure", "delete": ("llama-0", "llama-1")}),
    ("failure past budget -> Failed", {**RUNNING, "restarts": {"failure": 3}}, {}, pods(1, 1, "Running"), [],
     {"phase": "Failed", "cause": "failure", "delete": ("llama-1",)}),
    ("maxFailures 0 fails at once", RUNNING, {"restartPolicy": {"maxFailures": 0}}, pods(1, 3, 3), [],
     {"phase": "Failed", "delete": ()}),
    ("pod deleted -> disruption", RUNNING, {}, pods(1, "Running", {"phase": "Running", "deleting": True}), [],
     {"cause": "disruption", "delete": ("llama-0",)}),
    ("deleted pod killed by SIGTERM -> disruption, not failure", RUNNING, {},
     pods(1, "Running", {"phase": "Failed", "exit_code": 143, "deleting": True}), [], {"cause": "disruption"}),
    ("deleted pod that saved and exited 42 -> waits for the gang", RUNNING, {},
     pods(1, "Running", {"phase": "Failed", "exit_code": 42, "deleting": True}), [], {"cause": None}),
    ("pod missing -> disruption", RUNNING, {}, pods(1, "Running"), [], {"cause": "disruption"}),
    ("node lost without notice -> disruption", RUNNING, {},
     pods(1, "Running", {"phase": "Running", "node_lost": True}), [], {"cause": "disruption"}),
    ("node lost after notice -> preemption", {**RUNNING, "lastNotice": {**NOTICE, "attempt": 1}}, {},
     pods(1, "Running", {"phase": "Running", "node_lost": True}), [], {"cause": "preemption"}),
    ("evicted (failed, no exit code) -> disruption", RUNNING, {}, pods(1, "Running", {"phase": "Failed"}), [],
     {"cause": "disruption"}),
    ("preemption cap reached -> Failed", {**RUNNING, "restarts": {"preemption": 1, "disruption": 1}},
     {"restartPolicy": {"maxPreemptionRestarts": 2}}, pods(1, 42, 42), [],
     {"phase": "Failed", "cause": "preemption"}),
    ("disruptions do not use the failure budget", {**RUNNING, "restarts": {"failure": 3, "disruption": 9}}, {},
     pods(1, "Running"), [], {"phase": "Restarting", "cause": "disruption"}),
    ("restarting: old pods still terminating -> wait, no recount",
     {"phase": "Restarting", "attempt": 1, "restartingFrom": 1}, {},
     pods(1, {"phase": "Running", "deleting": True}, 42), [],
     {"phase": "Restarting", "cause": None, "create": (), "delete": ("llama-1",), "attempt": 1}),
    ("restarting: all gone -> attempt 2 away from noticed nodes",
     {"phase": "Restarting", "attempt": 1, "restartingFrom": 1}, {}, [], ["n1"],
     {"phase": "Pending", "attempt": 2, "create": (0, 1), "exclude_nodes": ("n1",), "new_attempt": True}),
    ("crash after creating attempt 2, before status", {"phase": "Restarting", "attempt": 1, "restartingFrom": 1},
     {}, pods(2, "Pending"), [],
     {"phase": "Pending", "attempt": 2, "create": (1,), "restarting_from": None, "cause": None}),
    ("stale pod of an old attempt is deleted", {**RUNNING, "attempt": 2},
     {}, [*pods(2, "Running", "Running")[:1], *pods(1, "Running", "Running")[1:]], [],
     {"cause": "disruption"}),
    ("suspend deletes pods", RUNNING, {"suspend": True}, pods(1, "Running", "Running"), [],
     {"phase": "Suspended", "delete": ("llama-0", "llama-1"), "cause": None}),
    ("suspended before start creates nothing", {}, {"suspend": True}, [], [],
     {"phase": "Suspended", "create": (), "attempt": 0}),
    ("resume waits for pods to go", {"phase": "Suspended", "attempt": 1}, {},
     pods(1, {"phase": "Running", "deleting": True}), [], {"phase": "Pending", "create": (), "delete": ()}),
    ("resume starts a new attempt", {"phase": "Suspended", "attempt": 1}, {}, [], [],
     {"phase": "Pending", "attempt": 2, "create": (0, 1), "cause": None}),
    ("Succeeded is final", {"phase": "Succeeded", "attempt": 1}, {}, pods(1, 0, 0), [],
     {"phase": "Succeeded", "create": (), "delete": ()}),
    ("Failed is final but stops stragglers", {"phase": "Failed", "attempt": 1}, {}, pods(1, 1, "Running"), [],
     {"phase": "Failed", "delete": ("llama-1",)}),
]


NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)
YOUNG = {**RUNNING, "attemptStartTime": "2026-11-22T02:59:50Z"}  # started 10 s before NOW
OLD = {**RUNNING, "attemptStartTime": "2026-11-22T02:00:00Z"}
BACKING_OFF = {"phase": "Restarting", "attempt": 1, "restartingFrom": 1, "rapidRestarts": 2,
               "nextAttemptTime": "2026-11-22T03:00:20Z"}
ROWS += [
    ("a pod carrying the notice counts as noticed (eviction raced the status write)", RUNNING, {},
     pods(1, {"phase": "Running", "noticed": True}, {"phase": "Running", "deleting": True, "noticed": True}), [],
     {"cause": "preemption"}),
    ("rapid: restart code within 60 s, no notice -> backoff 10 s", YOUNG, {}, pods(1, 42, 42), [],
     {"phase": "Restarting", "cause": "preemption", "rapid_restarts": 1,
      "next_attempt_time": NOW + timedelta(seconds=10)}),
    ("third rapid restart in a row waits 40 s", {**YOUNG, "rapidRestarts": 2}, {}, pods(1, 42, 42), [],
     {"rapid_restarts": 3, "next_attempt_time": NOW + timedelta(seconds=40)}),
    ("past maxRapidRestarts -> Failed", {**YOUNG, "rapidRestarts": 2}, {"restartPolicy": {"maxRapidRestarts": 2}},
     pods(1, 42, 42), [], {"phase": "Failed", "cause": "preemption", "rapid_restarts": 3}),
    ("a noticed quick restart is a real preemption", {**YOUNG, "lastNotice": {**NOTICE, "attempt": 1}}, {},
     pods(1, 42, 42), [], {"phase": "Restarting", "rapid_restarts": 0, "next_attempt_time": None}),
    ("a restart after a long attempt resets the count", {**OLD, "rapidRestarts": 4}, {}, pods(1, 42, 42), [],
     {"phase": "Restarting", "rapid_restarts": 0, "next_attempt_time": None}),
    ("a quick failure is a failure, not rapid", YOUNG, {}, pods(1, 1, 42), [],
     {"cause": "failure", "rapid_restarts": 0}),
    ("backing off: no pods yet, requeue when due", BACKING_OFF, {}, [], ["n1"],
     {"phase": "Restarting", "create": (), "attempt": 1, "requeue_after": 20.0}),
    ("backoff over -> attempt 2", {**BACKING_OFF, "nextAttemptTime": "2026-11-22T02:59:59Z"}, {}, [], [],
     {"phase": "Pending", "attempt": 2, "create": (0, 1), "new_attempt": True}),
]


IGNORE_KILL = {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}}
FAIL_CONFIG = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}
ROWS += [  # restartPolicy.exitCodeRules (first match wins; the strictest action among failing workers)
    ("Ignore: a SIGKILLed worker restarts the gang as a disruption", RUNNING,
     {"restartPolicy": {"exitCodeRules": [IGNORE_KILL]}}, pods(1, 137, "Running"), [],
     {"phase": "Restarting", "cause": "disruption"}),
    ("Ignore spends no failure even with the budget used up", {**RUNNING, "restarts": {"failure": 3}},
     {"restartPolicy": {"exitCodeRules": [IGNORE_KILL]}}, pods(1, 137, "Running"), [],
     {"phase": "Restarting", "cause": "disruption"}),
    ("Ignore is still capped by maxPreemptionRestarts", {**RUNNING, "restarts": {"disruption": 2}},
     {"restartPolicy": {"exitCodeRules": [IGNORE_KILL], "maxPreemptionRestarts": 2}}, pods(1, 137, "Running"), [],
     {"phase": "Failed", "cause": "disruption"}),
    ("a code no rule matches is a failure", RUNNING, {"restartPolicy": {"exitCodeRules": [IGNORE_KILL]}},
     pods(1, 1, "Running"), [], {"phase": "Restarting", "cause": "failure"}),
    ("FailJob fails at once with the failure budget untouched", RUNNING,
     {"restartPolicy": {"exitCodeRules": [FAIL_CONFIG]}}, pods(1, 3, "Running"), [],
     {"phase": "Failed", "cause": "failure", "delete": ("llama-1",)}),
    ("NotIn: every other failing code", RUNNING,
     {"restartPolicy": {"exitCodeRules": [{"action": "FailJob", "onExitCodes": {"operator": "NotIn",
                                                                                "values": [137]}}]}},
     pods(1, 1, "Running"), [], {"phase": "Failed"}),
    ("the first matching rule decides", RUNNING,
     {"restartPolicy": {"exitCodeRules": [{"action": "Count", "onExitCodes": {"operator": "In", "values": [137]}},
                                          IGNORE_KILL]}}, pods(1, 137, "Running"), [],
     {"phase": "Restarting", "cause": "failure"}),
    ("the strictest action among failing workers wins", RUNNING,
     {"restartPolicy": {"exitCodeRules": [IGNORE_KILL, FAIL_CONFIG]}}, pods(1, 137, 3), [],
     {"phase": "Failed", "cause": "failure"}),
    ("a worker that lost a peer is judged by the loss, not its code", RUNNING,
     {"restartPolicy": {"exitCodeRules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [134]}}]}},
     pods(1, {"phase": "Failed", "exit_code": 134, "peer_lost": (1,)}, {"phase": "Running", "node_lost": True}), [],
     {"phase": "Restarting", "cause": "disruption"}),
]


@pytest.mark.parametrize("status,spec,pod_list,avoid,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decide_restart(status: dict[str, Any], spec: dict[str, Any], pod_list: list[WorkerPod],
                        avoid: list[str], expected: dict[str, Any]) -> None:
    plan = decide_restart(job(status, **spec), pod_list, avoid, NOW)
    got = {k: getattr(plan, k) for k in expected}
    assert got == expected, plan


@pytest.mark.parametrize("doomed,cause", [((), "disruption"), (("n1",), "preemption"), (("n0",), "disruption")])
def test_a_pod_lost_on_a_doomed_node_is_a_preemption(doomed: tuple[str, ...], cause: str) -> None:
    """A NoExecute taint evicts before the status records the notice: the open notice on the node decides."""
    lost = pods(1, "Running", {"phase": "Running", "deleting": True})
    assert decide_restart(job(RUNNING), lost, (), NOW, doomed).cause == cause


def test_rapid_restart_message_says_what_to_do() -> None:
    plan = decide_restart(job({**YOUNG, "rapidRestarts": 5}), pods(1, 42, 42), (), NOW)
    (cond,) = plan.conditions
    assert cond.reason == "TooManyRapidRestarts" and "maxRapidRestarts=5" in cond.message
    assert "restart code 42 is probably returned for something other than a saved preemption" in cond.message


def test_backoff_doubles_to_five_minutes() -> None:
    from reprieve_operator.policy.restart import backoff_seconds

    assert [backoff_seconds(n) for n in (1, 2, 3, 4, 5, 6, 7, 10)] == [10, 20, 40, 80, 160, 300, 300, 300]


def test_failed_condition_says_why() -> None:
    plan = decide_restart(job({**RUNNING, "restarts": {"failure": 3}}), pods(1, 1, "Running"))
    (cond,) = plan.conditions
    assert (cond.type, cond.status, cond.reason) == ("Failed", "True", "TooManyFailures")
    assert "llama-0 exited with code 1" in cond.message and "maxFailures=3" in cond.message


def test_waiting_flag() -> None:
    waiting = decide_restart(job({"phase": "Restarting", "attempt": 1, "restartingFrom": 1}),
                             pods(1, {"phase": "Running", "deleting": True}, 42))
    assert waiting.waiting
    assert not decide_restart(job(RUNNING), pods(1, "Running", "Running")).waiting


# (case, status, spec, pods as (name, phase, deleting), spares, expected (phase, delete, conditions))
PROLOGUE = [
    ("failed: stop what still runs", {"phase": "Failed", "attempt": 2}, {},
     [("a", "Running", False), ("b", "Failed", False), ("c", "Running", True)], (),
     ("Failed", ("a",), ())),
    ("succeeded: keep the workers, drop the spares", {"phase": "Succeeded", "attempt": 2}, {},
     [("a", "Running", False)], ("s1",), ("Succeeded", ("s1",), ())),
    ("suspended: delete every pod not being deleted", {"phase": "Running", "attempt": 2}, {"suspend": True},
     [("a", "Running", False), ("b", "Succeeded", False), ("c", "Running", True)], (),
     ("Suspended", ("a", "b"), ("Suspended",))),
    ("running: neither", {"phase": "Running", "attempt": 2}, {}, [("a", "Running", False)], (), None),
]


@pytest.mark.parametrize("status,spec,states,spares,expected", [r[1:] for r in PROLOGUE],
                         ids=[r[0] for r in PROLOGUE])
@pytest.mark.parametrize("kind", ["WorkerPod", "PodView"])
def test_both_decisions_share_their_start(kind: str, status: dict[str, Any], spec: dict[str, Any],
                                          states: list[tuple[str, str, bool]], spares: tuple[str, ...],
                                          expected: tuple[str, tuple[str, ...], tuple[str, ...]] | None) -> None:
    from reprieve_operator.policy.inplace import PodView
    from reprieve_operator.policy.restart import finished_or_suspended

    make: Any = WorkerPod if kind == "WorkerPod" else functools.partial(PodView, role="worker")
    those = [make(name=n, index=i, attempt=1, phase=ph, deleting=d) for i, (n, ph, d) in enumerate(states)]
    plan = finished_or_suspended(job(status, **spec), 2, those, after_success=spares)
    if expected is None:
        assert plan is None
        return
    assert plan is not None
    assert (plan.phase, plan.delete, tuple(c.type for c in plan.conditions), plan.attempt) == (*expected, 2)


def test_an_exit_code_rule_names_itself_in_the_failed_condition_and_the_restart_message() -> None:
    failed = decide_restart(job(RUNNING, restartPolicy={"exitCodeRules": [IGNORE_KILL, FAIL_CONFIG]}),
                            pods(1, 3, "Running"), [], NOW)
    (cond,) = failed.conditions
    assert (cond.type, cond.reason) == ("Failed", "ExitCodeRule"), cond
    assert "worker llama-0 exited with code 3" in cond.message and "exitCodeRules[1]: FailJob" in cond.message, cond
    ignored = decide_restart(job(RUNNING, restartPolicy={"exitCodeRules": [IGNORE_KILL]}), pods(1, 137, "Running"),
                             [], NOW)
    assert "exitCodeRules[0]: Ignore" in ignored.message, ignored


@pytest.mark.parametrize("rules,why", [
    ([{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}}], "restart exit code"),
    ([{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [0]}}], "1-255"),
    ([{"action": "Ignore", "onExitCodes": {"operator": "In", "values": []}}], "at least 1"),
    ([{"action": "Retry", "onExitCodes": {"operator": "In", "values": [1]}}], "FailJob"),
])
def test_bad_exit_code_rules_are_refused_naming_the_field(rules: list[dict[str, Any]], why: str) -> None:
    from pydantic import ValidationError
    from reprieve_operator.models import RestartPolicySpec

    with pytest.raises(ValidationError, match=why):
        RestartPolicySpec.model_validate({"exitCodeRules": rules})
