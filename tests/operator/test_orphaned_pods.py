"""Pods whose Node is gone are force-deleted (restart policy helper), table-tested."""

from __future__ import annotations

import pytest
from reprieve_operator.policy.restart import WorkerPod, orphaned_pods

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("pods", "known", "expected"),
    [
        ([WorkerPod("j-0", 0, 1, node="a"), WorkerPod("j-1", 1, 1, node="b")], {"a", "b"}, ()),
        ([WorkerPod("j-0", 0, 1, node="a"), WorkerPod("j-1", 1, 1, node="b")], {"a"}, ("j-1",)),
        ([WorkerPod("j-1", 1, 1, node="gone", deleting=True)], {"a"}, ("j-1",)),  # already Terminating: forced
        ([WorkerPod("j-0", 0, 1, node=None, phase="Pending")], {"a"}, ()),  # unscheduled: not orphaned
        ([WorkerPod("j-0", 0, 1, node="gone")], None, ()),  # node cache not primed: decide nothing
    ],
)
def test_orphaned_pods(pods: list[WorkerPod], known: set[str] | None, expected: tuple[str, ...]) -> None:
    assert orphaned_pods(pods, known) == expected
