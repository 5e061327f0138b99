"""One reader of a JSON object in text the runtime was handed (a metadata file, a protocol line, a ConfigMap key),
with the error the caller's format names (pure)."""

from __future__ import annotations

import json
from typing import Any


def json_object(text: str | bytes, what: str, error: type[Exception], expected: str = "a JSON object") -> dict[str, Any]:
    """``text`` parsed as a JSON object. Raises ``error("<what> must be <expected>, got <found>")``, where found is
    ``text that is not JSON (<why>): <the first 200 characters>`` or the JSON type that came instead."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise error(f"{what} must be {expected}, got text that is not JSON ({err}): {str(text)[:200]!r}") from None
    if not isinstance(value, dict):
        raise error(f"{what} must be {expected}, got {type(value).__name__}")
    return value
