"""Where a restore read, by name: the memory tier's restore tiers and restore sources (``docs/contract.toml``,
``[memory] restore_tiers`` and ``restore_sources``; ``tests/test_contract.py`` binds them), each with the words an
Event says it in. One table each: ``status.lastRestore``, the ``Restored`` Event, the goodput accounting's restores
by tier and the metrics take their names from here.

A name this operator does not know (a runtime newer than the operator, a typo in a hand-written report) is not
dropped: ``status.lastRestore`` keeps the restore with that process's source as :data:`UNKNOWN`, the operator logs
the word it got once (when the restore is recorded), and the ``Restored`` Event is a Warning that names it.
"""

from __future__ import annotations

from collections.abc import Iterable

# restoredFrom.tier: where the attempt as a whole read
TIERS: dict[str, str] = {"memory": "the memory tier", "mixed": "memory and storage", "storage": "storage"}
# restoredFrom.sources[i]: where process i read
SOURCES: dict[str, str] = {"memory": "own memory", "peer": "a peer's memory", "storage": "storage"}
UNKNOWN = "unknown"  # a source (or tier) name not in the table
UNKNOWN_WORDS = "a source this operator does not know"


def known(name: object, table: dict[str, str]) -> str:
    """``name`` if ``table`` has it, else :data:`UNKNOWN`."""
    return name if isinstance(name, str) and name in table else UNKNOWN


def unknown_names(names: Iterable[object], table: dict[str, str]) -> list[str]:
    """The names of ``names`` that ``table`` does not have, as they were reported (sorted, each once)."""
    return sorted({str(n) for n in names if not (isinstance(n, str) and n in table)})
