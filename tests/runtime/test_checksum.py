"""``reprieve.checksum.crc32c``: the one checksum both tiers check every restored byte with."""

from __future__ import annotations

import ctypes.util

import google_crc32c
import numpy as np
import pytest
from reprieve import checksum

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_the_bundled_library_is_loaded_without_searching_the_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheel's own library is found first; the system search (gcc and ldconfig, ~10 ms: an eighth of a 1 GiB
    own-memory restore, paid by its first checksum) runs only when the wheel bundles none."""
    def search(name: str) -> str:
        raise AssertionError(f"find_library({name!r}) ran although the wheel bundles the library")

    monkeypatch.setattr(ctypes.util, "find_library", search)
    checksum._extend.cache_clear()
    try:
        assert checksum._extend() is not None
    finally:
        checksum._extend.cache_clear()


def test_a_buffer_checked_in_pieces_gives_the_crc32c_of_the_whole() -> None:
    data = np.random.default_rng(0).integers(0, 255, 3 << 20, dtype=np.uint8)
    whole = google_crc32c.value(data.tobytes())
    assert checksum.crc32c(data) == whole
    crc = 0
    for a in range(0, data.nbytes, 1 << 20):
        crc = checksum.crc32c(data, a, a + (1 << 20), crc=crc)
    assert crc == whole
    assert checksum.crc32c(data.tobytes()) == whole  # a read-only buffer, by its address


@pytest.mark.parametrize(("first", "second"), [(0, 0), (0, 5), (5, 0), (1, 1), (1000, 33), (3 << 20, 7), (17, 1 << 20)])
def test_two_checksums_combine_into_that_of_the_bytes_one_after_the_other(first: int, second: int) -> None:
    """Chunks of a shard checked apart (on the threads that received them) give the shard's crc32c."""
    rng = np.random.default_rng(first * 31 + second)
    a, b = rng.bytes(first), rng.bytes(second)
    assert checksum.crc32c_combine(google_crc32c.value(a), google_crc32c.value(b), second) == google_crc32c.value(a + b)
