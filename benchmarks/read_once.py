"""Each replicated byte read once: a fully replicated state restored by 1, 2 and 4 processes, each byte read from
storage by one of them and sent to the others (``read_once="on"``) or read by every process (``"off"``).

    .venv/bin/python benchmarks/read_once.py --size 0.5 --procs 1,2,4 --repeats 3     # or: memtier.py --parts replicas

One process saves a float32 state of ``--size`` GiB in ``--leaves`` leaves (16 MiB chunk files) to local disk and,
unless ``--no-s3``, to the s3 emulator (moto on loopback, ``memtier.s3_emulator``). Then, ``--repeats`` rounds, each
measurement a fresh gang of N processes (``jax.distributed`` on 127.0.0.1, one CPU device each, the state fully
replicated over the N devices: what data-parallel replicas hold) restoring it with ``CheckpointManager.restore``,
from: **disk** (the page cache), **disk-cold** (the checkpoint's files dropped from the page cache first,
``memtier.evict``) and **s3**. Each process times its restore from a barrier every process passed to its return,
reports the bytes its reads took from storage (``last_restore_stats``, counted by the reader) and checks every
leaf bit-exact (crc32c against the saved state's). A row: the slowest process's restore (the gang waits for it;
median and worst of the rounds), storage bytes per process (the largest), and the storage bytes of all
processes over the state's (how many times each byte was read).

``--mixed`` adds a memory-tier restore's storage readers: a gang of N+1 processes of which N read the checkpoint
with ``CheckpointManager.read_step(among=...)`` (the mixed restore's storage readers, docs/memory.md) and one
takes no part (it restores from memory in a real job); rows ``N of N+1``.

On one machine the processes share its cores, memory bus and page cache: N processes restore N copies of the state
with the CPU of one, so times grow with N either way; the storage bytes are the machine-independent half.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
GiB = 1 << 30
SOURCES = ("disk", "disk-cold", "s3")


def _abstract(jax: Any, size: float, leaves: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    replicated = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P())
    rows = max(8, int(size * GiB) // leaves // (1024 * 4) // 8 * 8)
    return {f"p{i:03d}": jax.ShapeDtypeStruct((rows, 1024), jnp.float32, sharding=replicated) for i in range(leaves)}


def _crcs(state: dict[str, Any]) -> dict[str, int]:
    import numpy as np
    from reprieve.checksum import crc32c

    return {k: crc32c(np.ascontiguousarray(np.asarray(v.addressable_shards[0].data))) for k, v in state.items()}


def child_prepare(a: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    import jax
    import jax.numpy as jnp
    from reprieve.checkpoint import CheckpointManager

    abstract = _abstract(jax, a.size, a.leaves)
    build = jax.jit(lambda: {k: jax.random.uniform(jax.random.key(i), s.shape, jnp.float32) + i
                             for i, (k, s) in enumerate(abstract.items())})
    state = jax.block_until_ready(build())
    for uri in a.uris:
        mgr = CheckpointManager(uri, keep=1)
        mgr.save(1, state)
        mgr.close()
    return {"crcs": _crcs(state), "bytes": sum(v.nbytes for v in state.values())}


def child_gang(a: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    g = a.gang
    jax.distributed.initialize(f"127.0.0.1:{g['port']}", num_processes=g["nproc"], process_id=g["pid"],
                               initialization_timeout=120)
    from reprieve.checkpoint import CheckpointManager
    from reprieve.coordination import JaxCoordinator

    coord = JaxCoordinator.from_jax()
    mgr = CheckpointManager(a.uris[0], coordinator=coord, attempt=2, keep=1, read_once=g["mode"],
                            barrier_timeout_s=300)
    abstract = _abstract(jax, a.size, a.leaves)
    among = g.get("among")
    coord.barrier("bench-start", 300)
    t0 = time.perf_counter()
    if among is not None and g["pid"] not in among:  # restores from memory in a real job: no part in this read
        out: dict[str, Any] = {"seconds": 0.0, "storage": 0, "peer": 0, "fallback": 0, "exact": True, "idle": True}
    else:
        if among is None:
            _, state, _ = mgr.restore(abstract, step=1)
        else:
            _, state, _ = mgr.read_step(1, 1, abstract, among=among, key="bench")
        jax.block_until_ready(state)
        seconds = time.perf_counter() - t0
        exact = _crcs(state) == {k: int(v) for k, v in g["crcs"].items()}
        stats = mgr.last_restore_stats
        out = {"seconds": seconds, "storage": stats.storage_bytes, "peer": stats.peer_bytes,
               "fallback": stats.fallback_pieces, "exact": exact}
    print(json.dumps(out), flush=True)  # before the others may leave: a process whose leader left is aborted
    coord.barrier("bench-end", 300)
    if g["pid"] == 0:
        time.sleep(1.0)  # the leader (the coordination service) leaves last
    os._exit(0)


def _run(args: list[str]) -> subprocess.Popen[str]:
    """This script's child ``args`` in a fresh process on this checkout's runtime."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "runtime"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _last_json(p: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({p.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def gang(nproc: int, mode: str, uri: str, common: list[str], crcs: dict[str, int], *,
         among: list[int] | None = None) -> list[dict[str, Any]]:
    """One fresh gang's restore: every process's result (``among``: only those read, with ``read_step``; the
    others' results are left out)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [_run(["gang", *common, "--uris", uri, "--gang", json.dumps({"port": port, "nproc": nproc, "pid": pid,
                                                                           "mode": mode, "crcs": crcs,
                                                                           "among": among})])
             for pid in range(nproc)]
    return [r for r in (_last_json(p, 900) for p in procs) if not r.get("idle")]


def bench(size: float, leaves: int, procs: list[int], repeats: int, *, s3: bool,
          mixed: bool = False) -> dict[str, Any]:
    from memtier import evict, s3_emulator

    base = tempfile.mkdtemp(prefix="read-once-bench-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    disk = os.path.join(base, "ckpt")
    try:
        with s3_emulator() if s3 else contextlib.nullcontext(None) as s3_uri:
            common = ["--size", str(size), "--leaves", str(leaves)]
            prep = _last_json(_run(["prepare", *common, "--uris", disk, *([s3_uri] if s3_uri else [])]), 1800)
            rows: dict[str, dict[str, list[Any]]] = {}
            for _ in range(repeats):
                for source in [s for s in SOURCES if s != "s3" or s3_uri]:
                    shapes = [(n, None) for n in procs] + [(n + 1, list(range(1, n + 1))) for n in procs
                                                             if mixed and n > 1]
                    for size_n, among in shapes:
                        readers = size_n if among is None else len(among)
                        for mode in ("off", "on") if readers > 1 else ("off",):
                            cached = evict(disk) if source == "disk-cold" else None
                            r = gang(size_n, mode, s3_uri if source == "s3" and s3_uri else disk, common,
                                     prep["crcs"], among=among)
                            name = f"n={size_n}" if among is None else f"n={readers} of {size_n}"
                            row = rows.setdefault(f"{source} {name} {mode}", {"seconds": [], "storage": [],
                                                                              "reads": [], "exact": [], "cached": []})
                            row["seconds"].append(max(x["seconds"] for x in r))
                            row["storage"].append(max(x["storage"] for x in r))
                            row["reads"].append(sum(x["storage"] for x in r) / prep["bytes"])
                            row["exact"].append(all(x["exact"] for x in r) and not any(x["fallback"] for x in r))
                            row["cached"].append(cached)
        return {"size_gib": size, "leaves": leaves, "bytes": prep["bytes"], "rows": rows,
                "load": os.getloadavg()}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def print_bench(r: dict[str, Any]) -> None:
    print(f"fully replicated restore, {r['size_gib']:g} GiB in {r['leaves']} leaves ({r['bytes']} bytes); "
          f"load average at the end {r['load'][0]:.1f}")
    print(f"  {'source n mode':26s} {'median s':>9s} {'worst s':>8s} {'storage MiB/process':>20s} {'reads/byte':>10s}"
          "  bit-exact")
    for name, row in r["rows"].items():
        print(f"  {name:26s} {statistics.median(row['seconds']):9.3f} {max(row['seconds']):8.3f} "
              f"{max(row['storage']) / (1 << 20):20.1f} {statistics.median(row['reads']):10.2f}  {all(row['exact'])}"
              + (f"  (cached before: {row['cached']})" if row["cached"][0] is not None else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=0.5, help="state size in GiB")
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--procs", default="1,2,4", help="process counts, comma separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-s3", dest="s3", action="store_false")
    ap.add_argument("--mixed", action="store_true", help="also N storage readers of a gang of N+1 (read_step among)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    r = bench(a.size, a.leaves, [int(x) for x in a.procs.split(",")], a.repeats, s3=a.s3, mixed=a.mixed)
    print_bench(r)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r, fh, indent=1)


def child_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["prepare", "gang"])
    ap.add_argument("--size", type=float, required=True)
    ap.add_argument("--leaves", type=int, required=True)
    ap.add_argument("--uris", nargs="+", required=True)
    ap.add_argument("--gang", type=json.loads, default={}, help="gang: port, nproc, pid, mode, crcs (JSON)")
    a = ap.parse_args(argv)
    result = {"prepare": child_prepare, "gang": child_gang}[a.role](a)
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # jax.distributed's shutdown barrier at exit adds seconds and nothing measured


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
