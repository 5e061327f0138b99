"""What ``Job.restore_or`` reads: the latest checkpoint, from the checkpointer alone or through the memory tier's
restore round (its sources: this pod's memory, a peer's, storage, :mod:`reprieve.memtier.sources`), checked
against this run's identity, as one :class:`Read`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, Self, runtime_checkable

from . import data as data_mod
from . import identity
from .capabilities import Capabilities, Checkpointer, ProcessExtraResult, RestoreCheckFn

log = logging.getLogger("reprieve.job")  # the job's restore lines, under the name they always had

# Notice sources whose notice outlives the process that saved for it (a SIGTERM's id names the pod, not the event).
SOURCES_THAT_PERSIST = ("notice-file", "annotation", "job-notice")
FROM_MEMORY = ("memory", "mixed")  # the memory tier's restores that did not read the whole step from storage

# ``read(abstract, check)``: the memory tier's restore round over the storage checkpointer
# (``reprieve.memtier.restore_round.restore``); it runs ``check`` on a memory copy itself.
TieredRead = Callable[[Any, RestoreCheckFn], Any]


@runtime_checkable
class TieredResult(ProcessExtraResult, Protocol):
    """The memory tier's restore result (``reprieve.memtier.restore_round``)."""

    storage_step: int | None
    restored_from: dict[str, Any] | None


class Restored(tuple):  # type: ignore[type-arg]
    """What :meth:`Job.restore_or` returns: unpacks as ``(state, first_step)``; also carries ``data`` (this
    process's saved data position, None without one), ``extra`` (the checkpoint's ``extra``) and ``step``
    (the restored step, None on a fresh start)."""

    data: Any
    extra: dict[str, Any]
    step: int | None

    def __new__(cls, state: Any, first_step: int, *, data: Any = None, extra: dict[str, Any] | None = None,
                step: int | None = None) -> Self:
        self = super().__new__(cls, (state, first_step))
        self.data, self.extra, self.step = data, extra or {}, step
        return self


@dataclasses.dataclass(frozen=True)
class Read:
    """One restored checkpoint. ``committed``: the newest step committed in storage (a restore from memory leaves
    it where it was: the job reports that, not the memory step); ``restored_from``: the memory tier's account of
    where each process read (None without the tier)."""

    step: int
    state: Any
    extra: dict[str, Any]
    process_extra: list[Any] | None
    committed: int | None
    restored_from: dict[str, Any] | None
    seconds: float

    @property
    def record(self) -> dict[str, Any]:
        """The checkpoint's ``reprieve`` record ({} when it has none)."""
        raw = self.extra.get("reprieve")
        return raw if isinstance(raw, dict) else {}

    @property
    def user_extra(self) -> dict[str, Any]:
        return {k: v for k, v in self.extra.items() if k != "reprieve"}

    def position(self, data: Any, process_id: int, num_processes: int,
                 reshard: Callable[[list[Any], int, int], Any] | None) -> Any:
        """This process's saved data position (:func:`reprieve.data.value_for_process`), put back into ``data``
        (the data pipeline, when given) in place."""
        value = data_mod.value_for_process(self.process_extra, process_id, num_processes, reshard)
        if data is not None:
            if value is None:
                log.warning("restored step %d has no data position: the data pipeline starts from its beginning",
                            self.step)
            data_mod.restore_into(data, value)
        return value

    def account(self, loop: Any, metrics: Any, seconds: float) -> None:
        """What the progress reports and the metrics say of this restore (``loop``: ``progress.LoopProgress``)."""
        loop.restore_seconds, loop.restored_from = seconds, self.restored_from
        metrics.observe("reprieve_restore_seconds", seconds)
        metrics.set("reprieve_last_committed_step", -1 if self.committed is None else self.committed)

    def log(self, uri: str, seconds: float) -> None:
        """The restore's line: from ``uri``, and how long the read took, unless the memory tier read it from memory
        (its own line, one per process, says from which pod's memory and already ends with
        :func:`identity.resuming`)."""
        if self.restored_from is not None and self.restored_from.get("tier") in FROM_MEMORY:
            return
        log.info("restored step %d from %s in %.2fs: %s", self.step, uri, seconds,
                 identity.resuming(self.step, self.record))

    def persisting_notice(self) -> str | None:
        """The notice this checkpoint was the agreed save of, when that notice outlives the process (a notice
        file nobody clears on a laptop, the kept pod's annotation): it must not stop the run it stopped once."""
        record = self.record
        if record.get("noticeSource") in SOURCES_THAT_PERSIST and record.get("notice"):
            return str(record["notice"])
        return None


def read_latest(checkpointer: Checkpointer, caps: Capabilities, target: Any, *, run_id: str | None, where: str,
                tiered: TieredRead | None = None) -> Read | None:
    """The latest checkpoint restored onto ``target`` (abstract leaves), None when there is none yet.

    The run-identity check (:mod:`reprieve.identity`) runs before any array is read where the checkpointer
    offers it (:class:`reprieve.capabilities.RestoreCheck`) or the memory tier reads, else on the restored record.
    """
    ours = identity.structure(target)

    def check(record: Any, saved_structure: Any, at: str) -> None:
        problem = identity.mismatch(record.get("run") if isinstance(record, dict) else None, run_id, ours,
                                    saved_structure, at)
        if problem:
            raise identity.RunMismatchError(f"restore_or: {problem}")

    if caps.restore_check is not None:
        caps.restore_check.set_restore_check(check)  # before any array is read, on every process alike
    t0 = time.perf_counter()
    try:
        # step=None: the checkpointer picks the latest complete checkpoint once for all processes
        result = checkpointer.restore(target, step=None) if tiered is None else tiered(target, check)
    except FileNotFoundError:
        return None
    step, state, extra = result
    if caps.restore_check is None and tiered is None:  # checked after the fact
        check(extra.get("reprieve"), None, f"{where} step {step}")
    process_extra = result.process_extra if isinstance(result, ProcessExtraResult) else None
    committed = result.storage_step if isinstance(result, TieredResult) else step
    restored_from = result.restored_from if isinstance(result, TieredResult) else None
    return Read(step, state, extra, process_extra, committed, restored_from, time.perf_counter() - t0)
