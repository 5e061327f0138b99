"""How long a survivor takes to know a peer is lost and end, with the pulse (``reprieve.pulse``) and without it,
in the same run: ``python benchmarks/peer_lost.py [--runs 3] [--heartbeat 10]``.

A real 2-process ``jax.distributed`` job on loopback (tests/runtime/workers/train_worker.py, a step with an
all-reduce every 20 ms), one process hit by one fault, timed from the fault to the end of the other (the exit that
lets the job restart):

- ``killed``: SIGKILL of process 1 mid-run (a process that dies on a host that still answers: OOM, a crash).
- ``killed-at-start``: SIGKILL of process 1 the moment process 0 trains (the loop running ahead; process 1 may not
  have reached its first collective, so no connection of JAX's resets: the case that failed CI at 6115ea7).
- ``vanished``: SIGSTOP of process 1 and its pulse's accept queue filled, so a connect gets no answer (what a node
  that vanished, or a pod cut off the network, looks like from process 0; emulated on loopback: no real node is
  lost). Timed from the queue being full (the filling takes ~0.2 s after the SIGSTOP: a probe in that window is
  answered, as a busy peer's would be).
- ``vanished-0``: the same for process 0 (the coordination service's host, which then hangs rather than closes),
  timed to the end of process 1.

The peer, beside it: the same job with process 1 given no pod IP, so it keeps no pulse (the runtime before the
pulse: a failed collective's error, the silence threshold at half the heartbeat, JAX's heartbeat timeout
``--heartbeat``). Prints JSON lines, one a run, then a table with the medians and the ratio peer / pulse, and when
process 0 named the peer (its log line's time, to the millisecond; the end follows it by the process's teardown).
The bound is ``REPRIEVE_PEER_LOST_SECONDS`` (2 s), on the naming.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIOS = ("killed", "killed-at-start", "vanished", "vanished-0")


def one(scenario: str, pulse: bool, heartbeat: int, work: Path) -> dict[str, object]:
    from tests.runtime.helpers_agreement import fill_accept_queue, launch

    victim = 0 if scenario == "vanished-0" else 1
    ip = "127.0.0.3" if scenario == "vanished" else "127.0.0.1"
    env = {"WORKER_ASYNC": "1"} if scenario == "killed-at-start" else {"WORKER_COLLECTIVE": "1"}
    gang = launch(work, 2, steps=10**6, step_seconds=0 if scenario == "killed-at-start" else 0.02,
                  heartbeat_s=heartbeat, extra_env=env,
                  process_env={victim: {"REPRIEVE_POD_IP": ip if pulse else ""}})
    held: list[socket.socket] = []
    try:
        gang.wait_for_file("running-0", 120)
        if scenario != "killed-at-start":
            time.sleep(1.0)  # mid-run: the gang has made steps, and process 0 holds its link to process 1's pulse
        if scenario.startswith("vanished"):
            gang.signal(victim, signal.SIGSTOP)
            found = re.search(rf"process {victim}'s pulse listens at {re.escape(ip)}:(\d+)",
                              gang.logs[victim].read_text())
            if found:
                held = fill_accept_queue((ip, int(found.group(1))))
            fault, wall = time.monotonic(), time.time()  # the address stops answering now (beats stopped ~0.2 s before)
        else:
            gang.signal(1, signal.SIGKILL)
            fault, wall = time.monotonic(), time.time()
        code = gang.procs[1 - victim].wait(120)
        seconds = time.monotonic() - fault
    finally:
        gang.procs[victim].send_signal(signal.SIGCONT)
        gang.kill()
        for sock in held:
            sock.close()
    log = gang.logs[1 - victim].read_text()
    how = ("pulse" if "has ended without leaving the job" in log or "does not answer within" in log else
           "collective" if "the failed collective names" in log else
           "jax-heartbeat" if "stopped sending heartbeats" in log or "another task died" in log else
           "tether" if "the coordination service is gone" in log else "other")
    named = re.search(rf"^(\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}}) p{1 - victim} reprieve\.peers ERROR ending process",
                      log, re.MULTILINE)
    named_s = (datetime.strptime(named.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - wall) if named else None
    return {"scenario": scenario, "pulse": pulse, "seconds": round(seconds, 3), "code": code, "named_by": how,
            "named_s": None if named_s is None else round(named_s, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heartbeat", type=int, default=10, help="REPRIEVE_HEARTBEAT_TIMEOUT_SECONDS (default 10)")
    parser.add_argument("--scenario", choices=SCENARIOS, action="append", help="default: all")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reprieve-peer-lost-"))
    results: dict[tuple[str, bool], list[float]] = {}
    named: dict[str, list[float]] = {}
    for scenario in args.scenario or SCENARIOS:
        for run in range(args.runs):
            for pulse in (True, False):
                row = one(scenario, pulse, args.heartbeat, work / f"{scenario}-{run}-{int(pulse)}")
                print(json.dumps(row), flush=True)
                results.setdefault((scenario, pulse), []).append(float(row["seconds"]))  # type: ignore[arg-type]
                if pulse and row["named_s"] is not None:
                    named.setdefault(scenario, []).append(float(row["named_s"]))  # type: ignore[arg-type]
    print(f"\nfault -> the survivor ended, median (max) of {args.runs} runs; JAX heartbeat {args.heartbeat} s")
    print(f"{'scenario':<18}{'pulse':>16}{'without pulse':>18}{'ratio':>8}{'pulse: named':>16}")
    for scenario in args.scenario or SCENARIOS:
        a, b = results[(scenario, True)], results[(scenario, False)]
        print(f"{scenario:<18}{statistics.median(a):>8.2f} s ({max(a):4.1f}){statistics.median(b):>10.2f} s "
              f"({max(b):4.1f}){statistics.median(b) / max(statistics.median(a), 1e-3):>7.1f}x"
              f"{statistics.median(named[scenario]) if named.get(scenario) else float('nan'):>14.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
