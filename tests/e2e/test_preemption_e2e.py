"""End to end: the operator (chart RBAC), the real runtime in 2-process JAX jobs, the process-node local cluster:
an application failure spends the job's failure budget; an attempt replaced before its first step leaves the steps
the attempt before it lost to the next attempt that reports (issue #46, 6).

The other Recreate-mode behaviours are proven once, on real nodes (tests/e2e/test_realnodes_e2e.py: a noticed
preemption bit-identical beside an uninterrupted run, a node lost without notice, the operator restarted
mid-preemption, each with the operator's goodput checked against the step log and the report rendered);
tests/e2e/test_inplace_e2e.py covers in-place restarts on process nodes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from localcluster.goodput import analyse, read_step_log

from .conftest import (
    assert_goodput_agrees,
    assert_report_renders,
    submit_recreate,
    succeeded,
    wait_step,
    wait_tj,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# The job fails at step 5; the steps after it are never reached.
STEPS, SLEEP = 240, 0.03


def submit(cluster: Any, namespace: str, name: str, root: Path, pool: str, *, interval: int = 0,
           extra_env: dict[str, str] | None = None, max_failures: int | None = None) -> Path:
    return submit_recreate(cluster, namespace, name, root, steps=STEPS, step_sleep=SLEEP, interval=interval,
                           extra_env=extra_env, node_selector={"reprieve.test/pool": pool}, max_failures=max_failures)


def test_application_failure_is_counted_and_fails_the_job_after_the_budget(
        cluster: Any, namespace: str, operator: Any, pool: Any, tmp_path: Path) -> None:
    """Why this long: Two attempts (maxFailures=1) of a 2-process job, each a JAX start, to see the budget
    spent."""
    pool_a, _ = pool(2)
    submit(cluster, namespace, "buggy", tmp_path, pool_a, max_failures=1, extra_env={"TRAIN_FAIL_AT_STEP": "5"})
    final = wait_tj(cluster, namespace, "buggy", lambda s: s.get("phase") == "Failed", 300, "Failed", operator)
    status = final["status"]
    # One gang restart allowed; the second failure (attempt 2) ends the job. Failures are counted as they
    # happen, so the count includes the final one.
    assert status["attempt"] == 2, status
    assert status["restarts"] == {"preemption": 0, "failure": 2, "disruption": 0}, status
    failed = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["status"] == "True" and failed[0]["reason"] == "TooManyFailures", status
    assert "exited with code 1" in failed[0]["message"] and "maxFailures=1" in failed[0]["message"], failed
    assert_report_renders(cluster, namespace, "buggy", tmp_path / "report", "Failed", 'class="mark failure"',
                          "TooManyFailures", "attempt 2")


def _trainer_pids(namespace: str, pod: str) -> list[int]:
    """The host pids of ``pod``'s processes (a process node runs a pod's container as host processes), by the pod
    name and namespace the operator puts in their environment."""
    want = {f"REPRIEVE_POD_NAME={pod}".encode(), f"REPRIEVE_NAMESPACE={namespace}".encode()}
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if want <= set(environ.read_bytes().split(b"\0")):
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids


def test_an_attempt_replaced_before_its_first_step_leaves_the_lost_steps_to_the_next_that_reports(
        cluster: Any, namespace: str, operator: Any, pool: Any, tmp_path: Path) -> None:
    """Issue #46, 6: worker 1's trainer is killed (no save: the steps since the last periodic save are lost), and
    attempt 2 is replaced before its first step (one of its pods deleted while it waits out an emulated container
    start). The operator settled attempt 1 only against attempt 2, which never reported a step: its lost steps were
    0. They are settled against attempt 3, the first later one that reported: the operator's lost steps equal the
    step log's.

    Why this long: three starts of a 2-process job, each behind an emulated 10 s container start (the window in
    which attempt 2 is replaced)."""
    from localcluster.costs import EmulatedCosts

    pool_a, _ = pool(2, costs=EmulatedCosts(start_seconds=10.0))
    name = "replaced"
    ckpt = submit(cluster, namespace, name, tmp_path, pool_a, interval=40)
    wait_step(ckpt, 60, 300, cluster, namespace, name)  # past the periodic save of step 39
    pids = _trainer_pids(namespace, f"{name}-1")
    assert pids, f"no process of {namespace}/{name}-1"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 2, 120, "attempt 2", operator)
    second = cluster.read("pods", namespace=namespace, selector=f"reprieve.dev/job-name={name},"
                                                               "reprieve.dev/attempt=2")["items"]
    assert second, "attempt 2's pods"
    cluster.kubectl("delete", "pod", second[0]["metadata"]["name"], "-n", namespace, "--wait=false")
    wait_tj(cluster, namespace, name, lambda s: (s.get("attempt") or 0) >= 3, 120, "attempt 3", operator)

    final = wait_tj(cluster, namespace, name, succeeded, 420, "Succeeded", operator)["status"]
    assert final["attempt"] == 3 and final["restarts"] == {"preemption": 0, "failure": 1, "disruption": 1}, final
    records = read_step_log(ckpt / "steps.jsonl")
    assert not [r for r in records if r.attempt == 2], "attempt 2 took a step: this test shows nothing"
    steplog = analyse(records, start=0, end=1)
    assert steplog.lost_steps > 0, steplog.summary()
    assert final["goodput"]["lostSteps"] == steplog.lost_steps, (final["goodput"], steplog.summary())
    assert_goodput_agrees(final, ckpt / "steps.jsonl")
