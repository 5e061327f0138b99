"""Reprieve runtime: preemption-safe checkpointing for JAX training.

    job = reprieve.init()
    state, start = job.restore_or(init_fn, abstract)
    for step in job.steps(start, total_steps):
        state = train_step(state, batch(step))
        job.save(step, state)

See ``docs/runtime.md``. The names below are what a training program calls; the parts they are made of stay
importable from their modules (``reprieve.agreement``, ``reprieve.checkpoint``, ``reprieve.coordination``,
``reprieve.countdown``, ``reprieve.notice``, ``reprieve.policy``, ``reprieve.lifecycle``, ...).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from .bootstrap import init
from .config import ConfigError, RuntimeConfig
from .countdown import CountdownSettings
from .data import DataPositionError
from .jax_workarounds import PreemptionServiceDisabled
from .job import Checkpointer, Job, Restored
from .notice import Notice
from .policy import SavePolicy
from .prelower import lower_ahead
from .topology import Topology, TopologyError
from .trace_ahead import expected_topology
from .virtual import VirtualData, VirtualShardsError

if TYPE_CHECKING:
    from .per_process import PerProcess
    from .virtual_step import VirtualStep

_IMPORTS_JAX = {"VirtualStep": "virtual_step", "PerProcess": "per_process"}  # `import reprieve` does not import JAX: these load when first named

try:
    __version__ = _version("reprieve")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"



def __getattr__(name: str) -> object:
    """``reprieve.orbax``, ``reprieve.checkpoint``, ... after a plain ``import reprieve``: submodules are imported
    when first named (the Orbax checkpointer's module is not imported unless used)."""
    import importlib
    import importlib.util

    if name in _IMPORTS_JAX:
        return getattr(importlib.import_module(f"{__name__}.{_IMPORTS_JAX[name]}"), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Checkpointer", "ConfigError", "CountdownSettings", "DataPositionError", "Job", "Notice", "PerProcess",
    "PreemptionServiceDisabled", "Restored", "RuntimeConfig", "SavePolicy", "Topology", "TopologyError",
    "VirtualData", "VirtualShardsError", "VirtualStep", "__version__", "expected_topology", "init", "lower_ahead",
]
