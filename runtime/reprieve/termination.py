"""The container's termination message: what this process leaves for the operator in the pod's status.

The kubelet copies the file at the container's ``terminationMessagePath`` (``/dev/termination-log`` by default,
mounted when the container starts) into ``state.terminated.message`` when the container ends, at most 4096
bytes. Unlike an annotation it needs no API call from this process, so it says what the process could not tell
the API server: the silent peers when JAX ends it (``peerLost``, :mod:`reprieve.peers`), and the last progress
report when the job ended while the API server was down (``progress``, :mod:`reprieve.progress`).
``docs/contract.md``, "Progress" and "In-place restarts and the supervisor" (peer lost).

One JSON object; each writer sets its own key (:func:`write`), the others are kept.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath, mounted by the kubelet
MAX_BYTES = 4096  # what the kubelet keeps of it
_lock = threading.Lock()  # writers run in different threads (the peer watch, the exit path)


def merged(current: str, fields: Mapping[str, Any]) -> str:
    """The message ``current`` with ``fields`` set (a None or empty value removes its key); ``""`` when nothing
    is left. A part that would not fit ``MAX_BYTES`` is left out, with a warning (pure but for the log)."""
    try:
        value = json.loads(current) if current.strip() else {}
    except ValueError:
        value = {}
    if not isinstance(value, dict):
        value = {}
    for key, v in fields.items():
        if v is None or v == [] or v == {}:
            value.pop(key, None)
        else:
            value[key] = v
    text = json.dumps(value, sort_keys=True, separators=(",", ":")) if value else ""
    while len(text.encode()) > MAX_BYTES and value:
        key = max(value, key=lambda k: len(json.dumps(value[k])))
        log.warning("termination message: %r left out (the kubelet keeps %d bytes)", key, MAX_BYTES)
        value.pop(key)
        text = json.dumps(value, sort_keys=True, separators=(",", ":")) if value else ""
    return text


def write(fields: Mapping[str, Any], path: str = TERMINATION_LOG) -> None:
    """Set ``fields`` in the message at ``path`` (``RuntimeConfig.termination_log``, REPRIEVE_TERMINATION_LOG)
    when that file exists (a kubelet mounted it); never raises."""
    target = Path(path)
    if not target.exists():
        return
    with _lock:
        try:
            current = target.read_text(errors="replace")
            text = merged(current, fields)
            if text != current:  # the same report again (the exit path repeats the watch's): nothing to rewrite
                with target.open("r+", encoding="utf-8") as f:  # written over, then cut: never an empty file
                    f.write(text)
                    f.truncate()
        except OSError as err:
            log.debug("termination message not written to %s: %s", path, err)


def held() -> threading.Lock:
    """The writers' lock: :func:`reprieve.peers.end_process` takes it before it aborts the process, so an abort
    never lands between a write's first byte and its last (a truncated file is an empty message)."""
    return _lock
