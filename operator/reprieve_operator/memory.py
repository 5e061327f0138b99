"""Memory diagnostics: hand freed heap back to the OS, and (``REPRIEVE_TRACEMALLOC=1``) log where it is held."""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("reprieve_operator")
ENV_TRACE = "REPRIEVE_TRACEMALLOC"


def start_tracing() -> None:
    """With ``REPRIEVE_TRACEMALLOC=1``, trace allocations from now on (each resync round logs the top ones)."""
    if os.environ.get(ENV_TRACE) == "1":
        import tracemalloc

        tracemalloc.start(4)


def release() -> None:
    """Hand freed heap back to the OS (glibc keeps it after bursts such as the initial listing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def log_top_allocations() -> None:
    """While tracing, log where memory is held: a diagnosis aid."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return
    snap = tracemalloc.take_snapshot()
    for stat in snap.statistics("traceback")[:12]:
        log.info("memory: %.1f MB in %d blocks at %s", stat.size / 1e6, stat.count,
                 " <- ".join(str(f) for f in stat.traceback[-6:]))


def each_resync() -> None:
    release()
    log_top_allocations()
