"""End to end: the kube-apiserver restarted under a running 2-process job (the chaos soak's ``apiserver-restart``,
docs/soak.md). Training never waits on the API, so the job steps on through the down window; the operator (a local
process with the chart's RBAC), the kubelets and the runtime's progress reports reconnect on their own; the job
Succeeds in its first attempt with no restart of any kind, and its final status is the operator's. A second
restart spans the job's end: its last reports are refused, and the operator learns its last step and checkpoint
from the termination message process 0 left (docs/contract.md, "Progress")."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from localcluster.goodput import analyse, read_step_log

from .conftest import submit_recreate, succeeded, wait_step, wait_tj, worker_logs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

# The restart comes at step RESTART_AT; the ~19 s of steps after it (0.15 s of sleep each) outlast the 3 s down
# window plus the apiserver's start (~2 s here, more on a busy machine), so steps land during the window and after
# the API is back (at 100 steps a restart that took 13 s saw the job end before the API was back).
STEPS, SLEEP, RESTART_AT, DOWN = 140, 0.15, 10, 3.0
END_AT = STEPS - 5  # the second restart: the job ends while the apiserver is down


def pod0_left(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """What process 0's container left in its termination message (the process kubelet's file for it)."""
    for path in cluster.workdir.glob(f"nodes/*/pods/{namespace}/{name}-0-*/termination/*.log"):
        text = path.read_text(errors="replace")
        if text.strip():
            return dict(json.loads(text))
    return {}


def left_at_exit(cluster: Any, namespace: str, name: str) -> bool:
    return pod0_left(cluster, namespace, name).get("progress", {}).get("step") == STEPS - 1


def test_a_job_trains_through_an_apiserver_restart_and_the_operator_writes_its_end(
        cluster: Any, namespace: str, operator: Any, tmp_path: Path) -> None:
    """Why this long: two apiserver restarts (each a down window plus a start, ~5-10 s under load) around a job
    whose steps must outlast the first window and end inside the second (~60 s alone, ~95 s in the suite)."""
    name = "through"
    ckpt = submit_recreate(cluster, namespace, name, tmp_path, steps=STEPS, step_sleep=SLEEP, interval=20)
    wait_step(ckpt, RESTART_AT, 240, cluster, namespace, name)
    down_from = time.time()
    cluster.restart_apiserver(down_seconds=DOWN)
    back_at = time.time()
    wait_step(ckpt, END_AT, 240, cluster, namespace, name)
    cluster.restart_apiserver(down_seconds=DOWN, timeout=120, until=lambda: left_at_exit(cluster, namespace, name))

    final = wait_tj(cluster, namespace, name, succeeded, 180, "Succeeded after the apiserver restart",
                    operator)["status"]
    if final["attempt"] != 1:  # say why: the whole status, the operator's log, every run's last lines
        pytest.fail(f"the job restarted: status {json.dumps(final)}\noperator log:\n{operator.tail(60)}\n"
                    f"worker logs (last 25 lines of each run):\n{worker_logs(cluster, namespace, name, 2)}")
    # status.restarts is written with the first restart's cause: none here
    assert final.get("restarts") in (None, {"preemption": 0, "failure": 0, "disruption": 0}), final
    assert final.get("restartCount", 0) == 0, final
    # Sent while the API was down: known from process 0's termination message only.
    assert (final["step"], final["lastCheckpointStep"]) == (STEPS - 1, STEPS - 1), final
    assert operator.proc is not None and operator.proc.poll() is None and operator.runs == 1, operator.tail()

    log = read_step_log(ckpt / "steps.jsonl")
    during = [r.step for r in log if down_from < r.t < back_at]
    after = [r.step for r in log if r.t > back_at]
    assert during, f"no step logged while the apiserver was away ({down_from:.1f}..{back_at:.1f})"
    assert after and max(after) == STEPS - 1, after[-5:]
    assert pod0_left(cluster, namespace, name)["progress"]["committedStep"] == STEPS - 1
    assert {r.attempt for r in log} == {1}
    assert analyse(log, start=log[0].t, end=log[-1].t).interruptions == []
