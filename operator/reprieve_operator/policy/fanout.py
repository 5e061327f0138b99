"""Pure decisions of notice fan-out: which pods hear a job's notice through the job's notice object (one write
per job, the API server's watch cache carries it to every pod that watches it) and which need their own
``reprieve.dev/notice`` annotation (docs/notices.md, "One write per job").

A pod watches the object when its runtime said so: its ``reprieve.dev/notice-watch`` annotation names the object
(written once the runtime's watch of it listed; "refused: ..." when the API server refused it, 403 or 429). A pod
that has not said so (its runtime has not started yet, its watch is refused, an older runtime) hears what its own
annotation carries, so it gets the annotation: the fallback. When the object itself cannot be written, every pod
the notice is due to gets the annotation (:func:`fallback`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import ANNOTATION_NOTICE_WATCH
from .notice import NoticePlan, annotation_deadline
from .views import notice_annotation


@dataclass(frozen=True)
class NoticeRoute:
    """How one plan's notice reaches its pods: the job's notice object written (or not), and the pods annotated."""

    write_object: bool
    annotate: tuple[str, ...]
    unwatched: tuple[str, ...]  # of ``annotate``: pods that do not watch the object (said in the job's Event)
    # Some pod due the notice hears it through the object: the write is urgent (before the annotations). False
    # with ``write_object``: no pod due it watches yet, so the object only waits for a process that starts later
    # and is written after the pods' annotations (``delivery._deliver``).
    heard_now: bool = False


def watches(pod: Mapping[str, Any], object_name: str) -> bool:
    """Whether ``pod``'s runtime watches the notice object ``object_name`` (it said so in its annotation)."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NOTICE_WATCH) == object_name


def heard(annotation: str | None, object_value: str | None, watching: bool, attempt: int) -> str | None:
    """The notice value a pod hears for ``attempt``: its own annotation's, or, when it watches the object, the
    object's if that names an earlier deadline (the earliest deadline wins, docs/contract.md)."""
    if not watching or object_value is None:
        return annotation
    own, shared = annotation_deadline(annotation, attempt), annotation_deadline(object_value, attempt)
    if shared is None:
        return annotation
    return annotation if own is not None and own <= shared else object_value


def heard_by_pods(pods: Iterable[Mapping[str, Any]], object_name: str, object_value: str | None,
                  attempt: int) -> dict[str, str | None]:
    """pod name -> the notice value it hears (:func:`heard`), for ``policy.notice.decide_notice``."""
    return {p["metadata"]["name"]: heard(notice_annotation(p), object_value, watches(p, object_name), attempt)
            for p in pods}


def route(plan: NoticePlan, object_value: str | None, watching: Iterable[str]) -> NoticeRoute:
    """The object is written when it does not already carry a deadline as early for the plan's attempt (a pod that
    joins later lists it, so it is written even if no pod watches yet); the pods due the notice that do not watch
    it are annotated."""
    known = annotation_deadline(object_value, plan.attempt)
    write = bool(plan.annotate) and (known is None or known > plan.notice.deadline)
    watched = set(watching)
    unwatched = tuple(p for p in plan.annotate if p not in watched)
    return NoticeRoute(write_object=write, annotate=unwatched, unwatched=unwatched,
                       heard_now=write and len(unwatched) < len(plan.annotate))


def fallback(plan: NoticePlan) -> NoticeRoute:
    """The object could not be written (403, 429, the API server unreachable): every pod due the notice is
    annotated, as before the object existed."""
    return NoticeRoute(write_object=False, annotate=plan.annotate, unwatched=())


def fallback_message(object_name: str, route: NoticeRoute, refused: str | None) -> str | None:
    """The job's ``NoticeFallback`` Event: why pods were annotated instead of hearing ``object_name`` (None: none
    were)."""
    if refused is not None:
        return (f"{object_name} could not be written ({refused}): the notice was annotated on "
                f"{len(route.annotate)} pod(s) instead")
    if route.unwatched:
        shown = ", ".join(route.unwatched[:5]) + (", ..." if len(route.unwatched) > 5 else "")
        return (f"{len(route.unwatched)} pod(s) do not watch {object_name} (not started yet, or their watch was "
                f"refused): annotated with the notice: {shown}")
    return None
