"""Runtime overhead per training step, and notice -> all-processes-committed latency (2 real processes).

    .venv/bin/python benchmarks/agreement.py [--processes 2] [--steps 10] [--blocks 16]

Each process runs a jitted step on a global array sharded over the processes (a matmul chain plus a
cross-process reduction, so the processes step in lockstep like real data-parallel training), calibrated to
~10 ms and ~100 ms. Blocks of steps alternate between a plain loop (the peer: runtime off) and the same
loop driven by ``job.steps()`` + ``job.save()`` (runtime on, no periodic saves), so machine noise hits
both alike. Then process 1 receives SIGTERM and every process reports when the agreed checkpoint
(``reprieve.checkpoint.CheckpointManager`` if present) was committed. Target: < 1% overhead, agreement
within one step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    import logging

    import jax

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax.numpy as jnp
    import numpy as np
    import reprieve
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from reprieve.policy import SavePolicy

    results: dict[str, object] = {}

    def exit_fn(code: int) -> None:
        results["exit_code"] = code
        results["committed_at"] = time.time()
        results["notice_to_commit_s"] = job.metrics.get("reprieve_notice_to_commit_seconds")
        target = job.agreement.target
        results["agreed_step"] = None if target is None else target.plan.final_step
        results["notice_to_agreed_s"] = None if target is None else target.agreed_at - target.notice.received_at
        results["save_s"] = job.checkpointer.last_save_seconds
        results["checkpointer"] = type(job.checkpointer).__name__
        print("RESULT " + json.dumps(results), flush=True)
        sys.exit(code)

    job = reprieve.init(policy=SavePolicy(interval_steps=0, save_last=False), exit_fn=exit_fn)
    pid, n = job.process_id, job.num_processes
    mesh = Mesh(np.array(jax.devices()), ("p",))
    rows = 256
    sharding = NamedSharding(mesh, PartitionSpec("p"))
    x = jax.make_array_from_callback((rows * n, rows), sharding,
                                     lambda idx: np.full((rows, rows), 0.01, np.float32))
    w = jnp.asarray(np.eye(rows, dtype=np.float32) * 0.5)

    @jax.jit
    def train_step(x: jax.Array, w: jax.Array, reps: jax.Array) -> jax.Array:
        y = jax.lax.fori_loop(0, reps, lambda i, y: jnp.tanh(y @ w), x)
        return x + 1e-6 * jnp.mean(y)  # the mean is a cross-process all-reduce

    # calibration must run the same number of collective steps on every process: do it locally instead
    local = {}
    for target_s in (0.01, 0.1):
        local[target_s] = _calibrate_local(train_step, x, w, target_s, pid, job.coordinator)
    steps = job.steps(0, 10**9)
    state = x
    for target_s, reps_value in local.items():
        reps = jnp.int32(reps_value)
        off, on = [], []
        for block in range(args.blocks):
            job.coordinator.barrier(f"bench/{target_s}/{block}", 120)  # start blocks together
            for mode in (("off", "on") if block % 2 == 0 else ("on", "off")):  # alternate the order
                t0 = time.perf_counter()
                if mode == "off":
                    for _ in range(args.steps):
                        state = jax.block_until_ready(train_step(state, w, reps))
                    off.append((time.perf_counter() - t0) / args.steps)
                else:
                    for _ in range(args.steps):
                        step = next(steps)
                        state = jax.block_until_ready(train_step(state, w, reps))
                        job.save(step, state)
                    on.append((time.perf_counter() - t0) / args.steps)
        results[f"step_{int(target_s * 1000)}ms"] = {"reps": reps_value, "off": off, "on": on}
    # the runtime's own cost per step, without a training step in between (no noise from the step)
    job.coordinator.barrier("bench/direct", 120)
    count = 20_000
    t0 = time.perf_counter()
    for _ in range(count):
        step = next(steps)
        job.save(step, state)
    results["runtime_us_per_step"] = (time.perf_counter() - t0) / count * 1e6
    # notice -> committed
    job.coordinator.barrier("bench/notice", 120)
    reps = jnp.int32(local[0.01])
    if pid == n - 1:
        results["notice_sent_at"] = time.time()
        os.kill(os.getpid(), signal.SIGTERM)
    sent_step = None
    while True:
        step = next(steps)
        if sent_step is None:
            sent_step = step
            results["first_step_after_notice_sent"] = step
        state = jax.block_until_ready(train_step(state, w, reps))
        job.save(step, state)


def worker_jax_peer(args: argparse.Namespace) -> None:
    """The named peer: JAX's preemption sync manager (``reached_preemption_sync_point`` every step)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from reprieve.coordination import JaxCoordinator

    n, pid = int(os.environ["REPRIEVE_NUM_PROCESSES"]), int(os.environ["REPRIEVE_PROCESS_ID"])
    jax.distributed.initialize(os.environ["REPRIEVE_COORDINATOR_ADDRESS"], n, pid)  # preemption service on
    coordinator = JaxCoordinator.from_jax()
    results: dict[str, object] = {}
    mesh = Mesh(np.array(jax.devices()), ("p",))
    rows = 256
    x = jax.make_array_from_callback((rows * n, rows), NamedSharding(mesh, PartitionSpec("p")),
                                     lambda idx: np.full((rows, rows), 0.01, np.float32))
    w = jnp.asarray(np.eye(rows, dtype=np.float32) * 0.5)

    @jax.jit
    def train_step(x: jax.Array, w: jax.Array, reps: jax.Array) -> jax.Array:
        y = jax.lax.fori_loop(0, reps, lambda i, y: jnp.tanh(y @ w), x)
        return x + 1e-6 * jnp.mean(y)

    reps = jnp.int32(_calibrate_local(train_step, x, w, 0.01, pid, coordinator))
    coordinator.barrier("peer/direct", 120)
    count = 20_000
    t0 = time.perf_counter()
    for step in range(count):
        multihost_utils.reached_preemption_sync_point(step)
    results["runtime_us_per_step"] = (time.perf_counter() - t0) / count * 1e6
    coordinator.barrier("peer/notice", 120)
    state, step = x, count
    if pid == n - 1:
        results["notice_sent_at"] = time.time()
        results["first_step_after_notice_sent"] = step
        os.kill(os.getpid(), signal.SIGTERM)  # JAX's C++ handler catches it
    while not multihost_utils.reached_preemption_sync_point(step):
        state = jax.block_until_ready(train_step(state, w, reps))
        step += 1
    results["synced_at"] = time.time()
    results["agreed_step"] = step
    print("RESULT " + json.dumps(results), flush=True)
    jax.distributed.shutdown()


def _calibrate_local(train_step, x, w, target_s, pid, coordinator) -> int:  # type: ignore[no-untyped-def]
    """Process 0 times the step (all processes run the same count of steps meanwhile) and publishes reps."""
    import jax
    import jax.numpy as jnp

    reps = 2
    for round_ in range(12):  # fixed number of rounds on every process: the step is collective
        jax.block_until_ready(train_step(x, w, jnp.int32(reps)))
        t0 = time.perf_counter()
        for _ in range(3):
            jax.block_until_ready(train_step(x, w, jnp.int32(reps)))
        took = (time.perf_counter() - t0) / 3
        key = f"bench/cal/{target_s}/{round_}"
        if pid == 0:
            nxt = reps if abs(took - target_s) < 0.1 * target_s else max(1, int(reps * target_s / max(took, 1e-5)))
            coordinator.set(key, str(nxt))
        reps = int(coordinator.get(key, 120))
    return reps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="steps per block")
    ap.add_argument("--blocks", type=int, default=16, help="off/on block pairs per step size")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_jax_peer(args) if args.peer else worker(args)
        return
    workdir = Path(tempfile.mkdtemp(prefix="reprieve-bench-agreement-"))
    results, codes = _run(args, workdir, peer=False)
    peer, _ = _run(args, workdir / "peer", peer=True)
    _report(args, workdir, results, codes, peer)


def _run(args: argparse.Namespace, workdir: Path, *, peer: bool) -> tuple[list[dict], list[int]]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for i in range(args.processes):
        env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
        env.update({
            "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1 --xla_cpu_multi_thread_eigen=false "
                         "intra_op_parallelism_threads=1",
            "REPRIEVE_NUM_PROCESSES": str(args.processes), "REPRIEVE_PROCESS_ID": str(i),
            "REPRIEVE_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "REPRIEVE_POD_IP": "127.0.0.1",
            "REPRIEVE_CHECKPOINT_URI": str(workdir / "ckpt"), "REPRIEVE_TERMINATION_GRACE_SECONDS": "5",
        })
        with open(workdir / f"worker-{i}.log", "w") as log:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--steps", str(args.steps),
                                           "--blocks", str(args.blocks)] + (["--peer"] if peer else []),
                                          env=env, stdout=subprocess.PIPE, stderr=log, text=True))
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        outputs.append((p.returncode, out))
    results = []
    for i, (code, out) in enumerate(outputs):
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if not lines:
            sys.exit(f"process {i} exited {code} without a result; see {workdir}/worker-{i}.log")
        results.append(json.loads(lines[-1][7:]))
    return results, [code for code, _ in outputs]


def _report(args: argparse.Namespace, workdir: Path, results: list[dict], codes: list[int],
            peer: list[dict]) -> None:
    print(f"reprieve agreement benchmark: {args.processes} processes, {args.blocks} x {args.steps} steps per "
          f"mode, median of per-block means (logs: {workdir})")
    direct = max(r["runtime_us_per_step"] for r in results)
    print(f"  runtime cost per step (job.steps + job.save, no training step): {direct:.2f} us")
    for key in ("step_10ms", "step_100ms"):
        off = statistics.median(x for r in results for x in r[key]["off"])
        on = statistics.median(x for r in results for x in r[key]["on"])
        pairs = [b / a for r in results for a, b in zip(r[key]["off"], r[key]["on"])]
        print(f"  {key:>10} (calibrated; measured {off * 1000:.2f} ms): off {off * 1000:8.3f} ms/step, "
              f"on {on * 1000:8.3f} ms/step; A/B ratio on/off median {statistics.median(pairs):.4f} "
              f"(noise: min {min(pairs):.3f}, max {max(pairs):.3f}); direct cost "
              f"{100 * direct * 1e-6 / off:.4f}% of the step")
    sender = results[-1]
    sent = float(sender["notice_sent_at"])
    exits = [float(r["committed_at"]) for r in results]
    commits = [float(r["notice_to_commit_s"]) for r in results]
    agreed = {r["agreed_step"] for r in results}
    print(f"  notice -> all processes committed: {max(commits):.3f} s (per process {[round(c, 3) for c in commits]})"
          f"; -> exit call {max(exits) - sent:.3f} s; exit codes {codes}")
    print(f"    of which notice -> plan known: {[round(r['notice_to_agreed_s'], 4) for r in results]} s, "
          f"save call -> commit: {[round(r['save_s'], 3) for r in results]} s "
          f"({results[0]['checkpointer']})")
    first = sender["first_step_after_notice_sent"]
    ours_steps = min(agreed) - first + 1
    print(f"  agreed step(s) {sorted(agreed)}: {ours_steps} step(s) trained after the notice before the save")
    # the named peer: JAX's preemption sync manager
    p_direct = max(r["runtime_us_per_step"] for r in peer)
    p_sent = float(peer[-1]["notice_sent_at"])
    p_sync = max(float(r["synced_at"]) for r in peer) - p_sent
    p_agreed = {r["agreed_step"] for r in peer}
    p_steps = min(p_agreed) - int(peer[-1]["first_step_after_notice_sent"])
    plan = max(float(r["notice_to_agreed_s"]) for r in results)
    print("  peer: JAX preemption sync manager (multihost_utils.reached_preemption_sync_point every step)")
    print(f"    its cost per step {p_direct:.2f} us -> reprieve/peer ratio {direct / p_direct:.2f}")
    print(f"    notice -> all processes at the sync point {p_sync:.3f} s (reprieve: notice -> plan known on all "
          f"{plan:.3f} s, ratio {plan / p_sync:.2f}); sync step(s) {sorted(p_agreed)}: {p_steps} step(s) after "
          f"the notice (reprieve: {ours_steps})")


if __name__ == "__main__":
    main()
