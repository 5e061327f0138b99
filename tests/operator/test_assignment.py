"""The owner of the in-place assignments as written (``assignment.Assignments``): a copy belongs to one job
object, and a deleted job's copy is forgotten on its DELETED event."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from fake_clock import FakeClock
from reprieve_operator import handlers
from reprieve_operator.assignment import Assignments
from reprieve_operator.cache import Cache
from reprieve_operator.models import TrainingJob
from reprieve_operator.nodesignals import NodeSignals
from reprieve_operator.policy.inplace import Assignment
from reprieve_operator.policy.signals import BUILTIN_SIGNALS
from reprieve_operator.state import State

pytestmark = pytest.mark.unit

A = Assignment(2, {"llama-0": 0, "llama-1": 1}, "llama-0.llama.ml.svc:8476", {})


def body(uid: str, name: str = "llama") -> dict[str, Any]:
    return {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "ml", "uid": uid},
            "spec": {"replicas": 2, "checkpoint": {"uri": "/ckpt"},
                     "template": {"spec": {"containers": [{"name": "t", "image": "i", "command": ["python"]}]}}}}


def job(uid: str, name: str = "llama") -> TrainingJob:
    return TrainingJob.from_body(body(uid, name))


def test_a_copy_belongs_to_the_job_that_wrote_it() -> None:
    owner = Assignments()
    owner.wrote(job("u1"), A)
    assert owner.get(job("u1")) == A
    assert owner.get(job("u2")) is None  # deleted and created again under the same name: not its assignment
    assert owner.get(job("u1", name="gpt")) is None
    owner.wrote(job("u2"), A)  # the new job's first assignment replaces the old copy
    assert owner.get(job("u2")) == A and owner.get(job("u1")) is None and len(owner) == 1


def test_a_deleted_jobs_copy_and_commit_time_are_forgotten_on_its_deleted_event() -> None:
    async def reconcile(st: State, namespace: str, name: str, fresh: bool) -> None:
        return None

    cache = Cache()
    st = State(api=None, cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache, FakeClock()),  # type: ignore[arg-type]
               reconcile=reconcile)
    memo = SimpleNamespace(state=st)
    asyncio.run(handlers.job_event(event={"type": "ADDED"}, body=body("u1"), memo=memo))
    asyncio.run(handlers.job_event(event={"type": "ADDED"}, body=body("u9", name="gpt"), memo=memo))
    for name in ("llama", "gpt"):
        st.assignments.wrote(job("u1" if name == "llama" else "u9", name), A)
        st.commits.posted(("ml", name), 100.0)

    asyncio.run(handlers.job_event(event={"type": "DELETED"}, body=body("u1"), memo=memo))

    assert len(st.assignments) == 1 and st.assignments.get(job("u9", name="gpt")) == A  # the other job keeps its
    assert st.commits.last(("ml", "llama")) is None and st.commits.last(("ml", "gpt")) == 100.0
    assert ("ml", "llama") not in cache.jobs


@pytest.mark.parametrize("resize", [None, "grow"])
def test_an_operator_that_reads_its_assignment_back_sees_what_it_wrote(resize: str | None) -> None:
    """A restarted operator reads the ConfigMap once (``parse_assignment``): a grow's still says it is a grow."""
    from reprieve_operator.assignment import parse_assignment
    from reprieve_operator.policy import builders

    written = Assignment(3, {"llama-0": 0, "llama-1": 1, "llama-2": 2}, "10.0.0.1:8476", {}, {}, resize)
    cm = builders.build_assignment(job("u1"), written.attempt, dict(written.processes), written.coordinator,
                                   resize=written.resize)
    assert parse_assignment(cm) == written
