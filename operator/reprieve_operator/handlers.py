"""kopf registrations: each handler updates the cache, then hands off to the reconcile queue or ``delivery``.

Triggers: TrainingJob create/update(spec) (retried with ``kopf.TemporaryError`` only when the reconcile fails),
resume (kicked, not awaited: see ``job_resumed``), every TrainingJob event (cache), every Node event (cache + notice
delivery). Worker pods are watched by
``podwatch`` (cache + coalesced reconcile), not by kopf. No kopf timers or daemons: they would put a finalizer on every job.
"""

from __future__ import annotations

from typing import Any

import kopf

from . import delivery, jobwatch, metrics
from .models import GROUP, PLURAL, VERSION
from .state import State

WAIT_DELAY = 2.0


def _state(memo: Any) -> State:
    return memo.state  # type: ignore[no-any-return]


@kopf.on.resume(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
async def job_resumed(namespace: str, name: str, memo: Any, **_: Any) -> None:
    """At the operator's start, every job it finds: its reconcile is kicked, not awaited. Awaited, each of thousands
    of jobs held kopf's worker, its decoded body and kopf's copies of it until one of the reconcile slots was free
    (~45 KB a job, ~110 MB at 2,500 jobs, kept by the heap after); a kicked reconcile reads the cache instead, and
    one that fails is logged, counted and run again by the resync."""
    _state(memo).queue.kick(namespace, name)


@kopf.on.create(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")  # type: ignore[arg-type]
async def job_changed(namespace: str, name: str, memo: Any, **_: Any) -> None:
    """The same reconcile as a pod event's kick: a plan that must look again (old pods draining, a backoff)
    carries its own requeue delay, whichever path ran it."""
    try:
        await _state(memo).queue.run(namespace, name)
    except (kopf.PermanentError, kopf.TemporaryError):
        raise
    except Exception as err:
        metrics.RECONCILE_ERRORS.labels("job").inc()
        raise kopf.TemporaryError(f"reconcile failed: {err}", delay=WAIT_DELAY) from err


@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
async def job_event(event: Any, body: Any, memo: Any, **_: Any) -> None:
    state = _state(memo)
    cache = state.cache
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace")), str(meta.get("name")))
    if event.get("type") == "DELETED":  # nothing of a deleted job stays behind
        cache.delete_job(body)
        state.assignments.forget(key)
        state.commits.forget(key)
        state.nodes.forget_job(key)
        jobwatch.forget(*key)
    else:
        old = cache.jobs.get(key)
        replicas = (body.get("spec") or {}).get("replicas")
        jobwatch.record(*key, old["status"] if old else None, dict(body.get("status") or {}),
                        replicas if isinstance(replicas, int) else None)
        cache.upsert_job(body)


@kopf.on.event("nodes")  # type: ignore[arg-type]
async def node_event(event: Any, name: str, body: Any, memo: Any, **_: Any) -> None:
    await delivery.on_node(_state(memo), event.get("type"), name, body)
