"""--log-format json: one JSON object per line (Cloud Logging reads the severity instead of calling stderr an
error); plain stays the default."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from reprieve_operator.__main__ import configure_logging, parse_args

pytestmark = pytest.mark.unit


@pytest.fixture
def root_logger() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield
    root.handlers[:], _ = saved[0], root.setLevel(saved[1])


def test_json_lines(root_logger: None, capfd: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "json")
    logging.getLogger("reprieve_operator").warning("node %s will go away", "n0")
    line = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()][-1]
    record = json.loads(line)
    assert record["message"] == "node n0 will go away" and record["severity"] == "WARNING", record
    assert record["logger"] == "reprieve_operator" and record["timestamp"]


def test_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args([]).log_format == "plain" and not parse_args([]).leader_elect
    monkeypatch.setenv("REPRIEVE_LOG_FORMAT", "json")
    assert parse_args([]).log_format == "json"
    with pytest.raises(SystemExit):
        parse_args(["--log-format", "xml"])
