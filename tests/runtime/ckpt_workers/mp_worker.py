"""One process of a multi-process checkpoint test (real jax.distributed on 127.0.0.1).

    python mp_worker.py --port P --nproc N --pid I --devices D --dir DIR --mesh 2x2 \
        [--save STEP --variant a] [--restore STEP --variant b] [--seed S] [--timeout T]

Saves the deterministic state of ``state_def`` and/or restores it into another sharding and
verifies every addressable shard bit-exactly. Prints ``OK`` on success, exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--mesh", default="2x2")
    ap.add_argument("--save", type=int)
    ap.add_argument("--save-variant", default="a")
    ap.add_argument("--restore", type=int)
    ap.add_argument("--restore-variant", default="b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attempt", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()

    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.nproc, process_id=args.pid,
                               initialization_timeout=int(args.timeout))
    import state_def
    from reprieve.checkpoint import CheckpointManager
    from reprieve.coordination import JaxCoordinator

    rows, cols = (int(x) for x in args.mesh.split("x"))
    mesh = state_def.make_mesh((rows, cols))
    mgr = CheckpointManager(args.dir, coordinator=JaxCoordinator.from_jax(), attempt=args.attempt,
                            keep=10, barrier_timeout_s=args.timeout)
    if args.save is not None:
        state = state_def.make_state(args.seed, mesh, args.save_variant)
        mgr.save(args.save, state, extra={"seed": args.seed, "nproc": args.nproc})
        mgr.wait()
        print(f"SAVED {args.save} in {mgr.last_save_seconds:.3f}s", flush=True)
    if args.restore is not None:
        abstract = state_def.make_abstract(mesh, args.restore_variant)
        step, restored, extra = mgr.restore(abstract, step=args.restore if args.restore >= 0 else None)
        errors = state_def.check_state(restored, extra["seed"], mesh, args.restore_variant)
        if errors:
            print("MISMATCH", errors, flush=True)
            return 3
        print(f"RESTORED {step} from nproc={extra['nproc']}", flush=True)
    mgr.close()
    print("OK", flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except BaseException:  # noqa: BLE001  a dead peer would make jax's atexit shutdown barrier wait ~100 s
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(2)
    sys.exit(rc)
