"""Test-only fault injection of the checkpoint tier: ``REPRIEVE_CKPT_TEST_CRASH_AT=<point>[:<process>]`` makes the
process die (exit 86) at that point, so the multi-process tests meet a real dead peer (docs/contract.toml,
``testing``)."""

from __future__ import annotations

import logging
import os

from ..env import Env

log = logging.getLogger(__name__)

CRASH_ENV = "REPRIEVE_CKPT_TEST_CRASH_AT"


def crashing_at(point: str, process_id: int) -> bool:
    """Whether ``REPRIEVE_CKPT_TEST_CRASH_AT`` names ``point`` (alone or with this process's id)."""
    want = Env(os.environ).opt_text(CRASH_ENV)
    return want is not None and (want == point or want == f"{point}:{process_id}")


def maybe_crash(point: str, process_id: int) -> None:
    """Die here when ``REPRIEVE_CKPT_TEST_CRASH_AT`` names ``point`` (alone or with this process's id)."""
    if crashing_at(point, process_id):
        log.error("test fault injection: crashing at %s", point)
        os._exit(86)
