"""Memory diagnostics: hand freed heap back to the OS, and (``REPRIEVE_TRACEMALLOC=1``) log where it is held and
what grew since the cache was primed;
``REPRIEVE_MEMORY_CENSUS=1``: log the live objects by type and the dicts by their keys (which structure holds them)."""

from __future__ import annotations

import collections
import ctypes
import gc
import logging
import os
import sys

log = logging.getLogger("reprieve_operator")
ENV_TRACE = "REPRIEVE_TRACEMALLOC"
ENV_CENSUS = "REPRIEVE_MEMORY_CENSUS"


def start_tracing() -> None:
    """With ``REPRIEVE_TRACEMALLOC=1``, trace allocations from now on (each resync round logs the top ones)."""
    if os.environ.get(ENV_TRACE) == "1":
        import tracemalloc

        tracemalloc.start(8)


def rss_mb() -> float:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def release() -> None:
    """Hand freed heap back to the OS (glibc keeps it after bursts such as the initial listing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


_primed: list[object] = []  # the snapshot taken once the cache was primed (while tracing)


def mark_primed() -> None:
    """While tracing: remember what is allocated now (the cache primed), so each round logs what grew since."""
    import tracemalloc

    if tracemalloc.is_tracing():
        _primed[:] = [tracemalloc.take_snapshot()]


def log_top_allocations() -> None:
    """While tracing, log where memory is held, and what grew since the cache was primed: a diagnosis aid."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return
    snap = tracemalloc.take_snapshot()
    for stat in snap.statistics("traceback")[:12]:
        log.info("memory: %.1f MB in %d blocks at %s", stat.size / 1e6, stat.count,
                 " <- ".join(str(f) for f in stat.traceback[-8:]))
    for diff in snap.compare_to(_primed[0], "traceback")[:12] if _primed else []:  # type: ignore[arg-type]
        log.info("memory since primed: %+.1f MB in %+d blocks at %s", diff.size_diff / 1e6, diff.count_diff,
                 " <- ".join(str(f) for f in diff.traceback[-8:]))


def census(top: int = 12) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    """The objects the garbage collector tracks (and the untracked dicts they hold), as (type, count, bytes) by
    bytes, and the dicts among them as (their first keys, count, bytes): a dict's keys say whose it is (a pod, a job
    body, kopf's memory). Bytes are each object's own (``sys.getsizeof``), not what it refers to."""
    by_type: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    by_keys: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    def count(obj: object) -> None:
        size = sys.getsizeof(obj)
        row = by_type[type(obj).__name__]
        row[0] += 1
        row[1] += size
        if type(obj) is dict:
            row = by_keys[",".join(str(k) for k in list(obj)[:4])]
            row[0] += 1
            row[1] += size

    for obj in gc.get_objects():
        count(obj)
        for part in gc.get_referents(obj):  # dicts of atomic values only are not tracked: their holder names them
            if type(part) is dict and not gc.is_tracked(part):
                count(part)

    def ranked(rows: dict[str, list[int]]) -> list[tuple[str, int, int]]:
        return sorted(((k, n, b) for k, (n, b) in rows.items()), key=lambda r: -r[2])[:top]

    return ranked(by_type), ranked(by_keys)


def log_census() -> None:
    """With ``REPRIEVE_MEMORY_CENSUS=1``: log :func:`census` (a diagnosis aid; a walk of every object)."""
    if os.environ.get(ENV_CENSUS) != "1":
        return
    log.info("census: RSS %.0f MB", rss_mb())
    sys._debugmallocstats()  # pymalloc's arenas: blocks in use against the memory they keep (stderr)
    types, dicts = census()
    for name, count, size in types:
        log.info("census: %.1f MB in %d %s", size / 1e6, count, name)
    for keys, count, size in dicts:
        log.info("census: %.1f MB in %d dicts {%s}", size / 1e6, count, keys)


def each_resync() -> None:
    release()
    log_top_allocations()
    log_census()
