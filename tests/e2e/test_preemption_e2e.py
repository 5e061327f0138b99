"""End to end: the operator (chart RBAC), the real runtime in 2-process JAX jobs, the local cluster.

Every job is the example trainer (examples/train_lm.py via examples/trainingjob.yaml) on nodes of the test's
own pool; its step log and result land in a per-job host directory mounted at /ckpt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from localcluster.goodput import analyse, read_step_log

from .conftest import (
    assert_restarted_once_for_the_notice,
    assert_resumed_bit_identical,
    notice_node_of,
    pod_node,
    preempt_second_worker,
    submit_recreate,
    succeeded,
    wait_step,
    wait_tj,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Faults come early (step 20-50 of 240): the steps left are the window in which the test makes its fault and the
# notice arrives (about 0.1 s a step: 20 s or more), and after the restart they show the resume.
STEPS, SLEEP = 240, 0.03


def submit(cluster: Any, namespace: str, name: str, root: Path, pool: str, *, interval: int = 0,
           extra_env: dict[str, str] | None = None, max_failures: int | None = None) -> Path:
    """This file tests recreate-all; test_inplace_e2e the default (InPlace)."""
    return submit_recreate(cluster, namespace, name, root, steps=STEPS, step_sleep=SLEEP, interval=interval,
                           extra_env=extra_env, node_selector={"reprieve.test/pool": pool}, max_failures=max_failures)


def assert_report_renders(cluster: Any, namespace: str, name: str, out: Path, *expected: str) -> str:
    """``python -m reprieve_operator.timeline`` against the cluster: an SVG that parses and an HTML page that
    holds ``expected``."""
    import xml.etree.ElementTree as ET

    from reprieve_operator.timeline import main

    assert main([name, "-n", namespace, "-o", str(out), "--kubeconfig", str(cluster.kubeconfig)]) == 0
    picture = (out / f"{name}.svg").read_text()
    ET.fromstring(picture)
    page = (out / f"{name}.html").read_text()
    missing = [e for e in expected if e not in page]
    assert not missing, (missing, page[-3000:])
    return page


GOODPUT_TOLERANCE = 0.03  # absolute, on goodput in 0..1 (docs/goodput.md, "Two figures, one definition")


def assert_goodput_agrees(status: dict, steplog: Path) -> None:
    """The operator's status.goodput (from sparse progress reports) against the example's own step log, over
    the same wall time. The step log cannot tell a save's wait from the step around it, so its productive
    time is compared with the operator's productive + checkpoint seconds."""
    gp = status["goodput"]
    wall = gp["wallSeconds"]
    buckets = gp["productiveSeconds"] + sum(gp["badputSeconds"].values())
    assert buckets == pytest.approx(wall, abs=0.5), gp  # every second in exactly one bucket
    assert gp["accounting"]["open"] == [], gp  # the job ended: nothing provisional is left
    own = analyse(read_step_log(steplog), start=0, end=wall)
    operator_figure = (gp["productiveSeconds"] + gp["badputSeconds"]["checkpoint"]) / wall
    print(f"\ngoodput: operator {gp['goodput']:.4f} (+checkpoint {operator_figure:.4f}), step log {own.goodput:.4f} "
          f"over {wall:.1f}s; badput {gp['badputSeconds']}; lost steps {gp['lostSteps']} vs {own.lost_steps}")
    assert abs(operator_figure - own.goodput) <= GOODPUT_TOLERANCE, (gp, own.summary())


def test_noticed_preemption_loses_no_step_and_ends_bit_identical_beside_an_uninterrupted_job(
        cluster: Any, namespace: str, operator: Any, pool: Any, api: Any, tmp_path: Path) -> None:
    """Why this long: Two jobs side by side (the preempted one and the uninterrupted reference for the bit-
    identical parameters), the first with two attempts."""
    pool_a, nodes_a = pool(3)
    pool_b, _ = pool(2)
    ckpt_a = submit(cluster, namespace, "preempted", tmp_path, pool_a)
    ckpt_b = submit(cluster, namespace, "steady", tmp_path, pool_b)

    wait_step(ckpt_a, 30, 240, cluster, namespace, "preempted")
    # Attempt 2 may be short: it is running, or already done.
    doomed = preempt_second_worker(cluster, api, namespace, "preempted", nodes_a, 120, operator)
    cluster.remove_node(doomed)  # the VM is reclaimed after the job moved away

    final_a = wait_tj(cluster, namespace, "preempted", succeeded, 300, "Succeeded", operator)
    final_b = wait_tj(cluster, namespace, "steady", succeeded, 300, "Succeeded", operator)
    report = assert_resumed_bit_identical(ckpt_a, ckpt_b, 30)
    assert report.steps == STEPS
    assert final_a["status"]["restarts"] == {"preemption": 1, "failure": 0, "disruption": 0}
    assert final_a["status"]["lastCheckpointStep"] == STEPS - 1
    assert_goodput_agrees(final_a["status"], ckpt_a / "steps.jsonl")
    assert final_a["status"]["goodput"]["lostSteps"] == 0 and final_a["status"]["step"] == STEPS - 1
    assert_goodput_agrees(final_b["status"], ckpt_b / "steps.jsonl")
    assert_report_renders(cluster, namespace, "preempted", tmp_path / "report", 'class="mark notice"',
                          'class="mark deadline"', "attempt 2", 'class="gap"', "PreemptionNotice", "GangRestart")
    assert final_b["status"]["restartCount"] == 0 and final_b["status"]["attempt"] == 1


def test_hard_node_loss_resumes_from_the_last_periodic_checkpoint(
        cluster: Any, namespace: str, operator: Any, pool: Any, tmp_path: Path) -> None:
    """Why this long: The lost node is only noticed through its heartbeats stopping (the node controller's
    grace), then a second attempt runs to the end."""
    interval = 20
    pool_a, _ = pool(3)
    ckpt = submit(cluster, namespace, "lost", tmp_path, pool_a, interval=interval)
    wait_step(ckpt, 50, 240, cluster, namespace, "lost")
    cluster.remove_node(pod_node(cluster, namespace, "lost-1"))  # no taint, no notice: the node is just gone

    final = wait_tj(cluster, namespace, "lost", succeeded, 420, "Succeeded after the node loss", operator)
    report = analyse(read_step_log(ckpt / "steps.jsonl"), start=0, end=1)
    assert len(report.interruptions) >= 1, report.summary()
    first = report.interruptions[0]
    assert first.resumed_at % interval == 0, report.summary()  # resumed right after a periodic checkpoint
    assert first.lost_steps <= interval, report.summary()
    restarts = final["status"]["restarts"]
    assert restarts["preemption"] == 0 and restarts["disruption"] + restarts["failure"] >= 1, restarts
    assert_goodput_agrees(final["status"], ckpt / "steps.jsonl")
    # Steps after the last report of the lost attempt are restart gap to the operator, not lost steps.
    assert final["status"]["goodput"]["lostSteps"] <= report.lost_steps, (final["status"]["goodput"], report.summary())
    lost = ['class="lost"'] if final["status"]["goodput"]["lostSteps"] else []
    assert_report_renders(cluster, namespace, "lost", tmp_path / "report", "attempt 2", 'class="gap"',
                          'class="mark restart"', *lost)


def test_application_failure_is_counted_and_fails_the_job_after_the_budget(
        cluster: Any, namespace: str, operator: Any, pool: Any, tmp_path: Path) -> None:
    """Why this long: Three attempts (maxFailures=2) of a 2-process job, each a JAX start, to see the budget
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


def test_operator_restarted_in_the_middle_of_a_preemption_restarts_the_gang_once(
        cluster: Any, namespace: str, operator: Any, pool: Any, api: Any, tmp_path: Path) -> None:
    """Why this long: Two attempts of a 2-process job with an operator restart (its start-up and resync)
    between them."""
    pool_a, _ = pool(3)
    ckpt = submit(cluster, namespace, "twice", tmp_path, pool_a)
    wait_step(ckpt, 20, 240, cluster, namespace, "twice")
    notice_node_of(cluster, api, namespace, "twice-0")
    wait_tj(cluster, namespace, "twice", lambda s: s.get("lastNotice") is not None, 30, "notice recorded",
            operator)
    operator.kill()  # mid-preemption: the workers are saving and exiting while nobody watches
    operator.start()

    final = wait_tj(cluster, namespace, "twice", succeeded, 300, "Succeeded", operator)
    assert_restarted_once_for_the_notice(cluster, namespace, "twice", final, ckpt)
