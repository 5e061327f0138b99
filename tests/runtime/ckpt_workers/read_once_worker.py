"""One process of a read-once restore test (real jax.distributed on 127.0.0.1, one CPU device per process).

    python read_once_worker.py --port P --nproc N --pid I --dir DIR [--direct | --among 0,2] [--timeout T]

Saves a fully replicated state (every leaf on every device: what data-parallel replicas hold), restores it with
``read_once="on"`` and checks every leaf bit-exactly, then prints ``STATS storage=<bytes> peer=<bytes>
fallback=<pieces> total=<state bytes>``, then ``OK``. ``--direct``: the restore is ``restore_tree`` alone (no
collective verdict after it), so a survivor of a peer that dies during the exchange shows its own result.
``--among``: only those processes restore, with ``CheckpointManager.read_step(among=...)`` (a memory-tier restore's
storage readers); the others print ``IDLE`` and wait for them at a barrier. Unless ``--direct``, every process
then leaves through ``jax.distributed.shutdown()`` (together).
"""

from __future__ import annotations

import argparse
import os
import sys


def values() -> dict[str, object]:
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(7)
    return {
        "big": rng.standard_normal((768, 8192)).astype(np.float32),  # 24 MiB: two 12 MiB chunk files
        "w": rng.standard_normal((1024, 1024)).astype(np.float32),  # 4 MiB
        "emb": rng.standard_normal((1024, 1536)).astype(ml_dtypes.bfloat16),  # 3 MiB
        "q": rng.integers(-128, 127, size=(2048, 1024), dtype=np.int8),  # 2 MiB
        "bias": rng.standard_normal((256,)).astype(np.float32),  # 1 KiB: under the threshold, read by everyone
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--direct", action="store_true")
    ap.add_argument("--among", default=None)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.nproc, process_id=args.pid,
                               initialization_timeout=int(args.timeout))
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from reprieve.checkpoint import CheckpointManager
    from reprieve.checkpoint.exchange import Peers
    from reprieve.checkpoint.layout import METADATA_FILE, committed_name
    from reprieve.checkpoint.metadata import CheckpointMeta
    from reprieve.checkpoint.restore import ReadStats, restore_tree
    from reprieve.checkpoint.storage import open_storage
    from reprieve.coordination import JaxCoordinator

    replicated = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P())
    expect = values()
    state = {k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx]) for k, v in expect.items()}
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) for k, v in expect.items()}
    coord = JaxCoordinator.from_jax()
    mgr = CheckpointManager(args.dir, coordinator=coord, keep=2, barrier_timeout_s=args.timeout, read_once="on",
                            max_chunk_bytes=12 << 20)
    mgr.save(1, state)
    mgr.wait()
    if args.direct:
        storage = open_storage(args.dir)
        name = committed_name(1, 1)
        meta = CheckpointMeta.from_json(storage.read_file(f"{name}/{METADATA_FILE}"), name)
        stats = ReadStats()
        restored = restore_tree(storage, name, meta, abstract, stats=stats,
                                peers=Peers(coord, "test/read-once", mode="on", timeout_s=args.timeout))
    elif args.among is not None:
        among = [int(p) for p in args.among.split(",")]
        if args.pid not in among:
            print("IDLE", flush=True)
            coord.barrier("test/among-done", args.timeout)
            print("OK", flush=True)
            jax.distributed.shutdown()
            return 0
        _, restored, _ = mgr.read_step(1, 1, abstract, among=among, key="test/among")
        stats = mgr.last_restore_stats
    else:
        _, restored, _ = mgr.restore(abstract, step=1)
        stats = mgr.last_restore_stats
    for k, v in expect.items():
        for shard in restored[k].addressable_shards:
            got = np.asarray(shard.data)
            if got.dtype != v.dtype or got.tobytes() != v.tobytes():
                print(f"MISMATCH {k}", flush=True)
                return 3
    total = sum(v.nbytes for v in expect.values())
    print(f"STATS storage={stats.storage_bytes} peer={stats.peer_bytes} fallback={stats.fallback_pieces} "
          f"total={total}", flush=True)
    if args.among is not None:
        coord.barrier("test/among-done", args.timeout)
    print("OK", flush=True)
    if not args.direct:
        # Every process got here: leave together. Without it process 0, which serves the coordination service,
        # could exit while another was still between the last barrier and its exit, and that one's error poller,
        # finding the service gone, aborts it (seen once in CI: rc -6 after STATS, before OK).
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        rc = 2
    sys.stdout.flush()
    os._exit(rc)  # a dead peer would make jax's atexit shutdown barrier wait ~100 s
