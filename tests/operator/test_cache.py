"""The operator's in-memory indices: node -> jobs and job -> pods follow pod, node and job events."""

from __future__ import annotations

from typing import Any

import pytest
from reprieve_operator.cache import Cache

pytestmark = pytest.mark.unit


def pod(name: str, job: str | None = "llama", node: str | None = "n0", ns: str = "ml") -> dict[str, Any]:
    labels = {"reprieve.dev/job-name": job, "reprieve.dev/replica-index": name[-1],
              "reprieve.dev/attempt": "1"} if job else {}
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "managedFields": [{"x": 1}]},
            "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def test_pods_index_by_node_and_job() -> None:
    c = Cache()
    for p in [pod("llama-0", node="n0"), pod("llama-1", node="n1"), pod("gpt-0", "gpt", "n0"), pod("stray", job=None)]:
        c.upsert_pod(p)
    c.nodes.update({"n0": {}, "n1": {}})
    assert c.jobs_on("n0") == [("ml", "gpt"), ("ml", "llama")] and c.jobs_on("n1") == [("ml", "llama")]
    assert sorted(p["metadata"]["name"] for p in c.pods_of("ml", "llama")) == ["llama-0", "llama-1"]
    assert "managedFields" not in c.pods_of("ml", "gpt")[0]["metadata"]
    assert c.stats() == {"pods": 3, "jobs": 0, "nodes": 2}


def test_updates_and_deletes() -> None:
    c = Cache()
    c.upsert_pod(pod("llama-0", node=None))  # not yet scheduled
    assert c.jobs_on("n0") == []
    c.upsert_pod(pod("llama-0", node="n0"))
    c.upsert_pod(pod("llama-0", node="n0"))  # a repeated event does not double count
    c.upsert_pod(pod("llama-1", node="n0"))
    c.delete_pod(pod("llama-0"))
    assert c.jobs_on("n0") == [("ml", "llama")]
    c.delete_pod(pod("llama-1"))
    c.delete_pod(pod("llama-1"))  # already gone: fine
    assert c.jobs_on("n0") == [] and c.pods_of("ml", "llama") == []


def test_jobs() -> None:
    c = Cache()
    done = {"metadata": {"name": "a", "namespace": "ml", "uid": "u"}, "spec": {}, "status": {"phase": "Succeeded"}}
    live = {"metadata": {"name": "b", "namespace": "ml", "uid": "v"}, "spec": {"replicas": 1}, "status": {}}
    c.upsert_job(done)
    c.upsert_job(live)
    assert c.unfinished_jobs() == [("ml", "b")] and c.jobs[("ml", "b")]["spec"] == {"replicas": 1}
    got = c.jobs.get(("ml", "b"))
    assert got is not None
    got["spec"]["replicas"] = 9  # a copy: the cached body is text
    c.merge_job_status("ml", "b", {"phase": "Failed"})
    assert c.jobs[("ml", "b")] == {**live, "metadata": {**live["metadata"], "generation": None},
                                   "status": {"phase": "Failed"}}
    assert c.unfinished_jobs() == [] and ("ml", "b") in c.jobs and len(c.jobs) == 2
    c.delete_job(live)
    assert c.unfinished_jobs() == [] and c.jobs.get(("ml", "b")) is None


def test_replace_job_pods_repairs_a_missed_event() -> None:
    c = Cache()
    c.upsert_pod(pod("llama-0", node="n0"))
    c.upsert_pod(pod("llama-1", node="n1"))  # its DELETED event was "missed"
    c.replace_job_pods("ml", "llama", [pod("llama-0", node="n0")])
    assert [p["metadata"]["name"] for p in c.pods_of("ml", "llama")] == ["llama-0"] and c.jobs_on("n1") == []


def test_a_deleted_pod_is_remembered_with_its_node_until_a_pod_of_its_name_returns() -> None:
    """A pod evicted and gone before a reconcile saw it deleting: the decision still learns where it ran."""
    from reprieve_operator.cache import GONE_PER_JOB
    from reprieve_operator.policy.views import GonePod

    c = Cache()
    c.upsert_pod(pod("llama-0", node="n0"))
    c.upsert_pod(pod("llama-1", node="n1"))
    c.pod_gone(pod("llama-0", node="n0"))
    assert c.gone_of("ml", "llama") == (GonePod("llama-0", "n0", 0, 1),)
    assert [p["metadata"]["name"] for p in c.pods_of("ml", "llama")] == ["llama-1"] and c.jobs_on("n0") == []
    c.pod_gone(pod("llama-9", node=None))  # never placed: nothing to remember
    c.upsert_pod(pod("llama-0", node="n2"))  # the next attempt's pod of the same name
    assert c.gone_of("ml", "llama") == ()
    for i in range(GONE_PER_JOB + 5):
        c.pod_gone(pod(f"llama-x{i}", node=f"n{i}"))
    gone = c.gone_of("ml", "llama")
    assert len(gone) == GONE_PER_JOB and gone[-1].name == f"llama-x{GONE_PER_JOB + 4}" and gone[0].name == "llama-x5"
    c.delete_job({"metadata": {"namespace": "ml", "name": "llama"}})
    assert c.gone_of("ml", "llama") == ()


def test_a_deleted_pods_last_steps_outlive_the_pod_and_its_name() -> None:
    """What a deleted pod's processes said of their last step (its final state, from the watch's DELETED event) is
    kept per attempt, the highest, through the next attempt's pod of the same name; bounded; dropped with the job."""
    import json

    from reprieve_operator.cache import SAID_PER_JOB

    def said(name: str, attempt: int, step: int, at: float) -> dict[str, Any]:
        p = pod(name, node="n0")
        message = json.dumps({"peerLost": [0], "attempt": attempt, "lastStep": step, "lastStepAt": at})
        p["status"]["containerStatuses"] = [{"name": "t", "state": {"terminated": {"exitCode": 134,
                                                                                   "message": message}}}]
        return p

    c = Cache()
    c.pod_gone(pod("llama-0", node="n0"))  # said nothing
    assert c.said_of("ml", "llama") == ()
    c.pod_gone(said("llama-1", 1, 62, 10.0))
    c.pod_gone(said("llama-0", 1, 61, 11.0))  # lower: not it
    c.upsert_pod(pod("llama-1", node="n1"))  # the next attempt's pod of the same name
    assert c.said_of("ml", "llama") == ((1, 62, 10.0),)
    for attempt in range(2, SAID_PER_JOB + 4):
        c.pod_gone(said("llama-1", attempt, attempt * 10, float(attempt)))
    kept = c.said_of("ml", "llama")
    assert len(kept) == SAID_PER_JOB and kept[0][0] == 4 and kept[-1][0] == SAID_PER_JOB + 3, kept
    c.delete_job({"metadata": {"namespace": "ml", "name": "llama"}})
    assert c.said_of("ml", "llama") == ()


def test_pods_share_the_parts_they_have_alike_and_a_part_no_pod_holds_is_dropped() -> None:
    """A node's pods share its ``spec``, a job's pods their annotations, unstarted pods their status (each held once:
    ~0.5 KB of a pod); what no pod holds any more does not stay (the table is swept once it doubled)."""
    c = Cache()

    def at(name: str, node: str, job: str = "llama") -> dict[str, Any]:
        p = pod(name, job, node)
        p["metadata"]["annotations"] = {"reprieve.dev/notice-watch": f"{job}-notice", "other": "dropped"}
        p["status"] = {"phase": "Pending"}
        return p

    c.upsert_pod(at("llama-0", "n0"))
    c.upsert_pod(at("llama-1", "n0"))
    c.upsert_pod(at("gpt-1", "n0", "gpt"))
    a, b = c.pods_of("ml", "llama")
    (g,) = c.pods_of("ml", "gpt")
    assert a["spec"] is b["spec"] is g["spec"] and a["status"] is b["status"] is g["status"]
    assert a["metadata"]["annotations"] is b["metadata"]["annotations"] is not g["metadata"]["annotations"]
    assert a["metadata"]["labels"] is not b["metadata"]["labels"]  # their replica index differs
    assert a["metadata"]["annotations"] == {"reprieve.dev/notice-watch": "llama-notice"}
    c.upsert_pod(pod("llama-0", node="n1"))  # a new event: a new compact pod, the others' parts untouched
    assert a["spec"] == {"nodeName": "n0"} and c.jobs_on("n1") == [("ml", "llama")]
    for i in range(20_000):  # pods moving through 20,000 nodes: the table does not keep every node's spec
        c.upsert_pod(pod("llama-9", node=f"m{i}"))
    assert len(c._shared) < 5_000
    assert c.pods_of("ml", "gpt")[0]["spec"] == {"nodeName": "n0"}  # a part a pod holds stays
