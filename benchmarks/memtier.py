"""The memory tier: restore from own memory, from a peer's memory and from storage, and what the tier costs the
training loop, in one run on one machine, with the floors measured in the same run.

    .venv/bin/python benchmarks/memtier.py --sizes 1                 # restore sources + floors, 1 GiB
    .venv/bin/python benchmarks/memtier.py --sizes 4 --repeats 1     # the same at 4 GiB (peaks at ~4x in RAM)
    .venv/bin/python benchmarks/memtier.py --cost                    # loop overhead A/B at the default interval

Restore (one process, 4 simulated CPU devices, a float32 state in ``--leaves`` leaves sharded over them; every
restore in a fresh process, the three sources alternating, the median reported):

* **own**: the pod's memory directory holds the copy (the restarted trainer reads it through a private mapping);
* **peer**: the pod's directory is empty (a replacement pod), another process serves the copy as a peer's
  replica server on loopback TCP;
* **storage**: the storage tier (``CheckpointManager``) on local disk, read from the page cache.

Each goes through the whole restore (``memtier.restore_round.restore``: the round, the decision, the reads and
checks, the arrays on the devices) and is checked bit-exact. Floors: host memcpy into pre-faulted memory, fresh
memory allocate+touch, crc32c, and one loopback TCP stream (``sendfile`` from tmpfs into a pre-faulted buffer).

Cost (``--cost``): one process trains a state of ``--cost-mib`` MiB with a jitted step, in blocks that alternate
the memory tier off and on (the default interval: the 1 % budget, as ``reprieve.init`` sets it up, sending every
copy to a peer's replica server in another process); the per-step median of each mode over the block pairs, the
save's loop stall (its host copy) beside the storage tier's host copy of the same state, and the interval chosen.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

GiB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _jax(devices: int = 4) -> Any:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    return jax


def _state(jax: Any, size_gib: float, leaves: int) -> tuple[Any, Any]:
    """A random float32 state of ``size_gib`` in ``leaves`` leaves, rows sharded over the devices; (state, abstract)."""
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d", None))
    rows = max(8, int(size_gib * GiB) // leaves // (1024 * 4) // 8 * 8)
    build = jax.jit(lambda: {f"p{i:03d}": jax.random.uniform(jax.random.key(i), (rows, 1024), jnp.float32) + i
                             for i in range(leaves)}, out_shardings=sharding)
    state = jax.block_until_ready(build())
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    return state, abstract


def _tier(directory: str, *, peer: str | None = None) -> Any:
    from reprieve.coordination import LocalCoordinator
    from reprieve.memtier.config import MemoryConfig
    from reprieve.memtier.tier import MemoryTier

    cfg = MemoryConfig(directory=directory, interval_steps=1, peer=peer)
    return MemoryTier(cfg, coordinator=LocalCoordinator(), attempt=2, serve=False)


# -- children ---------------------------------------------------------------------------------------------------------
def child_prepare(a: argparse.Namespace) -> dict[str, Any]:
    """Write the storage checkpoint and the memory copy (sent to the peer's replica server at ``a.peer``)."""
    jax = _jax()
    from reprieve.checkpoint import CheckpointManager

    state, _ = _state(jax, a.size, a.leaves)
    mgr = CheckpointManager(os.path.join(a.dir, "ckpt"), attempt=1, keep=1)
    t0 = time.perf_counter()
    mgr.save(1, state, extra={"reprieve": {"attempt": 1}})
    storage_blocking = time.perf_counter() - t0
    mgr.wait()
    mgr.close()
    tier = _tier(os.path.join(a.shm, "pod-own"), peer=a.peer)
    tier.attempt = 1
    t0 = time.perf_counter()
    assert tier.save(1, state, extra={"reprieve": {"attempt": 1}})
    memory_blocking = time.perf_counter() - t0
    tier.wait()
    assert tier.replicated_step == 1, "the copy did not reach the peer"
    tier.close()
    return {"storage_blocking_s": storage_blocking, "memory_blocking_s": memory_blocking}


def child_restore(a: argparse.Namespace) -> dict[str, Any]:
    jax = _jax()
    import numpy as np
    from reprieve.checkpoint import CheckpointManager
    from reprieve.memtier import restore_round

    _, abstract = _state(jax, a.size, a.leaves)
    directory = {"own": "pod-own", "peer": "pod-replacement", "storage": "pod-replacement"}[a.source]
    tier = _tier(os.path.join(a.shm, directory), peer=a.peer if a.source == "peer" else None)
    storage = CheckpointManager(os.path.join(a.dir, "ckpt"), attempt=2, keep=1)
    t0 = time.perf_counter()
    result = restore_round.restore(tier, storage, abstract)
    restored = jax.block_until_ready(result[1])
    seconds = time.perf_counter() - t0
    assert result.restored_from["sources"] == [{"own": "memory"}.get(a.source, a.source)], result.restored_from
    want, _ = _state(jax, a.size, a.leaves)
    exact = all(np.array_equal(np.asarray(restored[k]), np.asarray(want[k])) for k in list(want)[:: max(1, a.leaves // 4)])
    nbytes = sum(x.nbytes for x in jax.tree.leaves(restored))
    storage.close()
    tier.close()
    shutil.rmtree(os.path.join(a.shm, "pod-replacement"), ignore_errors=True)
    return {"seconds": seconds, "bytes": nbytes, "exact": exact}


def child_cost(a: argparse.Namespace) -> dict[str, Any]:
    """Alternating blocks, tier off / on, in one process (the schedule is the default: the 1 % budget)."""
    jax = _jax()
    from reprieve.checkpoint import CheckpointManager
    from reprieve.coordination import LocalCoordinator
    from reprieve.memtier.config import MemoryConfig
    from reprieve.memtier.tier import MemoryTier

    state, _ = _state(jax, a.cost_mib / 1024, 16)
    step = jax.jit(lambda s: jax.tree.map(lambda x: x * 0.999 + 0.001 * jax.numpy.sin(x), s), donate_argnums=0)
    tier = MemoryTier(MemoryConfig(directory=os.path.join(a.shm, "pod-cost"), peer=a.peer),
                      coordinator=LocalCoordinator(), attempt=1, serve=False)
    mgr = CheckpointManager(os.path.join(a.dir, "cost-ckpt"), keep=1)
    for _ in range(5):
        state = jax.block_until_ready(step(state))
    t0 = time.perf_counter()
    mgr.save(0, state)
    storage_copy = time.perf_counter() - t0
    mgr.wait()
    mgr.close()
    k, ema, times = 0, None, {"off": [], "on": []}  # type: ignore[var-annotated]
    tier.begin(0)
    blocking: list[float] = []
    saves_per_block: list[int] = []
    for block in range(2 * a.blocks + 2):  # the first pair warms up (and bootstraps the schedule)
        mode = "on" if block % 2 else "off"
        spent, saves = [], 0
        for _ in range(a.block_steps):
            t = time.perf_counter()
            state = jax.block_until_ready(step(state))
            if mode == "on" and tier.due(k, ema):
                s0 = time.perf_counter()
                if tier.save(k, state, extra={}):
                    blocking.append(time.perf_counter() - s0)
                    saves += 1
            dt = time.perf_counter() - t
            ema = dt if ema is None else ema + 0.1 * (dt - ema)
            spent.append(dt)
            k += 1
        tier.wait()  # outside the timed steps: nothing of one block runs into the next
        if block >= 2:
            times[mode].append(statistics.mean(spent))
            if mode == "on":
                saves_per_block.append(saves)
    tier.close()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    schedule = tier.schedule
    return {"step_off_s": off, "step_on_s": on, "overhead": on / off - 1, "pairs": list(zip(times["off"], times["on"])),
            "saves_per_block": saves_per_block, "memory_copy_s": statistics.median(blocking[1:] or blocking),
            "storage_copy_s": storage_copy, "every": schedule.every if schedule else None,
            "cost_s": tier.last_blocking_s + tier.last_background_s}


# -- parent ------------------------------------------------------------------------------------------------------------
def run_child(role: str, args: list[str], timeout: float = 1800) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "runtime")}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", role, *args], env=env, check=False,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"child {role} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def floors(size_gib: float, shm: str) -> dict[str, float]:
    import mmap

    import numpy as np
    from reprieve.memtier.manifest import crc32c

    n = int(size_gib * GiB)
    src = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    dst = np.empty_like(src)
    dst.fill(1)
    out: dict[str, float] = {}
    t = time.perf_counter()
    np.copyto(dst, src)
    out["memcpy_gib_s"] = size_gib / (time.perf_counter() - t)
    t = time.perf_counter()
    fresh = np.empty(n, np.uint8)
    fresh.fill(2)
    out["fresh_memory_gib_s"] = size_gib / (time.perf_counter() - t)
    del fresh
    t = time.perf_counter()
    crc32c(src)
    out["crc32c_gib_s"] = size_gib / (time.perf_counter() - t)
    path = os.path.join(shm, "floor.bin")
    src.tofile(path)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        recv = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))

        def serve() -> None:
            conn, _ = listener.accept()
            with conn, open(path, "rb") as fh:
                conn.sendfile(fh, 0, n)

        th = threading.Thread(target=serve)
        th.start()
        with socket.create_connection(("127.0.0.1", port)) as c:
            t = time.perf_counter()
            view, got = memoryview(recv), 0
            while got < n:
                got += c.recv_into(view[got:], min(n - got, 8 << 20))
            out["loopback_tcp_gib_s"] = size_gib / (time.perf_counter() - t)
            view.release()
        th.join()
        recv.close()
    os.unlink(path)
    return out


def bench_restore(size: float, leaves: int, repeats: int) -> dict[str, Any]:
    from reprieve.memtier.server import ReplicaServer
    from reprieve.memtier.store import MemoryDir

    base = tempfile.mkdtemp(prefix="memtier-bench-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    shm = tempfile.mkdtemp(prefix="memtier-bench-", dir="/dev/shm")
    server = ReplicaServer(MemoryDir(os.path.join(shm, "pod-peer")), host="127.0.0.1", port=0).start()
    try:
        common = ["--dir", base, "--shm", shm, "--size", str(size), "--leaves", str(leaves), "--peer", server.address]
        prep = run_child("prepare", common)
        fl = floors(size, shm)
        times: dict[str, list[float]] = {"own": [], "peer": [], "storage": []}
        exact = True
        for _ in range(repeats):
            for source, took in times.items():
                r = run_child("restore", [*common, "--source", source])
                took.append(r["seconds"])
                exact = exact and r["exact"]
        med = {k: statistics.median(v) for k, v in times.items()}
        return {"size_gib": size, "leaves": leaves, "prepare": prep, "floors": fl, "seconds": times, "median": med,
                "exact": exact}
    finally:
        server.close()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def bench_cost(a: argparse.Namespace) -> dict[str, Any]:
    from reprieve.memtier.server import ReplicaServer
    from reprieve.memtier.store import MemoryDir

    base = tempfile.mkdtemp(prefix="memtier-cost-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    shm = tempfile.mkdtemp(prefix="memtier-cost-", dir="/dev/shm")
    # the peer's replica server in another process, as on another pod
    peer = subprocess.Popen([sys.executable, "-m", "reprieve.memtier.server", "--dir", os.path.join(shm, "peer")],
                            env={**os.environ, "PYTHONPATH": os.path.join(REPO, "runtime")}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert peer.stdout is not None
        address = peer.stdout.readline().strip()
        return run_child("cost", ["--dir", base, "--shm", shm, "--peer", address, "--cost-mib", str(a.cost_mib),
                                  "--blocks", str(a.blocks), "--block-steps", str(a.block_steps)], timeout=3600)
    finally:
        peer.terminate()
        peer.wait(10)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        del ReplicaServer, MemoryDir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1", help="state sizes in GiB, comma separated")
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cost", action="store_true", help="the loop overhead A/B instead of the restores")
    ap.add_argument("--cost-mib", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=6, help="block pairs (off, on) after a warm-up pair")
    ap.add_argument("--block-steps", type=int, default=300)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results: list[dict[str, Any]] = []
    if a.cost:
        r = bench_cost(a)
        results.append(r)
        print(f"tier cost, {a.cost_mib} MiB state, step {r['step_off_s'] * 1e3:.1f} ms: overhead "
              f"{r['overhead'] * 100:+.2f} % (median of {len(r['pairs'])} block pairs; pairs "
              f"{[round((on / off - 1) * 100, 2) for off, on in r['pairs']]} %), a save every {r['every']} steps, "
              f"{r['saves_per_block']} saves per block, loop stall per save {r['memory_copy_s'] * 1e3:.1f} ms "
              f"(the storage tier's host copy: {r['storage_copy_s'] * 1e3:.1f} ms), measured save cost "
              f"{r['cost_s']:.3f} s")
    else:
        for size in (float(s) for s in a.sizes.split(",")):
            r = bench_restore(size, a.leaves, a.repeats)
            results.append(r)
            m, fl = r["median"], r["floors"]
            gib = r["size_gib"]
            print(f"restore {gib:g} GiB, {a.leaves} leaves (median of {a.repeats}; bit-exact: {r['exact']}):")
            for source in ("own", "peer", "storage"):
                print(f"  {source:8s} {m[source]:7.3f} s  {gib / m[source]:6.2f} GiB/s  "
                      f"{m['storage'] / m[source]:5.1f}x storage   all: {[round(x, 3) for x in r['seconds'][source]]}")
            print(f"  floors: memcpy {fl['memcpy_gib_s']:.2f} GiB/s, fresh memory {fl['fresh_memory_gib_s']:.2f} "
                  f"GiB/s, crc32c {fl['crc32c_gib_s']:.2f} GiB/s, loopback TCP {fl['loopback_tcp_gib_s']:.2f} GiB/s")
            p = r["prepare"]
            print(f"  save: loop stall {p['memory_blocking_s']:.3f} s (memory tier) vs {p['storage_blocking_s']:.3f} s "
                  "(storage tier's host copy)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


def child_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["prepare", "restore", "cost"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--shm", required=True)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--peer", default=None)
    ap.add_argument("--source", default="own")
    ap.add_argument("--cost-mib", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--block-steps", type=int, default=300)
    a = ap.parse_args(argv)
    result = {"prepare": child_prepare, "restore": child_restore, "cost": child_cost}[a.role](a)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
