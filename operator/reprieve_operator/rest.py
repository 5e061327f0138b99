"""The core and RBAC calls the operator makes, without the kubernetes client's generated API classes.

``client.CoreV1Api`` loads the pydantic model of every core type when it is first made (+19 MB of the operator's
memory before it holds a single pod) and builds a request validator per method on its first call; the operator
reads every answer as plain JSON (``_preload_content=False``) and needs only the paths. These classes keep the
client's method names and arguments (a test fakes either) and its transport: ``ApiClient`` serialises the request
(host, credentials, a refreshed token) and raises ``ApiException`` for an answer other than 2xx. A create's body is
still checked against the client's model of that kind before it is sent, loaded on the kind's first create, so a
misspelt field is refused as before (``apply.refusal_of``: the same pydantic error, the same field paths).
"""

from __future__ import annotations

import importlib
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

CORE = "/api/v1"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# the client's argument -> the API's query parameter
_QUERY = {"label_selector": "labelSelector", "field_selector": "fieldSelector", "_continue": "continue",
          "limit": "limit", "resource_version": "resourceVersion", "allow_watch_bookmarks": "allowWatchBookmarks",
          "resource_version_match": "resourceVersionMatch",
          "timeout_seconds": "timeoutSeconds", "watch": "watch", "dry_run": "dryRun",
          "field_validation": "fieldValidation", "grace_period_seconds": "gracePeriodSeconds"}
# a kind's plural -> the client's model its create checks the body against (what the generated method's
# ``validate_call`` did)
_MODELS = {"pods": "V1Pod", "configmaps": "V1ConfigMap", "events": "CoreV1Event", "services": "V1Service",
           "serviceaccounts": "V1ServiceAccount", "secrets": "V1Secret", "roles": "V1Role",
           "rolebindings": "V1RoleBinding"}
_checkers: dict[str, Any] = {}


def checked(plural: str, body: Any) -> Any:
    """``body`` as the client's model of ``plural`` (a create's body); raises pydantic's ``ValidationError`` with the
    field paths the generated method's gave (the argument's position first)."""
    checker = _checkers.get(plural)
    if checker is None:
        from pydantic import TypeAdapter

        model = getattr(importlib.import_module("kubernetes.client.models"), _MODELS[plural])
        checker = _checkers[plural] = TypeAdapter(tuple[model])  # type: ignore[valid-type]
    return checker.validate_python((body,))[0]


class Rest:
    """One request through ``api_client``, its answer unread (``_preload_content=False`` is the only way asked)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    def call(self, method: str, path: str, body: Any = None, *, _content_type: str | None = None,
             _preload_content: bool = True, **params: Any) -> Any:
        if _preload_content:
            raise TypeError(f"{method} {path}: the operator reads answers raw: pass _preload_content=False")
        unknown = set(params) - set(_QUERY)
        if unknown:
            raise TypeError(f"{method} {path}: unknown argument(s) {sorted(unknown)}; known: {sorted(_QUERY)}")
        query = [(_QUERY[k], v) for k, v in params.items() if v is not None]
        headers = {"Accept": "application/json"}
        if _content_type or method == "PATCH":  # as the client's: a patch is a JSON patch unless told
            headers["Content-Type"] = _content_type or "application/json-patch+json"
        request = self.api_client.param_serialize(method=method, resource_path=path, query_params=query,
                                                  header_params=headers, body=body, auth_settings=["BearerToken"])
        answer = self.api_client.call_api(*request)
        if not 200 <= answer.status <= 299:
            answer.read()
            raise ApiException.from_response(http_resp=answer, body=None, data=None)
        return answer.response


class CoreV1Api(Rest):
    """The operator's calls of ``client.CoreV1Api``."""

    # --- pods ---
    def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
        return self.call("GET", f"{CORE}/pods", **kw)

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
        return self.call("GET", f"{CORE}/namespaces/{namespace}/pods", **kw)

    def create_namespaced_pod(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{CORE}/namespaces/{namespace}/pods", checked("pods", body), **kw)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("PATCH", f"{CORE}/namespaces/{namespace}/pods/{name}", body, **kw)

    def delete_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("DELETE", f"{CORE}/namespaces/{namespace}/pods/{name}", **kw)

    # --- nodes ---
    def list_node(self, **kw: Any) -> Any:
        return self.call("GET", f"{CORE}/nodes", **kw)

    def read_node(self, name: str, **kw: Any) -> Any:
        return self.call("GET", f"{CORE}/nodes/{name}", **kw)

    # --- config maps, services, service accounts, secrets, events ---
    def list_config_map_for_all_namespaces(self, **kw: Any) -> Any:
        return self.call("GET", f"{CORE}/configmaps", **kw)

    def list_namespaced_config_map(self, namespace: str, **kw: Any) -> Any:
        return self.call("GET", f"{CORE}/namespaces/{namespace}/configmaps", **kw)

    def read_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("GET", f"{CORE}/namespaces/{namespace}/configmaps/{name}", **kw)

    def create_namespaced_config_map(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{CORE}/namespaces/{namespace}/configmaps", checked("configmaps", body), **kw)

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("PATCH", f"{CORE}/namespaces/{namespace}/configmaps/{name}", body, **kw)

    def delete_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("DELETE", f"{CORE}/namespaces/{namespace}/configmaps/{name}", **kw)

    def create_namespaced_service(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{CORE}/namespaces/{namespace}/services", checked("services", body), **kw)

    def patch_namespaced_service(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("PATCH", f"{CORE}/namespaces/{namespace}/services/{name}", body, **kw)

    def delete_namespaced_service(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("DELETE", f"{CORE}/namespaces/{namespace}/services/{name}", **kw)

    def create_namespaced_service_account(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{CORE}/namespaces/{namespace}/serviceaccounts",
                         checked("serviceaccounts", body), **kw)

    def patch_namespaced_service_account(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("PATCH", f"{CORE}/namespaces/{namespace}/serviceaccounts/{name}", body, **kw)

    def delete_namespaced_service_account(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("DELETE", f"{CORE}/namespaces/{namespace}/serviceaccounts/{name}", **kw)

    def create_namespaced_secret(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{CORE}/namespaces/{namespace}/secrets", checked("secrets", body), **kw)

    def patch_namespaced_secret(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("PATCH", f"{CORE}/namespaces/{namespace}/secrets/{name}", body, **kw)

    def delete_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("DELETE", f"{CORE}/namespaces/{namespace}/secrets/{name}", **kw)

    def create_namespaced_event(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{CORE}/namespaces/{namespace}/events", checked("events", body), **kw)


class RbacAuthorizationV1Api(Rest):
    """The operator's calls of ``client.RbacAuthorizationV1Api`` (a job's worker Role and its binding)."""

    def create_namespaced_role(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{RBAC}/namespaces/{namespace}/roles", checked("roles", body), **kw)

    def patch_namespaced_role(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("PATCH", f"{RBAC}/namespaces/{namespace}/roles/{name}", body, **kw)

    def delete_namespaced_role(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("DELETE", f"{RBAC}/namespaces/{namespace}/roles/{name}", **kw)

    def create_namespaced_role_binding(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("POST", f"{RBAC}/namespaces/{namespace}/rolebindings", checked("rolebindings", body), **kw)

    def patch_namespaced_role_binding(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.call("PATCH", f"{RBAC}/namespaces/{namespace}/rolebindings/{name}", body, **kw)

    def delete_namespaced_role_binding(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.call("DELETE", f"{RBAC}/namespaces/{namespace}/rolebindings/{name}", **kw)
