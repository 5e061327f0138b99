"""benchmarks/donated_first_step.py's premise, checked against the installed JAX: a CPU device adopts the
restore's host buffer (no copy), and a donated step cannot reuse adopted memory, so its first call writes the whole
state into new memory; an array in memory XLA owns is updated in place. A JAX upgrade that changes either shows
here (then the benchmark's ratio, and what restores should land in, change with it)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from reprieve import arrays

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

N = 1 << 21  # 8 MiB of float32: above arrays' huge-page threshold, as a real state's leaves


def test_a_donated_step_reuses_memory_xla_owns_but_not_an_adopted_restore_buffer() -> None:
    device = jax.devices()[0]
    step = jax.jit(lambda x: x.at[:8].add(1.0), donate_argnums=0)

    landed = arrays.host_buffer((N,), np.dtype(np.float32))
    landed[:] = 1.0
    adopted = arrays.on_devices([landed], [[device]])[device]
    assert adopted.unsafe_buffer_pointer() == landed.ctypes.data  # adopted: the restore's one copy a byte
    before = adopted.unsafe_buffer_pointer()
    out = step(adopted)
    assert out.unsafe_buffer_pointer() != before  # the donation could not reuse it: a new state was written

    raw = np.empty(N + 1, np.float32)
    unaligned = raw[1:]  # one element off the 64-byte alignment: the device copies it into memory XLA owns
    unaligned[:] = 1.0
    owned = jax.device_put(unaligned, device)
    before = owned.unsafe_buffer_pointer()
    assert before != unaligned.ctypes.data
    out = step(owned)
    assert out.unsafe_buffer_pointer() == before  # donated: updated in place
    assert float(out[0]) == 2.0 and float(out[-1]) == 1.0
