"""The one place that talks to the JAX coordination service.

Agreement (notices, the agreed save step) and checkpoint commits (barriers) both go through a
:class:`Coordinator`. Two implementations share one contract:

* :class:`JaxCoordinator` wraps the ``DistributedRuntimeClient`` that ``jax.distributed.initialize`` made:
  a key-value store and barriers served by process 0.
* :class:`LocalCoordinator` is the same contract for a single process (no ``jax.distributed``): an
  in-memory store with the same first-writer-wins and timeout semantics.

Every blocking call takes a timeout and, when it runs out, raises :class:`CoordinationTimeout` whose
message names the processes that did not answer, so a stuck job says who to look at.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

_BARRIER_PREFIX = "reprieve/barrier/"


class CoordinationError(RuntimeError):
    """The coordination service failed or refused a request."""


class CoordinationTimeout(CoordinationError):
    """A wait ran out of time. ``missing`` lists the process ids that had not arrived."""

    def __init__(self, message: str, missing: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)


def missing_processes(arrived: Sequence[str], expected: Sequence[int]) -> list[int]:
    """Process ids in ``expected`` whose id is not among the ``arrived`` key suffixes."""
    seen = set()
    for key in arrived:
        tail = key.rsplit("/", 1)[-1]
        if tail.isdigit():
            seen.add(int(tail))
    return [p for p in expected if p not in seen]


class Coordinator:
    """Key-value store plus barriers shared by all processes of one job attempt."""

    process_id: int = 0
    num_processes: int = 1

    # -- key-value ---------------------------------------------------------------------------------
    def set(self, key: str, value: str, *, overwrite: bool = False) -> None:
        raise NotImplementedError

    def claim(self, key: str, value: str) -> bool:
        """Set ``key`` only if nobody has; True when this call was the first writer."""
        raise NotImplementedError

    def get(self, key: str, timeout_s: float) -> str:
        """Block until ``key`` exists; :class:`CoordinationTimeout` after ``timeout_s``."""
        raise NotImplementedError

    def dir_get(self, prefix: str) -> dict[str, str]:
        raise NotImplementedError

    def dir_get_bytes(self, prefix: str) -> dict[str, bytes]:
        """:meth:`dir_get` for values that are not text (what JAX's own collectives keep in the store)."""
        return {k: v.encode() for k, v in self.dir_get(prefix).items()}

    # -- barriers ----------------------------------------------------------------------------------
    def barrier(self, name: str, timeout_s: float, process_ids: Sequence[int] | None = None) -> None:
        """Wait until every process (or ``process_ids``) reached barrier ``name``.

        Names must be unique per use (include the step and attempt). On timeout the error names the
        processes that never arrived.
        """
        expected = list(process_ids) if process_ids is not None else list(range(self.num_processes))
        self.set(f"{_BARRIER_PREFIX}{name}/{self.process_id}", "1", overwrite=True)
        try:
            self._wait_at_barrier(name, timeout_s, process_ids)
        except CoordinationTimeout:
            raise
        except Exception as err:  # the JAX client raises plain XlaRuntimeError on deadline
            arrived = list(self.dir_get(f"{_BARRIER_PREFIX}{name}/"))
            missing = missing_processes(arrived, expected)
            raise CoordinationTimeout(
                f"barrier {name!r} failed after {timeout_s:.1f}s on process {self.process_id}: "
                f"processes {missing} did not arrive ({err})",
                missing,
            ) from err

    def _wait_at_barrier(self, name: str, timeout_s: float, process_ids: Sequence[int] | None) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Leave the job cleanly (no-op for a single process)."""


class LocalCoordinator(Coordinator):
    """Single-process coordinator: the same semantics, in memory."""

    def __init__(self) -> None:
        self.process_id = 0
        self.num_processes = 1
        self._kv: dict[str, str] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: str, *, overwrite: bool = False) -> None:
        with self._cond:
            if not overwrite and key in self._kv:
                raise CoordinationError(f"key {key!r} already exists")
            self._kv[key] = value
            self._cond.notify_all()

    def claim(self, key: str, value: str) -> bool:
        with self._cond:
            if key in self._kv:
                return False
            self._kv[key] = value
            self._cond.notify_all()
            return True

    def get(self, key: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while key not in self._kv:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CoordinationTimeout(f"key {key!r} not set within {timeout_s:.1f}s", [0])
                self._cond.wait(left)
            return self._kv[key]

    def dir_get(self, prefix: str) -> dict[str, str]:
        with self._cond:
            return {k: v for k, v in self._kv.items() if k.startswith(prefix)}

    def _wait_at_barrier(self, name: str, timeout_s: float, process_ids: Sequence[int] | None) -> None:
        return None


class JaxCoordinator(Coordinator):
    """Coordinator over ``jax.distributed``'s ``DistributedRuntimeClient``."""

    def __init__(self, client: Any, process_id: int, num_processes: int) -> None:
        self._client = client
        self.process_id = process_id
        self.num_processes = num_processes

    @classmethod
    def from_jax(cls) -> JaxCoordinator:
        """The coordinator of the already-initialized ``jax.distributed`` runtime."""
        from jax._src import distributed  # the client is not public API; this is its one user

        state = distributed.global_state
        if state.client is None:
            raise CoordinationError("jax.distributed is not initialized; call reprieve.init() first")
        return cls(state.client, state.process_id, state.num_processes)

    def set(self, key: str, value: str, *, overwrite: bool = False) -> None:
        self._client.key_value_set(key, value, allow_overwrite=overwrite)

    def claim(self, key: str, value: str) -> bool:
        try:
            self._client.key_value_set(key, value, allow_overwrite=False)
            return True
        except Exception as err:
            if "ALREADY_EXISTS" in str(err) or "already exists" in str(err).lower():
                return False
            raise CoordinationError(f"claim of {key!r} failed: {err}") from err

    def get(self, key: str, timeout_s: float) -> str:
        try:
            return str(self._client.blocking_key_value_get(key, max(1, int(timeout_s * 1000))))
        except Exception as err:
            if "DEADLINE_EXCEEDED" not in str(err):  # e.g. UNAVAILABLE: the service is gone
                raise CoordinationError(f"get of {key!r} failed on process {self.process_id}: {err}") from err
            raise CoordinationTimeout(
                f"key {key!r} not set within {timeout_s:.1f}s on process {self.process_id}: {err}"
            ) from err

    def dir_get(self, prefix: str) -> dict[str, str]:
        try:
            return {str(k): str(v) for k, v in self._client.key_value_dir_get(prefix)}
        except Exception as err:
            raise CoordinationError(f"dir_get of {prefix!r} failed: {err}") from err

    def dir_get_bytes(self, prefix: str) -> dict[str, bytes]:
        try:
            return {str(k): bytes(v) for k, v in self._client.key_value_dir_get_bytes(prefix)}
        except Exception as err:
            raise CoordinationError(f"dir_get of {prefix!r} failed: {err}") from err

    def live_processes(self) -> list[int]:
        """Process ids the service still sees heartbeating."""
        return sorted(self._client.get_live_nodes(list(range(self.num_processes))))

    def _wait_at_barrier(self, name: str, timeout_s: float, process_ids: Sequence[int] | None) -> None:
        ids = list(process_ids) if process_ids is not None else None
        self._client.wait_at_barrier(f"reprieve:{name}", max(1, int(timeout_s * 1000)), ids)

    def shutdown(self) -> None:
        import jax

        try:
            jax.distributed.shutdown()
        except Exception as err:  # noqa: BLE001 - a peer already gone must not turn a clean exit into a crash
            log.warning("jax.distributed.shutdown failed: %s", err)
