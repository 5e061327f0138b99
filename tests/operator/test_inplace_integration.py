"""An in-place gang that finishes, against the real API server: the operator as a local process (chart RBAC), the
pods on a process kubelet, each trainer under reprieve-supervisor. What a person watching ``kubectl get tj -w``
sees of the phase between the first worker's exit 0 and the last's (issue #46, item 9: it read Pending for that
second at the end of every finished in-place job; the decision is table-tested in test_inplace_policy.py)."""

from __future__ import annotations

import textwrap
import threading
from typing import Any

import pytest
from conftest import apply
from kubernetes import client, watch
from localcluster.testing import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Process 0 finishes at once, process 1 a few seconds later: the window in which only one worker has finished.
TRAINER = """
    import os, time
    time.sleep(0 if os.environ["REPRIEVE_PROCESS_ID"] == "0" else 4)
"""


def _phases(api: Any, namespace: str, name: str) -> list[str]:
    """The job's phases in the order a watch delivers them (repeats dropped), filled in by a daemon thread until the
    job ends: a phase held for a second, which a poll could miss."""
    seen: list[str] = []

    def run() -> None:
        stream = watch.Watch().stream(client.CustomObjectsApi(api).list_namespaced_custom_object, "reprieve.dev",
                                      "v1alpha1", namespace, "trainingjobs", field_selector=f"metadata.name={name}",
                                      timeout_seconds=150)
        for ev in stream:
            phase = (ev["object"].get("status") or {}).get("phase")
            if phase and (not seen or seen[-1] != phase):
                seen.append(phase)
            if phase in ("Succeeded", "Failed"):
                return

    threading.Thread(target=run, daemon=True).start()
    return seen


def test_a_gang_whose_workers_finish_one_after_the_other_is_running_until_it_succeeds(
        cluster: Any, api: Any, namespace: str, operator: Any, nodes: list[str]) -> None:
    tag = cluster.kubectl("get", "node", nodes[0], "-o", "jsonpath={.metadata.labels.reprieve-test}").stdout
    container = {"name": "trainer", "image": "python:3.11", "command": ["python", "-c", textwrap.dedent(TRAINER)]}
    phases = _phases(api, namespace, "fin")
    apply(cluster, {"apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
                    "metadata": {"name": "fin", "namespace": namespace},
                    "spec": {"replicas": 2, "restartMode": "InPlace", "terminationGracePeriodSeconds": 5,
                             "checkpoint": {"uri": "/tmp/ckpt"},
                             "template": {"spec": {"nodeSelector": {"reprieve-test": tag},
                                                   "containers": [container]}}}})
    wait_for(lambda: phases and phases[-1] in ("Succeeded", "Failed"), 120, "the job to end",
             describe=lambda: f"phases {phases}\n{operator.tail(40)}")
    assert phases[-1] == "Succeeded", (phases, operator.tail(40))
    running = phases.index("Running")
    assert phases[running:] == ["Running", "Succeeded"], phases  # was Running, Pending, Succeeded
    operator.assert_no_errors()
