"""reprieve-supervisor in a worker pod of the local cluster (real kube-apiserver, process kubelet): the pod's container is
``reprieve-supervisor -- python -c ...``, exactly as the operator wraps it. The test plays the operator: it writes the
``<job>-assignment`` ConfigMap and reads the exit reports, with the worker RBAC the contract names (get/list/watch
on that one ConfigMap, get/list/watch/patch on the job's pods) and nothing more."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster.inplace import SupervisedPod
from localcluster.testing import container_exit_code, wait_for, wait_for_pod_gone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

POD = "job-0"


class Worker(SupervisedPod):
    """The pod plus what these tests read: the trainer's own records of its runs (/out/runs.jsonl)."""

    def start_script(self, script: str, *, grace: int = 5, **env: str) -> Any:
        return self.start(["python", "-c", textwrap.dedent(script)], grace=grace, env=env)

    def runs(self) -> list[dict[str, Any]]:
        path = self.out / "runs.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_runs(self, count: int, timeout: float = 90) -> list[dict[str, Any]]:
        return wait_for(lambda: len(self.runs()) >= count and self.runs(), timeout, f"{count} trainer run(s)",
                        describe=lambda: f"runs {self.runs()}; log:\n{self.log()[-3000:]}")


@pytest.fixture
def worker(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Worker]:
    with Worker.under(cluster, namespace, tmp_path, pod=POD) as w:
        yield w


# A trainer's part that reads the runs before it in the pod (``earlier``) and whether a pid still lives (``alive``).
EARLIER_RUNS = """
    earlier = [json.loads(l) for l in (out / "runs.jsonl").read_text().splitlines()] \\
        if (out / "runs.jsonl").exists() else []
    def alive(pid):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
"""

# A trainer that records every run (attempt, identity, pid) and then does what its attempt's line says.
RECORDER = """
    import json, os, pathlib, signal, socket, subprocess, sys, time
    out = pathlib.Path(os.environ["OUT"])
    attempt = int(os.environ["REPRIEVE_ATTEMPT"])
""" + EARLIER_RUNS + """
    record = {"attempt": attempt, "pid": os.getpid(), "t": time.time(),
              "env": {k: os.environ.get(k) for k in ("REPRIEVE_PROCESS_ID", "REPRIEVE_NUM_PROCESSES",
                                                     "REPRIEVE_COORDINATOR_ADDRESS", "REPRIEVE_SUPERVISED")},
              "earlier_alive": [p for r in earlier for p in [r["pid"], *r.get("children", [])] if alive(p)]}
    plan = json.loads(os.environ["PLAN"]).get(str(attempt), "exit 0")
    if plan == "hang":  # ignores SIGTERM and leaves a child that would outlive it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        record["children"] = [subprocess.Popen(["sleep", "300"]).pid]
    if plan == "term 42":
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(42)))
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\\n")
    if plan == "peer lost, abort":  # what a trainer does when JAX ends it for a dead peer: tell, then SIGABRT
        events = socket.socket(fileno=int(os.environ["REPRIEVE_SUPERVISOR_FD"]))
        events.sendall(b'{"event": "peerLost", "processes": [1], "step": 412, "stepAt": 1764000054.25}\\n')
        os.abort()
    if plan.startswith("exit"):
        sys.exit(int(plan.split()[1]))
    while True:
        time.sleep(0.1)
"""


def test_assignments_restart_the_trainer_in_place(worker: Worker) -> None:
    """Exit 42 is reported; the next assignment starts a new process in the same pod with the new identity; exit 0
    of the newest attempt ends the pod with success."""
    pod = worker.start_script(RECORDER, PLAN=json.dumps({"1": "exit 42", "2": "exit 0"}))
    assert worker.wait_exit_report(1)["code"] == 42
    supervisor = worker.annotation("reprieve.dev/supervisor")
    assert supervisor is not None and supervisor["contract"] == 1 and supervisor["version"]
    worker.assign(2, {POD: 3, "job-1": 0, "job-2": 1, "job-3": 2}, count=4, coordinator="10.9.9.9:8476")
    done = worker.wait_phase("Succeeded", timeout=90)
    assert done.metadata.uid == pod.metadata.uid  # the same pod: restarted in place
    assert container_exit_code(done) == 0
    first, second = worker.runs()
    assert first["env"] == {"REPRIEVE_PROCESS_ID": "0", "REPRIEVE_NUM_PROCESSES": "1",
                            "REPRIEVE_COORDINATOR_ADDRESS": None, "REPRIEVE_SUPERVISED": "1"}
    assert second["env"] == {"REPRIEVE_PROCESS_ID": "3", "REPRIEVE_NUM_PROCESSES": "4",
                             "REPRIEVE_COORDINATOR_ADDRESS": "10.9.9.9:8476", "REPRIEVE_SUPERVISED": "1"}
    assert second["pid"] != first["pid"] and second["earlier_alive"] == []
    assert worker.annotation("reprieve.dev/exit")["code"] == 0  # type: ignore[index]


def test_a_trainer_aborted_right_after_it_named_a_lost_peer_is_reported_as_that_loss(worker: Worker) -> None:
    """The trainer's last line (``peerLost``) and its SIGABRT come together: the line is read before the exit is
    handled, so the report names the peer (the operator counts a disruption, not a failure), and the last step the
    trainer finished (the operator counts the steps after process 0's last progress report as lost)."""
    worker.start_script(RECORDER, PLAN=json.dumps({"1": "peer lost, abort"}))
    report = worker.wait_exit_report(1)
    assert report["code"] == 134 and report["peerLost"] == [1], report
    assert (report["lastStep"], report["lastStepAt"]) == (412, 1764000054.25), report


def test_a_hung_trainer_is_killed_before_the_next_attempt_starts(worker: Worker) -> None:
    """Attempt 1 ignores SIGTERM and leaves a child behind: the new assignment gets it SIGTERM, SIGKILL after the
    grace (2 s), the exit reported as 137, its child killed; only then does attempt 2 start."""
    worker.start_script(RECORDER, grace=2, PLAN=json.dumps({"1": "hang", "2": "exit 0"}))
    (first,) = worker.wait_runs(1)
    written = worker.assign(2, {POD: 0})
    assert worker.wait_exit_report(1)["code"] == 137
    worker.wait_phase("Succeeded", timeout=90)
    _, second = worker.runs()
    assert second["earlier_alive"] == [], "a process of attempt 1 ran beside attempt 2"
    assert second["t"] - written >= 2.0  # the grace was given
    log = worker.log()
    assert "attempt 1 superseded by attempt 2: sending SIGTERM" in log
    assert re.search(r"still running [0-9.]+s after SIGTERM \(grace 2s, REPRIEVE_TERMINATION_GRACE_SECONDS\): sending "
                     r"SIGKILL", log), log
    assert f"killing pid {first['children'][0]}, left behind by an earlier attempt" in log


def test_pod_deletion_forwards_sigterm_and_the_code_is_reported(worker: Worker) -> None:
    worker.start_script(RECORDER, grace=10, PLAN=json.dumps({"1": "term 42"}))
    worker.wait_runs(1)
    since = worker.core.read_namespaced_pod(POD, worker.ns).metadata.resource_version
    worker.core.delete_namespaced_pod(POD, worker.ns)
    # from the pod's events: a poll can miss the report between the supervisor's patch and the pod's removal
    assert worker.exit_report_since(1, since, timeout=30)["code"] == 42
    wait_for_pod_gone(worker.core.api_client, worker.ns, POD, timeout=60)
    log = worker.log()
    assert "SIGTERM: stopping" in log and "forwarding SIGTERM to the trainer" in log
    assert "exiting with code 42" in log


def test_a_contract_it_does_not_speak_fails_the_container_with_2(worker: Worker) -> None:
    worker.create(["python", "-c", textwrap.dedent(RECORDER)], env={"REPRIEVE_CONTRACT": "2", "PLAN": "{}"})
    pod = worker.wait_phase("Failed", timeout=60)
    assert container_exit_code(pod) == 2
    supervisor = worker.annotation("reprieve.dev/supervisor")
    assert supervisor is not None and "contract version '2'" in supervisor["error"]
    assert "speaks version 1" in worker.log() and worker.runs() == []


def test_an_assignment_in_another_contract_stops_the_trainer_and_exits_2(worker: Worker) -> None:
    worker.start_script(RECORDER, PLAN=json.dumps({"1": "term 42"}))
    worker.wait_runs(1)
    worker.assign(2, {POD: 0}, contract="3")
    pod = worker.wait_phase("Failed", timeout=60)
    assert container_exit_code(pod) == 2
    assert worker.wait_exit_report(1)["code"] == 42  # the trainer was stopped the usual way
    assert len(worker.runs()) == 1


# A trainer on the real runtime: reprieve.init(), a few JAX steps, checkpoints; stops (exit 0) once /out/finish exists.
JAX_TRAINER = """
    import json, logging, os, pathlib, time
    out = pathlib.Path(os.environ["OUT"])
    if os.environ.get("TRAINER_LOG"):  # the runtime's INFO lines in the pod's log
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("reprieve").setLevel(logging.INFO)
    import jax, jax.numpy as jnp
    import reprieve
    imported = {"pid": os.getpid(), "t_imported": time.time(), "warm": "REPRIEVE_WARM_FD" in os.environ}
    expected = reprieve.expected_topology()  # what a step could be traced ahead for (no device touched)
    imported["expected"] = None if expected is None else expected.to_json()
    imported["hint"] = os.environ.get("REPRIEVE_EXPECTED_TOPOLOGY")
    if os.environ.get("TOUCH_DEVICES"):
        jax.devices()  # not allowed before reprieve.init() in a pre-warmed process
    job = reprieve.init()
""" + EARLIER_RUNS + """
    record = {**imported, "attempt": job.config.attempt, "env_attempt": os.environ["REPRIEVE_ATTEMPT"],
              "topology": reprieve.topology.current().to_json(),
              "t_init": time.time(), "earlier_alive": [r["pid"] for r in earlier if alive(r["pid"])]}
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\\n")
    state, start = job.restore_or(lambda: {"w": jnp.zeros(4)})
    for step in job.steps(start, 1_000_000):
        state = {"w": state["w"] + 1.0}
        time.sleep(0.05)
        job.save(step, state)
        if (out / "finish").exists():
            break
    job.finish()
"""


def test_a_warm_process_takes_over_the_next_attempt(worker: Worker) -> None:
    worker.start_script(JAX_TRAINER, REPRIEVE_PREWARM_DELAY_SECONDS="600")  # started by the first-step report
    worker.wait_runs(1)
    worker.wait_log("parked in reprieve.init()", timeout=120)
    record = worker.out / "ckpt" / "topology.json"  # process 0's first step recorded its devices for spares
    recorded = wait_for(lambda: record.exists() and json.loads(record.read_text()), 30, "attempt 1's topology record")
    assert recorded == {"attempt": 1, "topology": worker.wait_runs(1)[0]["topology"]}, recorded
    written = worker.assign(2, {POD: 0})
    assert worker.wait_exit_report(1)["code"] == 42  # SIGTERM -> agreed checkpoint -> restart code
    first, second = worker.wait_runs(2)
    assert not first["warm"] and second["warm"]
    assert second["t_imported"] < written, "the warm process had imported JAX before the assignment"
    assert (second["attempt"], second["env_attempt"]) == (2, "2")
    assert second["earlier_alive"] == []
    # the first trainer reported its devices with its first step; the warm process was told them
    assert first["expected"] is None and first["hint"] is None
    assert json.loads(second["hint"]) == second["expected"] == first["topology"]
    (worker.out / "finish").write_text("")
    pod = worker.wait_phase("Succeeded", timeout=90)
    assert container_exit_code(pod) == 0
    assert json.loads(record.read_text()) == {"attempt": 2, "topology": second["topology"]}  # each attempt's own
    report = worker.annotation("reprieve.dev/exit")
    assert report is not None and (report["attempt"], report["code"]) == (2, 0)
    log = worker.log()
    assert "attempt 2: the warm process" in log and "took over" in log
    assert "attempt 2: first step done" in log and "after the warm start" in log
    # the runtime announced its decided code before its teardown: reported then, not again at the exit
    assert "attempt 1: the trainer (pid" in log and "is exiting with code 42: reported before it ends" in log


def test_a_warm_process_that_touched_devices_falls_back_to_a_cold_start(worker: Worker) -> None:
    worker.start_script(JAX_TRAINER, TOUCH_DEVICES="1", REPRIEVE_PREWARM_DELAY_SECONDS="600")
    worker.wait_runs(1)
    worker.wait_log("the warm process (pid", timeout=120)
    log = worker.wait_log("refused", timeout=60)
    assert "must not touch devices" in log
    written = worker.assign(2, {POD: 0})
    assert worker.wait_exit_report(1)["code"] == 42
    _, second = worker.wait_runs(2)
    assert not second["warm"] and second["t_imported"] > written  # a cold start: imported after the assignment
    assert second["attempt"] == 2 and second["earlier_alive"] == []
    (worker.out / "finish").write_text("")
    worker.wait_phase("Succeeded", timeout=90)
    assert "attempt 2: starting process 0/1 cold" in worker.log()


def test_a_kept_pods_notice_of_the_previous_attempt_is_ignored(worker: Worker) -> None:
    """Attempt 1 saves on its notice and exits 42; the pod keeps the annotation, and attempt 2 (same pod) must not
    read it as its own (pod watch and notice file alike): it trains until a notice for attempt 2 comes."""
    worker.start_script(JAX_TRAINER, REPRIEVE_PREWARM="0", REPRIEVE_SAVE_SECONDS_ESTIMATE="0.5", TRAINER_LOG="1")
    worker.wait_runs(1)
    worker.notify(1, 5, "node-a/1")
    assert worker.wait_exit_report(1)["code"] == 42
    worker.assign(2, {POD: 0})
    worker.wait_runs(2)
    worker.wait_log("attempt 2: first step done")
    # the old notice is in the pod's annotations (and file) all along: attempt 2 read it both ways and said so
    for source in ("annotation", "notice-file"):
        worker.wait_log(f"{source} reprieve.dev/notice id=node-a/1 was delivered to attempt 1; this is attempt 2: "
                        "ignored")
    assert worker.wait_exit_report(1)["attempt"] == 1, "attempt 2 stopped on attempt 1's notice"
    worker.notify(2, 5, "node-a/2")
    assert worker.wait_exit_report(2)["code"] == 42
    assert len(list((worker.out / "ckpt").glob("step_*_a2"))) == 1  # attempt 2 saved its own agreed checkpoint
