"""REPRIEVE_COMPILATION_CACHE_DIR: a restarted process loads its programs from JAX's persistent cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reprieve.config import ConfigError, RuntimeConfig

PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name))
import reprieve
job = reprieve.init(install_sigterm=False, watch_pod=False)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())  # compiles in well under JAX's default 1 s threshold
f(jnp.ones((64, 64))).block_until_ready()
print(json.dumps({"hits": hits.count("/jax/compilation_cache/cache_hits")}))
"""


def _run(tmp_path: Path, cache: Path | None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
    env["REPRIEVE_CHECKPOINT_URI"] = str(tmp_path / "ckpt")
    if cache is not None:
        env["REPRIEVE_COMPILATION_CACHE_DIR"] = str(cache)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["hits"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_second_process_loads_the_program_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "jax-cache"
    assert _run(tmp_path, cache) == 0  # first run compiles and writes the entry
    assert any(cache.iterdir()), "no cache entry written"
    assert _run(tmp_path, cache) >= 1  # the "restarted" process hits it
    assert _run(tmp_path, None) == 0   # and without the variable nothing is cached


GANG_PROGRAM = r"""
import json
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
import reprieve
job = reprieve.init(install_sigterm=False, watch_pod=False)
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.full((4,), job.process_id + 1.0))
total = jax.jit(lambda a: (a * a).sum())(x)  # a cross-process all-reduce (gloo)
print(json.dumps({"total": float(total), "hits": events.count("/jax/compilation_cache/cache_hits")}))
"""


def _run_gang(tmp_path: Path, cache: Path, n: int = 2) -> list[dict]:
    from tests.runtime.helpers_agreement import free_port

    program = tmp_path / "gang.py"
    program.write_text(GANG_PROGRAM)
    port = free_port()
    procs = []
    for i in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith("REPRIEVE_")}
        env.update({"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), "REPRIEVE_COMPILATION_CACHE_DIR": str(cache),
                    "REPRIEVE_NUM_PROCESSES": str(n), "REPRIEVE_PROCESS_ID": str(i), "JAX_PLATFORMS": "cpu",
                    "REPRIEVE_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "REPRIEVE_POD_IP": "127.0.0.1",
                    "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
        procs.append(subprocess.Popen([sys.executable, str(program)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_every_process_of_a_restarted_cpu_gang_loads_its_programs(tmp_path: Path) -> None:
    """JAX writes cache entries from process 0 only, but on CPU each process's key differs (the local topology
    is hashed): without the runtime's fix only process 0 of a restarted gang loaded, the others compiled while
    it waited in its first collective (gloo's rendezvous timed out under load: SIGABRT)."""
    cache = tmp_path / "jax-cache"
    first = _run_gang(tmp_path, cache)
    assert [r["hits"] for r in first] == [0, 0], first
    again = _run_gang(tmp_path, cache)
    assert all(r["hits"] >= 1 for r in again), again  # every process, not only process 0
    assert [r["total"] for r in again] == [r["total"] for r in first] == [20.0, 20.0], (first, again)


@pytest.mark.unit
def test_the_variable_is_read_and_blank_means_off() -> None:
    assert RuntimeConfig.from_env({"REPRIEVE_COMPILATION_CACHE_DIR": "/ckpt/jax"}).compilation_cache_dir == "/ckpt/jax"
    assert RuntimeConfig.from_env({"REPRIEVE_COMPILATION_CACHE_DIR": " "}).compilation_cache_dir is None
    with pytest.raises(ConfigError):  # the reader still validates the others around it
        RuntimeConfig.from_env({"REPRIEVE_COMPILATION_CACHE_DIR": "/x", "REPRIEVE_NUM_PROCESSES": "0"})
