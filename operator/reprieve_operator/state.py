"""Process-local operator state. Everything here can be re-derived from the cluster after a restart."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import apply
from .cache import Cache
from .models import GROUP, KIND, VERSION
from .policy.signals import Signal

Key = tuple[str, str]


@dataclass
class State:
    api: apply.Api
    signals: tuple[Signal, ...]
    cache: Cache = field(default_factory=Cache)
    horizon_seconds: float = 600.0  # notices further away are held (policy.notice)
    started: datetime = field(default_factory=lambda: datetime.now(UTC))  # operator start (for late deadlines)
    first_seen: dict[str, dict[str, datetime]] = field(default_factory=dict)  # node -> signal -> time
    seen_mono: dict[str, float] = field(default_factory=dict)  # node -> monotonic time of first signal
    notice_nodes: set[str] = field(default_factory=set)  # nodes with a signal of the operator's table
    delivered: set[tuple[str, int, str]] = field(default_factory=set)  # (job uid, attempt, notice id)
    node_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)  # held notice -> re-examine
    requeues: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)  # job -> next reconcile
    create_backoff: dict[Key, tuple[int, float]] = field(default_factory=dict)  # job -> (tries, monotonic due)
    assignments: dict[Key, Any] = field(default_factory=dict)  # in-place job -> its Assignment (we write it)
    custom_jobs: set[Key] = field(default_factory=set)  # jobs with their own custom signals
    locks: dict[Key, asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    pending: dict[Key, bool] = field(default_factory=dict)  # reconcile queued/running -> dirty
    fresh: set[Key] = field(default_factory=set)  # next reconcile of these LISTs pods (resync)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    reconcile_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(16))


def now() -> datetime:
    return datetime.now(UTC)


def job_ref(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"],
            "namespace": meta["namespace"], "uid": meta.get("uid")}
