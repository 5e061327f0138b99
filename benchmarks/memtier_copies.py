"""What one memory-tier copy of a large state costs the machine: the writer's CPU (checksum, the copy into its pod's
volume, the commit and the delete of the copy it replaces, the send) and the peer's replica server's CPU (the
receive into its volume, the check, the commit and the delete), per copy, at ``--gib`` per copy.

Each row is a fresh writer process and a fresh replica server process (another process on loopback, as
reprieve-supervisor serves it), both on the row's runtime: ``this`` tree's, or ``--baseline ROOT``'s (a ``git archive``
of an older commit: ``git archive REV runtime | tar -x -C ROOT``), rows taking turns for ``--repeats`` rounds. The
writer drives the memory directory and the wire as the tier does (``MemoryDir.begin``/``commit``, ``pwrite``, the
``put``), over ``--leaves`` numpy leaves it changes a little before each copy; the first ``--warmup`` copies of a row
are not counted (the volume's first allocations). CPU is each process's user + system time (``/proc``), wall from the
copy's start to the server's answer. The volumes are directories on ``/dev/shm`` (tmpfs, as a ``medium: Memory``
emptyDir is).

    python benchmarks/memtier_copies.py --gib 1 --copies 6 --repeats 3 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SERVER = """
import sys, time
from reprieve.memtier.server import ReplicaServer
from reprieve.memtier.store import MemoryDir
s = ReplicaServer(MemoryDir(sys.argv[1]), host="127.0.0.1", port=0).start()
print(s.address, flush=True)
sys.stdin.read()
"""


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def writer(args: argparse.Namespace) -> None:
    """One row: start the server, write ``warmup + copies`` copies, print one JSON line of per-copy figures."""

    import numpy as np
    from reprieve.memtier import layout, wire
    from reprieve.memtier.layout import CopyName
    from reprieve.memtier.manifest import Manifest, Shard, crc32c
    from reprieve.memtier.store import MemoryDir

    root = Path(args.dir)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(root / "holder")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        address = server.stdout.readline().strip()
        client = wire.Client(address)
        mdir = MemoryDir(str(root / "writer"))
        n = int(args.gib * (1 << 30)) // args.leaves
        leaves = [np.full(n, i, dtype=np.uint8) for i in range(args.leaves)]
        info = [{"path": f"['l{i}']", "kind": "array", "index": i, "shape": [n], "dtype": "uint8",
                 "chunk_shape": [n], "nbytes": n} for i in range(args.leaves)]
        rows = []
        for k in range(args.warmup + args.copies):
            for leaf in leaves:
                leaf[k % n] += 1
            t0, c0, s0 = time.perf_counter(), _cpu(os.getpid()), _cpu(server.pid)
            name = CopyName(10 * (k + 1), 1, 0)
            shards, offset = [], 0
            for i, leaf in enumerate(leaves):
                offset = layout.aligned(offset)
                shards.append(Shard(i, ((0, n),), offset, n, crc32c(leaf)))
                offset += n
            m = Manifest(writer=0, num_processes=2, step=name.step, attempt=1, leaves=info, shards=shards,
                         data_bytes=offset, extra={})
            with mdir.in_flight():
                tmp = mdir.begin(layout.OWN, name, offset, attempt=1)
                fd = os.open(os.path.join(tmp, layout.DATA_FILE), os.O_WRONLY)
                try:
                    for leaf, s in zip(leaves, shards, strict=True):
                        view, done = memoryview(leaf), 0
                        while done < n:
                            done += os.pwrite(fd, view[done:], s.offset + done)
                finally:
                    os.close(fd)
                mdir.commit(layout.OWN, name, m)
            t1, c1 = time.perf_counter(), _cpu(os.getpid())
            client.put(layout.PEER, str(name), m.to_bytes(),
                       os.path.join(mdir.copy_dir(layout.OWN, name), layout.DATA_FILE), offset)
            t2, c2, s2 = time.perf_counter(), _cpu(os.getpid()), _cpu(server.pid)
            if k >= args.warmup:
                rows.append({"write_s": t1 - t0, "writer_cpu_s": c2 - c0, "write_cpu_s": c1 - c0,
                             "server_cpu_s": s2 - s0, "wall_s": t2 - t0})
        print(json.dumps({"copies": rows}), flush=True)
    finally:
        server.stdin.close()
        server.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="bytes a copy moves, GiB")
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--copies", type=int, default=6, help="copies counted per row")
    ap.add_argument("--warmup", type=int, default=2, help="copies of a row not counted")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each round runs every row once")
    ap.add_argument("--baseline", metavar="ROOT", default=None,
                    help="a tree with an older runtime/ (git archive REV runtime | tar -x -C ROOT): its rows beside")
    ap.add_argument("--json", default=None)
    ap.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer:
        return writer(args)
    for what, value, low in (("--gib", args.gib, 1 / 1024), ("--copies", args.copies, 1),
                             ("--repeats", args.repeats, 1), ("--leaves", args.leaves, 1)):
        if not value >= low:
            ap.error(f"{what} must be at least {low:g}, got {value:g}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    need = args.gib * 5 * (1 << 30)  # the leaves, and in the two volumes the copies held and the one in flight
    free = shutil.disk_usage("/dev/shm").free
    if need > free:
        ap.error(f"--gib {args.gib:g} needs about {need / 2**30:.1f} GiB on /dev/shm, which has {free / 2**30:.1f} GiB")
    if args.baseline and not (Path(args.baseline) / "runtime" / "reprieve").is_dir():
        ap.error(f"--baseline {args.baseline}: no runtime/reprieve under it")
    variants = [("this", REPO / "runtime")] + ([("baseline", Path(args.baseline) / "runtime")] if args.baseline else [])
    results: dict[str, list[dict[str, float]]] = {v: [] for v, _ in variants}
    for r in range(args.repeats):
        for label, runtime in variants if r % 2 == 0 else variants[::-1]:
            d = tempfile.mkdtemp(prefix="reprieve-copies-", dir="/dev/shm")
            try:
                env = dict(os.environ, PYTHONPATH=str(runtime), JAX_PLATFORMS="cpu")
                out = subprocess.run([sys.executable, __file__, "--writer", "--dir", d, "--gib", str(args.gib),
                                      "--leaves", str(args.leaves), "--copies", str(args.copies),
                                      "--warmup", str(args.warmup)], check=False, env=env, capture_output=True,
                                     text=True,
                                     timeout=1800)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            if out.returncode != 0:
                sys.exit(f"{label} round {r}: the writer failed ({out.returncode}):\n{out.stderr[-3000:]}")
            rows = json.loads(out.stdout.strip().splitlines()[-1])["copies"]
            results[label] += rows
            print(f"round {r} {label:8s}: " + ", ".join(
                f"{x['writer_cpu_s'] + x['server_cpu_s']:.2f}" for x in rows) + " CPU-s a copy", flush=True)
    print(f"\n{args.gib:g} GiB a copy, {args.leaves} leaves, {args.copies} copies x {args.repeats} rounds a row "
          f"(median, worst):")
    print(f"{'row':10s} {'writer CPU':>18s} {'server CPU':>18s} {'both':>18s} {'wall':>18s}")
    summary = {}
    for label, rows in results.items():
        cols = {}
        for key in ("writer_cpu_s", "server_cpu_s", "both", "wall_s"):
            xs = [x["writer_cpu_s"] + x["server_cpu_s"] if key == "both" else x[key] for x in rows]
            cols[key] = (statistics.median(xs), max(xs))
        summary[label] = cols
        print(f"{label:10s} " + " ".join(f"{m:8.3f} ({w:6.3f})" for m, w in cols.values()))
    if args.baseline:
        both = summary["baseline"]["both"][0] / summary["this"]["both"][0]
        wall = summary["baseline"]["wall_s"][0] / summary["this"]["wall_s"][0]
        print(f"\nbaseline / this, median: CPU {both:.2f}x, wall {wall:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "results": results,
                                               "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
