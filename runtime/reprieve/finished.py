"""The last step this process *finished*, not the last one its loop dispatched.

JAX dispatches asynchronously: the loop's ``for step in job.steps(...)`` moves on as soon as a step is queued, so
the step the loop reached can be one or more ahead of the step whose results exist. When a peer is lost, a
survivor says its last finished step (the gang's: training is synchronous) and the operator counts the steps after
it as restart gap, those before it as lost (``docs/goodput.md``). Said from the loop's position, that step was up
to two past the step the gang finished in the chaos soak (``docs/soak.md``).

Per :meth:`Job.save` call (the loop calls it every step) :class:`FinishedSteps` keeps a *probe*: a one-element
slice of one local shard of the state, computed on its device after the step. The state itself cannot be kept
(the next step's dispatch donates it, and a donated array can no longer be asked whether it is ready); the probe
is ready once the step's computation is, and carries its error when a collective of that step failed (an
errored result reads as ready; only ``block_until_ready`` tells it apart). Cost per probe: one leaf lookup and one
tiny dispatch, no wait, no host transfer (``benchmarks/progress.py`` measures it; its figures are in
benchmarks/RESULTS.md, "Cost of progress reports"). Every step is probed: the loop's own step time cannot choose fewer (a loop
running ahead of its device sees its dispatch time, not the step's).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from typing import Any

log = logging.getLogger(__name__)

MAX_PENDING = 32  # probes not yet seen ready; a loop further ahead (JAX queues steps without bound) probes again
# once the oldest have finished: the step said is then at most the newest probed one
MAX_PREPARED_DEVICES = 8  # prepare_outputs compiles the probe for at most this many of a process's devices


def _probe_fn() -> Any:
    import jax

    return jax.jit(lambda x: x.reshape(-1)[:1])


class FinishedSteps:
    """Probes of the newest steps; :meth:`last` says the newest one finished without error. Thread-safe: the
    training thread notes, any thread asks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[tuple[int, float, Any]] = deque()  # (step, perf_counter at save, probe or None)
        self._done: tuple[int, float] | None = None  # the newest step seen finished (ready, no error)
        self._noted: int | None = None  # the newest step noted
        self._probe: Any = None
        self._leaf_path: int | None = None  # index of the leaf probed (the first with a local shard)
        self._off = False  # a state the probe could not read: handed over counts as finished (the loop's position)
        self.failed: tuple[int, str] | None = None  # the first step seen failed and why (every later one fails of it)

    @property
    def noted(self) -> int | None:
        return self._noted

    def prepare(self, state: Any) -> None:
        """Compile the probe for ``state`` (the restored or initial state, laid out as the steps' results) before
        the loop starts, so that the first step after a restart compiles nothing of it (its restart gap). Never
        raises: a state the probe cannot read turns the probe off, as in :meth:`note`."""
        if self._off:
            return
        try:
            probe = self._make_probe(state)
            if probe is not None:
                probe.block_until_ready()
        except Exception as err:  # noqa: BLE001 - never a reason not to train; the loop's position instead
            self._off = True
            log.info("the last finished step is the loop's position from now on (no probe of the state: %s: %s)",
                     type(err).__name__, err)

    def prepare_outputs(self, outputs: Any) -> None:
        """Compile the probe for the step's outputs as compiled ahead (``Compiled.out_info``: its first leaf is the
        state's first, for a step that returns ``(state, ...)``), on each of this process's devices of that
        leaf, so that a step whose outputs are laid out otherwise than its inputs compiles nothing of the probe
        at its first call either. Best effort (the first save compiles what is missing)."""
        import jax

        if self._off or outputs is None:
            return
        leaf = next((x for x in jax.tree_util.tree_leaves(outputs)
                     if getattr(getattr(x, "sharding", None), "addressable_devices", None)), None)
        if leaf is None:
            return
        shape = leaf.sharding.shard_shape(leaf.shape)
        for device in sorted(leaf.sharding.addressable_devices, key=lambda d: d.id)[:MAX_PREPARED_DEVICES]:
            with _no_mesh():
                self._probe_of()(jax.device_put(jax.numpy.zeros(shape, leaf.dtype), device)).block_until_ready()

    def note(self, step: int, state: Any, t: float | None = None) -> None:
        """The loop handed ``step``'s state to save (it may still be computing)."""
        t = time.perf_counter() if t is None else t
        with self._lock:
            self._settle()
            if len(self._pending) >= MAX_PENDING:  # a loop further ahead: its newest steps wait for room (they
                self._noted = step  # cannot finish before the oldest ones anyway)
                return
        probe = None
        if not self._off:
            try:
                probe = self._make_probe(state)
            except Exception as err:  # noqa: BLE001 - never a reason to stop training; the loop's position instead
                self._off = True
                log.info("the last finished step is the loop's position from now on (no probe of the state: %s: %s)",
                         type(err).__name__, err)
        with self._lock:
            self._noted = step
            if probe is None:  # nothing on a device (a host-only state): handed over means finished
                self._pending.clear()
                self._done = (step, t)
                return
            self._pending.append((step, t, probe))

    def last(self) -> tuple[int, float] | None:
        """The newest step whose results exist on this process (step, perf_counter when the loop handed it to
        save); None before any was seen finished."""
        with self._lock:
            self._settle()
            return self._done

    def _settle(self) -> None:
        """Move finished probes, oldest first, into ``_done`` (steps finish in order: stop at the first one still
        running; a failed one and everything after it never finished)."""
        while self._pending:
            step, t, probe = self._pending[0]
            if not _ready(probe):
                return
            self._pending.popleft()
            error = _error(probe)
            if error is not None:
                first = self.failed is None  # said once: a later step fails of the same failure
                self.failed = self.failed or (step, error)
                log.log(logging.INFO if first else logging.DEBUG, "step %d did not finish on this process (%s); the "
                        "last one that did: %s", step, error, None if self._done is None else self._done[0])
                self._pending.clear()  # a failed step poisons every later one (their inputs are its outputs)
                return
            self._done = (step, t)

    def _make_probe(self, state: Any) -> Any:
        import jax

        leaves = jax.tree_util.tree_leaves(state)
        if self._leaf_path is None or self._leaf_path >= len(leaves) or not _on_device(leaves[self._leaf_path]):
            self._leaf_path = next((i for i, leaf in enumerate(leaves) if _on_device(leaf)), None)
            if self._leaf_path is None:
                return None
        shard = leaves[self._leaf_path].addressable_shards[0].data
        with _no_mesh():  # a shard is on one device: under the loop's mesh (``jax.set_mesh``) jit refuses it
            return self._probe_of()(shard)

    def _probe_of(self) -> Any:
        probe = self._probe  # made once: every later step reads it without the lock
        if probe is None:
            with self._lock:
                if self._probe is None:
                    self._probe = _probe_fn()
                probe = self._probe
        return probe


@functools.cache
def _set_mesh() -> Any:
    import jax

    set_mesh = getattr(jax, "set_mesh", None)
    return set_mesh if callable(set_mesh) else None


def _no_mesh() -> Any:
    """A context without the loop's mesh (``jax.set_mesh(None)``; nothing to leave where JAX has no such call).
    Once a step: the lookup is done once."""
    set_mesh = _set_mesh()
    return set_mesh(None) if set_mesh is not None else contextlib.nullcontext()


def _on_device(leaf: Any) -> bool:
    return hasattr(leaf, "addressable_shards") and hasattr(leaf, "is_ready") and bool(leaf.addressable_shards)


def _ready(probe: Any) -> bool:
    try:
        return bool(probe.is_ready())
    except Exception:  # noqa: BLE001 - deleted or otherwise unreadable: treat as an error result (ready)
        return True


def _error(probe: Any) -> str | None:
    """Why the step's computation failed (a lost peer's collective), or None: it finished."""
    try:
        probe.block_until_ready()  # returns at once: only called once ready
    except Exception as err:  # noqa: BLE001 - the step's error, whatever its type
        return f"{type(err).__name__}: {str(err)[:200]}"
    return None
