"""How long a grow's stop takes and what it writes, the way it was (SIGTERM, a notice with the supervisor's grace
as its deadline) and with the resize signal (SIGUSR1: the earliest agreed step, to the memory tier alone), in the
same run: ``python benchmarks/grow_stop.py [--runs 3] [--grace 30]``.

A real 2-process ``jax.distributed`` job on loopback over 4 virtual shards (tests/runtime/workers/virtual_worker.py,
a memory copy every step replicated to the other process, no periodic storage save), each process signalled as its
supervisor would when the operator assigns a grow, once the job made 20 steps. Timed from the signals to both
processes' exit with the restart code: the newcomer's attempt cannot start before. Prints one JSON line a run, then
a table with the medians: signal -> exit, the steps trained meanwhile (none lost either way: the agreed step is the
last computed), the storage checkpoints written, and the agreed plan of one run.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKER = ROOT / "tests" / "runtime" / "workers" / "virtual_worker.py"
STOPS = {"sigterm (before)": signal.SIGTERM, "resize signal": signal.SIGUSR1}
WARM_STEPS = 20


def _steps(work: Path, pid: int) -> list[int]:
    path = work / f"batches-{pid}.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def one(name: str, grace: float, work: Path) -> dict[str, Any]:
    from tests.runtime import helpers_memtier as memtier

    base = memtier.shm_base(work)
    pods = [memtier.new_pod(base, "pod-0"), memtier.new_pod(base, "pod-1")]
    env = {i: {"REPRIEVE_SUPERVISED": "1", "REPRIEVE_TERMINATION_GRACE_SECONDS": str(grace)} for i in range(2)}
    gang = memtier.launch(work, pods, {0: pods[1], 1: pods[0]}, attempt=1, steps=10**6, mem_every=1,
                          ckpt_every=10**6, worker=WORKER, extra=env)
    try:
        limit = time.monotonic() + 180
        while len(_steps(work, 1)) < WARM_STEPS:
            if time.monotonic() > limit or any(p.poll() is not None for p in gang.procs):
                raise RuntimeError(f"{name}: the job never made {WARM_STEPS} steps\n{gang.tail(20)}")
            time.sleep(0.02)
        at = max(_steps(work, 0) + _steps(work, 1))
        t0 = time.monotonic()
        for proc in gang.procs:
            proc.send_signal(STOPS[name])
        codes = gang.wait(grace + 60)
        seconds = time.monotonic() - t0
        logs = "\n".join(p.read_text() for p in gang.logs)
    finally:
        memtier.kill_launched()
        shutil.rmtree(base, ignore_errors=True)
    plan = re.search(r"agreed save step \d+ \((.*)\)$", logs, re.MULTILINE)  # the first plan (a re-plan moves it)
    saved = re.search(r"saving agreed step (\d+)", logs)
    storage = sorted(p.name for p in (work / "ckpt").iterdir() if p.name.startswith("step_")) \
        if (work / "ckpt").exists() else []
    last = max(_steps(work, 0) + _steps(work, 1))
    return {"stop": name, "codes": codes, "signal_to_exit_s": round(seconds, 3), "steps_meanwhile": last - at,
            "agreed_step": int(saved.group(1)) if saved else None, "last_computed": last,
            "storage_checkpoints": storage, "plan": plan.group(1) if plan else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--grace", type=float, default=30.0, help="REPRIEVE_TERMINATION_GRACE_SECONDS (default 30)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in STOPS}
    with tempfile.TemporaryDirectory(prefix="grow-stop-") as tmp:
        for run in range(args.runs):
            for name in STOPS:
                out = one(name, args.grace, Path(tmp) / f"{run}-{name.split()[0]}")
                print(json.dumps(out), flush=True)
                results[name].append(out)
    print("\n| stop | signal -> exit (median, max) | steps meanwhile | lost steps | storage checkpoints |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        secs = [r["signal_to_exit_s"] for r in runs]
        lost = sorted({r["last_computed"] - r["agreed_step"] for r in runs if r["agreed_step"] is not None})
        print(f"| {name} | {statistics.median(secs):.2f} s ({max(secs):.2f}) | "
              f"{statistics.median(r['steps_meanwhile'] for r in runs)} | {lost} | "
              f"{statistics.median(len(r['storage_checkpoints']) for r in runs)} |")

if __name__ == "__main__":
    main()
