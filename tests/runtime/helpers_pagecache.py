"""Dropping files from the page cache, as on a node that never read them (a restore then reads, not maps)."""

from __future__ import annotations

import os


def evict(path: str | os.PathLike[str]) -> None:
    """``fsync`` then ``posix_fadvise(DONTNEED)`` on the file ``path``, or on every file under it. A page some
    process still maps stays cached."""
    paths = [os.path.join(d, f) for d, _, files in os.walk(path) for f in files] if os.path.isdir(path) else [path]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
