"""apply.tolerate: the one place where an expected 404/409 is logged at INFO and counts as done."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from reprieve_operator.apply import create_pod, tolerate

pytestmark = pytest.mark.unit


def answer(status: int) -> ApiException:
    return ApiException(status=status, reason="x")


def fails(status: int):  # type: ignore[no-untyped-def]
    def call() -> str:
        raise answer(status)
    return call


def test_the_expected_answer_is_logged_and_counts_as_done(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="reprieve_operator.apply"):
        assert tolerate(fails(404), 404, False, "pod %s/%s already gone", "ml", "llama-0") is False
    assert [r.getMessage() for r in caplog.records] == ["pod ml/llama-0 already gone"]


def test_a_success_is_returned_and_nothing_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="reprieve_operator.apply"):
        assert tolerate(lambda: {"kind": "Pod"}, 409, None, "never") == {"kind": "Pod"}
    assert caplog.records == []


@pytest.mark.parametrize("status", [403, 409, 500])
def test_every_other_answer_is_raised(status: int) -> None:
    with pytest.raises(ApiException) as err:
        tolerate(fails(status), 404, None)
    assert err.value.status == status


class Answer:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass


def test_a_pod_with_only_a_generated_name_is_created() -> None:
    """Spares and replacements are created with ``generateName`` and no name (a KeyError here once stopped every
    spare from being created: the in-place end-to-end tests caught it)."""
    sent: list[dict[str, Any]] = []

    def create_namespaced_pod(namespace: str, body: dict[str, Any], **_: Any) -> Answer:
        sent.append(body)
        return Answer({**body, "metadata": {**body["metadata"], "name": "llama-spare-x7k2p"}})

    api: Any = SimpleNamespace(core=SimpleNamespace(create_namespaced_pod=create_namespaced_pod))
    pod = {"kind": "Pod", "metadata": {"namespace": "ml", "generateName": "llama-spare-"}}
    made = create_pod(api, pod)
    assert made is not None and made["metadata"]["name"] == "llama-spare-x7k2p" and sent == [pod]


def test_no_answer_is_told_apart_from_an_error_in_the_operator() -> None:
    """A reset connection or a timeout is the API server's to retry; a KeyError is the operator's bug (logged with
    its traceback and named in the condition as an error inside the operator, not as "no answer")."""
    import urllib3
    from reprieve_operator.apply import is_no_answer

    assert is_no_answer(ConnectionResetError(104, "reset")) and is_no_answer(TimeoutError())
    assert is_no_answer(urllib3.exceptions.ProtocolError("broken"))
    assert not is_no_answer(KeyError("name")) and not is_no_answer(TypeError("x"))


def test_an_assignment_put_over_the_last_keeps_none_of_its_keys_the_new_one_lacks() -> None:
    """The e2e of an elastic job's faults: the shrink after a grow (attempt 4 after 3) still said ``resize: grow``
    and named attempt 3's two memory peers, because the assignment was merge-patched over the last one (a merge
    patch keeps every key the patch does not name). The fake applies each patch as the API server does
    (merge patch: RFC 7386; JSON patch ``add``: RFC 6902)."""
    from op_jobs import make_job
    from reprieve_operator.apply import put_configmap
    from reprieve_operator.policy.builders import build_assignment

    stored: dict[str, Any] = {}

    def create_namespaced_config_map(namespace: str, body: dict[str, Any], **_: Any) -> Answer:
        if stored:
            raise ApiException(status=409)
        stored.update(json.loads(json.dumps(body)))
        return Answer(body)

    def patch_namespaced_config_map(name: str, namespace: str, body: Any, **kw: Any) -> Answer:
        if kw["_content_type"] == "application/merge-patch+json":
            for field, value in body.items():
                stored[field] = {**stored.get(field, {}), **value}
        else:
            assert kw["_content_type"] == "application/json-patch+json", kw
            for op in body:
                assert op["op"] in ("add", "replace"), op
                stored[op["path"].lstrip("/")] = op["value"]
        return Answer(stored)

    api: Any = SimpleNamespace(core=SimpleNamespace(create_namespaced_config_map=create_namespaced_config_map,
                                                    patch_namespaced_config_map=patch_namespaced_config_map))
    body = make_job(name="el", namespace="ml", replicas=2, restartMode="InPlace")
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "train.py"]
    job = body.model()
    put_configmap(api, build_assignment(job, 3, {"el-0": 0, "el-1-x": 1}, "10.0.0.1:8476",
                                        {0: "10.0.0.2:8477", 1: "10.0.0.1:8477"}, {0: "n2", 1: "n1"}, "grow"))
    put_configmap(api, build_assignment(job, 4, {"el-0": 0}, "10.0.0.1:8476"))
    assert stored["data"] == build_assignment(job, 4, {"el-0": 0}, "10.0.0.1:8476")["data"], stored["data"]
