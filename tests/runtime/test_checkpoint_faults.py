"""``reprieve.checkpoint.faults``: which agreed save ``REPRIEVE_CKPT_TEST_STOP_IN_AGREED_SAVE`` stops in (the stop
itself is met end to end: tests/e2e/test_elastic_faults_e2e.py holds the grow's save with it)."""

from __future__ import annotations

import pytest
from reprieve.checkpoint.faults import STOP_ENV, stopping_in_agreed_save

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("value", "notice", "attempt", "stops"), [
    (None, "resize/a5/s10/", 5, False),  # unset: never
    ("resize/:5", "resize/a5/s10/", 5, True),
    ("resize/:5", "resize/a5/s10/", 6, False),  # another attempt
    ("resize/:5", "gke-spot/node-a/1", 5, False),  # another notice
    (":5", "gke-spot/node-a/1", 5, True),  # an empty prefix: any notice of that attempt
    ("resize/", "resize/a5/s10/", 5, False),  # no attempt given: never
])
def test_the_stop_names_an_attempt_and_a_notice_id_prefix(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                        notice: str, attempt: int, stops: bool) -> None:
    if value is None:
        monkeypatch.delenv(STOP_ENV, raising=False)
    else:
        monkeypatch.setenv(STOP_ENV, value)
    assert stopping_in_agreed_save(notice, attempt) is stops
