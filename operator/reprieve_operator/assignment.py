"""An in-place job's current assignment (the ``<job>-assignment`` ConfigMap the supervisors watch): read it.

The operator is its only writer (``reconcile.apply_outcome``) and keeps its own copy in ``State.assignments``;
the ConfigMap is read only when that copy is missing (an operator that just started).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from . import apply, builders
from .models import TrainingJob
from .policy.inplace import Assignment
from .state import State

log = logging.getLogger("reprieve_operator")


async def assignment_of(state: State, job: TrainingJob) -> Assignment | None:
    """The job's current assignment: the operator's own copy (it is the only writer), else the ConfigMap."""
    key = (job.namespace, job.name)
    if key in state.assignments:
        return state.assignments[key]
    raw = await apply.run(apply.get_configmap, state.api, job.namespace, builders.assignment_name(job))
    found = parse_assignment(raw)
    if found is not None:
        state.assignments[key] = found
    return found


def parse_assignment(raw: dict[str, Any] | None) -> Assignment | None:
    if not raw:
        return None
    data = raw.get("data") or {}
    try:
        return Assignment(int(data["attempt"]), {str(k): int(v) for k, v in json.loads(data["processes"]).items()},
                          str(data.get("coordinator") or ""))
    except (KeyError, ValueError, TypeError, AttributeError):
        log.warning("ConfigMap %s/%s is not an assignment (ignored)", (raw.get("metadata") or {}).get("namespace"),
                    (raw.get("metadata") or {}).get("name"))
        return None
