"""``reprieve.finished``: the last step whose results exist, from one probe per step (fake probes for the order
and error rules; real JAX arrays for the probe itself). The multi-process case (a survivor of a killed process 0
says the gang's last finished step, not its loop's) is in ``test_startup_and_peers.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reprieve.finished import MAX_PENDING, FinishedSteps

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Probe:
    def __init__(self) -> None:
        self.ready, self.error = False, False

    def is_ready(self) -> bool:
        return self.ready

    def block_until_ready(self) -> None:
        assert self.ready, "only called once ready"
        if self.error:
            raise RuntimeError("the collective failed: peer lost")


class Computing:
    """The probed leaf of step ``state``'s state: still computing when the loop hands it over."""

    def __init__(self, state: int) -> None:
        self.state = state

    def is_ready(self) -> bool:
        return False


def settled(finished: FinishedSteps) -> tuple[int, float] | None:
    """:meth:`FinishedSteps.last` once every probe dispatched so far is computed (a probe runs a moment after the
    state it reads: waiting for the state alone races it)."""
    for _step, _t, probe in list(finished._pending):
        try:
            probe.block_until_ready()
        except Exception:  # noqa: BLE001, S110 - a failed step's probe: last() says so
            pass
    return finished.last()


def probed(monkeypatch: pytest.MonkeyPatch) -> tuple[FinishedSteps, dict[int, Probe]]:
    finished, probes = FinishedSteps(probe=True), {}

    def dispatch(leaf: Computing) -> Probe:
        probes[leaf.state] = Probe()
        return probes[leaf.state]

    monkeypatch.setattr(finished, "_leaf", Computing)
    monkeypatch.setattr(finished, "_dispatch", dispatch)
    return finished, probes


def test_the_last_finished_step_is_the_newest_one_computed_not_the_newest_handed_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    finished, probes = probed(monkeypatch)
    for step in range(5):
        finished.note(step, step, t=float(step))
    assert finished.last() is None and finished.noted == 4  # none computed yet
    probes[0].ready = probes[1].ready = True
    assert finished.last() == (1, 1.0)
    probes[3].ready = True  # out of order cannot happen; the rule stops at the first one still running
    assert finished.last() == (1, 1.0)
    probes[2].ready = True
    assert finished.last() == (3, 3.0)


def test_a_failed_step_and_every_step_after_it_never_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    finished, probes = probed(monkeypatch)
    for step in range(6):
        finished.note(step, step, t=float(step))
    for step in range(6):
        probes[step].ready = True  # an errored result reads as ready
    probes[3].error = True
    assert finished.last() == (2, 2.0)
    finished.note(6, 6, t=6.0)  # a step after the failure (it would fail too) is not counted either
    assert finished.last() == (2, 2.0)


def test_a_step_failed_already_when_handed_over_did_not_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    finished = FinishedSteps(probe=True)

    def computed(state: Any) -> Probe:  # the leaf itself, its step over already: failed in step 1
        leaf = Probe()
        leaf.ready, leaf.error = True, state == 1
        return leaf

    monkeypatch.setattr(finished, "_leaf", computed)
    finished.note(0, 0, t=0.0)
    finished.note(1, 1, t=1.0)
    assert finished.last() == (0, 0.0)


def test_a_loop_far_ahead_keeps_its_oldest_probes_and_probes_again_once_they_finish(
        monkeypatch: pytest.MonkeyPatch) -> None:
    finished, probes = probed(monkeypatch)
    for step in range(MAX_PENDING + 1000):  # JAX queued 1000 steps past what the gang computed
        finished.note(step, step, t=float(step))
    assert sorted(probes) == list(range(MAX_PENDING))  # the newest wait for room; the oldest say where it is
    for step in range(8):
        probes[step].ready = True
    assert finished.last() == (7, 7.0)
    for step in range(MAX_PENDING):
        probes[step].ready = True
    finished.note(2000, 2000, t=2000.0)  # room again: probed
    assert 2000 in probes and finished.last() == (MAX_PENDING - 1, MAX_PENDING - 1.0)


def test_a_host_state_is_finished_when_handed_over() -> None:
    finished = FinishedSteps(probe=True)
    finished.note(7, {"w": [1.0, 2.0]}, t=3.0)
    assert finished.last() == (7, 3.0)


def test_a_state_the_probe_cannot_read_falls_back_to_the_loops_position(monkeypatch: pytest.MonkeyPatch) -> None:
    finished = FinishedSteps(probe=True)

    def broken(state: Any) -> None:
        raise TypeError("not a pytree of arrays")

    monkeypatch.setattr(finished, "_leaf", broken)
    finished.note(3, object(), t=1.0)
    finished.note(4, object(), t=2.0)
    assert finished.last() == (4, 2.0)


def test_real_arrays_are_finished_once_computed() -> None:
    import jax
    import jax.numpy as jnp

    step_fn = jax.jit(lambda s: {"w": jnp.tanh(s["w"] @ s["w"]), "b": s["b"] + 1}, donate_argnums=0)
    state = {"w": jnp.full((64, 64), 0.01), "b": jnp.zeros((3,))}
    finished = FinishedSteps(probe=True)
    for step in range(20):
        state = step_fn(state)
        finished.note(step, state, t=float(step))
    jax.block_until_ready(state)
    last = settled(finished)
    assert last is not None and last[0] == 19


def test_a_single_process_has_no_survivor_to_say_a_step_so_nothing_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    import jax.numpy as jnp

    finished = FinishedSteps()  # this test process is a job of one process
    looked: list[Any] = []
    monkeypatch.setattr(finished, "_leaf", looked.append)  # what every probe starts with (prepare's and note's)
    finished.prepare({"w": jnp.ones((4, 4))})
    for step in range(3):
        finished.note(step, {"w": jnp.ones((4, 4))}, t=float(step))
    assert looked == [] and finished.last() == (2, 2.0) and finished.noted == 2


def counting_dispatches(monkeypatch: pytest.MonkeyPatch, finished: FinishedSteps) -> list[Any]:
    dispatched: list[Any] = []
    dispatch = finished._dispatch

    def counted(leaf: Any) -> Any:
        dispatched.append(leaf)
        return dispatch(leaf)

    monkeypatch.setattr(finished, "_dispatch", counted)
    return dispatched


def test_a_step_computed_by_its_save_is_said_at_once_without_a_probe_even_once_donated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import jax
    import jax.numpy as jnp

    step_fn = jax.jit(lambda s: {"w": s["w"] * 1.01}, donate_argnums=0)
    state = jax.block_until_ready({"w": jnp.ones((8, 8))})
    finished = FinishedSteps(probe=True)
    dispatched = counting_dispatches(monkeypatch, finished)
    finished.note(0, state, t=0.5)
    state = jax.block_until_ready(step_fn(state))  # step 0's array donated before anyone asks: kept, it would
    assert dispatched == [] and finished.last() == (0, 0.5)  # read as failed (a deleted array)
    finished.note(1, state, t=1.5)
    assert dispatched == [] and finished.last() == (1, 1.5)


def test_a_step_still_computing_at_its_save_is_probed_and_said_once_computed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import jax
    import jax.numpy as jnp

    slow = jax.jit(lambda s: {"w": jax.lax.fori_loop(0, 40, lambda i, w: jnp.tanh(w @ w), s["w"])},
                   donate_argnums=0)
    state = jax.block_until_ready(slow({"w": jnp.full((256, 256), 0.001)}))  # compiled
    finished = FinishedSteps(probe=True)
    finished.prepare(state)
    dispatched = counting_dispatches(monkeypatch, finished)
    state = slow(state)  # tens of ms of matmuls: not computed when the loop hands it over
    finished.note(0, state, t=0.5)
    assert len(dispatched) == 1 and finished.last() is None
    jax.block_until_ready(slow(state))  # step 0's state donated by step 1, its probe still says
    assert settled(finished) == (0, 0.5)


def test_the_probe_compiled_for_the_steps_outputs_lowers_nothing_at_the_first_probe() -> None:
    """What ``Job.compile_ahead`` hands over (``Compiled.out_info``): a restart's first step, still computing when
    saved, then dispatches a probe compiled already (its lowering would be restart gap)."""
    import jax
    import jax.numpy as jnp
    from reprieve.compile_ahead import watch_lowerings

    slow = jax.jit(lambda s: {"w": jax.lax.fori_loop(0, 40, lambda i, w: jnp.tanh(w @ w), s["w"])},
                   donate_argnums=0)
    # placed on its device and not weakly typed, as a model's parameters (the step's outputs are then too)
    state = {"w": jax.device_put(jnp.full((256, 256), 0.001, jnp.float32), jax.devices()[0])}
    compiled = slow.lower(state).compile()
    finished = FinishedSteps(probe=True)
    finished.prepare_outputs(compiled.out_info)
    state = compiled(state)  # still computing when handed over: probed
    with watch_lowerings() as lowered:
        finished.note(0, state, t=0.5)
    assert finished._pending, "computed already: not probed (the step is too fast for this test)"
    assert lowered.stop()[0] == 0, "the first probe compiled itself"
    assert settled(finished) == (0, 0.5)


def test_the_probed_leaf_is_found_again_by_its_place_and_again_when_the_state_changes_shape() -> None:
    import jax
    import jax.numpy as jnp

    class Opaque:  # a pytree node registered without keys: its leaf is found by flattening
        def __init__(self, w: Any) -> None:
            self.w = w

    jax.tree_util.register_pytree_node(Opaque, lambda o: ((o.w,), None), lambda _, children: Opaque(*children))
    finished = FinishedSteps(probe=True)
    for step, state in enumerate([
        {"host": [1.0], "params": [{"b": jnp.ones(2), "w": jnp.ones(3)}]},  # the first leaf on a device: params[0].b
        {"host": [1.0], "params": [{"b": jnp.full(2, 2.0), "w": jnp.ones(3)}]},
        {"host": [1.0], "params": [{"b": 9.0, "w": jnp.full(3, 2.5)}]},  # a host value there now: found again
        {"params": [{"w": jnp.full(3, 3.0)}]},  # laid out otherwise: found again
        Opaque(jnp.full(4, 4.0)),
        Opaque(jnp.full(4, 5.0)),
    ]):
        leaf = finished._leaf(state)
        assert leaf is not None and float(leaf[0]) == [1.0, 2.0, 2.5, 3.0, 4.0, 5.0][step], (step, leaf)
        finished.note(step, jax.block_until_ready(state), t=float(step))
        assert finished.last() == (step, float(step))


def test_the_probe_works_under_the_loops_mesh() -> None:
    """The example trains under ``jax.set_mesh(mesh)``: jit then refused the probe of a one-device shard ("Received
    incompatible devices for jitted computation"), and every attempt of the 30-minute soak at f25d4b8 fell back to
    the loop's position (a survivor said a step past the one its gang finished: 5 of 46 faults +1). A real
    4-device mesh in a process of its own (the device count is fixed at JAX's start)."""
    script = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from reprieve.finished import FinishedSteps
mesh = Mesh(np.array(jax.devices()), ("p",))
assert len(jax.devices()) == 4
step_fn = jax.jit(lambda s: {"w": jnp.tanh(s["w"] * 1.01)}, donate_argnums=0)
finished = FinishedSteps(probe=True)
with jax.set_mesh(mesh):
    state = {"w": jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, P("p")))}
    finished.prepare(state)  # dispatches the probe (a step computed by the time it is saved dispatches none)
    assert not finished._off, "the probe was turned off"
    for step in range(5):
        state = step_fn(state)
        finished.note(step, state, t=float(step))
    jax.block_until_ready([probe for _, _, probe in finished._pending])  # a probe runs just after its state
    assert not finished._off, "the probe was turned off"
    assert finished.last() == (4, 4.0), finished.last()
print("ok")
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
