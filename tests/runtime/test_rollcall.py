"""reprieve.rollcall: who has come before JAX starts, who never came (pure tables; real sockets on loopback with
threads for the processes, no JAX: the whole start-up with JAX is in test_startup_and_peers.py)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import pytest
from reprieve.rollcall import Hello, RollCallError, attend, lead, never_came, processes, refusal, waiting_line

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.mark.parametrize("ids,words", [([1], "process 1"), ([1, 3], "processes 1, 3"), ([1, 2, 3], "processes 1-3"),
                                       ([2, 3, 5], "processes 2, 3, 5")])
def test_processes(ids: list[int], words: str) -> None:
    assert processes(ids) == words


def test_lines() -> None:
    assert waiting_line([1], 2, "10.0.0.1:8476", 287.4) == "waiting for process 1 of 2 at 10.0.0.1:8476 (287 s left)"
    assert waiting_line([0], 4, "j-0:1", 5, coordinator=True) == \
        "waiting for process 0 of 4 (the coordinator) at j-0:1 (5 s left)"
    assert never_came([2, 3], 4, "a:1", 300).startswith("processes 2, 3 of 4 never came to a:1 within 300 s")
    assert never_came([0], 2, "a:1", 9, coordinator=True).startswith(
        "process 0 of 2 (the coordinator) never listened at a:1 within 9 s")


@pytest.mark.parametrize("hello,present,why", [
    (Hello("j", 3, 1), set(), None),
    (Hello("j", 2, 1), set(), "it is attempt 2 of job 'j'; this is attempt 3 of job 'j'"),
    (Hello("k", 3, 1), set(), "it is attempt 3 of job 'k'"),
    (Hello("j", 3, 0), set(), "process 0 is not one of 1..3"),
    (Hello("j", 3, 4), set(), "process 4 is not one of 1..3"),
    (Hello("j", 3, 2), {2}, "process 2 has come already"),
    (None, set(), "not a reprieve roll call line"),
])
def test_refusal(hello: Hello | None, present: set[int], why: str | None) -> None:
    got = refusal(hello, job="j", attempt=3, n=4, present=present)
    assert got == why if why is None else (got is not None and got.startswith(why))


def test_hello_round_trip() -> None:
    h = Hello("j", 3, 1, "pod-1")
    assert Hello.parse(h.line()) == h and Hello.parse(b"nope") is None


# -- real sockets ----------------------------------------------------------------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - handed to the test
            out["error"] = err

    out["thread"] = threading.Thread(target=run, daemon=True)
    out["thread"].start()
    return out


def test_everybody_comes_then_the_port_is_free_for_jax() -> None:
    port = _port()
    address = f"127.0.0.1:{port}"
    members = [_in_thread(attend, address, Hello("j", 1, p), n=3, timeout_s=20) for p in (1, 2)]
    time.sleep(0.3)  # they knock before process 0 listens
    waited = lead(("127.0.0.1", port), address, job="j", attempt=1, n=3, timeout_s=20)
    for m in members:
        m["thread"].join(10)
        assert "error" not in m and m["value"] < 20
    assert waited < 20
    with socket.create_server(("127.0.0.1", port)):  # what JAX's service does next: the port is free
        pass


def test_a_process_that_never_comes_is_named_on_every_process(caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import reprieve.rollcall as rc

    monkeypatch.setattr(rc, "FIRST_LINE_AFTER_S", 0.2)
    port = _port()
    address = f"127.0.0.1:{port}"
    member = _in_thread(attend, address, Hello("j", 1, 1), n=3, timeout_s=1.5)
    with caplog.at_level(logging.INFO, logger="reprieve.rollcall"):
        with pytest.raises(RollCallError, match=rf"process 2 of 3 never came to {address} within 2 s"):
            lead(("127.0.0.1", port), address, job="j", attempt=1, n=3, timeout_s=1.5)
        member["thread"].join(10)
    assert isinstance(member.get("error"), RollCallError) and "process 2 of 3 never came" in str(member["error"])
    assert f"waiting for process 2 of 3 at {address}" in caplog.text


def test_the_coordinator_that_never_listens_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _port()
    with pytest.raises(RollCallError, match=rf"process 0 of 2 \(the coordinator\) never listened at 127.0.0.1:{port}"):
        attend(f"127.0.0.1:{port}", Hello("j", 1, 1), n=2, timeout_s=0.5)


def test_a_process_of_another_attempt_is_turned_away_and_not_counted() -> None:
    port = _port()
    address = f"127.0.0.1:{port}"
    stale = _in_thread(attend, address, Hello("j", 1, 1), n=2, timeout_s=10)
    leader = _in_thread(lead, ("127.0.0.1", port), address, job="j", attempt=2, n=2, timeout_s=10)
    stale["thread"].join(10)
    assert isinstance(stale.get("error"), RollCallError) and "turned this process away" in str(stale["error"])
    fresh = attend(address, Hello("j", 2, 1), n=2, timeout_s=10)
    leader["thread"].join(10)
    assert fresh < 10 and "error" not in leader
