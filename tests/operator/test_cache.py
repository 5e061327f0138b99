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


def test_a_pod_is_held_deflated_and_each_read_is_a_fresh_copy_that_keeps_its_parse() -> None:
    """The cache holds each pod's compact form as deflated JSON (~0.13 KB where the dicts took ~2.3 KB): a read
    gives a fresh copy equal to ``compact_pod`` of the event, which the caller may change without changing the
    cache; ``pod_view``'s parse is kept for the pod until an event changes it."""
    import json

    from reprieve_operator.policy.views import VIEW_KEY, compact_pod, pod_view

    c = Cache()
    p = pod("llama-0", node="n0")
    p["metadata"]["labels"]["reprieve.dev/role"] = "worker"
    p["metadata"]["annotations"] = {"reprieve.dev/notice-watch": "llama-notice", "other": "dropped",
                                    "reprieve.dev/exit": json.dumps({"attempt": 1, "code": 42})}
    p["status"] = {"phase": "Running", "podIP": "10.0.0.1", "containerStatuses": [
        {"name": "trainer", "state": {"running": {"startedAt": "2026-11-29T00:00:00Z"}}, "image": "x"}]}
    c.upsert_pod(p)
    (entry,) = c._pods[("ml", "llama")].values()
    expected = {k: v for k, v in compact_pod(p).items() if k != VIEW_KEY}
    assert len(entry.packed) < len(json.dumps(expected)) / 2  # deflated against the shared dictionary

    first, second = c.pods_of("ml", "llama"), c.pods_of("ml", "llama")
    assert {k: v for k, v in first[0].items() if k != VIEW_KEY} == expected
    assert first[0] is not second[0]
    first[0]["metadata"]["annotations"].clear()  # a reader's change stays in its copy
    assert c.pods_of("ml", "llama")[0]["metadata"]["annotations"] == expected["metadata"]["annotations"]

    view = pod_view(second[0])
    assert view is not None and view.exit_code == 42 and view.ip == "10.0.0.1"
    assert pod_view(c.pods_of("ml", "llama")[0]) is view  # parsed once while the pod is unchanged
    p["status"]["podIP"] = "10.0.0.2"
    c.upsert_pod(p)  # an event: a new entry, parsed again
    assert pod_view(c.pods_of("ml", "llama")[0]).ip == "10.0.0.2"  # type: ignore[union-attr]

    big = pod("llama-1")  # a text past the deflate window (2 KiB) still comes back whole
    big["metadata"]["annotations"] = {"reprieve.dev/progress": "x" * 5000}
    c.upsert_pod(big)
    got = {q["metadata"]["name"]: q for q in c.pods_of("ml", "llama")}["llama-1"]
    assert got["metadata"]["annotations"]["reprieve.dev/progress"] == "x" * 5000
