"""rest: the operator's core and RBAC calls send exactly the requests the kubernetes client's generated classes send
(method, URL with its query, headers, body), refuse a misspelt create body with the same pydantic error, and raise
the same ApiException for a refusal; every method of theirs is in the table."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException, RESTResponse
from pydantic import ValidationError
from reprieve_operator import rest

pytestmark = pytest.mark.unit

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "labels": {"a": "b"}},
       "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "X", "value": "1"}]}],
                "nodeName": "n0", "tolerations": [{"key": "k", "operator": "Exists"}]}}
CM = {"metadata": {"name": "c", "namespace": "ml"}, "data": {"k": "v"}}
EVENT = {"metadata": {"generateName": "j.", "namespace": "ml"}, "reason": "R", "message": "m", "type": "Normal",
         "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ml"}, "count": 1,
         "firstTimestamp": "2026-01-01T00:00:00Z", "source": {"component": "reprieve-operator"}}
MERGE = {"_content_type": "application/merge-patch+json"}
JSON_PATCH = [{"op": "add", "path": "/data", "value": {"k": "v"}}]
ROLE = {"metadata": {"name": "r", "namespace": "ml"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
BINDING = {"metadata": {"name": "r", "namespace": "ml"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                                      "kind": "Role", "name": "r"},
           "subjects": [{"kind": "ServiceAccount", "name": "s", "namespace": "ml"}]}

CALLS: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
    ("core", "list_pod_for_all_namespaces", (), {"label_selector": "reprieve.dev/job-name", "limit": 500}),
    ("core", "list_pod_for_all_namespaces", (), {"label_selector": "l", "watch": True, "resource_version": "42",
                                                 "allow_watch_bookmarks": True, "timeout_seconds": 300}),
    ("core", "list_namespaced_pod", ("ml",), {"label_selector": "l=j", "limit": 500, "_continue": "tok=="}),
    ("core", "create_namespaced_pod", ("ml", POD), {"dry_run": "All", "field_validation": "Strict"}),
    ("core", "patch_namespaced_pod", ("p", "ml", {"metadata": {"annotations": {"a": None}}}), MERGE),
    ("core", "patch_namespaced_pod", ("p", "ml", JSON_PATCH), {}),  # a JSON patch unless told
    ("core", "delete_namespaced_pod", ("p", "ml"), {"grace_period_seconds": 0}),
    ("core", "list_node", (), {"limit": 500, "_continue": "x"}),
    ("core", "list_config_map_for_all_namespaces", (), {"label_selector": "reprieve.dev/job-name", "limit": 500}),
    ("core", "list_namespaced_config_map", ("ml",), {"label_selector": "reprieve.dev/job-name", "limit": 500,
                                                     "_continue": "x"}),
    ("core", "read_node", ("n0",), {}),
    ("core", "read_namespaced_config_map", ("c", "ml"), {}),
    ("core", "create_namespaced_config_map", ("ml", CM), {}),
    ("core", "patch_namespaced_config_map", ("c", "ml", {"data": {"k": "v"}}), MERGE),
    ("core", "patch_namespaced_config_map", ("c", "ml", JSON_PATCH), {"_content_type": "application/json-patch+json"}),
    ("core", "delete_namespaced_config_map", ("c", "ml"), {}),
    ("core", "create_namespaced_service", ("ml", {"metadata": {"name": "s"}, "spec": {"clusterIP": "None"}}), {}),
    ("core", "patch_namespaced_service", ("s", "ml", JSON_PATCH), {"_content_type": "application/json-patch+json"}),
    ("core", "delete_namespaced_service", ("s", "ml"), {}),
    ("core", "create_namespaced_service_account", ("ml", {"metadata": {"name": "s"}}), {}),
    ("core", "patch_namespaced_service_account", ("s", "ml", {"metadata": {"labels": {"a": "b"}}}), MERGE),
    ("core", "delete_namespaced_service_account", ("s", "ml"), {}),
    ("core", "create_namespaced_secret", ("ml", {"metadata": {"name": "s"}, "stringData": {"k": "v"}}), {}),
    ("core", "patch_namespaced_secret", ("s", "ml", JSON_PATCH), {"_content_type": "application/json-patch+json"}),
    ("core", "delete_namespaced_secret", ("s", "ml"), {}),
    ("core", "create_namespaced_event", ("ml", EVENT), {}),
    ("rbac", "create_namespaced_role", ("ml", ROLE), {}),
    ("rbac", "patch_namespaced_role", ("r", "ml", JSON_PATCH), {"_content_type": "application/json-patch+json"}),
    ("rbac", "delete_namespaced_role", ("r", "ml"), {}),
    ("rbac", "create_namespaced_role_binding", ("ml", BINDING), {}),
    ("rbac", "patch_namespaced_role_binding", ("r", "ml", JSON_PATCH), {"_content_type": "application/json-patch+json"}),
    ("rbac", "delete_namespaced_role_binding", ("r", "ml"), {}),
]
OURS = {"core": rest.CoreV1Api, "rbac": rest.RbacAuthorizationV1Api}
THEIRS = {"core": client.CoreV1Api, "rbac": client.RbacAuthorizationV1Api}


class Transport:
    """The ApiClient's REST client: records each request, answers ``status`` with an empty JSON object."""

    def __init__(self, status: int = 200) -> None:
        self.status, self.requests = status, []  # type: int, list[tuple[Any, ...]]

    def request(self, method: str, url: str, headers: Any = None, body: Any = None, post_params: Any = None,
                _request_timeout: Any = None) -> RESTResponse:
        self.requests.append((method, url, dict(headers or {}), body))
        import urllib3

        return RESTResponse(urllib3.HTTPResponse(body=b"{}", status=self.status, preload_content=False,
                                                 headers={"Content-Type": "application/json"}))


def api_client(status: int = 200) -> tuple[client.ApiClient, Transport]:
    cfg = client.Configuration(host="https://kube.test:6443", api_key={"authorization": "t0k"},
                               api_key_prefix={"authorization": "Bearer"})
    c = client.ApiClient(cfg)
    c.rest_client = transport = Transport(status)  # type: ignore[assignment]
    return c, transport


def sent(group: str, classes: dict[str, Any], method: str, args: tuple[Any, ...], kw: dict[str, Any],
         status: int = 200) -> tuple[Any, ...]:
    c, transport = api_client(status)
    answer = getattr(classes[group](c), method)(*args, _preload_content=False, **kw)
    assert answer.data == b"{}"
    (request,) = transport.requests
    method_, url, headers, body = request
    path, _, query = url.partition("?")
    return method_, path, sorted(query.split("&")) if query else [], headers, body  # the query's order aside


@pytest.mark.parametrize(("group", "method", "args", "kw"), CALLS, ids=[f"{c[1]}-{i}" for i, c in enumerate(CALLS)])
def test_the_same_request_as_the_clients_generated_method(group: str, method: str, args: tuple[Any, ...],
                                                          kw: dict[str, Any]) -> None:
    assert sent(group, OURS, method, args, kw) == sent(group, THEIRS, method, args, kw)


def test_every_method_is_compared() -> None:
    for group, cls in OURS.items():
        ours = {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_") and n != "call"}
        assert ours == {m for g, m, _, _ in CALLS if g == group}


def test_a_misspelt_create_body_is_refused_before_sending_with_the_clients_error() -> None:
    bad = {**POD, "spec": {**POD["spec"], "containers": [{"name": "c", "imagee": "i"}]}}
    errors = []
    for classes in (OURS, THEIRS):
        c, transport = api_client()
        with pytest.raises(ValidationError) as err:
            classes["core"](c).create_namespaced_pod("ml", bad, _preload_content=False)
        assert transport.requests == []
        errors.append([(e["loc"][1:], e["type"]) for e in err.value.errors()])
    assert errors[0] == errors[1] and ((("spec", "containers", 0, "imagee"), "extra_forbidden") in errors[0])


@pytest.mark.parametrize("status", [404, 409, 422, 500])
def test_a_refusal_is_the_clients_api_exception(status: int) -> None:
    got = []
    for classes in (OURS, THEIRS):
        with pytest.raises(ApiException) as err:
            sent("core", classes, "patch_namespaced_pod", ("p", "ml", {}), MERGE, status=status)
        got.append((err.value.status, err.value.body))
    assert got[0] == got[1] and got[0][0] == status


def test_an_answer_read_whole_is_refused_naming_the_call() -> None:
    c, _ = api_client()
    with pytest.raises(TypeError, match="GET /api/v1/nodes/n0: the operator reads answers raw"):
        rest.CoreV1Api(c).read_node("n0")
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['pretty'\]"):
        rest.CoreV1Api(c).read_node("n0", pretty="true", _preload_content=False)


def test_the_standby_warm_up_sends_its_four_reads() -> None:
    """``__main__.warm_up`` (a standby's first calls) goes through these classes: each read is sent (an error there is
    swallowed, so a wrong argument would go unseen)."""
    from reprieve_operator.__main__ import warm_up

    c, transport = api_client()
    warm_up(c, ["ml"])
    assert [(m, u.split("?")[0].removeprefix("https://kube.test:6443")) for m, u, _, _ in transport.requests] == [
        ("GET", "/api/v1/nodes"), ("GET", "/api/v1/namespaces/ml/pods"), ("GET", "/api/v1/pods"),
        ("GET", "/apis/reprieve.dev/v1alpha1/namespaces/ml/trainingjobs")]
