"""The last step this process *finished*, not the last one its loop dispatched.

JAX dispatches asynchronously: the loop's ``for step in job.steps(...)`` moves on as soon as a step is queued, so
the step the loop reached can be one or more ahead of the step whose results exist. When a peer is lost, a
survivor says its last finished step (the gang's: training is synchronous) and the operator counts the steps after
it as restart gap, those before it as lost (``docs/goodput.md``). Said from the loop's position, that step was up
to two past the step the gang finished in the chaos soak (``docs/soak.md``).

Per :meth:`Job.save` call (the loop calls it every step) :class:`FinishedSteps` looks at one leaf of the state
(the first on a device, found again by its key path, not by flattening the state). A leaf already computed says
so itself: the step is finished (or failed) now, and nothing is dispatched (a loop that waits for its step, or a
state handed over again). A leaf still computing gets a *probe*: a one-element slice of one local shard,
computed on its device after the step. The state itself cannot be kept (the next step's dispatch donates it, and
a donated array can no longer be asked whether it is ready); the probe is ready once the step's computation is,
and carries its error when a collective of that step failed (an errored result reads as ready; only
``block_until_ready`` tells it apart). Every step still computing is probed: the loop's own step time cannot
choose fewer (a loop running ahead of its device sees its dispatch time, not the step's), and a survivor says its
gang's step exactly. A job of one process looks at nothing (no survivor to say a step: the loop's position
stands). The cost per save, computed or probed, is in benchmarks/RESULTS.md, "The loop's own cost"
(``benchmarks/loop_cost.py``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from typing import Any

from .deferred import DeferredState

log = logging.getLogger(__name__)

MAX_PENDING = 32  # probes not yet seen ready; a loop further ahead (JAX queues steps without bound) probes again
# once the oldest have finished: the step said is then at most the newest probed one
MAX_PREPARED_DEVICES = 8  # prepare_outputs compiles the probe for at most this many of a process's devices


def _probe_fn() -> Any:
    import jax

    return jax.jit(lambda x: x.reshape(-1)[:1])


class FinishedSteps:
    """Probes of the newest steps; :meth:`last` says the newest one finished without error. Thread-safe: the
    training thread notes, any thread asks.

    ``probe``: look at the steps' results at all. None (the default): where a peer can be lost, a job of several
    processes (``jax.process_count() > 1``, read at the first call): a single process has no survivor to say its
    step (``reprieve.bootstrap`` asks only when a peer is lost), so there the last finished step is the loop's
    position, for nothing."""

    def __init__(self, probe: bool | None = None) -> None:
        self._lock = threading.Lock()
        self._pending: deque[tuple[int, float, Any]] = deque()  # (step, perf_counter at save, probe or None)
        self._done: tuple[int, float] | None = None  # the newest step seen finished (ready, no error)
        self._noted: int | None = None  # the newest step noted
        self._probe: Any = None
        self._where: _Where | None = None  # where the probed leaf sits (the first with a local shard)
        self._off = False  # a state the probe could not read: handed over counts as finished (the loop's position)
        self._wanted = probe  # None: decided at the first call (_probing)
        self._on = False  # probing: decided (_probing) and not turned off
        self.failed: tuple[int, str] | None = None  # the first step seen failed and why (every later one fails of it)

    @property
    def noted(self) -> int | None:
        return self._noted

    def prepare(self, state: Any) -> None:
        """Compile the probe for ``state`` (the restored or initial state, laid out as the steps' results) before
        the loop starts, so that the first step after a restart compiles nothing of it (its restart gap). Never
        raises: a state the probe cannot read turns the probe off, as in :meth:`note`."""
        if not self._probing():
            return
        try:
            leaf = self._leaf(state)
            if leaf is not None:
                self._dispatch(leaf).block_until_ready()
        except Exception as err:  # noqa: BLE001 - never a reason not to train; the loop's position instead
            self._turn_off(err)

    def prepare_outputs(self, outputs: Any) -> None:
        """Compile the probe for the step's outputs as compiled ahead (``Compiled.out_info``: its first leaf is the
        state's first, for a step that returns ``(state, ...)``), on each of this process's devices of that
        leaf, so that a step whose outputs are laid out otherwise than its inputs compiles nothing of the probe
        at its first call either. Best effort (the first save compiles what is missing)."""
        import jax

        if outputs is None or not self._probing():
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
        if not (self._on or self._probing()):  # handed over counts as finished: the loop's position
            self._noted, self._done = step, (step, t)
            return
        if type(state) is DeferredState:
            state = state.probe()  # the one leaf looked at, not the state built
        if self._pending:  # only this thread adds probes: none pending stays none (a step computed by its save)
            with self._lock:
                self._settle()
                if len(self._pending) >= MAX_PENDING:  # a loop further ahead: its newest steps wait for room (they
                    self._noted = step  # cannot finish before the oldest ones anyway)
                    return
        try:
            probe = leaf = self._leaf(state)
            # a step computed already is said now, not kept (the next step may donate the array, and a deleted
            # one reads as failed); one that failed already is kept: it reads as failed however it is asked
            if leaf is not None and not leaf.is_ready():
                probe = self._dispatch(leaf)
            elif leaf is not None and _error(leaf) is None:
                probe = None
        except Exception as err:  # noqa: BLE001 - never a reason to stop training; the loop's position instead
            self._turn_off(err)
            probe = None
        if probe is None and not self._pending:  # computed, or nothing on a device (a host-only state: handed
            self._noted, self._done = step, (step, t)  # over means finished); nothing pending for a reader to
            return  # settle meanwhile, so no lock
        with self._lock:
            self._noted = step
            if probe is None:
                self._pending.clear()  # the steps before it finished too (its inputs were their outputs)
                self._done = (step, t)
                return
            self._pending.append((step, t, probe))

    def last(self) -> tuple[int, float] | None:
        """The newest step whose results exist on this process (step, perf_counter when the loop handed it to
        save); None before any was seen finished."""
        with self._lock:
            self._settle()
            return self._done

    def _probing(self) -> bool:
        wanted = self._wanted
        if wanted is None:
            import jax

            wanted = self._wanted = jax.process_count() > 1
        self._on = wanted and not self._off
        return self._on

    def _turn_off(self, err: Exception) -> None:
        with self._lock:
            self._off, self._on = True, False
            self._pending.clear()  # what they would say is older than the loop's position said from now on
        log.info("the last finished step is the loop's position from now on (no probe of the state: %s: %s)",
                 type(err).__name__, err)

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

    def _leaf(self, state: Any) -> Any:
        """The state's first leaf with a local shard: at the place it was last time (a few lookups), else found
        by flattening the state (the first call, or a state laid out otherwise)."""
        where = self._where
        if where is not None:
            leaf = where.find(state)
            if leaf is not None:
                return leaf
        self._where = _Where.first_on_device(state)
        return None if self._where is None else self._where.find(state)

    def _dispatch(self, leaf: Any) -> Any:
        shard = leaf.addressable_data(0)
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


class _Where:
    """Where a leaf sits in a state: its key path as lookups (``state[key]``, ``getattr(state, name)``), or, for a
    node registered without keys, its index among the state's leaves (found by flattening every time)."""

    def __init__(self, lookups: tuple[tuple[bool, Any], ...] | None, index: int, kind: type) -> None:
        self.lookups = lookups  # (by attribute, key) per level; None: by index
        self.index = index
        self.kind = kind  # the leaf's array type: the place holds the same kind of leaf (one type check a save)

    @classmethod
    def first_on_device(cls, state: Any) -> _Where | None:
        import jax

        leaves = jax.tree_util.tree_flatten_with_path(state)[0]
        index = next((i for i, (_, leaf) in enumerate(leaves) if _on_device(leaf)), None)
        if index is None:
            return None
        path, leaf = leaves[index]
        lookups = _lookups(path)
        if lookups is not None and _at(state, lookups) is not leaf:
            lookups = None  # a node whose keys do not look it up (a custom pytree's own keys)
        return cls(lookups, index, type(leaf))

    def find(self, state: Any) -> Any:
        """The leaf at this place in ``state`` if it is the same kind of array as the one found there, else None
        (its sharding is not asked again: a state's leaf keeps its place on the devices while it trains)."""
        if self.lookups is not None:
            try:
                leaf = _at(state, self.lookups)
            except (KeyError, IndexError, AttributeError, TypeError):
                return None
        else:
            import jax

            leaves = jax.tree_util.tree_leaves(state)
            if self.index >= len(leaves):
                return None
            leaf = leaves[self.index]
        return leaf if type(leaf) is self.kind else None


def _lookups(path: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...] | None:
    from jax.tree_util import DictKey, GetAttrKey, SequenceKey

    lookups: list[tuple[bool, Any]] = []
    for entry in path:
        if isinstance(entry, DictKey):
            lookups.append((False, entry.key))
        elif isinstance(entry, SequenceKey):
            lookups.append((False, entry.idx))
        elif isinstance(entry, GetAttrKey):
            lookups.append((True, entry.name))
        else:
            return None
    return tuple(lookups)


def _at(node: Any, lookups: tuple[tuple[bool, Any], ...]) -> Any:
    for by_attribute, key in lookups:
        node = getattr(node, key) if by_attribute else node[key]
    return node


def _on_device(leaf: Any) -> bool:
    import jax

    return isinstance(leaf, jax.Array) and bool(leaf.sharding.addressable_devices)


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
