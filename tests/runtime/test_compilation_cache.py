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


@pytest.mark.unit
def test_the_variable_is_read_and_blank_means_off() -> None:
    assert RuntimeConfig.from_env({"REPRIEVE_COMPILATION_CACHE_DIR": "/ckpt/jax"}).compilation_cache_dir == "/ckpt/jax"
    assert RuntimeConfig.from_env({"REPRIEVE_COMPILATION_CACHE_DIR": " "}).compilation_cache_dir is None
    with pytest.raises(ConfigError):  # the reader still validates the others around it
        RuntimeConfig.from_env({"REPRIEVE_COMPILATION_CACHE_DIR": "/x", "REPRIEVE_NUM_PROCESSES": "0"})
