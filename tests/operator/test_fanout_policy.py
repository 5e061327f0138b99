"""``policy.fanout``: which pods hear a notice through the job's notice object (one write per job) and which get the
annotation (docs/notices.md, "One write per job"). Pure: tables, no cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from reprieve_operator import ANNOTATION_NOTICE, ANNOTATION_NOTICE_WATCH
from reprieve_operator.policy import fanout
from reprieve_operator.policy.notice import NoticePlan
from reprieve_operator.policy.signals import Notice

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)
OBJ = "llama-notice"


def value(seconds: int, attempt: int | None = 1, nid: str = "n") -> str:
    body: dict[str, Any] = {"id": f"{nid}{seconds}", "reason": "gke-spot",
                            "deadline": (NOW + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if attempt is not None:
        body["attempt"] = attempt
    return json.dumps(body)


def pod(name: str, *, notice: str | None = None, watch: str | None = None) -> dict[str, Any]:
    annotations = {k: v for k, v in ((ANNOTATION_NOTICE, notice), (ANNOTATION_NOTICE_WATCH, watch)) if v}
    return {"metadata": {"name": name, "annotations": annotations}}


def plan(seconds: int, *annotate: str) -> NoticePlan:
    return NoticePlan(Notice("gke-spot/n1/1", "gke-spot", "n1", NOW + timedelta(seconds=seconds), NOW), 1,
                      tuple(annotate))


@pytest.mark.parametrize(("annotation", "obj", "watching", "want"), [
    (None, None, True, None),  # nothing anywhere
    (None, value(30), False, None),  # the object is not heard by a pod that does not watch it
    (None, value(30), True, value(30)),
    (value(60), value(30), True, value(30)),  # the earliest deadline wins
    (value(30), value(60), True, value(30)),
    (value(60), value(30, attempt=0), True, value(60)),  # the object's notice is of another attempt
    (None, "not json", True, "not json"),  # malformed: the earliest possible deadline (save now), never lost
])
def test_a_pod_hears_the_earliest_of_its_annotation_and_the_object_it_watches(
        annotation: str | None, obj: str | None, watching: bool, want: str | None) -> None:
    assert fanout.heard(annotation, obj, watching, 1) == want


def test_heard_by_pods_reads_who_watches_from_the_pods_own_declaration() -> None:
    pods = [pod("a", watch=OBJ), pod("b"), pod("c", watch="refused: HTTP 403"), pod("d", notice=value(10), watch=OBJ)]
    assert fanout.heard_by_pods(pods, OBJ, value(30), 1) == {"a": value(30), "b": None, "c": None, "d": value(10)}
    assert [fanout.watches(p, OBJ) for p in pods] == [True, False, False, True]


@pytest.mark.parametrize(("obj", "due", "watching", "write", "annotate", "heard_now"), [
    (None, ("a", "b"), ("a", "b"), True, (), True),  # every pod watches: one write, no annotation
    (None, ("a", "b"), ("a",), True, ("b",), True),  # b has not said it watches (not started, refused): annotated
    # nobody watches yet: annotated, and the object for late joiners (not urgent: after the annotations)
    (None, ("a", "b"), (), True, ("a", "b"), False),
    (None, ("b",), ("a",), True, ("b",), False),  # the pod that watches is not due it: the object is not urgent
    (value(60), ("a",), ("a",), True, (), True),  # the object names a later deadline: the earlier one replaces it
    (value(30), ("b",), ("a",), False, ("b",), False),  # the object is as early already: only the pod that does not watch
    (value(30, attempt=0), ("a",), ("a",), True, (), True),  # the object's notice is of another attempt
    (None, (), ("a",), False, (), False),  # nothing due (the plan only records the status)
])
def test_the_object_is_written_once_and_only_pods_that_do_not_watch_are_annotated(
        obj: str | None, due: tuple[str, ...], watching: tuple[str, ...], write: bool,
        annotate: tuple[str, ...], heard_now: bool) -> None:
    route = fanout.route(plan(30, *due), obj, watching)
    assert (route.write_object, route.annotate, route.unwatched, route.heard_now) == (write, annotate, annotate,
                                                                                     heard_now)


def test_a_refused_object_annotates_every_pod_due_and_the_event_says_why() -> None:
    route = fanout.fallback(plan(30, "a", "b"))
    assert (route.write_object, route.annotate) == (False, ("a", "b"))
    assert fanout.fallback_message(OBJ, route, "HTTP 429") == (
        "llama-notice could not be written (HTTP 429): the notice was annotated on 2 pod(s) instead")
    assert fanout.fallback_message(OBJ, fanout.route(plan(30, "a"), None, ["a"]), None) is None
    many = fanout.route(plan(30, *"abcdefg"), None, [])
    assert fanout.fallback_message(OBJ, many, None) == (
        "7 pod(s) do not watch llama-notice (not started yet, or their watch was refused): annotated with the "
        "notice: a, b, c, d, e, ...")
