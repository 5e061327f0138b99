"""``localcluster.stack.example_job``: the shared compilation cache's mount and the environment that keys it alike
on process nodes and real nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
from localcluster.stack import example_job

pytestmark = pytest.mark.unit


def env_of(body: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in body["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("cached", [True, False])
def test_a_shared_compilation_cache_is_mounted_and_keyed_without_its_path(tmp_path: Path, cached: bool) -> None:
    cache = tmp_path / "xla" if cached else None
    body = example_job("j", checkpoint_dir=tmp_path / "ckpt", compilation_cache=cache)
    env = env_of(body)
    mounts = {m["mountPath"] for m in body["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    if cached:
        assert env["REPRIEVE_COMPILATION_CACHE_DIR"] == "/xla-cache" and "/xla-cache" in mounts
        # JAX's default XLA cache (GPU autotuning's) puts the cache's own path into every key: a process node sees
        # the host path, a container /xla-cache, and neither would load the other's entries
        assert env["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    else:
        # the example's own cache, under the job's /ckpt: seen by one job's pods, on one kind of node
        assert env["REPRIEVE_COMPILATION_CACHE_DIR"] == "/ckpt/xla-cache", env
        assert "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES" not in env and "/xla-cache" not in mounts


def test_the_environment_variable_is_the_jax_option_it_names() -> None:
    from jax._src import config

    assert config.persistent_cache_enable_xla_caches.name.upper() == "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"
