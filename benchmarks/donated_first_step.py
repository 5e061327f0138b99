"""The first step after a restore when the step donates its state: restored arrays that the devices adopt (the
restore's zero-copy landing, ``reprieve.arrays.on_devices``) against arrays in memory XLA owns.

A CPU device adopts a 64-byte aligned host buffer instead of copying it, which makes a restore one copy a byte
(docs/checkpoint.md). But XLA cannot reuse adopted memory for a donated input: the first call of a step with
``donate_argnums`` (as the example's) then writes its whole output into fresh memory, every byte of the state, and
only from the second call does the donation work. This benchmark measures what that costs, in fresh processes
(one per row, ``--repeats`` rounds taking turns), with ``--mib`` of float32 state replicated on each of
``--devices`` simulated CPU devices (the example's layout), and a step that changes a few elements:

* **adopted, donated**: the arrays made as a restore makes them (``arrays.host_buffer`` filled, then
  ``arrays.on_devices``), then the donated step: its first and second call;
* **XLA-owned, donated**: the same bytes copied into memory XLA allocates (``jax.device_put`` of a view the device
  cannot adopt): the copy, then the donated step's first and second call (the peer row);
* **adopted+copied, donated**: the adopted arrays copied on their devices into memory XLA owns
  (``jax.device_put(arrays, devices, may_alias=False)``; for a numpy source JAX 0.10 ignores ``may_alias=False``
  and adopts it all the same, jax-ml/jax#37830), then the donated step;
* **copied in the put, donated**: what a restore does when it knows the step donates by the time the bytes are read
  (``arrays.owned_copies``): the buffer adopted by its first device and copied by XLA onto each device in
  ``arrays.assemble``, without a host copy for each further replica (the row above makes one, ``arrays.on_devices``);
* **adopted+copied, populated ahead**: the adopted+copied row, with the copy's memory populated in the process's C heap before
  the clock starts, as a pre-warmed process does when its trainer reported it (``reprieve.landing.reserve_owned``,
  ``REPRIEVE_WARM_OWNED_BYTES``);
* **adopted, not donated**: the adopted arrays and the same step without donation (every call writes a new state).

The last line is the ratio of the first two rows' restore-plus-first-call time.

    python benchmarks/donated_first_step.py --mib 1024 --devices 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
from reprieve import arrays, landing
how, n = sys.argv[1], int(sys.argv[2])
devs = jax.devices()
donate = how != "adopted-kept"
step = jax.jit(lambda x: x.at[:8].add(1.0), donate_argnums=0 if donate else ())
jax.block_until_ready(step(jnp.zeros(n, jnp.float32)))  # compiled before the clock starts (its own buffer)
if how == "copied-ahead" and not landing.reserve_owned(4 * n * len(devs)):  # what a warm process does while it waits
    raise SystemExit("the copy's memory could not be populated ahead (see the log)")
buf = arrays.host_buffer((n,), np.dtype(np.float32))
buf[:] = 1.0
t0 = time.perf_counter()
if how == "owned":
    views = []
    for _ in devs:  # one element less aligned: the device copies instead of adopting
        raw = np.empty(n + 1, np.float32)
        views.append(raw[1:])
        views[-1][:] = buf
    t0 = time.perf_counter()
    xs = jax.block_until_ready(jax.device_put(views, devs))
    del views
elif how == "put-copied":
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devs), ("d",)), jax.sharding.PartitionSpec())
    with arrays.owned_copies(lambda: True):
        (x,) = arrays.assemble([([buf], [devs], (n,), replicated)])
    xs = [s.data for s in x.addressable_shards]  # each device's copy, as the other rows step them
    del x
    landing.owned_done()
else:
    xs = list(arrays.on_devices([buf], [devs]).values())
    if how in ("copied", "copied-ahead"):  # then into memory XLA owns: a copy of each device's array on its device
        xs = jax.device_put(xs, devs, may_alias=False)
    jax.block_until_ready(xs)
    landing.owned_done()
t1 = time.perf_counter()
ys = jax.block_until_ready([step(x) for x in xs])
t2 = time.perf_counter()
zs = jax.block_until_ready([step(y) for y in ys])
t3 = time.perf_counter()
ok = all(float(z[0]) == 3.0 and float(z[-1]) == 1.0 for z in zs)
print(json.dumps({"to_devices": t1 - t0, "first": t2 - t1, "second": t3 - t2, "ok": ok}))
'''

ROWS = (("adopted", "adopted, donated"), ("owned", "XLA-owned, donated"), ("copied", "adopted+copied, donated"),
        ("put-copied", "copied in the put, donated"), ("copied-ahead", "copied, populated ahead"),
        ("adopted-kept", "adopted, not donated"))


def run(how: str, n: int, devices: int) -> dict[str, float]:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT / "runtime")}
    out = subprocess.run([sys.executable, "-c", CHILD, how, str(n)], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"{how}: exit {out.returncode}\n{out.stderr[-2000:]}")
    row: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    if not row.pop("ok"):
        raise SystemExit(f"{how}: the step's results are wrong")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024, help="state size in MiB (a replica on each device)")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.mib < 1 or args.devices < 1 or args.repeats < 1:
        p.error("--mib, --devices and --repeats must be at least 1")
    n = args.mib * (1 << 20) // 4
    got: dict[str, list[dict[str, float]]] = {how: [] for how, _ in ROWS}
    for _ in range(args.repeats):
        for how, _ in ROWS:
            got[how].append(run(how, n, args.devices))
    print(f"{args.mib} MiB of float32 on each of {args.devices} devices; median (worst) of {args.repeats} fresh "
          "processes")
    print(f"{'':28s} {'onto devices':>16s} {'first call':>16s} {'second call':>16s} {'both':>16s}")
    both = {}
    for how, label in ROWS:
        rows = got[how]

        def cell(key: str, rows: list[dict[str, float]] = rows) -> str:
            vals = [r[key] for r in rows]
            return f"{statistics.median(vals):.3f} ({max(vals):.3f}) s"

        total = [r["to_devices"] + r["first"] for r in rows]
        both[how] = statistics.median(total)
        print(f"{label:28s} {cell('to_devices'):>16s} {cell('first'):>16s} {cell('second'):>16s} "
              f"{statistics.median(total):.3f} ({max(total):.3f}) s")
    print(f"onto devices + first donated call: adopted / XLA-owned = {both['adopted'] / both['owned']:.2f}x, "
          f"adopted / adopted+copied = {both['adopted'] / both['copied']:.2f}x, "
          f"adopted+copied / copied in the put = {both['copied'] / both['put-copied']:.2f}x, "
          f"adopted+copied / populated ahead = {both['copied'] / both['copied-ahead']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
