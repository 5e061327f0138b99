"""End to end: the operator (chart RBAC), the real runtime in 2-process JAX jobs, the process-node local cluster:
an application failure spends the job's failure budget.

The other Recreate-mode behaviours are proven once, on real nodes (tests/e2e/test_realnodes_e2e.py: a noticed
preemption bit-identical beside an uninterrupted run, a node lost without notice, the operator restarted
mid-preemption, each with the operator's goodput checked against the step log and the report rendered);
tests/e2e/test_inplace_e2e.py covers in-place restarts on process nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import assert_report_renders, submit_recreate, wait_tj

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
