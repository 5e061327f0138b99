"""What a :class:`reprieve.Job` needs from a checkpoint manager, and what it uses when the manager offers more.

:class:`Checkpointer` is the whole requirement. Each optional capability is one named protocol, and
:meth:`Capabilities.of` checks a checkpointer against all of them once, when the job is built (the way Kueue's
``jobframework`` asserts its optional ``JobWith...`` interfaces in one place). The one exception is
:class:`StepReads`, which only the memory tier's restore round uses and checks, by this protocol, where it reads
(:mod:`reprieve.memtier.restore_round`). ``reprieve.checkpoint.CheckpointManager`` offers all of them,
``reprieve.orbax.OrbaxCheckpointer`` all but :class:`DeferredRetention`, :class:`HostLanding` and
:class:`StepReads`; a checkpointer of the user's own needs only :class:`Checkpointer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

# ``check(record, saved_structure, where)``: Job.restore_or's run-identity check (reprieve.identity)
RestoreCheckFn = Callable[[Any, Any, str], None]


class Checkpointer(Protocol):
    """What every checkpointer does. ``restore(step=None)`` picks the latest complete checkpoint once for all
    processes and raises ``FileNotFoundError`` (on every process alike) when there is none;
    ``last_save_seconds``: ``save`` call to durable commit of the last save, None before one."""

    last_save_seconds: float | None

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None: ...

    def wait(self) -> None: ...

    def latest_step(self) -> int | None: ...

    def restore(self, abstract_state: Any, *, step: int | None = None) -> tuple[int, Any, dict[str, Any]]: ...

    def close(self) -> None: ...


@runtime_checkable
class CommitCallback(Protocol):
    """Calls ``callback(step)`` after every commit: metrics and the progress annotation at once, not at the
    next save."""

    def set_commit_callback(self, callback: Callable[[int], None] | None) -> None: ...


@runtime_checkable
class RestoreCheck(Protocol):
    """Runs the run-identity check on what it restores before any array is read (else the job checks the
    restored record after the fact)."""

    def set_restore_check(self, check: RestoreCheckFn | None) -> None: ...


@runtime_checkable
class ProcessExtra(Protocol):
    """Stores one JSON value per process (its data position) when ``supports_process_extra`` is true; its
    ``restore`` result carries them as ``.process_extra``."""

    supports_process_extra: bool

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None,
             process_extra: Any = None) -> None: ...


@runtime_checkable
class DeferredRetention(Protocol):
    """Leaves the deletion of older checkpoints to the next attempt's first commit (the agreed save before a
    restart must not wait for it)."""

    def defer_retention(self) -> None: ...


@runtime_checkable
class StateCheck(Protocol):
    """Reports a leaf no save can hold at the first ``job.save`` call, not at the first save."""

    def check_state(self, state: Any) -> None: ...


@runtime_checkable
class HostLanding(Protocol):
    """Reads a restore into buffers from ``reprieve.arrays.host_buffer`` when ``lands_in_host_buffers`` is true: so
    into the memory a warm process populated ahead (:mod:`reprieve.landing`). A job whose restores land elsewhere
    (Orbax's own reads) reports no landing bytes, and its next warm process populates none. Its checkpoints record
    what a spare populates ahead: the landing bytes, and after ``set_donated(True)`` (the job's step donates the
    state) the bytes a restore copies into memory XLA allocates on CPU devices."""

    lands_in_host_buffers: bool

    def set_donated(self, donated: bool) -> None: ...


@runtime_checkable
class StepReads(Protocol):
    """Lists its visible checkpoints with their attempts, and reads one process's part of a given one without the
    other processes: a memory-tier restore then reads from storage only what memory lacks (a *mixed* restore,
    :mod:`reprieve.memtier.restore_round`); without it such a restore sends every process to storage.
    ``read_step(..., among=, key=)``: the processes reading that checkpoint now (every one of them passes the same,
    with the same ``key``), which may share the replicated pieces they all need."""

    def visible_checkpoints(self) -> list[tuple[int, int]]: ...

    def read_step(self, step: int, attempt: int, abstract_state: Any, *, among: Sequence[int] | None = None,
                  key: str | None = None) -> ProcessExtraResult: ...


@runtime_checkable
class ProcessExtraResult(Protocol):
    """A restore result with the per-process values saved beside the state (:class:`ProcessExtra`)."""

    process_extra: list[Any] | None


@dataclass(frozen=True)
class Capabilities:
    """The optional capabilities one checkpointer has (None: it has not). Built once, by :meth:`of`."""

    commit_callback: CommitCallback | None = None
    restore_check: RestoreCheck | None = None
    process_extra: ProcessExtra | None = None
    deferred_retention: DeferredRetention | None = None
    state_check: StateCheck | None = None
    host_landing: HostLanding | None = None

    @classmethod
    def of(cls, checkpointer: Checkpointer) -> Capabilities:
        c: Any = checkpointer
        return cls(
            commit_callback=c if isinstance(c, CommitCallback) else None,
            restore_check=c if isinstance(c, RestoreCheck) else None,
            process_extra=c if isinstance(c, ProcessExtra) and c.supports_process_extra else None,
            deferred_retention=c if isinstance(c, DeferredRetention) else None,
            state_check=c if isinstance(c, StateCheck) else None,
            host_landing=c if isinstance(c, HostLanding) and c.lands_in_host_buffers else None,
        )


if TYPE_CHECKING:  # mypy holds this package's two checkpointers to every protocol they offer
    from .checkpoint.manager import CheckpointManager
    from .orbax import OrbaxCheckpointer

    def _offers(m: CheckpointManager, o: OrbaxCheckpointer) -> None:
        _m: tuple[Checkpointer, CommitCallback, RestoreCheck, ProcessExtra, DeferredRetention, StateCheck,
                  HostLanding, StepReads] = (m, m, m, m, m, m, m, m)
        _o: tuple[Checkpointer, CommitCallback, RestoreCheck, ProcessExtra, StateCheck] = (o, o, o, o, o)
