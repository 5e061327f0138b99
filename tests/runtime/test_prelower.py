"""reprieve.lower_ahead and what Job.compile_ahead does with its module (reprieve.prelower), in this process: where
it may be called, when it lowers nothing, which arguments a module lowered ahead fits, and the step the loop calls
falling back to the jitted function. The whole path in fresh processes (lowered before the devices, the backend
cleared, compiled from the persistent cache for the devices, the same first step) is
tests/runtime/test_first_step_bench.py; through restarts under reprieve-supervisor, the e2e jobs of the example.
Real JAX on 4 simulated CPU devices."""

from __future__ import annotations

import logging
import os
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from reprieve import lower_ahead, prelower

from tests.runtime.test_compile_ahead import _abstract, _init, _shardings, _step
from tests.runtime.test_restore_or import _mesh

pytestmark = pytest.mark.integration


def test_lower_ahead_outside_a_trace_ahead_function_says_where_it_belongs() -> None:
    with pytest.raises(RuntimeError, match=r"inside the function passed to reprieve.init\(trace_ahead=...\)"):
        lower_ahead(_step(), *_abstract())
    with prelower.collecting(), pytest.raises(TypeError, match="has no .trace"):
        lower_ahead(lambda x: x, 1)


def test_nothing_is_lowered_on_another_platform_or_once_a_backend_exists(caplog: pytest.LogCaptureFixture) -> None:
    step = _step()
    with prelower.collecting() as pending:
        traced = lower_ahead(step, *_abstract())
    assert len(pending) == 1 and pending[0].fn is step and pending[0].traced is traced
    jax.devices()  # this process has a backend (a warm process must not: init() refuses it)
    with caplog.at_level(logging.INFO, logger="reprieve"):
        assert prelower.lower_pending(pending, "gpu") == 0
        assert prelower.lower_pending(pending, "cpu") == 0
    assert "traced only; lowering before the devices is done for cpu topologies, not gpu" in caplog.text
    assert "not lowered, a JAX backend is already initialised" in caplog.text
    assert prelower.take(step) is None


def test_a_module_fits_the_arguments_of_its_tree_shapes_dtypes_and_sharding_specs() -> None:
    step = _step()
    state, batch = _abstract()
    lowered = step.lower(state, batch)
    assert prelower.mismatch(lowered, (state, batch), {}) is None
    assert prelower.devices_of((state, batch), {}) == tuple(_mesh().devices.flat)
    wider = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=batch.sharding)
    assert "argument 2: float32[16, 8] against float32[8, 8]" in (prelower.mismatch(lowered, (state, wider), {})
                                                                  or "")
    other = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(_mesh(), P(None, "d")))
    assert "argument 2: sharding" in (prelower.mismatch(lowered, (state, other), {}) or "")
    assert "structure differs" in (prelower.mismatch(lowered, ({"w": state["w"]}, batch), {}) or "")
    unsharded = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    assert prelower.devices_of((unsharded,), {}) is None


def test_the_loop_calls_the_compiled_program_and_the_jitted_function_once_it_refuses(
        caplog: pytest.LogCaptureFixture) -> None:
    jitted = _step()
    calls: list[str] = []

    def fn(*args: Any) -> Any:
        calls.append("jit")
        return jitted(*args)

    step = prelower.AheadStep(fn)
    _, batch_sharding = _shardings()
    batch = jax.device_put(jnp.ones((8, 8), jnp.float32), batch_sharding)
    _, loss = step(_init(), batch)  # not compiled yet: the jitted function
    assert calls == ["jit"]
    step.compiled = jitted.lower(*_abstract()).compile()
    _, again = step(_init(), batch)
    assert calls == ["jit"] and float(again) == float(loss)  # the program, the same result
    replicated = jax.device_put(jnp.ones((8, 8), jnp.float32), NamedSharding(_mesh(), P()))
    with caplog.at_level(logging.WARNING, logger="reprieve"):
        step(_init(), replicated)  # another sharding: refused before it ran, the jitted function compiles for it
    assert calls == ["jit", "jit"] and step.compiled is None
    assert "the program compiled ahead refused the step's arguments" in caplog.text


def test_compile_ahead_compiles_a_module_that_fits_and_lowers_again_one_that_does_not(
        caplog: pytest.LogCaptureFixture) -> None:
    """CompileAhead with a module lowered ahead (here lowered in this process, on its backend: compile_lowered swaps
    in the current one either way): one that fits the arguments is compiled and handed to the step the loop calls,
    computing what the jitted function computes; one lowered for other arguments (as after a resize) is not used:
    the step is lowered again beside the restore, and the loop's step is the jitted function."""
    from reprieve.compile_ahead import CompileAhead

    state, batch = _abstract()
    _, batch_sharding = _shardings()
    real_batch = jax.device_put(jnp.ones((8, 8), jnp.float32), batch_sharding)
    jitted = _step()
    _, want = jitted(_init(), real_batch)

    fits = prelower.AheadStep(jitted)
    ahead = CompileAhead(jitted, (state, batch), {}, prelowered=_step().lower(state, batch), step=fits)
    ahead.wait()
    assert ahead.ok and ahead.from_ahead and fits.compiled is not None and ahead.donates_inputs()
    _, got = fits(_init(), real_batch)
    assert float(got) == float(want)

    other = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=batch_sharding)
    refused = prelower.AheadStep(jitted)
    with caplog.at_level(logging.INFO, logger="reprieve"):
        ahead = CompileAhead(jitted, (state, batch), {}, prelowered=_step().lower(state, other), step=refused)
        ahead.wait()
    assert ahead.ok and not ahead.from_ahead and refused.compiled is None
    assert "the step lowered before the devices does not fit them (argument 2: float32[8, 8] against" in caplog.text
