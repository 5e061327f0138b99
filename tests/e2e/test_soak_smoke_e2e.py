"""The CI smoke soak (issue #25; docs/soak.md, "In CI"): ``benchmarks/soak.py`` for a short fixed schedule on real
nodes, its totals asserted. The 30-minute soak is run by hand (``make soak``).

The seed rotates over ``chaos.smoke_rotation()``'s seeds by the UTC day (``REPRIEVE_SOAK_SEED`` picks one); each seed
brings a group of kinds of its own, dealt from the fault registry and injected once each, and over the rotation every
registered kind is injected (``tests/localcluster/test_chaos_unit.py`` proves that from the pure schedule, without a
cluster).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localcluster import chaos
from localcluster.realnodes import prerequisites

from .conftest import compilation_cache

pytestmark = [pytest.mark.e2e, pytest.mark.realnodes, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
# As few steps as keep the job stepping past the last fault (at most smoke_minutes + a quarter of SMOKE_FAULT_EVERY
# after its first step, ~79 s) and through that fault's restart, however fast the machine: each step sleeps
# SMOKE_STEP_SLEEP, so 320 steps take at least 96 s (about 128 s on a quiet 2-core VM; with the soak's default 0.05 s
# they took 0.2 s a step there and seed 2's job ended before its last two faults, with 0.15 s before its last one),
# more under load; the fault-free run is the same steps (the sha256 is compared) without the sleep (it changes no
# parameter; this test asserts no goodput ratio), so it takes about half the time. One device per process: each step's
# gloo all-reduce is between two ranks, not four (cheaper steps: RESULTS.md, "Other measurements").
SMOKE_STEPS = 320
SMOKE_STEP_SLEEP = 0.3
JOB_TIMEOUT = 480  # per job (fault-free, soak): each about SMOKE_STEPS x 0.4-1.2 s plus its restarts
SOAK_TIMEOUT = 900  # the whole soak (see the docstring); then Ctrl-C, up to 180 s to clean up


def smoke_command(seed: int, kinds: list[str], out: Path) -> list[str]:
    return [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--seed", str(seed), "--faults", ",".join(kinds),
            "--minutes", f"{chaos.smoke_minutes(kinds):g}", "--fault-every", f"{chaos.SMOKE_FAULT_EVERY:g}",
            "--steps", str(SMOKE_STEPS), "--step-sleep", f"{SMOKE_STEP_SLEEP:g}", "--reference-step-sleep", "0",
            "--devices-per-process", "1", "--nodes", str(chaos.SMOKE_NODES), "--timeout", str(JOB_TIMEOUT),
            "--out", str(out), "--require-real-nodes",
            "--compilation-cache", str(compilation_cache())]


def test_a_short_soak_on_real_nodes_recovers_every_fault_and_loses_nothing(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """One short soak (5 faults, one about every 15 s, of the rotation's seed's kinds): every fault injected and
    recovered, no committed checkpoint lost, the final parameters' sha256 equal to the fault-free run's, no restart
    that no fault explains, the job Succeeded.

    Why this long: a cluster of its own (the soak mounts its checkpoint tmpfs before its nodes start and restarts
    its API server, which the shared real-node cluster cannot take), a system node, 5 real worker nodes (2 workers,
    a spare, two free: ``chaos.SMOKE_NODES``) and the chart with two operator replicas, then the
    fault-free run (the sha256 reference), then the soak run (faults and their restarts); measured times in
    benchmarks/RESULTS.md ("CI smoke", and "Test suite": its cost under the whole suite's load)."""
    if prerequisites():
        message = "REAL-NODE TIER NOT RUN: " + "; ".join(prerequisites())
        if os.environ.get("REPRIEVE_REQUIRE_REAL_NODES") == "1":
            pytest.fail(message + " (REPRIEVE_REQUIRE_REAL_NODES=1)", pytrace=False)
        pytest.skip(message)
    seed = chaos.smoke_seed(os.environ.get("REPRIEVE_SOAK_SEED"), int(time.time() // 86400))
    kinds, plan = chaos.smoke_plan(seed)
    out = tmp_path_factory.mktemp("soak")
    cmd = smoke_command(seed, kinds, out)
    how = (f"seed {seed} (REPRIEVE_SOAK_SEED={seed} reruns this test with it), schedule: "
           + ", ".join(f"{f.at:.0f}s {f.kind}" for f in plan)
           + f"\n  the same run by hand: {shlex.join(['python', *cmd[1:]])}")
    print(how, flush=True)
    logfile = out / "soak.log"
    with open(logfile, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            rc = proc.wait(timeout=SOAK_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Ctrl-C: the soak undoes the faults still pending, stops its cluster and prints what it recorded
            proc.send_signal(signal.SIGINT)
            try:
                rc = proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    text = logfile.read_text(errors="replace")
    work = re.search(r"work directory \(logs, storage\): (\S+)", text)
    if work and Path(work[1]).name.startswith("reprieve-soak-"):
        # its nodes' roots (~2 GB: containerd's images and snapshots) go in any case; its logs stay for a failure
        shutil.rmtree(Path(work[1]) / "cluster" / "realnodes", ignore_errors=True)
    print(text[-6000:])
    report = out / "soak.json"
    assert report.exists(), f"the soak wrote no soak.json (exit {rc}); {how}\n{text[-4000:]}"
    doc = json.loads(report.read_text())
    tot = doc["totals"]
    failed = f"{how}\n{text[-4000:]}"
    assert doc["real_nodes"], f"the soak ran on process nodes: real nodes failed to start; {failed}"
    assert not doc["interrupted"], failed
    assert doc["phase"] == "Succeeded", failed
    assert sorted(f["kind"] for f in doc["faults"]) == sorted(kinds), failed
    assert tot["not_injected"] == 0 and tot["injected"] == len(plan), failed
    assert tot["recovered"] == tot["injected"], failed
    assert tot["committed_lost"] == [], failed
    assert tot["sha256_equal"] is True, failed
    assert tot["unexplained"] == [], failed
    assert rc == 0, failed
    # passed: its work directory (a short path under /tmp: containerd's sockets in it must stay under 104
    # characters) goes; a failed run's logs stay, named in the output
    if work and Path(work[1]).name.startswith("reprieve-soak-"):
        shutil.rmtree(work[1], ignore_errors=True)
