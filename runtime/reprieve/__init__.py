"""Reprieve runtime: preemption-safe checkpointing for JAX training.

    job = reprieve.init()
    state, start = job.restore_or(init_fn)
    for step in job.steps(start, total_steps):
        state = train_step(state, batch(step))
        job.save(step, state)

See ``docs/runtime.md``.
"""

from .agreement import Agreement, AgreementError, Target
from .bootstrap import default_checkpointer, init
from .config import ConfigError, RuntimeConfig
from .coordination import (
    CoordinationError,
    CoordinationTimeout,
    Coordinator,
    JaxCoordinator,
    LocalCoordinator,
)
from .countdown import CountdownSettings, SavePlan, choose_save_step
from .job import Checkpointer, Job
from .metrics import Metrics
from .notice import Notice, parse_downward_file, parse_notice_annotation
from .policy import SavePolicy, should_save

try:  # the checkpoint package is optional at import time: `import reprieve` must never fail because of it
    from .checkpoint import CheckpointManager  # type: ignore[attr-defined]  # noqa: F401
except ImportError:  # pragma: no cover - not present yet
    pass
except Exception as _err:  # noqa: BLE001  # pragma: no cover - a broken checkpoint package must not break the runtime
    import logging as _logging

    _logging.getLogger(__name__).warning("reprieve.checkpoint failed to import: %r", _err)

__all__ = [
    "Agreement", "AgreementError", "Checkpointer", "ConfigError", "CoordinationError", "CoordinationTimeout",
    "Coordinator", "CountdownSettings", "JaxCoordinator", "Job", "LocalCoordinator", "Metrics", "Notice",
    "RuntimeConfig", "SavePlan", "SavePolicy", "Target", "choose_save_step", "default_checkpointer", "init",
    "parse_downward_file", "parse_notice_annotation", "should_save",
]
