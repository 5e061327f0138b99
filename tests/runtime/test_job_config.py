"""Table tests for the contract environment (reprieve.config) and the periodic save policy (reprieve.policy)."""

from __future__ import annotations

import pytest
from reprieve.config import ConfigError, RuntimeConfig
from reprieve.policy import NEVER, SavePolicy, agreed_to_memory, next_due_step, should_save

pytestmark = pytest.mark.unit

FULL = {
    "REPRIEVE_JOB": "llama", "REPRIEVE_NAMESPACE": "ml", "REPRIEVE_POD_NAME": "llama-1",
    "REPRIEVE_POD_IP": "10.0.0.7", "REPRIEVE_NUM_PROCESSES": "4", "REPRIEVE_PROCESS_ID": "1",
    "REPRIEVE_COORDINATOR_ADDRESS": "llama-0.llama.ml.svc:8476", "REPRIEVE_CHECKPOINT_URI": "gs://b/llama",
    "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": "100", "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS": "600",
    "REPRIEVE_CHECKPOINT_KEEP": "2", "REPRIEVE_ATTEMPT": "3",
    "REPRIEVE_RESTART_EXIT_CODE": "43", "REPRIEVE_NOTICE_FILE": "/etc/reprieve/annotations",
    "REPRIEVE_TERMINATION_GRACE_SECONDS": "120", "REPRIEVE_SERVICEACCOUNT_DIR": "/sa",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "6443",
}


def test_full_contract_environment() -> None:
    cfg = RuntimeConfig.from_env(FULL)
    assert (cfg.job, cfg.namespace, cfg.pod_name, cfg.num_processes, cfg.process_id) == ("llama", "ml", "llama-1", 4, 1)
    assert (cfg.checkpoint_uri, cfg.checkpoint_interval_steps, cfg.checkpoint_keep, cfg.attempt) == (
        "gs://b/llama", 100, 2, 3)
    assert cfg.checkpoint_interval_seconds == 600.0
    assert (cfg.restart_exit_code, cfg.termination_grace_seconds, cfg.notice_file) == (
        43, 120.0, "/etc/reprieve/annotations")
    assert cfg.coordinator_bind_address() == "10.0.0.7:8476"
    assert cfg.distributed and cfg.in_cluster and cfg.kubernetes_port == 6443


def test_defaults_outside_kubernetes() -> None:
    cfg = RuntimeConfig.from_env({})
    assert (cfg.num_processes, cfg.process_id, cfg.attempt, cfg.restart_exit_code) == (1, 0, 1, 42)
    assert cfg.checkpoint_uri == "./checkpoints" and not cfg.distributed and not cfg.in_cluster
    assert cfg.coordinator_bind_address() is None
    assert (cfg.heartbeat_timeout_seconds, cfg.shutdown_timeout_seconds) == (10, 30)
    assert cfg.checkpoint_interval_seconds == 0.0  # off


def test_ipv6_pod_ip_is_bracketed() -> None:
    cfg = RuntimeConfig.from_env({**FULL, "REPRIEVE_POD_IP": "fd00::7"})
    assert cfg.coordinator_bind_address() == "[fd00::7]:8476"


BAD = [
    ({"REPRIEVE_NUM_PROCESSES": "two"}, "REPRIEVE_NUM_PROCESSES must be an integer >= 1, got 'two'"),
    ({"REPRIEVE_NUM_PROCESSES": "0"}, "REPRIEVE_NUM_PROCESSES must be >= 1, got '0'"),
    ({"REPRIEVE_PROCESS_ID": "4"}, r"REPRIEVE_PROCESS_ID must be < REPRIEVE_NUM_PROCESSES \(4\), got 4"),
    ({"REPRIEVE_COORDINATOR_ADDRESS": ""}, "REPRIEVE_COORDINATOR_ADDRESS must be set"),
    ({"REPRIEVE_COORDINATOR_ADDRESS": "host-without-port"}, "must be host:port, got 'host-without-port'"),
    ({"REPRIEVE_RESTART_EXIT_CODE": "300"}, "REPRIEVE_RESTART_EXIT_CODE must be between 3 and 125, got '300'"),
    ({"REPRIEVE_RESTART_EXIT_CODE": "1"}, "REPRIEVE_RESTART_EXIT_CODE must be between 3 and 125, got '1'"),
    ({"KUBERNETES_SERVICE_PORT": "https"}, "KUBERNETES_SERVICE_PORT must be a port number"),
    ({"REPRIEVE_TERMINATION_GRACE_SECONDS": "nan"}, "must be a finite number"),
    ({"REPRIEVE_TERMINATION_GRACE_SECONDS": "-1"}, "must be >= 0, got '-1'"),
    ({"REPRIEVE_METRICS_PORT": "http"}, "REPRIEVE_METRICS_PORT must be an integer"),
    ({"REPRIEVE_CHECKPOINT_INTERVAL_SECONDS": "-5"}, "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS must be >= 0, got '-5'"),
    ({"REPRIEVE_CHECKPOINT_INTERVAL_SECONDS": "10m"}, "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS must be a number"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m for _, m in BAD])
def test_bad_values_name_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RuntimeConfig.from_env({**FULL, **change})


# (step, interval, last_saved, last_step, save_last, expected)
POLICY = [
    (99, 100, None, None, True, True),
    (100, 100, 99, None, True, False),
    (199, 100, 99, None, True, True),
    (5, 0, None, None, True, False),
    (9, 0, None, 9, True, True),  # the last step of the job
    (9, 0, None, 9, False, False),
    (9, 10, 9, 9, True, False),  # already saved (e.g. by an agreed save)
    (3, 1, 3, None, True, False),
    (4, 1, 3, None, True, True),
]


@pytest.mark.parametrize("step,interval,last_saved,last_step,save_last,expected", POLICY)
def test_should_save(step: int, interval: int, last_saved: int | None, last_step: int | None, save_last: bool,
                     expected: bool) -> None:
    policy = SavePolicy(interval_steps=interval, save_last=save_last)
    assert should_save(step, policy=policy, last_saved=last_saved, last_step=last_step) is expected


@pytest.mark.parametrize("interval", [0, 1, 3, 10])
@pytest.mark.parametrize("last_step", [None, 0, 7, 30])
@pytest.mark.parametrize("save_last", [True, False])
def test_no_step_before_next_due_step_is_saved_by_the_interval_and_it_is_one_that_can_be(
        interval: int, last_step: int | None, save_last: bool) -> None:
    """``Job.idle_step`` asks the policy nothing before ``next_due_step``: ``should_save`` (with nothing saved yet,
    its most willing case) says no at every step before it and yes at it, from every step on."""
    policy = SavePolicy(interval_steps=interval, save_last=save_last)
    for start in range(40):
        due = next_due_step(start, policy=policy, last_step=last_step)
        says = [s for s in range(start, 80) if should_save(s, policy=policy, last_saved=None, last_step=last_step)]
        assert due == (says[0] if says else NEVER), (start, due, says[:3])


@pytest.mark.parametrize("reason,memory_on,restart,node,to_memory,expected", [
    ("resize", True, True, None, False, True),  # a grow: every pod stays, the next attempt reads the pods' memory
    ("resize", True, True, None, True, True),  # REPRIEVE_NOTICE_TO_MEMORY is about notices that take a node
    ("resize", False, True, None, False, False),  # no memory tier: storage
    ("resize", True, False, None, False, False),  # the loop's last step: the run's end belongs in storage
    ("gke-spot", True, True, "node-b", True, True),  # REPRIEVE_NOTICE_TO_MEMORY=1, a node named: memory first
    ("gke-spot", True, True, "node-b", False, False),  # by default: storage (a memory copy beside it)
    ("gke-spot", True, True, None, True, False),  # which pods go is not known: storage
    ("gke-spot", False, True, "node-b", True, False),
    ("gke-spot", True, False, "node-b", True, False),
    ("sigterm", True, True, None, False, False),  # a SIGTERM names no node: storage (and a memory copy beside it)
    ("interrupt", True, True, None, False, False),
])
def test_which_agreed_saves_go_to_memory_first(reason: str, memory_on: bool, restart: bool, node: str | None,
                                               to_memory: bool, expected: bool) -> None:
    assert agreed_to_memory(reason, memory_on=memory_on, restart=restart, noticed_node=node,
                            notices_to_memory=to_memory) is expected


def test_negative_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="interval_steps must be >= 0, got -1"):
        SavePolicy(interval_steps=-1)


@pytest.mark.parametrize("version,ok", [("0.8.3", False), ("0.6.0", False), ("0.9.0", True), ("0.10.2", True),
                                        ("0.12.0.1", True), ("0.9.1.dev20261101", True), ("main", True)])
def test_the_supported_jax_range_is_checked_with_a_clear_message(version: str, ok: bool) -> None:
    from reprieve.jax_workarounds import jax_version_problem

    problem = jax_version_problem(version)
    assert (problem is None) is ok
    if problem:
        assert f"found jax {version}" in problem and "pip install 'jax>=0.9.0'" in problem


@pytest.mark.parametrize("left,save_s,want", [
    (None, 0.0, 15.0),  # no deadline known (a resize): three waits of 5 s
    (60.0, 2.0, 15.0),  # room for everything: capped
    (20.0, 2.0, 14.0),  # 20 - (1 + 2 x 2 + 1): the storage save still fits after the attempt
    (9.5, 1.5, 4.5),  # the goodput benchmark's agreed saves at 1 GiB: 9.5 s before the deadline
    (4.5, 0.5, 1.5),  # 4.5 - 3: just enough
    (4.4, 0.5, None),  # storage at once
    (-1.0, 0.0, None),  # past the deadline
])
def test_an_agreed_steps_memory_attempt_leaves_room_for_the_storage_save_after_it(left: float | None, save_s: float,
                                                                                 want: float | None) -> None:
    from reprieve.job import memory_attempt_seconds

    got = memory_attempt_seconds(left, save_s)
    assert got == pytest.approx(want) if want is not None else got is None
