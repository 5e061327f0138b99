"""Test-only fault injection of the checkpoint tier: ``REPRIEVE_CKPT_TEST_CRASH_AT=<point>[:<process>]`` makes the
process die (exit 86) at that point, so the multi-process tests meet a real dead peer;
``REPRIEVE_CKPT_TEST_STOP_IN_AGREED_SAVE=<notice id prefix>:<attempt>`` makes that attempt's process stop itself
(SIGSTOP) once it has said it saves an agreed step for such a notice, so an end-to-end test can land a fault inside
that save, however short, and let it go on (SIGCONT) (docs/contract.toml, ``testing``)."""

from __future__ import annotations

import logging
import os
import signal
import sys

from ..env import Env

log = logging.getLogger(__name__)

CRASH_ENV = "REPRIEVE_CKPT_TEST_CRASH_AT"
STOP_ENV = "REPRIEVE_CKPT_TEST_STOP_IN_AGREED_SAVE"


def crashing_at(point: str, process_id: int) -> bool:
    """Whether ``REPRIEVE_CKPT_TEST_CRASH_AT`` names ``point`` (alone or with this process's id)."""
    want = Env(os.environ).opt_text(CRASH_ENV)
    return want is not None and (want == point or want == f"{point}:{process_id}")


def maybe_crash(point: str, process_id: int) -> None:
    """Die here when ``REPRIEVE_CKPT_TEST_CRASH_AT`` names ``point`` (alone or with this process's id)."""
    if crashing_at(point, process_id):
        log.error("test fault injection: crashing at %s", point)
        os._exit(86)


def stopping_in_agreed_save(notice_id: str, attempt: int) -> bool:
    """Whether ``REPRIEVE_CKPT_TEST_STOP_IN_AGREED_SAVE`` names this attempt and a prefix of ``notice_id``."""
    want = Env(os.environ).opt_text(STOP_ENV)
    if want is None:
        return False
    prefix, _, at = want.rpartition(":")
    return at == str(attempt) and notice_id.startswith(prefix)


def maybe_stop_in_agreed_save(notice_id: str, attempt: int) -> None:
    """Stop this process (SIGSTOP: every thread, until a SIGCONT) when :func:`stopping_in_agreed_save`."""
    if stopping_in_agreed_save(notice_id, attempt):
        log.warning("test fault injection: stopping in the agreed save (notice %s, attempt %d)", notice_id, attempt)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
