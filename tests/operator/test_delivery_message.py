"""The PreemptionNotice Event text: what, by when, which attempt, and when the deadline may be late."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from reprieve_operator.policy.notice import notice_event_name, notice_message
from reprieve_operator.policy.signals import Notice

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)


def notice(estimated: bool) -> Notice:
    return Notice("cordon/n0/1", "cordon", "n0", T0 + timedelta(seconds=30), T0, estimated=estimated)


def test_plain_delivery() -> None:
    msg = notice_message(notice(False), 2, None, T0, T0 - timedelta(hours=1))
    assert msg == ("node n0 will go away (cordon) by 2026-11-22T03:00:30Z; notice cordon/n0/1 delivered to "
                   "attempt 2")


def test_an_earlier_notice_says_what_it_replaces() -> None:
    msg = notice_message(notice(False), 1, T0 + timedelta(seconds=120), T0, T0 - timedelta(hours=1))
    assert "(earlier than the deadline 2026-11-22T03:02:00Z delivered before)" in msg


@pytest.mark.parametrize("first_seen_after_start,estimated,warned", [
    (0, True, True), (3, True, True), (60, True, False), (0, False, False)])
def test_a_signal_present_at_operator_start_without_a_timestamp_is_flagged(
        first_seen_after_start: int, estimated: bool, warned: bool) -> None:
    started = T0 - timedelta(seconds=first_seen_after_start)
    msg = notice_message(notice(estimated), 1, None, T0, started)
    assert ("may be late by the time the operator was down" in msg) is warned


def test_event_names_are_unique_per_notice_and_attempt() -> None:
    job = {"name": "llama", "uid": "0123456789abcdef"}
    names = {notice_event_name(job, a, i) for a in (1, 2) for i in ("gke-spot/n0/1", "aws-rebalance/n1/1")}
    assert len(names) == 4 and all(n.startswith("llama.01234567.notice-") for n in names)
