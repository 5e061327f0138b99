"""Reprieve checkpoints vs orbax-checkpoint, measured side by side in one run on the same state.

    .venv/bin/python benchmarks/checkpoint.py                      # 1 GiB x {16, 200} leaves + 2-process
    .venv/bin/python benchmarks/checkpoint.py --sizes 1,4 --leaves 16,200 --repeats 3
    .venv/bin/python benchmarks/checkpoint.py --lm-only                # a state shaped like examples/train_lm.py

``--lm`` adds (``--lm-only``: runs only) a state shaped like the example language model, scaled up: a transformer's
parameters in bf16 and its AdamW moments in f32 (hundreds of small leaves: layer norms and biases of a few KiB
beside 0.5-2 MiB kernels), an int32 step count, and nnx.Rngs-style typed PRNG keys with their counters.

Every measurement runs in a fresh subprocess (4 simulated CPU devices; the 2-process case uses real
jax.distributed with 2 devices per process), so peak RSS and allocator state are not shared:

(a) blocking time per save inside a jitted training loop whose step donates the state;
(b) save() call -> durable commit (Reprieve: wait(); Orbax: wait_until_finished());
(c) restore into the same sharding and into a different one (throughput, GiB/s); Reprieve's also in a warm process
    (``reprieve-warm``: the landing memory of the state populated first, off the clock, as a pre-warmed process does
    while it waits for its assignment; docs/restarts.md, "Pre-warmed next attempt");
(d) peak RSS during restore above the pre-restore baseline, as a multiple of the state per host;
(e) floors: sequential write+fsync bandwidth, host memcpy of the same bytes, sequential read.

Durability: both make every commit durable. Orbax writes through TensorStore's file driver with
file_io_sync=true (an fsync per file, few files thanks to OCDBT); Reprieve writes without per-file sync, then
fsyncs the checkpoint's files and directories concurrently (16 at a time) and the root after its rename. Both read from the page
cache on restore (the files were just written; dropping caches would need a privileged host).
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
import threading
import time
from typing import Any

GiB = 1 << 30
WARM = "reprieve-warm"  # Reprieve's restore in a process that populated its landing memory first
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# -- child side ------------------------------------------------------------------------------------
class PeakRss:
    """Samples this process's RSS every 2 ms between start() and stop()."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def start(self) -> None:
        self.peak = self.now()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.002)

    def stop(self) -> int:
        self._stop.set()
        assert self._t is not None
        self._t.join()
        self.peak = max(self.peak, self.now())
        return self.peak


def _setup_jax(devices: int) -> Any:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    return jax


def _shapes(size: int, leaves: int) -> list[tuple[int, int]]:
    rows = max(8, (size // leaves // (1024 * 4)) // 8 * 8)
    return [(rows, 1024)] * leaves


LM_LAYERS, LM_D = 8, 512


def _lm_state(jax: Any, variant: str) -> Any:
    """The example LM's state shape, scaled up (``LM_LAYERS`` x d_model ``LM_D``): params bf16, moments f32,
    a count, typed keys. 2-D leaves are sharded over the devices (rows for "same", columns for "different")."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    d = LM_D
    shapes: dict[str, tuple[int, ...]] = {"embed": (4 * d, d), "pos": (d, d), "head": (d, 4 * d)}
    for layer in range(LM_LAYERS):
        for name, shape in {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "up": (d, 4 * d),
                            "down": (4 * d, d), "q_b": (d,), "k_b": (d,), "v_b": (d,), "o_b": (d,),
                            "up_b": (4 * d,), "down_b": (d,), "ln1_s": (d,), "ln1_b": (d,), "ln2_s": (d,),
                            "ln2_b": (d,)}.items():
            shapes[f"l{layer:02d}_{name}"] = shape
    mesh = _mesh(jax)
    spec = P("d", None) if variant == "same" else P(None, "d")

    def sharding(shape: tuple[int, ...]) -> Any:
        return NamedSharding(mesh, spec if len(shape) == 2 else P())

    def build() -> dict[str, Any]:
        keys = jax.random.split(jax.random.key(0), len(shapes))
        params = {n: jax.random.normal(k, s, jnp.bfloat16) for k, (n, s) in zip(keys, shapes.items(), strict=True)}
        mu = {n: jax.random.normal(jax.random.fold_in(k, 1), s, jnp.float32) * 1e-3
              for k, (n, s) in zip(keys, shapes.items(), strict=True)}
        nu = {n: jax.random.uniform(jax.random.fold_in(k, 2), s, jnp.float32) * 1e-6
              for k, (n, s) in zip(keys, shapes.items(), strict=True)}
        rngs = {f"dropout{i}": {"key": jax.random.key(i), "count": jnp.asarray(i, jnp.uint32)} for i in range(4)}
        return {"params": params, "opt": {"mu": mu, "nu": nu, "count": jnp.asarray(7, jnp.int32)}, "rngs": rngs}

    out_shardings = jax.tree.map(lambda x: sharding(x.shape), jax.eval_shape(build))
    return jax.jit(build, out_shardings=out_shardings), out_shardings


def _leaf(jax: Any, i: int, n: int, shape: tuple[int, int]) -> Any:
    """Leaf ``i`` of ``n``: random (incompressible) float32, like trained weights. Orbax compresses
    its chunks, so constant or patterned test data would let it write almost nothing."""
    import jax.numpy as jnp

    return jax.random.uniform(jax.random.split(jax.random.key(0), n)[i], shape, jnp.float32) + i


def _state(jax: Any, shapes: list[tuple[int, int]], sharding: Any) -> dict[str, Any]:
    n = len(shapes)
    return jax.jit(lambda: {f"p{i:03d}": _leaf(jax, i, n, s) for i, s in enumerate(shapes)}, out_shardings=sharding)()


def _mesh(jax: Any) -> Any:
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()), ("d",))


def _shardings(jax: Any, variant: str) -> Any:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(_mesh(jax), P("d", None) if variant == "same" else P(None, "d"))


class _Impl:
    def __init__(self, name: str, path: str, coordinator: Any = None) -> None:
        self.name = name
        if name == "reprieve":
            from reprieve.checkpoint import CheckpointManager

            self.m = CheckpointManager(path, coordinator=coordinator, keep=2)
        else:
            import orbax.checkpoint as ocp

            self.ocp = ocp
            self.m = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
                max_to_keep=2, enable_async_checkpointing=True))

    def save(self, step: int, state: Any) -> None:
        if self.name == "reprieve":
            self.m.save(step, state)
        else:
            self.m.save(step, args=self.ocp.args.StandardSave(state))

    def wait(self) -> None:
        if self.name == "reprieve":
            self.m.wait()
        else:
            self.m.wait_until_finished()

    def restore(self, step: int, abstract: Any) -> Any:
        if self.name == "reprieve":
            return self.m.restore(abstract, step=step)[1]
        return self.m.restore(step, args=self.ocp.args.StandardRestore(abstract))

    def close(self) -> None:
        self.m.close()


def _train(jax: Any, x: Any) -> Any:
    """One "training step" of a leaf: floats change, keys and counters stay (the check recomputes it)."""
    import jax.numpy as jnp

    return x * 0.5 + 1.0 if jnp.issubdtype(x.dtype, jnp.floating) else x


def child_save(a: argparse.Namespace) -> dict[str, Any]:
    jax = _setup_jax(a.devices)
    coord = _maybe_distributed(jax, a)
    shapes = [] if a.lm else _shapes(a.size, a.leaves)
    state = _lm_state(jax, "same")[0]() if a.lm else _state(jax, shapes, _shardings(jax, "same"))
    step_fn = jax.jit(lambda s: jax.tree.map(lambda x: _train(jax, x), s), donate_argnums=0)
    state = step_fn(state)
    jax.block_until_ready(state)
    t = time.perf_counter()
    for _ in range(2):
        state = step_fn(state)
    jax.block_until_ready(state)
    step_s = (time.perf_counter() - t) / 2
    impl = _Impl(a.impl, a.dir, coord)
    blocks, commits, next_steps = [], [], []
    for i in range(a.repeats + 1):  # the first save warms up (compiles, creates directories)
        t0 = time.perf_counter()
        impl.save(i, state)
        t1 = time.perf_counter()
        state = step_fn(state)  # donates the buffers right after the save returned
        jax.block_until_ready(state)
        t2 = time.perf_counter()
        impl.wait()
        t3 = time.perf_counter()
        if i:
            blocks.append(t1 - t0)
            next_steps.append(t2 - t1)
            commits.append(t3 - t0)
        state = step_fn(state)
        jax.block_until_ready(state)
    impl.close()
    nbytes = sum(x.nbytes for x in jax.tree.leaves(state)) if a.lm else sum(r * c * 4 for r, c in shapes)
    return {"block_s": statistics.median(blocks), "commit_s": statistics.median(commits),
            "next_step_s": statistics.median(next_steps), "step_s": step_s, "bytes": nbytes,
            "leaves": len(jax.tree.leaves(state)), "last_step": a.repeats}


def child_restore(a: argparse.Namespace) -> dict[str, Any]:
    jax = _setup_jax(a.devices)
    coord = _maybe_distributed(jax, a)
    shapes = [] if a.lm else _shapes(a.size, a.leaves)
    import jax.numpy as jnp

    if a.lm:
        build, shardings = _lm_state(jax, a.variant)
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                jax.eval_shape(build), shardings)
    else:
        sharding = _shardings(jax, a.variant)
        abstract = {f"p{i:03d}": jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding)
                    for i, s in enumerate(shapes)}
    impl = _Impl("reprieve" if a.impl == WARM else a.impl, a.dir, coord)
    import gc

    populated = None
    if a.impl == WARM:  # what a warm process does while it waits for its assignment (reprieve.prewarm): off the clock
        from reprieve import landing

        t = time.perf_counter()
        pool = landing.reserve(landing.landing_bytes(abstract) or 0, minimum=0)
        populated = time.perf_counter() - t
        assert pool is not None, "no landing memory populated: see the log line above"
    gc.collect()
    rss = PeakRss()
    base = rss.now()
    rss.start()
    t0 = time.perf_counter()
    out = impl.restore(a.step, abstract)
    jax.block_until_ready(out)
    t1 = time.perf_counter()
    peak = rss.stop()

    if a.lm:
        ok = _lm_matches(jax, a, build, out)
        arrays = jax.tree.leaves(out)
    else:
        ok = all(_matches(out[f"p{i:03d}"], _expected(jax, a, shapes, i)) for i in (0, len(shapes) - 1))
        arrays = list(out.values())
    local = sum(s.data.nbytes for x in arrays for s in x.addressable_shards if s.replica_id == 0)
    stats = getattr(impl.m, "last_restore_stats", None)  # reprieve's
    mapped = getattr(stats, "mapped_bytes", 0)  # from the page cache, as the buffers (no copy): nothing lands
    impl.close()
    if populated is not None:
        from reprieve import landing

        assert pool.taken > 0 or mapped > 0, "the restore did not land in the memory populated ahead"
        landing.release()
    return {"restore_s": t1 - t0, "rss_delta": peak - base, "local_bytes": local, "ok": ok, "populated_s": populated,
            "mapped_bytes": mapped}



def _lm_matches(jax: Any, a: argparse.Namespace, build: Any, out: Any) -> bool:
    """Every leaf bit-exact (typed keys by their key data) against the state rebuilt and trained as saved."""
    import numpy as np

    want = build()
    for _ in range(3 + 2 * a.step):
        want = jax.tree.map(lambda x: _train(jax, x), want)

    def bits(x: Any) -> bytes:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return b"".join(np.asarray(s.data).tobytes() for s in sorted(x.addressable_shards, key=lambda s: str(s.index)))

    return all(x.dtype == y.dtype and bits(x) == bits(y)
               for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(want), strict=True))


def _matches(x: Any, expected: Any) -> bool:
    """Bit-exact check of the first rows of every addressable shard (works across processes)."""
    import numpy as np

    return all(np.array_equal(np.asarray(s.data)[:8], expected[s.index][:8]) for s in x.addressable_shards)


def _expected(jax: Any, a: argparse.Namespace, shapes: list[tuple[int, int]], i: int) -> Any:
    """Leaf ``i`` as it was saved at ``a.step`` (3 + 2 * step training steps before save), on host."""
    import numpy as np
    from jax.sharding import SingleDeviceSharding

    n = len(shapes)
    x = jax.jit(lambda: _leaf(jax, i, n, shapes[i]), out_shardings=SingleDeviceSharding(jax.local_devices()[0]))()
    for _ in range(3 + 2 * a.step):
        x = x * 0.5 + 1.0
    return np.asarray(x)


def _maybe_distributed(jax: Any, a: argparse.Namespace) -> Any:
    if a.nproc == 1:
        return None
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{a.port}", num_processes=a.nproc, process_id=a.pid)
    from reprieve.coordination import JaxCoordinator

    return JaxCoordinator.from_jax()


# -- floors ----------------------------------------------------------------------------------------
def floors(size: int, directory: str) -> dict[str, float]:
    import numpy as np

    t = time.perf_counter()
    src = np.ones(size // 4, np.float32)  # fresh pages: what a restore must at least pay to materialise
    touch = time.perf_counter() - t
    dst = np.empty_like(src)
    dst[:] = 0  # pre-fault
    t = time.perf_counter()
    np.copyto(dst, src)
    memcpy = time.perf_counter() - t
    path = os.path.join(directory, "floor.bin")
    view = memoryview(src).cast("B")
    chunk = 64 << 20
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        f.writelines(view[off:off + chunk] for off in range(0, len(view), chunk))
        os.fsync(f.fileno())
    write = time.perf_counter() - t
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        dv = memoryview(dst).cast("B")
        off = 0
        while off < len(dv):
            n = f.readinto(dv[off:off + chunk])
            if not n:
                break
            off += n
    read = time.perf_counter() - t
    cold_dir = os.path.join(directory, "floor-cold")  # evict() drops a directory's files from the page cache
    os.makedirs(cold_dir, exist_ok=True)
    os.replace(path, os.path.join(cold_dir, "floor.bin"))
    # benchmarks/memtier.py beside this file: the same eviction, checked with fincore
    from memtier import evict

    cached = evict(cold_dir)
    t = time.perf_counter()
    with open(os.path.join(cold_dir, "floor.bin"), "rb", buffering=0) as f:
        dv = memoryview(dst).cast("B")
        off = 0
        while off < len(dv) and (n := f.readinto(dv[off:off + chunk])):
            off += n
    read_cold = time.perf_counter() - t
    shutil.rmtree(cold_dir, ignore_errors=True)
    from reprieve.arrays import host_buffer

    t = time.perf_counter()  # into fresh buffers as a restore makes them (16 of them, populated up front)
    for part in np.array_split(src, 16):
        np.copyto(host_buffer(part.shape, part.dtype), part)
    memcpy_fresh = time.perf_counter() - t
    return {"memcpy_s": memcpy, "write_fsync_s": write, "read_s": read, "alloc_touch_s": touch,
            "read_cold_s": read_cold, "read_cold_cached_bytes": cached, "memcpy_fresh_s": memcpy_fresh}


# -- parent ----------------------------------------------------------------------------------------
def run_child(args: list[str], nproc: int = 1, timeout: float = 900) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "runtime"), os.environ.get("PYTHONPATH", "")]))
    port = 0
    if nproc > 1:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--child", *args, "--nproc", str(nproc), "--pid", str(p),
                               "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for p in range(nproc)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"child {args} failed rc={p.returncode}:\n{e[-4000:]}")
    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    if nproc > 1:  # the slowest process decides wall times; RSS and bytes are per host
        merged = dict(results[0])
        for k in ("block_s", "commit_s", "restore_s", "next_step_s", "rss_delta"):
            if k in merged:
                merged[k] = max(r[k] for r in results)
        if "ok" in merged:
            merged["ok"] = all(r["ok"] for r in results)
        return merged
    return results[0]


def bench_case(size: int, leaves: int, repeats: int, base: str, nproc: int, devices: int,
               restore_repeats: int, lm: bool = False) -> dict[str, Any]:
    """Saves, then restores alternating Orbax and Reprieve (fresh processes) so both see the same
    background load; medians over ``restore_repeats``."""
    res: dict[str, Any] = {}
    dirs, common = {}, {}
    for impl in ("orbax", "reprieve"):
        dirs[impl] = os.path.join(base, f"{impl}-{'lm' if lm else size}-{leaves}-{nproc}")
        shutil.rmtree(dirs[impl], ignore_errors=True)
        common[impl] = ["--impl", impl, "--dir", dirs[impl], "--size", str(size), "--leaves", str(leaves),
                        "--devices", str(devices), *(["--lm"] if lm else [])]
        res[impl] = {"save": run_child(["save", *common[impl], "--repeats", str(repeats)], nproc)}
    common[WARM] = ["--impl", WARM, *common["reprieve"][2:]]  # reprieve's checkpoint, in a warm process
    res[WARM] = {"save": res["reprieve"]["save"]}
    for variant in ("same", "different"):
        runs: dict[str, list[dict[str, Any]]] = {"orbax": [], "reprieve": [], WARM: []}
        for _ in range(restore_repeats):
            for impl in ("orbax", "reprieve", WARM):
                runs[impl].append(run_child(["restore", *common[impl], "--step", str(res[impl]["save"]["last_step"]),
                                             "--variant", variant], nproc))
        for impl, rs in runs.items():
            res[impl][variant] = {
                "restore_s": statistics.median(r["restore_s"] for r in rs),
                "rss_delta": statistics.median(r["rss_delta"] for r in rs),
                "ok": all(r["ok"] for r in rs), "all_restore_s": [r["restore_s"] for r in rs]}
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)
    return res


def report(size: int, leaves: int, nproc: int, res: dict[str, Any], fl: dict[str, float], lm: bool = False) -> list[str]:
    o, r = res["orbax"], res["reprieve"]
    nbytes = r["save"]["bytes"]
    gib = nbytes / GiB
    per_host = nbytes / nproc
    what = "LM-shaped state (bf16 params, f32 moments, typed keys)" if lm else "uniform float32 state"
    lines = [(f"== {gib:.2f} GiB, {r['save'].get('leaves', leaves)} leaves, {what}, {nproc} process(es) x "
              f"{4 // nproc} devices (train step {r['save']['step_s'] * 1e3:.0f} ms)")]

    def row(name: str, ov: float, rv: float, floor: float | None, unit: str = "s") -> None:
        ratio = rv / ov if ov else float("nan")
        fl_txt = f"  floor {floor:.3f}{unit} -> reprieve {rv / floor:.2f}x floor" if floor else ""
        lines.append(f"  {name:<28} orbax {ov:8.3f}{unit}  reprieve {rv:8.3f}{unit}  reprieve/orbax {ratio:5.2f}{fl_txt}")

    row("blocking per save", o["save"]["block_s"], r["save"]["block_s"], fl["memcpy_s"] * per_host / nbytes)
    row("next step after save", o["save"]["next_step_s"], r["save"]["next_step_s"], r["save"]["step_s"])
    stall_o = o["save"]["block_s"] + max(0.0, o["save"]["next_step_s"] - o["save"]["step_s"])
    stall_r = r["save"]["block_s"] + max(0.0, r["save"]["next_step_s"] - r["save"]["step_s"])
    row("loop stall (block+slowdown)", stall_o, stall_r, fl["memcpy_s"] * per_host / nbytes)
    row("save -> durable commit", o["save"]["commit_s"], r["save"]["commit_s"], fl["write_fsync_s"] * per_host / nbytes)
    for variant in ("same", "different"):
        ot, rt = o[variant]["restore_s"], r[variant]["restore_s"]
        lines.append(f"  restore ({variant:<9} sharding)   orbax {gib / ot:6.2f} GiB/s  reprieve {gib / rt:6.2f} GiB/s  "
                     f"reprieve/orbax throughput {ot / rt:5.2f}  floor(alloc+touch) {gib / fl['alloc_touch_s']:.2f} GiB/s  "
                     f"share of memcpy {fl['memcpy_s'] / rt * 100:.0f} %, of memcpy into fresh buffers "
                     f"{fl['memcpy_fresh_s'] / rt * 100:.0f} %  "
                     f"verified orbax={o[variant]['ok']} reprieve={r[variant]['ok']}")
        wt = res[WARM][variant]["restore_s"]
        lines.append(f"  restore ({variant:<9} sharding), reprieve in a warm process (its landing memory populated "
                     f"ahead, off the clock): {gib / wt:6.2f} GiB/s  reprieve-warm/orbax throughput {ot / wt:5.2f}  "
                     f"verified={res[WARM][variant]['ok']}")
        lines.append(f"  restore peak RSS ({variant:<9})   orbax {o[variant]['rss_delta'] / per_host:5.2f}x  "
                     f"reprieve {r[variant]['rss_delta'] / per_host:5.2f}x state per host")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1", help="state sizes in GiB, comma separated (e.g. 1,4)")
    ap.add_argument("--leaves", default="16,200")
    ap.add_argument("--repeats", type=int, default=3, help="timed saves per implementation (after a warm-up)")
    ap.add_argument("--restore-repeats", type=int, default=3, help="restores per implementation and sharding")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir under /tmp)")
    ap.add_argument("--no-two-process", action="store_true")
    ap.add_argument("--only-two-process", action="store_true", help="just the 2-process case")
    ap.add_argument("--json", default=None, help="also write raw results here")
    ap.add_argument("--lm", action="store_true", help="also a state shaped like examples/train_lm.py (scaled up)")
    ap.add_argument("--lm-only", action="store_true", help="only the LM-shaped state")
    a = ap.parse_args()
    base = a.dir or tempfile.mkdtemp(prefix="reprieve-bench-")
    os.makedirs(base, exist_ok=True)
    sizes = [int(float(s) * GiB) for s in a.sizes.split(",")]
    leaves = [int(x) for x in a.leaves.split(",")]
    cases = [] if a.only_two_process or a.lm_only else [(s, n, 1, False) for s in sizes for n in leaves]
    if not a.no_two_process and not a.lm_only:
        cases.append((sizes[0], leaves[0], 2, False))
    if a.lm or a.lm_only:
        cases.append((GiB // 4, 0, 1, True))
    try:
        raw = []
        for size, n, nproc, lm in cases:
            fl = floors(size, base)
            res = bench_case(size, n, a.repeats, base, nproc, 4 // nproc, a.restore_repeats, lm)
            raw.append({"size": size, "leaves": n, "nproc": nproc, "lm": lm, "floors": fl, **res})
            print("\n".join(report(size, n, nproc, res, fl, lm)), flush=True)
            print(f"  floors: memcpy {size / GiB / fl['memcpy_s']:.2f} GiB/s, write+fsync "
                  f"{size / GiB / fl['write_fsync_s']:.2f} GiB/s, read (page cache) {size / GiB / fl['read_s']:.2f} GiB/s, "
                  f"alloc+touch {size / GiB / fl['alloc_touch_s']:.2f} GiB/s, memcpy into fresh buffers "
                  f"{size / GiB / fl['memcpy_fresh_s']:.2f} GiB/s, cold read {size / GiB / fl['read_cold_s']:.2f} GiB/s "
                  f"({fl['read_cold_cached_bytes']} bytes still cached before it); load average {os.getloadavg()[0]:.1f}",
                  flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(raw, f, indent=1)
    finally:  # 1-4 GiB per implementation: never leave it behind, also not on failure
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)


def child_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["save", "restore"])
    ap.add_argument("--impl", choices=["orbax", "reprieve", WARM], required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--leaves", type=int, required=True)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--variant", default="same")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--lm", action="store_true")
    a = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING)
    out = child_save(a) if a.role == "save" else child_restore(a)
    print(json.dumps(out), flush=True)
    if a.nproc > 1:
        import jax

        jax.distributed.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
