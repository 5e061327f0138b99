"""``reconcile``: an API answer that refuses a step stops the steps after it, and the answer's own outcome is carried
out in their place, in the same fixed order (read -> decide -> apply -> answer -> decide -> apply). The API server
here is a recorder of calls that refuses the ones a test names; what a real one refuses, and that nothing is left
behind, is ``test_operator_defects_integration.py``'s."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from fake_clock import FakeClock
from kubernetes.client.rest import ApiException
from op_jobs import make_job
from reprieve_operator.cache import Cache
from reprieve_operator.nodesignals import NodeSignals
from reprieve_operator.policy.signals import BUILTIN_SIGNALS
from reprieve_operator.reconcile import reconcile
from reprieve_operator.state import State

pytestmark = pytest.mark.unit


class Group:
    """One API group: every call is recorded (method, its first argument or the body's kind) into ``calls``;
    ``refuse`` says which calls raise what (a function of the method and its arguments)."""

    def __init__(self, calls: list[tuple[str, Any]], answers: dict[str, Any],
                 refuse: Callable[[str, tuple[Any, ...], dict[str, Any]], ApiException | None]) -> None:
        self.calls, self.answers, self.refuse = calls, answers, refuse

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, kwargs.get("dry_run")))
            err = self.refuse(method, args, kwargs)
            if err is not None:
                raise err
            body = self.answers.get(method, {})
            return SimpleNamespace(data=json.dumps(body).encode(), release_conn=lambda: None)
        return call


def forbidden(message: str) -> ApiException:
    err = ApiException(status=403, reason="Forbidden")
    err.body = json.dumps({"kind": "Status", "message": message})
    return err


def run(refuse: Callable[[str, tuple[Any, ...], dict[str, Any]], ApiException | None],
        passes: int = 1) -> tuple[list[tuple[str, Any]], list[Any], list[tuple[str, Any]]]:
    """``passes`` reconciles of a new job; the calls made, the plans returned and the status patches made."""
    calls: list[tuple[str, Any]] = []
    body = make_job(name="llama", namespace="ml")
    answers = {"get_namespaced_custom_object": dict(body), "list_namespaced_pod": {"items": []}}
    api = SimpleNamespace(**{g: Group(calls, answers, refuse) for g in ("core", "rbac", "custom", "events")})

    async def kick(st: State, namespace: str, name: str, fresh: bool) -> None:
        return None

    async def passes_() -> list[Any]:
        cache = Cache()
        st = State(api=api, cache=cache, nodes=NodeSignals(BUILTIN_SIGNALS, 600.0, cache, FakeClock()),  # type: ignore[arg-type]
                   reconcile=kick)
        return [await reconcile(st, "ml", "llama") for _ in range(passes)]

    plans = asyncio.run(passes_())
    patches = [c for c in calls if c[0] == "patch_namespaced_custom_object_status"]
    return calls, plans, patches


def test_a_final_refusal_fails_the_job_then_removes_what_a_new_job_had_in_place_of_the_rest() -> None:
    def refuse(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ApiException | None:
        if method == "create_namespaced_pod":
            return forbidden('admission webhook "policy" denied the request: no')
        return None

    calls, (plan,), patches = run(refuse)
    after = [m for m, _ in calls[calls.index(("create_namespaced_pod", "All")) + 1:]]
    # The refusal's outcome: its Event first, the Failed record, then what the job had deleted (in reverse order
    # of creation); not one step of the outcome the dry run stopped (no pods, no second status patch).
    assert after == ["create_namespaced_event", "patch_namespaced_custom_object_status",
                     "delete_namespaced_role_binding", "delete_namespaced_role",
                     "delete_namespaced_service_account", "delete_namespaced_service"], calls
    assert plan is not None and plan.phase == "Failed" and len(patches) == 1


def test_a_transient_refusal_deletes_nothing_and_the_next_pass_waits_out_the_backoff() -> None:
    def refuse(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ApiException | None:
        if method == "create_namespaced_pod" and not kwargs.get("dry_run"):
            return forbidden("exceeded quota: pods")
        return None

    calls, (first, second), patches = run(refuse, passes=2)
    assert not [m for m, _ in calls if m.startswith("delete_")], calls
    pods = [c for c in calls if c == ("create_namespaced_pod", None)]
    assert len(pods) == 2, calls  # the first pass tried both pods; the second, in the backoff, tried none
    assert first is not None and first.requeue_after == pytest.approx(2.0) and first.create == ()
    assert second is not None and second.create == () and 0 < (second.requeue_after or 0) <= 2.0
    assert len(patches) == 1  # the condition PodsCreated=False, written once: the backoff's pass writes nothing
