"""Where each restart restored from, read back from the trainers' logs (pure).

The runtime logs one line per restore (``docs/memory.md``, "Restoring"; ``reprieve/job.py``):

* with the memory tier, every process: ``restored step 14 on process 1 from a peer's memory over the network in
  0.210s (gang: 0=memory, 1=peer)``; the gang part names every process's source (``memory``: its own pod's
  memory, ``peer``: a peer's memory, ``storage``);
* every restore (with the tier or not): ``restored step 14 from /ckpt/checkpoints in 0.21s: resuming at step 15
  (saved by attempt 3)`` (runtimes before the read's seconds: without ``in 0.21s``).

:func:`parse` turns log lines into :class:`Restore` records keyed by the restored step, which is what the step log
knows of an interruption (``Interruption.resumed_at`` - 1): ``make demo`` and ``benchmarks/goodput.py`` print each
interruption's source beside its lost steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# the memory tier's line (groups: step, process, seconds, gang) and every restore's (step, URI, seconds if logged)
TIERED = re.compile(r"restored step (\d+) on process (\d+) from .+? in ([0-9.]+)s \(gang: ([^)]*)\)")
PLAIN = re.compile(r"restored step (\d+) from (\S+?)(?: in ([0-9.]+)s)?: resuming at step \d+")
_WORDS = {"memory": "own memory", "peer": "peer's memory", "storage": "storage"}


@dataclass(frozen=True)
class Restore:
    """One restore of the gang: the step it restored, and each process's source (``{}``: the log did not say
    per process, i.e. the storage tier alone restored, every process from ``uri``)."""

    step: int
    sources: dict[int, str]
    uri: str | None = None
    seconds: float | None = None  # the slowest process's restore (the memory tier), or process 0's storage read

    def describe(self) -> str:
        """``step 339: process 0 from own memory, 1 from peer's memory`` / ``step 300: storage (all)``."""
        took = f" in {self.seconds:.2f}s" if self.seconds is not None else ""
        if not self.sources:
            return f"step {self.step}: storage (all processes){took}"
        parts = [f"{p} from {_WORDS.get(s, s)}" for p, s in sorted(self.sources.items())]
        return f"step {self.step}: process " + ", ".join(parts) + took

    @property
    def kind(self) -> str:
        """``memory`` (every process from memory, own or a peer's), ``storage`` or ``mixed``."""
        kinds = {"storage" if s == "storage" else "memory" for s in self.sources.values()} or {"storage"}
        return kinds.pop() if len(kinds) == 1 else "mixed"


def parse(lines: Iterable[str]) -> dict[int, Restore]:
    """Restores by restored step, from the trainer log lines of every pod of a job (any order, duplicates fine).

    A step restored twice (two interruptions resuming from the same step) keeps the last gang record seen; the
    per-process lines of one restore agree on the gang, so any one of them is enough."""
    tiered: dict[int, Restore] = {}
    plain: dict[int, tuple[str, float | None]] = {}
    for line in lines:
        m = TIERED.search(line)
        if m:
            step, seconds = int(m.group(1)), float(m.group(3))
            gang = {}
            for item in m.group(4).split(","):
                proc, sep, source = item.strip().partition("=")
                if sep and proc.isdigit():
                    gang[int(proc)] = source
            known = tiered.get(step)
            slowest = max(seconds, known.seconds or 0.0) if known is not None and known.sources == gang else seconds
            tiered[step] = Restore(step, gang, seconds=slowest)
            continue
        m = PLAIN.search(line)
        if m:
            plain[int(m.group(1))] = (m.group(2), None if m.group(3) is None else float(m.group(3)))
    out = {step: Restore(step, {}, uri, seconds) for step, (uri, seconds) in plain.items()}
    for step, r in tiered.items():
        out[step] = Restore(step, r.sources, plain.get(step, (None, None))[0], r.seconds)
    return out


def for_resume(restores: dict[int, Restore], resumed_at: int) -> Restore | None:
    """The restore an interruption that resumed at step ``resumed_at`` (its first step) came from."""
    return restores.get(resumed_at - 1)
