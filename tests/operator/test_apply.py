"""apply.tolerate: the one place where an expected 404/409 is logged at INFO and counts as done."""

from __future__ import annotations

import logging

import pytest
from kubernetes.client.rest import ApiException
from reprieve_operator.apply import tolerate

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
