"""What the example trainer costs in CPU: to its first step and per step after, as a real 2-process job without
Kubernetes: ``python benchmarks/trainer_cpu.py [--steps 200] [--sleep 0.03] [--cold] [--trainer PATH] [VAR=value ...]``.

The test suite is CPU-bound and its end-to-end jobs run the example (examples/train_lm.py, one device per process as
the e2e jobs do), so a process start and a step are the units its cost is made of. This samples both processes'
CPU (``/proc/<pid>/stat``, user + system, children included) every 50 ms and prints, as JSON: the wall and the CPU
until process 0 logged its first step, the whole run's, and the CPU per step after the first. The compilation cache
is the shared one under ``~/.cache/reprieve/xla-cache`` (warm after a first run); ``--cold`` uses a fresh one.
``VAR=value`` arguments go to both processes' environment (e.g. ``XLA_FLAGS=...``). ``--trainer``: another version
of the script to compare with, e.g. ``git show REV:examples/train_lm.py > /tmp/old.py; ... --trainer /tmp/old.py``
(it runs with this checkout's runtime).

Measures CPU on a shared machine: run it with nothing else running for numbers to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(f) for f in fields[11:15]) / TICK  # utime, stime, cutime, cstime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.03, help="seconds each step sleeps (TRAIN_STEP_SLEEP)")
    parser.add_argument("--cold", action="store_true", help="a fresh compilation cache (a cold compile)")
    parser.add_argument("--trainer", type=Path, default=ROOT / "examples" / "train_lm.py",
                        help="the training script (default: examples/train_lm.py)")
    parser.add_argument("env", nargs="*", help="VAR=value for both processes")
    args = parser.parse_args()
    from tests.runtime.helpers_agreement import launch

    work = Path(tempfile.mkdtemp(prefix="reprieve-trainer-cpu-"))
    from importlib.metadata import version

    cache = (work / "xla-cache" if args.cold else
             Path.home() / ".cache" / "reprieve" / "xla-cache" / f"jax-{version('jax')}")
    env = {"TRAIN_STEPS": str(args.steps), "TRAIN_STEP_SLEEP": str(args.sleep), "TRAIN_STEP_LOG": str(work / "steps.jsonl"),
           "REPRIEVE_COMPILATION_CACHE_DIR": str(cache)}
    for pair in args.env:
        key, sep, value = pair.partition("=")
        if not sep:
            parser.error(f"{pair!r}: expected VAR=value")
        env[key] = value
    start = time.monotonic()
    gang = launch(work, 2, worker=args.trainer.resolve(), extra_env=env)
    first: tuple[float, float] | None = None
    last: dict[int, float] = {}
    log = work / "steps.jsonl"
    while any(p.poll() is None for p in gang.procs):
        for p in gang.procs:
            if (c := cpu_seconds(p.pid)) is not None:
                last[p.pid] = c
        if first is None and log.exists() and log.read_text().strip():
            first = (time.monotonic() - start, sum(last.values()))
        time.sleep(0.05)
    total = sum(last.values())
    codes = [p.returncode for p in gang.procs]
    print(json.dumps({
        "exit_codes": codes, "trainer": str(args.trainer), "steps": args.steps, "sleep_s": args.sleep,
        "xla_flags": env.get("XLA_FLAGS", "--xla_force_host_platform_device_count=1"), "cache": "cold" if args.cold else "shared",
        "first_step_wall_s": first and round(first[0], 1), "cpu_to_first_step_s": first and round(first[1], 1),
        "wall_s": round(time.monotonic() - start, 1), "cpu_s": round(total, 1),
        "cpu_per_step_ms": first and round(1000 * (total - first[1]) / args.steps, 1)}))
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
