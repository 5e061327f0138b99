"""Job.compile_ahead: the step is lowered and compiled in a background thread beside the restore, so the first step
after a restart lowers nothing (JAX's own monitoring events count the lowerings); failures only cost the head start.
Real JAX on 4 simulated CPU devices, a real checkpoint."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from reprieve.compile_ahead import watch_lowerings

from tests.runtime.test_restore_or import _job, _mesh  # a local job on a checkpoint directory; the 1-D mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _shardings() -> tuple[dict[str, NamedSharding], NamedSharding]:
    mesh = _mesh()
    return {"w": NamedSharding(mesh, P(None, "d")), "b": NamedSharding(mesh, P())}, NamedSharding(mesh, P("d"))


def _step() -> Any:
    """A fresh jitted step each time (a new function: nothing of it is in JAX's in-memory caches)."""
    def step(state: dict[str, jax.Array], batch: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        def loss_fn(s: dict[str, jax.Array]) -> jax.Array:
            return jnp.mean((jnp.tanh(batch @ s["w"]) + s["b"]) ** 2)
        loss, grads = jax.value_and_grad(loss_fn)(state)
        return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), loss
    return jax.jit(step, donate_argnums=0)


def _abstract() -> tuple[dict[str, jax.ShapeDtypeStruct], jax.ShapeDtypeStruct]:
    state, batch = _shardings()
    return ({"w": jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=state["w"]),
             "b": jax.ShapeDtypeStruct((16,), jnp.float32, sharding=state["b"])},
            jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=batch))


def _init() -> dict[str, jax.Array]:
    state, _ = _shardings()
    return {"w": jax.device_put(jnp.ones((8, 16), jnp.float32) / 8, state["w"]),
            "b": jax.device_put(jnp.zeros((16,), jnp.float32), state["b"])}


def _train(root: Path, total: int, *, ahead: tuple[Any, ...] | None) -> tuple[Any, int, tuple[int, float] | None]:
    """One attempt: restore (or init) and train to ``total``; ``ahead``: the arguments for compile_ahead."""
    step_fn = _step()
    abstract, batch_struct = _abstract()
    batch = jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(8, 8) / 64, batch_struct.sharding)
    with _job(root) as job, jax.set_mesh(_mesh()):
        if ahead is not None:  # nothing lowered before the devices here: the step to call is the jitted function
            assert job.compile_ahead(step_fn, *ahead) is step_fn
        state, start = job.restore_or(_init, abstract)
        for step in job.steps(start, total):
            state, _loss = step_fn(state, batch)
            job.save(step, state)
        return state, start, job.first_step_lowerings


def test_the_first_step_after_a_restart_lowers_nothing_when_compiled_ahead(tmp_path: Path) -> None:
    abstract, batch_struct = _abstract()
    _, start, cold = _train(tmp_path / "a", 3, ahead=None)
    assert start == 0 and cold is not None and cold[0] >= 1, f"without compile_ahead the first step lowers: {cold}"

    _, start, plain = _train(tmp_path / "a", 6, ahead=None)
    assert start == 3 and plain is not None and plain[0] >= 1, f"a restart's first step lowers the step: {plain}"

    state, start, ahead = _train(tmp_path / "a", 9, ahead=(abstract, batch_struct))
    assert start == 6
    assert ahead == (0, 0.0), f"the first step after compile_ahead lowered again: {ahead}"

    want, _, _ = _train(tmp_path / "b", 9, ahead=None)  # the same training without a restart's head start
    for k in want:
        np.testing.assert_array_equal(np.asarray(state[k]), np.asarray(want[k]))


def test_a_failing_compile_ahead_is_logged_and_the_step_compiles_at_its_first_call(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    abstract, _ = _abstract()
    wrong = jax.ShapeDtypeStruct((8, 3), jnp.float32, sharding=_shardings()[1])  # 3 columns: w has 8 rows
    with caplog.at_level(logging.INFO, logger="reprieve"):
        state, start, lowered = _train(tmp_path, 2, ahead=(abstract, wrong))
    assert start == 0 and state["w"].shape == (8, 16)
    failed = [r.getMessage() for r in caplog.records if "compile_ahead(step) failed" in r.getMessage()]
    assert failed and "TypeError" in failed[0], [r.getMessage() for r in caplog.records]
    assert lowered is not None and lowered[0] >= 1


def test_compile_ahead_refuses_what_it_cannot_compile_and_a_late_call(tmp_path: Path) -> None:
    with _job(tmp_path) as job:
        with pytest.raises(TypeError, match=r"'step' has no \.lower\(\): pass the jax\.jit function itself"):
            job.compile_ahead(_plain_step, 1)
        for _ in job.steps(0, 1):
            with pytest.raises(RuntimeError, match="call it before Job.steps"):
                job.compile_ahead(_step(), *_abstract())
        job.abandon()


def _plain_step(x: Any) -> Any:  # not jitted
    return x


_plain_step.__name__ = "step"


def test_the_watch_counts_only_the_watching_threads_lowerings() -> None:
    import threading

    x = jnp.ones(7)
    with watch_lowerings() as mine:
        other = threading.Thread(target=lambda: jax.jit(lambda x: x * 3 + 1).lower(x))
        other.start()
        other.join()
        assert mine.count == 0, "another thread's lowering was counted"
        jax.jit(lambda x: x * 5 - 2).lower(x)
        assert mine.count == 1 and mine.seconds > 0
    jax.jit(lambda x: x * 7 - 2).lower(x)
    assert mine.count == 1, "a lowering after the block was counted"


def _pointers(state: dict[str, jax.Array]) -> dict[str, list[int]]:
    return {k: sorted(s.data.unsafe_buffer_pointer() for s in v.addressable_shards) for k, v in state.items()}


def test_a_donating_steps_restored_state_is_in_memory_xla_owns_so_its_first_call_updates_it_in_place(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A CPU restore's arrays are its own host buffers, adopted (one copy a byte), which a donation cannot reuse:
    the first call of a donating step would write the whole state anew. When the step compiled ahead donates, the
    restored state is copied into memory XLA owns, and the donation works from the first call; ``donated=False``
    keeps the adopted buffers (the premise: that first call writes new memory)."""
    sharding = NamedSharding(_mesh(), P(None, "d"))
    replicated = NamedSharding(_mesh(), P())

    def init() -> dict[str, jax.Array]:
        return {"w": jax.device_put(jnp.zeros((256, 1024), jnp.float32), sharding),  # 1 MiB: adopted, not copied
                "k": jax.device_put(jax.random.key(7), replicated)}  # a typed key rides along

    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), init())
    donating = jax.jit(lambda s: {"w": s["w"] + 1.0, "k": jax.random.split(s["k"], 1)[0]}, donate_argnums=0)
    with _job(tmp_path) as job, jax.set_mesh(_mesh()):
        state, start = job.restore_or(init, abstract)
        for step in job.steps(start, 2):
            state = donating(state)
            job.save(step, state)

    for donated in (None, True, False):
        with _job(tmp_path) as job, jax.set_mesh(_mesh()), caplog.at_level(logging.INFO):
            caplog.clear()
            job.compile_ahead(donating, abstract)
            state, start = job.restore_or(init, abstract, donated=donated)
            assert start == 2
            before = _pointers({"w": state["w"]})
            out = donating(state)
            assert (_pointers({"w": out["w"]}) == before) is (donated is not False), (donated, before, _pointers(out))
            np.testing.assert_array_equal(np.asarray(out["w"]), np.full((256, 1024), 3.0, np.float32))
            said = [r.getMessage() for r in caplog.records if "copied into memory the CPU devices own" in r.getMessage()]
            assert bool(said) is (donated is not False), said
            if donated:  # known before the bytes were read: the restore put XLA's own copies, no copy after it
                assert "as it was put on the devices" in said[0], said
            for _ in job.steps(start, start):
                pass


def test_compile_ahead_says_whether_the_step_donates_once_lowered() -> None:
    from reprieve.compile_ahead import CompileAhead

    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    assert CompileAhead(jax.jit(lambda x: x + 1, donate_argnums=0), (spec,), {}).donates_inputs() is True
    assert CompileAhead(jax.jit(lambda x: x + 1), (spec,), {}).donates_inputs() is False
    wrong = CompileAhead(jax.jit(lambda x: x @ x), (jax.ShapeDtypeStruct((2, 3), jnp.float32),), {})
    assert wrong.donates_inputs() is False  # the lowering failed: nothing is known, nothing is copied
    wrong.wait()
    assert wrong.ok is False


def test_a_step_lowered_before_the_devices_says_it_donates_before_its_compile_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The module ``reprieve.lower_ahead`` lowered knows its donations: ``donates_inputs`` answers while that
    module's compile still runs, so the restore (which asks, to copy a donated state into memory XLA owns) goes on
    beside the compile instead of waiting for it; the compiled program is the step's once the compile ends."""
    import threading

    from reprieve import prelower
    from reprieve.compile_ahead import CompileAhead

    mesh = _mesh()
    spec = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh, P("d")))
    fn = jax.jit(lambda x: x * 2, donate_argnums=0)
    pre = fn.lower(spec)
    release, entered = threading.Event(), threading.Event()
    real = prelower.compile_lowered

    def held(lowered: Any, devices: tuple[Any, ...]) -> Any:
        entered.set()
        assert release.wait(30)
        return real(lowered, devices)

    monkeypatch.setattr(prelower, "compile_lowered", held)
    step = prelower.AheadStep(fn)
    ahead = CompileAhead(fn, (spec,), {}, prelowered=pre, step=step)
    try:
        assert entered.wait(30)
        answer: list[bool] = []
        asker = threading.Thread(target=lambda: answer.append(ahead.donates_inputs()), daemon=True)
        asker.start()
        asker.join(10)
        assert answer == [True] and ahead.ok is None  # answered while the compile is held
    finally:
        release.set()
    ahead.wait()
    assert ahead.ok is True and ahead.from_ahead and step.compiled is not None
    x = jax.device_put(jnp.arange(8, dtype=jnp.float32), spec.sharding)
    np.testing.assert_array_equal(np.asarray(step(x)), np.arange(8, dtype=np.float32) * 2)
