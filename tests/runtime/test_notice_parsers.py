"""Table tests for the notice parsers: annotation JSON, downward-API files, RFC 3339, user callables."""

from __future__ import annotations

import json
import logging

import pytest
from localcluster.downward import format_map, go_quote  # the process kubelet's real formatter
from reprieve.notice import (
    NOTICE_ANNOTATION,
    Notice,
    go_unquote,
    notice_from_annotations,
    parse_downward_file,
    parse_notice_annotation,
    parse_rfc3339,
    sigterm_notice,
    user_notice,
)

pytestmark = pytest.mark.unit

NOW = parse_rfc3339("2026-11-18T08:27:00Z")  # 10 s before GOOD["deadline"]
GOOD = {"id": "gke-spot/node-a/1", "reason": "gke-spot", "node": "node-a", "deadline": "2026-11-18T08:27:10Z",
        "observedAt": "2026-11-18T08:26:40Z"}

# (name, annotation text, expected reason, expected deadline - NOW (None = exact check skipped), known, warns)
ANNOTATIONS = [
    ("well formed", json.dumps(GOOD), "gke-spot", parse_rfc3339("2026-11-18T08:27:10Z") - NOW, True, False),
    ("not json", "{not json", "malformed", 0.0, False, True),
    ("json but not an object", "[1, 2]", "malformed", 0.0, False, True),
    ("empty string", "", "malformed", 0.0, False, True),
    ("missing deadline", json.dumps({**GOOD, "deadline": None}), "gke-spot", 0.0, False, True),
    ("unparsable deadline", json.dumps({**GOOD, "deadline": "tomorrow"}), "gke-spot", 0.0, False, True),
    ("deadline as a number", json.dumps({**GOOD, "deadline": 12345}), "gke-spot", 0.0, False, True),
    ("past deadline kept as is", json.dumps({**GOOD, "deadline": "2026-11-18T08:00:00Z"}), "gke-spot",
     parse_rfc3339("2026-11-18T08:00:00Z") - NOW, True, True),
    ("missing reason", json.dumps({k: v for k, v in GOOD.items() if k != "reason"}), "unknown",
     parse_rfc3339("2026-11-18T08:27:10Z") - NOW, True, False),
    ("nanosecond fraction and offset", json.dumps({**GOOD, "deadline": "2026-11-18T09:27:10.123456789+01:00"}),
     "gke-spot", parse_rfc3339("2026-11-18T08:27:10.123456Z") - NOW, True, False),
]


@pytest.mark.parametrize("name,text,reason,offset,known,warns", ANNOTATIONS, ids=[a[0] for a in ANNOTATIONS])
def test_parse_notice_annotation(name: str, text: str, reason: str, offset: float, known: bool, warns: bool,
                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="reprieve.notice"):
        notice = parse_notice_annotation(text, NOW)
    assert notice.reason == reason
    assert notice.deadline == pytest.approx(NOW + offset)
    assert notice.deadline_known is known
    assert notice.received_at == NOW and notice.source == "annotation" and notice.id
    assert bool(caplog.records) is warns, [r.getMessage() for r in caplog.records]


def test_malformed_notices_have_stable_ids() -> None:
    a, b = parse_notice_annotation("{bad", NOW), parse_notice_annotation("{bad", NOW + 5)
    assert a.id == b.id and a.id.startswith("malformed/")
    assert parse_notice_annotation("{worse", NOW).id != a.id


def test_missing_id_is_derived() -> None:
    notice = parse_notice_annotation(json.dumps({k: v for k, v in GOOD.items() if k != "id"}), NOW)
    assert notice.id == f"gke-spot/node-a/{GOOD['deadline']}"


@pytest.mark.parametrize("value", [
    "plain", "", 'with "quotes" and \\ backslash', "tab\tnewline\nbell\a", "unicode é ✓ 𝄞", "\x00\x7f\u200b",
    json.dumps(GOOD),
])
def test_go_unquote_inverts_the_kubelet_quoting(value: str) -> None:
    assert go_unquote(go_quote(value)) == value


@pytest.mark.parametrize("text", ['"unterminated', 'noquotes', '"bad \\q escape"', '"\\x4"', '"a"b"', '"\\'])
def test_go_unquote_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        go_unquote(text)


def test_go_unquote_octal() -> None:
    assert go_unquote('"\\101\\x42\\u0043\\U00000044"') == "ABCD"


def test_downward_file_round_trip() -> None:
    annotations = {NOTICE_ANNOTATION: json.dumps(GOOD), "a.io/b": 'x="y"\n', "kubectl.io/last": "{}"}
    assert parse_downward_file(format_map(annotations)) == annotations
    notice = notice_from_annotations(parse_downward_file(format_map(annotations)), NOW, source="notice-file")
    assert notice is not None and notice.id == GOOD["id"] and notice.source == "notice-file"


def test_downward_file_bad_lines_are_skipped_but_a_bad_notice_still_counts(
        caplog: pytest.LogCaptureFixture) -> None:
    text = 'good="1"\njunk line\nbad="unterminated\n' + f'{NOTICE_ANNOTATION}="{{broken\n'
    with caplog.at_level(logging.WARNING, logger="reprieve.notice"):
        parsed = parse_downward_file(text)
        notice = notice_from_annotations(parsed, NOW, source="notice-file")
    assert parsed["good"] == "1" and "bad" not in parsed
    assert notice is not None and notice.reason == "malformed" and notice.deadline == NOW
    assert len(caplog.records) >= 3


def test_no_notice() -> None:
    assert notice_from_annotations({}, NOW, source="x") is None
    assert notice_from_annotations(parse_downward_file(""), NOW, source="x") is None
    assert notice_from_annotations(None, NOW, source="x") is None


USER = [
    ("none", None, None),
    ("false", False, None),
    ("true: default grace", True, ("user", NOW + 30)),
    ("pair", ("maintenance", NOW + 100), ("maintenance", NOW + 100)),
    ("dict in annotation shape", dict(GOOD), ("gke-spot", parse_rfc3339(GOOD["deadline"]))),
    ("garbage: deadline now", 3.5, ("malformed", NOW)),
    ("bad pair: deadline now", ("x", "soon"), ("malformed", NOW)),
]


@pytest.mark.parametrize("name,value,expected", USER, ids=[u[0] for u in USER])
def test_user_notice(name: str, value: object, expected: tuple[str, float] | None) -> None:
    notice = user_notice(value, NOW, default_grace_seconds=30)
    if expected is None:
        assert notice is None
    else:
        assert notice is not None and (notice.reason, notice.deadline) == (expected[0], pytest.approx(expected[1]))


def test_sigterm_notice_and_json_round_trip() -> None:
    notice = sigterm_notice(NOW, 25.0, pod="job-1", process_id=1)
    assert (notice.reason, notice.deadline, notice.lead_seconds) == ("sigterm", NOW + 25, 25.0)
    back = Notice.from_json(notice.to_json())
    assert back == notice
    with pytest.raises(ValueError, match="deadline"):
        Notice.from_json(json.dumps({"id": "x", "source": "s", "reason": "r", "receivedAt": 1}))


@pytest.mark.parametrize("text", ["", "yesterday", "2026-13-01T00:00:00Z", None])
def test_parse_rfc3339_rejects(text: str | None) -> None:
    with pytest.raises((ValueError, TypeError)):
        parse_rfc3339(text)  # type: ignore[arg-type]


def test_parse_rfc3339_naive_is_utc() -> None:
    assert parse_rfc3339("2026-11-18T08:27:10") == parse_rfc3339("2026-11-18T08:27:10Z")


# (the annotation's "attempt", this runtime's attempt, counts?) docs/contract.md, "Notices across attempts"
ATTEMPTS = [
    (None, 3, True),  # an older operator writes no attempt: counts for every attempt
    (3, 3, True),
    (2, 3, False),  # the previous attempt's notice on a pod kept by an in-place restart
    (4, 3, False),
    ("3", 3, True),
    ("2", 3, False),
    ("three", 3, True),  # malformed: saving early is safe, ignoring a notice is not
    (True, 3, True),
]


@pytest.mark.parametrize("value,attempt,counts", ATTEMPTS)
def test_notice_of_another_attempt_is_ignored(value: object, attempt: int, counts: bool) -> None:
    raw = dict(GOOD) if value is None else {**GOOD, "attempt": value}
    annotations = {NOTICE_ANNOTATION: json.dumps(raw)}
    notice = notice_from_annotations(annotations, NOW, source="annotation", attempt=attempt)
    assert (notice is not None) == counts
    # without an attempt to compare with (outside the supervisor's world) every notice counts
    assert notice_from_annotations(annotations, NOW, source="annotation") is not None


def test_malformed_notice_counts_for_every_attempt() -> None:
    notice = notice_from_annotations({NOTICE_ANNOTATION: "{broken"}, NOW, source="annotation", attempt=5)
    assert notice is not None and notice.reason == "malformed"


def test_an_ignored_notice_is_logged_once_not_at_every_poll(caplog: pytest.LogCaptureFixture) -> None:
    annotations = {NOTICE_ANNOTATION: json.dumps({**GOOD, "id": "once-per-poll-test", "attempt": 1})}
    with caplog.at_level(logging.INFO, logger="reprieve.notice"):
        for _ in range(5):
            assert notice_from_annotations(annotations, NOW, source="notice-file", attempt=2) is None
    assert sum("ignored" in r.getMessage() for r in caplog.records) == 1, caplog.records


@pytest.mark.parametrize("deadline,known,attempt,started,verdict", [
    (100.0, True, None, 50.0, None),  # the deadline is still to come when the process started
    (100.0, True, None, 150.0, "leftover"),  # past before it started, no attempt: a file left by an earlier run
    (100.0, True, 3, 150.0, "no-deadline"),  # delivered to this attempt: counts, cannot be missed
    (100.0, False, None, 150.0, None),  # no known deadline: saved at once anyway
    (100.0, True, None, None, None),  # start unknown (a user callable): as it comes
])
def test_stale_at_start(deadline: float, known: bool, attempt: int | None, started: float | None,
                        verdict: str | None) -> None:
    from reprieve.notice import stale_at_start

    details = {} if attempt is None else {"attempt": attempt}
    notice = Notice(id="n", source="notice-file", reason="r", deadline=deadline, received_at=200.0,
                    deadline_known=known, details=details)
    assert stale_at_start(notice, started) == verdict
