"""An in-place job's current assignment (the ``<job>-assignment`` ConfigMap the supervisors watch): read it.

The operator is its only writer (``reconcile.apply_outcome``) and keeps its own copy (``Assignments``); the
ConfigMap is read only when that copy is missing (an operator that just started).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from . import ASSIGNMENT_LOSS_EVERY_KEY, ASSIGNMENT_RESIZE_KEY, apply
from .cache import Key
from .models import TrainingJob
from .policy import builders
from .policy.inplace import Assignment

log = logging.getLogger("reprieve_operator")


class Assignments:
    """The owner of the in-place jobs' current assignments as this operator wrote them (it is their only writer);
    a job it has no copy of (an operator that just started) is read from its ConfigMap once.

    A copy belongs to one job object (its uid): a job deleted and created again under the same name never sees
    the deleted one's assignment, even when the deletion's event was missed, and ``forget`` (the job's DELETED
    event) drops it, so a deleted job leaves nothing behind."""

    def __init__(self) -> None:
        self._copies: dict[Key, tuple[str, Assignment]] = {}  # (namespace, name) -> (job uid, assignment)

    def wrote(self, job: TrainingJob, assignment: Assignment) -> None:
        self._copies[(job.namespace, job.name)] = (job.uid, assignment)

    def get(self, job: TrainingJob) -> Assignment | None:
        """This operator's copy for ``job`` (None: none, or one of an earlier job of the same name)."""
        uid, assignment = self._copies.get((job.namespace, job.name), (None, None))
        return assignment if uid == job.uid else None

    def forget(self, key: Key) -> None:
        """The job is deleted."""
        self._copies.pop(key, None)

    def __len__(self) -> int:
        return len(self._copies)

    async def current(self, api: apply.Api, job: TrainingJob) -> Assignment | None:
        """The job's current assignment: this operator's copy, else the ConfigMap."""
        copy = self.get(job)
        if copy is not None:
            return copy
        raw = await apply.run(apply.get_configmap, api, job.namespace, builders.assignment_name(job))
        found = parse_assignment(raw)
        if found is not None:
            self.wrote(job, found)
        return found


def parse_assignment(raw: dict[str, Any] | None) -> Assignment | None:
    if not raw:
        return None
    data = raw.get("data") or {}
    try:
        peers = json.loads(data.get("memoryPeers") or "{}")  # the memory tier's pairing, kept where still valid
        nodes = json.loads(data.get("memoryPeerNodes") or "{}")
        return Assignment(int(data["attempt"]), {str(k): int(v) for k, v in json.loads(data["processes"]).items()},
                          str(data.get("coordinator") or ""), {int(k): str(v) for k, v in peers.items()},
                          {int(k): str(v) for k, v in nodes.items()}, data.get(ASSIGNMENT_RESIZE_KEY),
                          int(data[ASSIGNMENT_LOSS_EVERY_KEY]) if data.get(ASSIGNMENT_LOSS_EVERY_KEY) else None)
    except (KeyError, ValueError, TypeError, AttributeError):
        log.warning("ConfigMap %s/%s is not an assignment (ignored)", (raw.get("metadata") or {}).get("namespace"),
                    (raw.get("metadata") or {}).get("name"))
        return None
