"""crc32c over buffers in place: the one checksum helper both tiers use (the memory tier's shards and manifests,
the storage restore's chunk files). Pure (no JAX: the replica server in reprieve-supervisor uses it too)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
from typing import Any

import numpy as np


def crc32c(data: Any, start: int = 0, stop: int | None = None, *, crc: int = 0) -> int:
    """crc32c of ``data[start:stop]`` (bytes, a numpy array, an mmap), continued from ``crc`` (the crc32c of the
    bytes before it), without copying it: Google's crc32c library (hardware-accelerated, ~9-10 GiB/s on the test
    VM) through ctypes, which also releases the GIL. Every view is released before it returns, also on errors, so
    the caller can close a mapping it read."""
    with memoryview(data) as whole, whole.cast("B") as flat, flat[start:stop] as part:
        extend = _extend()
        if extend is None or len(part) == 0:
            import google_crc32c

            return int(google_crc32c.extend(crc, part.tobytes()))
        if part.readonly:
            # A read-only buffer (bytes; the save's np.asarray view of each staged shard) by its address: ctypes'
            # from_buffer wants a writable one, and a copy of it (tobytes) cost a fresh allocation of the whole
            # shard on every memory-tier save.
            view = np.frombuffer(part, np.uint8)
            try:
                return int(extend(crc, view.ctypes.data, len(part)))
            finally:
                del view
        buf = (ctypes.c_char * len(part)).from_buffer(part)
        try:
            return int(extend(crc, buf, len(part)))
        finally:
            del buf


POLY = 0x82F63B78  # crc32c's polynomial, reflected


def _multmodp(a: int, b: int) -> int:
    """``a`` times ``b`` modulo the polynomial (both reflected: bit 31 is x^0), as zlib's ``multmodp``."""
    m, p = 1 << 31, 0
    while a:
        if a & m:
            p ^= b
            a ^= m
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))  # x^(2^k)
    return table


_X2N = _x2n_table()


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The crc32c of ``A + B`` from ``crc1`` (of A), ``crc2`` (of B) and B's length (pure; zlib's
    ``crc32_combine`` for this polynomial): pieces checked apart, on several threads or as they arrive, give
    the shard's recorded checksum without reading it again."""
    p, k, n = 1 << 31, 3, len2  # x^(8 * len2) mod P
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


@functools.cache
def _extend() -> Any:
    """``crc32c_extend`` of the library the google-crc32c wheel bundles (its Python binding takes only bytes, so
    a check of a mapped copy would copy it first); None when it is not there (a source build): then the binding."""
    import google_crc32c

    root = os.path.dirname(os.path.dirname(google_crc32c.__file__))
    for path in sorted(glob.glob(os.path.join(root, "google_crc32c.libs", "libcrc32c*.so*"))):
        fn = _load_extend(path)
        if fn is not None:
            return fn
    # The system's library only when the wheel bundles none: find_library runs gcc and ldconfig (~10 ms, an eighth
    # of a 1 GiB own-memory restore, paid by its first checksum).
    system = ctypes.util.find_library("crc32c")
    return _load_extend(system) if system else None


def _load_extend(path: str) -> Any:
    """``crc32c_extend`` of the library at ``path``, typed for ctypes; None when it cannot be loaded."""
    try:
        fn = ctypes.CDLL(path).crc32c_extend
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    return fn
