"""Preemption notices and their pure parsers.

A :class:`Notice` says "this process's node goes away at ``deadline``". Every source (SIGTERM, the pod's
``reprieve.dev/notice`` annotation seen through the Kubernetes API or the downward-API file, a user callable)
produces one. Parsers never raise on bad input: a malformed annotation is logged and becomes a notice with
the most conservative deadline (now), because saving early is always safe and ignoring a notice is not
(``docs/contract.md``, "Notice annotation").
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

NOTICE_ANNOTATION = "reprieve.dev/notice"
# The job's notice object, the ConfigMap <job>-notice: its data key NOTICE_OBJECT_KEY carries what the annotation would
# (docs/contract.md); a runtime that watches it says so on its pod (NOTICE_WATCH_ANNOTATION = the object's name).
NOTICE_OBJECT_SUFFIX = "-notice"
NOTICE_OBJECT_KEY = "notice"
NOTICE_WATCH_ANNOTATION = "reprieve.dev/notice-watch"
PROGRESS_ANNOTATION = "reprieve.dev/progress"
# A notice's reason when the gang grows and this pod stays (docs/contract.toml [elastic] notice_reason): its agreed
# save may stay in the pods' memory (reprieve.policy.agreed_to_memory).
RESIZE_REASON = "resize"


@dataclass(frozen=True)
class Notice:
    """One preemption notice as seen by one process.

    Attributes:
        id: stable identity of the node event (re-delivery of the same id is ignored).
        source: where this process learned it: ``sigterm``, ``annotation``, ``notice-file``, ``user``, ...
        reason: why the node goes away (``gke-spot``, ``sigterm``, ``malformed``, ...).
        deadline: wall-clock (``time.time()``) seconds when the node is expected to go away.
        received_at: wall-clock seconds when this process learned of it.
        deadline_known: False when the deadline was invented (malformed notice): plan to save at once, but
            do not treat "past the deadline" as a failure.
    """

    id: str
    source: str
    reason: str
    deadline: float
    received_at: float
    deadline_known: bool = True
    node: str | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def lead_seconds(self) -> float:
        """How much warning this notice gave when it arrived (negative if it arrived late)."""
        return self.deadline - self.received_at

    def to_json(self) -> str:
        return json.dumps({
            "id": self.id, "source": self.source, "reason": self.reason, "deadline": self.deadline,
            "receivedAt": self.received_at, "deadlineKnown": self.deadline_known, "node": self.node,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Notice:
        """Inverse of :meth:`to_json` (used between processes; raises ValueError naming the bad field)."""
        try:
            raw = json.loads(text)
            return cls(id=str(raw["id"]), source=str(raw["source"]), reason=str(raw["reason"]),
                       deadline=float(raw["deadline"]), received_at=float(raw["receivedAt"]),
                       deadline_known=bool(raw.get("deadlineKnown", True)), node=raw.get("node"))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"agreement notice record is malformed ({err!r}): {text[:200]!r}") from None


def sigterm_notice(now: float, grace_seconds: float, *, pod: str | None, process_id: int) -> Notice:
    """The notice SIGTERM implies: the kubelet kills the container ``grace_seconds`` after sending it."""
    return Notice(id=f"sigterm/{pod or 'local'}/{process_id}", source="sigterm", reason="sigterm",
                  deadline=now + grace_seconds, received_at=now)


def user_notice(value: Any, now: float, *, default_grace_seconds: float) -> Notice | None:
    """Normalise what a user notice callable returned.

    Accepted: ``None``/``False`` (no notice), ``True`` (notice, deadline = now + default grace), a
    :class:`Notice`, a ``(reason, deadline)`` pair with ``deadline`` in wall-clock seconds, or a dict in the
    annotation's JSON shape. Anything else is logged and treated as a notice with deadline now.
    """
    if value is None or value is False:
        return None
    if isinstance(value, Notice):
        return value
    if value is True:
        return Notice(id="user", source="user", reason="user", deadline=now + default_grace_seconds,
                      received_at=now)
    if isinstance(value, tuple) and len(value) == 2:
        reason, deadline = value
        try:
            return Notice(id=f"user/{reason}", source="user", reason=str(reason), deadline=float(deadline),
                          received_at=now)
        except (TypeError, ValueError):
            pass
    if isinstance(value, dict):
        return parse_notice_annotation(json.dumps(value, default=str), now, source="user")
    log.warning("notice callable returned %r; expected None, True, (reason, deadline), a dict or a Notice; "
                "treating it as a notice with deadline now", value)
    return Notice(id="user/malformed", source="user", reason="malformed", deadline=now, received_at=now,
                  deadline_known=False)


def parse_rfc3339(text: Any) -> float:
    """RFC 3339 / ISO 8601 timestamp -> wall-clock seconds. Naive times are UTC. Raises ValueError."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected an RFC 3339 timestamp, got {text!r}")
    value = text.strip()
    if value[-1] in "zZ":
        value = value[:-1] + "+00:00"
    # Python 3.11's fromisoformat does not take more than 6 fractional digits (Go emits up to 9)
    value = re.sub(r"(\.\d{6})\d+", r"\1", value)
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def format_rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_notice_annotation(text: str, now: float, *, source: str = "annotation", warn_past: bool = True) -> Notice:
    """The ``reprieve.dev/notice`` annotation value -> :class:`Notice`; never raises.

    Malformed JSON, a missing or unparsable ``deadline`` -> logged at WARNING, and a notice with deadline
    ``now`` (``deadline_known=False``) so the job saves at once. A deadline already past is kept as is (the
    countdown then saves at the earliest safe step) and logged at WARNING unless ``warn_past`` is false.
    """
    try:
        raw = json.loads(text)
    except (TypeError, ValueError) as err:
        log.warning("%s %s is not JSON (%s): %r; treating it as a notice with deadline now",
                    source, NOTICE_ANNOTATION, err, str(text)[:200])
        return _malformed(text, now, source)
    if not isinstance(raw, dict):
        log.warning("%s %s must be a JSON object, got %s: %r; treating it as a notice with deadline now",
                    source, NOTICE_ANNOTATION, type(raw).__name__, str(text)[:200])
        return _malformed(text, now, source)
    reason = str(raw.get("reason") or "unknown")
    node = raw.get("node")
    node = str(node) if node is not None else None
    notice_id = raw.get("id")
    if not notice_id:
        notice_id = f"{reason}/{node or '?'}/{raw.get('deadline', '?')}"
        log.warning("%s %s has no id; using %r", source, NOTICE_ANNOTATION, notice_id)
    deadline_text = raw.get("deadline")
    try:
        deadline = parse_rfc3339(deadline_text)
        known = True
    except (TypeError, ValueError, OverflowError) as err:
        log.warning("%s %s id=%s: deadline %r is missing or not RFC 3339 (%s); using now", source,
                    NOTICE_ANNOTATION, notice_id, deadline_text, err)
        deadline, known = now, False
    notice = Notice(id=str(notice_id), source=source, reason=reason, deadline=deadline, received_at=now,
                    deadline_known=known, node=node, details=raw)
    if warn_past:
        _warn_if_past(notice, now)
    return notice


def _warn_if_past(notice: Notice, now: float) -> None:
    if notice.deadline_known and notice.deadline <= now:
        log.warning("%s %s id=%s: deadline %s is already %.1fs past", notice.source, NOTICE_ANNOTATION, notice.id,
                    notice.details.get("deadline"), now - notice.deadline)


def _malformed(text: Any, now: float, source: str) -> Notice:
    digest = zlib.crc32(str(text).encode("utf-8", "replace"))
    return Notice(id=f"malformed/{digest}", source=source, reason="malformed", deadline=now, received_at=now,
                  deadline_known=False)


_GO_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
               '"': '"', "'": "'"}


def go_unquote(text: str) -> str:
    """Inverse of Go's ``strconv.Quote`` (``%q``), the quoting of downward-API files. Raises ValueError."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError(f"expected a double-quoted Go string, got {text[:60]!r}")
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch == '"':
            raise ValueError(f"unescaped quote at offset {i + 1} in {text[:60]!r}")
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError(f"dangling backslash in {text[:60]!r}")
        esc = body[i + 1]
        if esc in _GO_ESCAPES:
            out.append(_GO_ESCAPES[esc])
            i += 2
        elif esc in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = body[i + 2:i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError(f"bad \\{esc} escape at offset {i + 1} in {text[:60]!r}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif esc in "01234567":
            digits = body[i + 1:i + 4]
            if len(digits) != 3 or not all(c in "01234567" for c in digits):
                raise ValueError(f"bad octal escape at offset {i + 1} in {text[:60]!r}")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{esc} at offset {i + 1} in {text[:60]!r}")
    return "".join(out)


def parse_downward_file(text: str) -> dict[str, str]:
    """A downward-API labels/annotations file (``key="quoted value"`` lines) -> dict; never raises.

    Lines that do not parse are logged at WARNING and skipped, except for the notice annotation itself,
    whose raw (unquoted-as-possible) value is kept so the caller still sees a (malformed) notice.
    """
    result: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            log.warning("downward-API file line %d has no key=value: %r; skipped", lineno, line[:200])
            continue
        try:
            result[key] = go_unquote(value.strip())
        except ValueError as err:
            log.warning("downward-API file line %d (%s): %s", lineno, key, err)
            if key == NOTICE_ANNOTATION:
                result[key] = value.strip()
    return result


_IGNORED_LOGGED: set[tuple[Any, ...]] = set()  # (source, notice id, why) already logged as ignored


def notice_from_annotations(annotations: dict[str, str] | None, now: float, *, source: str,
                            attempt: int | None = None, started_at: float | None = None) -> Notice | None:
    """The notice in a pod's annotations, or None when there is none or it was delivered to another attempt
    than ``attempt`` (a pod kept across an in-place restart still carries the previous attempt's notice).

    ``started_at`` (when this process started reading notices): a notice whose deadline had passed by then is
    :func:`stale_at_start`'s to judge: a leftover without an ``attempt`` is ignored, one delivered to this attempt
    counts without a deadline to miss."""
    if not annotations or NOTICE_ANNOTATION not in annotations:
        return None
    notice = parse_notice_annotation(annotations[NOTICE_ANNOTATION], now, source=source, warn_past=False)
    if attempt is not None and not notice_counts_for(notice, attempt):
        _log_once((source, notice.id, attempt), "%s %s id=%s was delivered to attempt %s; this is attempt %d: ignored",
                  source, NOTICE_ANNOTATION, notice.id, notice.details.get("attempt"), attempt)
        return None
    verdict = stale_at_start(notice, started_at)
    if verdict == "leftover":
        assert started_at is not None
        _log_once((source, notice.id, "leftover"), "%s %s id=%s: its deadline %s passed %.0fs before this process "
                  "started and it names no attempt: a leftover of an earlier run, ignored (remove it, or write a "
                  "notice with a deadline to come)", source, NOTICE_ANNOTATION, notice.id,
                  notice.details.get("deadline"), started_at - notice.deadline)
        return None
    if verdict == "no-deadline":
        assert started_at is not None
        _log_once((source, notice.id, "stale"), "%s %s id=%s: its deadline %s passed %.0fs before this process "
                  "started: saving at the earliest step, and not counted as a missed deadline", source,
                  NOTICE_ANNOTATION, notice.id, notice.details.get("deadline"), started_at - notice.deadline)
        return dataclasses.replace(notice, deadline_known=False)
    _warn_if_past(notice, now)  # only for a notice that counts: a kept pod's old notice is past by design
    return notice


def stale_at_start(notice: Notice, started_at: float | None) -> str | None:
    """What a notice whose deadline had already passed when the process started is (pure): ``"leftover"`` when
    it names no attempt (the operator always names one: it is a file left by an earlier run, on a laptop where
    every run is attempt 1), ``"no-deadline"`` when it does (the operator delivered it to this attempt: save at
    once, but a deadline that passed before the process existed is not this attempt's to miss), else None."""
    if started_at is None or not notice.deadline_known or notice.deadline >= started_at:
        return None
    return "leftover" if notice.details.get("attempt") is None else "no-deadline"


def _log_once(key: tuple[Any, ...], message: str, *args: Any) -> None:
    if key not in _IGNORED_LOGGED:  # once per source and notice, not at every poll of the file
        _IGNORED_LOGGED.add(key)
        log.info(message, *args)


def notice_counts_for(notice: Notice, attempt: int) -> bool:
    """Whether ``notice`` applies to ``attempt`` (pure): yes without an ``attempt`` field (an older operator) or
    with a malformed one (saving early is safe, ignoring a notice is not); else only for that attempt."""
    value = notice.details.get("attempt")
    if value is None or isinstance(value, bool):
        return True
    try:
        return int(value) == attempt
    except (TypeError, ValueError):
        log.warning("%s id=%s: attempt %r is not an integer; the notice counts", NOTICE_ANNOTATION, notice.id,
                    value)
        return True
