"""Times as the Kubernetes API writes them: RFC 3339, UTC, whole seconds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """Parse an RFC 3339 time (string or datetime, as the kubernetes client returns); None if unusable."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value)  # Python 3.11 parses the Z suffix
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)
