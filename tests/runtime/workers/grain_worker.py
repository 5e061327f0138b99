"""A real grain input pipeline on every process of a real ``jax.distributed`` job, resumed through reprieve.

``GRAIN_MODE``:

* ``loader``: ``grain.DataLoader`` over an ``IndexSampler`` sharded with ``ShardByJaxProcess`` (each process
  reads its own records and keeps its own position: MaxText's layout);
* ``global``: a ``grain.MapDataset`` of *global* batches, each process taking its slice of every global batch
  (the position is one global batch index, the same on every process, so it survives a process-count change).

Every step appends ``{"attempt", "step", "records"}`` (this process's record ids) to ``batches-<pid>.jsonl``.
The data position travels with the checkpoint: ``job.save(step, state, data=it)`` and
``job.restore_or(..., data=it)``. Configured by ``launch`` (tests/runtime/helpers_agreement.py) plus
``WORKER_STEPS``, ``WORKER_STEP_SECONDS``, ``GRAIN_MODE``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import grain
import jax
import numpy as np
import reprieve
from jax.sharding import Mesh, NamedSharding, PartitionSpec

RECORDS, GLOBAL_BATCH, SEED = 96, 6, 7


def loader(job: reprieve.Job) -> grain.DataLoaderIterator:
    sampler = grain.samplers.IndexSampler(RECORDS, shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True),
                                          shuffle=True, num_epochs=None, seed=SEED)
    batch = GLOBAL_BATCH // job.num_processes
    return iter(grain.DataLoader(data_source=np.arange(RECORDS), sampler=sampler, worker_count=0,
                                 operations=[grain.transforms.Batch(batch, drop_remainder=True)]))


def global_batches(job: reprieve.Job) -> grain.DatasetIterator:
    n, p = job.num_processes, job.process_id
    per = GLOBAL_BATCH // n
    ds = grain.MapDataset.range(RECORDS).shuffle(seed=SEED).repeat().batch(GLOBAL_BATCH)
    return iter(ds.map(lambda b: b[p * per:(p + 1) * per]).to_iter_dataset())


def main() -> None:
    pid = int(os.environ.get("REPRIEVE_PROCESS_ID", "0"))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s p{pid} %(name)s %(levelname)s %(message)s",
                        force=True)  # grain (absl) configured the root logger at import
    workdir = Path(os.environ["WORKER_DIR"])
    total = int(os.environ.get("WORKER_STEPS", "40"))
    step_seconds = float(os.environ.get("WORKER_STEP_SECONDS", "0.02"))
    attempt = int(os.environ.get("REPRIEVE_ATTEMPT", "1"))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    job = reprieve.init()
    it = loader(job) if os.environ.get("GRAIN_MODE", "loader") == "loader" else global_batches(job)
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("p",)), PartitionSpec("p"))

    def init_state() -> dict[str, jax.Array]:  # step counters spread over the processes, any process count
        return {"steps": jax.make_array_from_callback((GLOBAL_BATCH,), sharding,
                                                      lambda idx: np.zeros((GLOBAL_BATCH,), np.int32)[idx])}

    state, start = job.restore_or(init_state, data=it)
    add_one = jax.jit(lambda s: {"steps": s["steps"] + 1})
    log = open(workdir / f"batches-{pid}.jsonl", "a", buffering=1)  # noqa: SIM115 - line-buffered, open to the end
    for step in job.steps(start, total):
        records = [int(r) for r in np.asarray(next(it)).ravel()]
        state = add_one(state)
        log.write(json.dumps({"attempt": attempt, "step": step, "records": records}) + "\n")
        if step == start + 3:
            (workdir / f"running-{pid}").touch()
        time.sleep(step_seconds)
        job.save(step, state, data=it)
    (workdir / f"done-{pid}").write_text(str(int(state["steps"].addressable_shards[0].data[0])))


if __name__ == "__main__":
    main()
