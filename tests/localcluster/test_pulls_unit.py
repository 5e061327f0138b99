"""Reading the kubelet's Pulled events into pull times and sizes (hack/localcluster/pulls.py)."""

from __future__ import annotations

import pytest
from localcluster.pulls import Pull, go_duration, parse_pulled, pulls

pytestmark = pytest.mark.unit
REF = "127.0.0.1:5000/reprieve-dev/reprieve-example@sha256:" + "a" * 64


@pytest.mark.parametrize("text,seconds", [
    ("850ms", 0.85), ("41.2s", 41.2), ("1m3.5s", 63.5), ("1h0m2s", 3602.0), ("120us", 0.00012),
])
def test_go_durations_are_read_in_seconds(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "41.2", "1x", "s", "1m3.5s extra"])
def test_what_is_not_a_go_duration_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="not a Go duration"):
        go_duration(text)


@pytest.mark.parametrize("message,pull", [
    (f'Successfully pulled image "{REF}" in 1m3.512s (1m3.512s including waiting). Image size: 938512345 bytes.',
     Pull(REF, 63.512, 938512345, False)),
    (f'Successfully pulled image "{REF}" in 850ms (12.1s including waiting). Image size: 42 bytes.',
     Pull(REF, 0.85, 42, False)),
    (f'Successfully pulled image "{REF}" in 2.5s (2.5s including waiting)', Pull(REF, 2.5, None, False)),
    (f'Successfully pulled image "{REF}" in 20s (emulated)', Pull(REF, 20.0, None, True)),
    (f'Container image "{REF}" already present on machine', None),
])
def test_a_pulled_message_gives_the_pull_time_without_waiting_and_the_size(message: str, pull: Pull | None) -> None:
    assert parse_pulled(message) == pull


def test_each_image_counts_its_first_pull_and_other_events_are_ignored() -> None:
    def ev(reason: str, message: str, at: str) -> dict:
        return {"reason": reason, "message": message, "firstTimestamp": at}

    events = [
        ev("Pulled", f'Successfully pulled image "{REF}" in 9s (9s including waiting). Image size: 7 bytes.',
           "2026-01-01T00:00:09Z"),
        ev("Pulled", f'Successfully pulled image "{REF}" in 30s (30s including waiting). Image size: 7 bytes.',
           "2026-01-01T00:00:01Z"),
        ev("Pulling", f'Pulling image "{REF}"', "2026-01-01T00:00:00Z"),
        ev("Pulled", 'Container image "other" already present on machine', "2026-01-01T00:00:02Z"),
    ]
    assert pulls(events) == {REF: Pull(REF, 30.0, 7, False)}
