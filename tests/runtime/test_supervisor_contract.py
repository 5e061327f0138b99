"""The supervisor's formats (pure): the assignment ConfigMap and its line to a warm process, the environments
of a trainer and a warm process, the contract version, exit codes and the pod annotations."""

from __future__ import annotations

import json

import pytest
from reprieve.supervisor import contract
from reprieve.supervisor.contract import Assignment

pytestmark = pytest.mark.unit

GOOD = {"contract": "1", "attempt": "3", "numProcesses": "4", "coordinator": "10.1.2.3:8476",
        "processes": json.dumps({"job-0": 0, "job-1": 1, "job-2": 2, "job-spare-0": 3})}


@pytest.mark.parametrize("change,pod,expected", [
    ({}, "job-1", Assignment(3, 1, 4, "10.1.2.3:8476", "ConfigMap ns/job-assignment")),
    ({}, "job-spare-0", Assignment(3, 3, 4, "10.1.2.3:8476", "ConfigMap ns/job-assignment")),
    ({}, "job-9", Assignment(3, None, 4, "10.1.2.3:8476", "ConfigMap ns/job-assignment")),
    ({"attempt": 5}, "job-0", Assignment(5, 0, 4, "10.1.2.3:8476", "ConfigMap ns/job-assignment")),
    ({"resize": "grow"}, "job-1", Assignment(3, 1, 4, "10.1.2.3:8476", "ConfigMap ns/job-assignment", resize="grow")),
    ({"lossEverySeconds": "300"}, "job-1", Assignment(3, 1, 4, "10.1.2.3:8476", "ConfigMap ns/job-assignment",
                                                      loss_every=300)),
])
def test_parse_assignment(change: dict, pod: str, expected: Assignment) -> None:
    assert contract.parse_assignment({**GOOD, **change}, pod, configmap="ns/job-assignment") == expected


@pytest.mark.parametrize("change,message", [
    ({"attempt": None}, "attempt must be an integer >= 1, got None"),
    ({"attempt": "0"}, "attempt must be an integer >= 1, got '0'"),
    ({"attempt": "x"}, "attempt must be an integer >= 1, got 'x'"),
    ({"numProcesses": "-1"}, "numProcesses must be an integer >= 1"),
    ({"coordinator": "nohost"}, "coordinator must be host:port, got 'nohost'"),
    ({"processes": "{"}, "processes must be a JSON object of pod name -> index"),
    ({"processes": "[1]"}, "processes must be a JSON object of pod name -> index, got list"),
    ({"processes": json.dumps({"job-1": 4})}, "processes['job-1'] must be < numProcesses (4), got 4"),
    ({"processes": json.dumps({"job-1": "a"})}, "processes['job-1'] must be an integer >= 0, got 'a'"),
    ({"resize": "shrink"}, "resize must be 'grow' or absent, got 'shrink'"),
    ({"lossEverySeconds": "0"}, "lossEverySeconds must be an integer >= 1, got '0'"),
    ({"lossEverySeconds": "5m"}, "lossEverySeconds must be an integer >= 1, got '5m'"),
])
def test_parse_assignment_errors_name_the_key(change: dict, message: str) -> None:
    with pytest.raises(contract.AssignmentError, match="ConfigMap ns/j-assignment") as err:
        contract.parse_assignment({**GOOD, **change}, "job-1", configmap="ns/j-assignment")
    assert message in str(err.value)


def test_parse_assignment_missing_key() -> None:
    data = {k: v for k, v in GOOD.items() if k != "coordinator"}
    with pytest.raises(contract.AssignmentError, match="key 'coordinator' is missing"):
        contract.parse_assignment(data, "job-1", configmap="c")


@pytest.mark.parametrize("env,expected", [
    ({}, Assignment(1, 0, 1, None, "environment")),
    ({"REPRIEVE_ATTEMPT": "3", "REPRIEVE_PROCESS_ID": "1", "REPRIEVE_NUM_PROCESSES": "2",
      "REPRIEVE_COORDINATOR_ADDRESS": "j-0.j.ns.svc:8476"}, Assignment(3, 1, 2, "j-0.j.ns.svc:8476", "environment")),
    # a spare or a replacement pod: not listed until an assignment lists it
    ({"REPRIEVE_ATTEMPT": "3", "REPRIEVE_PROCESS_ID": "-1", "REPRIEVE_NUM_PROCESSES": "2",
      "REPRIEVE_COORDINATOR_ADDRESS": "j-0.j.ns.svc:8476"}, Assignment(3, None, 2, None, "environment")),
])
def test_assignment_from_env(env: dict, expected: Assignment) -> None:
    assert contract.assignment_from_env(env) == expected


@pytest.mark.parametrize("env,message", [
    ({"REPRIEVE_ATTEMPT": "0"}, "REPRIEVE_ATTEMPT must be >= 1, got '0'"),
    ({"REPRIEVE_NUM_PROCESSES": "two"}, "REPRIEVE_NUM_PROCESSES must be an integer >= 1, got 'two'"),
    ({"REPRIEVE_PROCESS_ID": "2", "REPRIEVE_NUM_PROCESSES": "2"}, "REPRIEVE_PROCESS_ID must be < "),
    ({"REPRIEVE_COORDINATOR_ADDRESS": "x"}, "REPRIEVE_COORDINATOR_ADDRESS must be host:port"),
])
def test_assignment_from_env_errors(env: dict, message: str) -> None:
    with pytest.raises(contract.AssignmentError, match=message):
        contract.assignment_from_env(env)


def test_assignment_line_round_trip() -> None:
    a = Assignment(7, 2, 4, "10.0.0.1:99")
    assert contract.parse_assignment_line(a.line()) == {
        "REPRIEVE_ATTEMPT": "7", "REPRIEVE_PROCESS_ID": "2", "REPRIEVE_NUM_PROCESSES": "4",
        "REPRIEVE_COORDINATOR_ADDRESS": "10.0.0.1:99"}
    for bad, words in [("nope", "not JSON"), ("[]", "JSON object"), ('{"attempt": 1}', "numProcesses"),
                       ('{"attempt": 1, "numProcesses": 2, "processId": 2}', "processId must be < numProcesses"),
                       ('{"attempt": 1, "numProcesses": 2, "processId": 1, "lossEverySeconds": -3}',
                        "lossEverySeconds must be an integer >= 1, got -3")]:
        with pytest.raises(contract.AssignmentError, match=words):
            contract.parse_assignment_line(bad)


def test_environments() -> None:
    base = {"PATH": "/bin", "REPRIEVE_ATTEMPT": "1", "REPRIEVE_PROCESS_ID": "0", "REPRIEVE_NUM_PROCESSES": "1",
            "REPRIEVE_COORDINATOR_ADDRESS": "old:1", "REPRIEVE_JOB": "j", "REPRIEVE_WARM_FD": "9"}
    a = Assignment(2, 1, 3, "new:2")
    assert contract.trainer_env(base, a) == {
        "PATH": "/bin", "REPRIEVE_JOB": "j", "REPRIEVE_ATTEMPT": "2", "REPRIEVE_PROCESS_ID": "1",
        "REPRIEVE_NUM_PROCESSES": "3", "REPRIEVE_COORDINATOR_ADDRESS": "new:2", "REPRIEVE_SUPERVISED": "1"}
    # a warm process does not know its identity yet: the old one must not be readable by mistake
    assert contract.warm_env(base) == {"PATH": "/bin", "REPRIEVE_JOB": "j", "REPRIEVE_SUPERVISED": "1"}
    # the devices the last trainer reported reach the warm process; a stale hint in the container's env never does
    assert contract.warm_env({**base, "REPRIEVE_EXPECTED_TOPOLOGY": "stale"}, '{"device_count": 8}') == {
        "PATH": "/bin", "REPRIEVE_JOB": "j", "REPRIEVE_SUPERVISED": "1", "REPRIEVE_EXPECTED_TOPOLOGY": '{"device_count": 8}'}
    assert "REPRIEVE_EXPECTED_TOPOLOGY" not in contract.warm_env({**base, "REPRIEVE_EXPECTED_TOPOLOGY": "stale"})
    # so do the bytes its restore landed; a stale number in the container's env never does
    assert contract.warm_env({**base, "REPRIEVE_WARM_LANDING_BYTES": "1"}, None, 1 << 30) == {
        "PATH": "/bin", "REPRIEVE_JOB": "j", "REPRIEVE_SUPERVISED": "1", "REPRIEVE_WARM_LANDING_BYTES": str(1 << 30)}
    assert "REPRIEVE_WARM_LANDING_BYTES" not in contract.warm_env({**base, "REPRIEVE_WARM_LANDING_BYTES": "1"})
    # and the bytes it copied into memory XLA allocates, the same way
    assert contract.warm_env({**base, "REPRIEVE_WARM_OWNED_BYTES": "1"}, None, None, 3 << 30) == {
        "PATH": "/bin", "REPRIEVE_JOB": "j", "REPRIEVE_SUPERVISED": "1", "REPRIEVE_WARM_OWNED_BYTES": str(3 << 30)}
    assert "REPRIEVE_WARM_OWNED_BYTES" not in contract.warm_env({**base, "REPRIEVE_WARM_OWNED_BYTES": "1"})


@pytest.mark.parametrize("value,ok", [(None, True), ("", True), ("1", True), (" 1 ", True), ("2", False),
                                      ("v1", False)])
def test_contract_problem(value: str | None, ok: bool) -> None:
    problem = contract.contract_problem(value, where="REPRIEVE_CONTRACT")
    assert (problem is None) == ok
    if not ok:
        assert f"version {value.strip()!r}" in problem and "speaks version 1" in problem  # type: ignore[union-attr]


@pytest.mark.parametrize("status,code", [(0, 0), (42, 42), (-9, 137), (-15, 143), (-6, 134)])
def test_exit_code(status: int, code: int) -> None:
    assert contract.exit_code(status) == code


def test_annotations() -> None:
    value = json.loads(contract.exit_annotation(3, 42, 0.0)["reprieve.dev/exit"])
    assert value == {"attempt": 3, "code": 42, "time": "1970-01-01T00:00:00Z"}
    assert json.loads(contract.supervisor_annotation("0.1.0")["reprieve.dev/supervisor"]) == {"contract": 1,
                                                                                        "version": "0.1.0"}
    assert json.loads(contract.supervisor_annotation("0.1.0", "bad")["reprieve.dev/supervisor"])["error"] == "bad"


@pytest.mark.parametrize(("base", "passed"), [
    ({}, True),
    ({"REPRIEVE_MEMORY_INTERVAL_STEPS": "0", "REPRIEVE_MEMORY_INTERVAL_SECONDS": "0"}, True),  # the operator's zeros
    ({"REPRIEVE_MEMORY_INTERVAL_STEPS": "10"}, False),  # set in the container by hand: the runtime would refuse both
    ({"REPRIEVE_MEMORY_INTERVAL_SECONDS": "2.5"}, False),
    ({"REPRIEVE_MEMORY_LOSS_EVERY_SECONDS": "3600"}, False),  # the spec's own rate stands
    ({"REPRIEVE_MEMORY_INTERVAL_STEPS": "ten"}, False),  # malformed: the runtime names it, nothing is added
])
def test_the_jobs_loss_rate_reaches_the_trainer_unless_its_container_spaces_the_copies(base: dict,
                                                                                         passed: bool) -> None:
    """The assignment's ``lossEverySeconds`` goes to the trainer and to a warm process alike, but never beside a
    spacing of the container's own (the runtime would refuse an interval beside a rate)."""
    a = Assignment(3, 1, 2, "10.0.0.1:8476", loss_every=300)
    trainer = contract.trainer_env(base, a)
    warm = contract.parse_assignment_line(a.line(), base)
    want = "300" if passed else base.get("REPRIEVE_MEMORY_LOSS_EVERY_SECONDS")
    assert trainer.get("REPRIEVE_MEMORY_LOSS_EVERY_SECONDS") == want, trainer
    assert ({**base, **warm}).get("REPRIEVE_MEMORY_LOSS_EVERY_SECONDS") == want, warm
