"""Each replicated byte read from storage once: the pure owner assignment (a table), and real 2-process JAX
restores of a fully replicated state (bit-exact, each process reading about half from storage, counted by the
reader) and of one whose peer dies half-way through sending a piece (the survivor reads it itself)."""

from __future__ import annotations

import concurrent.futures
import logging
import re
import time

import numpy as np
import pytest
from ckpt_workers.launch import run_gang
from reprieve.arrays import local_slices
from reprieve.checkpoint import read_once
from reprieve.checkpoint.exchange import Exchange, Peers
from reprieve.checkpoint.read_once import Piece
from reprieve.coordination import LocalCoordinator

MiB = 1 << 20


def _piece(nbytes: int, needers: tuple[int, ...], leaf: int = 0) -> Piece:
    return Piece(leaf, ((0, nbytes),), ((0, nbytes),), nbytes, needers)


@pytest.mark.unit
@pytest.mark.parametrize(("pieces", "owners"), [
    # equal pieces alternate between the two processes
    ([_piece(4 * MiB, (0, 1)) for _ in range(4)], [0, 1, 0, 1]),
    # a big piece first: the next ones go to the other process until it has as many bytes
    ([_piece(8 * MiB, (0, 1)), _piece(4 * MiB, (0, 1)), _piece(4 * MiB, (0, 1)), _piece(4 * MiB, (0, 1))],
     [0, 1, 1, 0]),
    # only needers own: a region of processes 2 and 3
    ([_piece(4 * MiB, (2, 3)), _piece(4 * MiB, (2, 3)), _piece(4 * MiB, (0, 1, 2, 3))], [2, 3, 0]),
])
def test_owners_balance_the_bytes_among_the_needers(pieces: list[Piece], owners: list[int]) -> None:
    assert [p.owner for p in read_once.assign(pieces)] == owners


@pytest.mark.unit
def test_small_or_unshared_pieces_are_read_by_every_needer() -> None:
    small = _piece(MiB - 1, (0, 1))
    alone = _piece(8 * MiB, (1,))
    assert read_once.assign([small, alone]) == []
    assert [p.owner for p in read_once.assign([small], min_bytes=1)] == [0]


@pytest.mark.unit
def test_shared_regions_are_those_two_processes_hold() -> None:
    a, b, c = ((0, 4),), ((4, 8),), ((8, 12),)
    assert read_once.shared_regions({0: [a, b], 1: [b, c], 2: [b], 3: [c]}) == {b: (0, 1, 2), c: (1, 3)}


@pytest.mark.unit
@pytest.mark.parametrize(("modes", "hosts", "on"), [
    (["auto", "auto"], ["a", "a"], False), (["auto", "auto"], ["a", "b"], True), (["on", "on"], ["a", "a"], True),
    (["off", "off"], ["a", "b"], False),
    # every process's mode counts, so that all reach the same answer: one off turns it off, one on turns it on
    (["auto", "off"], ["a", "b"], False), (["on", "off"], ["a", "a"], False), (["auto", "on"], ["a", "a"], True)])
def test_engaged(modes: list[str], hosts: list[str], on: bool) -> None:
    assert read_once.engaged(modes, hosts) is on


@pytest.mark.unit
def test_an_unknown_mode_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"read_once must be one of .*'auto'.*got 'always'"):
        read_once.engaged(["auto", "always"], [])


def _stats(out: str) -> dict[str, int]:
    m = re.search(r"STATS storage=(\d+) peer=(\d+) fallback=(\d+) total=(\d+)", out)
    assert m, out[-3000:]
    return dict(zip(("storage", "peer", "fallback", "total"), map(int, m.groups()), strict=True))


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_two_processes_read_each_replicated_byte_once(tmp_path) -> None:
    results = run_gang(2, ["--dir", str(tmp_path)], devices=None, worker="read_once_worker.py", timeout=45)
    outs = "\n".join(f"--- process {i} rc={rc}\n{o[-3000:]}" for i, (rc, o) in enumerate(results))
    assert all(rc == 0 and "OK" in o for rc, o in results), outs
    stats = [_stats(o) for _, o in results]
    total, small = stats[0]["total"], 1024  # the bias leaf is under the threshold: both read it
    assert sum(s["storage"] for s in stats) == total + small, outs  # every other byte read from storage once
    for s in stats:
        assert s["storage"] + s["peer"] == total and s["fallback"] == 0, outs
        assert abs(s["storage"] - total / 2) <= 2 * MiB, outs  # about half each (pieces of 2-12 MiB)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_processes_reading_one_step_among_themselves_read_each_replicated_byte_once(tmp_path) -> None:
    # A memory-tier restore's storage readers (read_step among processes 0 and 2 of 3): the two share the
    # replicated pieces between them, without process 1, which reads nothing and is not waited for.
    results = run_gang(3, ["--dir", str(tmp_path), "--among", "0,2"], devices=None, worker="read_once_worker.py",
                       timeout=50)
    outs = "\n".join(f"--- process {i} rc={rc}\n{o[-3000:]}" for i, (rc, o) in enumerate(results))
    assert all(rc == 0 and "OK" in o for rc, o in results), outs
    assert "IDLE" in results[1][1] and "STATS" not in results[1][1], outs
    stats = [_stats(results[p][1]) for p in (0, 2)]
    total, small = stats[0]["total"], 1024
    assert sum(s["storage"] for s in stats) == total + small, outs
    for s in stats:
        assert s["storage"] + s["peer"] == total and s["fallback"] == 0, outs
        assert abs(s["storage"] - total / 2) <= 2 * MiB, outs


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_peer_that_dies_mid_exchange_leaves_the_survivor_reading_it_itself(tmp_path) -> None:
    results = run_gang(2, ["--dir", str(tmp_path), "--direct", "--timeout", "20"], devices=None,
                       worker="read_once_worker.py", timeout=45,
                       per_process_env={1: {"REPRIEVE_CKPT_TEST_CRASH_AT": "read_once_send:1"}})
    (rc0, out0), (rc1, out1) = results
    assert rc1 == 86, out1[-3000:]
    assert rc0 == 0 and "OK" in out0, out0[-3000:]  # bit-exact
    s = _stats(out0)
    assert s["fallback"] >= 1 and s["storage"] + s["peer"] == s["total"], out0[-3000:]
    assert "did not arrive whole" in out0 and "from process 1" in out0, out0[-3000:]
    # it died half-way through a piece: the survivor had received half of it (then read it all from storage)
    m = re.search(r"connection closed after (\d+) bytes of piece 1 of \d+ \((\d+) bytes\)", out0)
    assert m and int(m[1]) == int(m[2]) // 2, out0[-3000:]


class _Process(LocalCoordinator):
    """Process ``pid`` of ``n`` threads of this test: one key-value store, as the job's coordination service is."""

    def __init__(self, store: LocalCoordinator, pid: int, n: int) -> None:
        self._kv, self._cond = store._kv, store._cond
        self.process_id, self.num_processes = pid, n


@pytest.mark.unit
def test_members_must_be_distinct_processes_of_the_job_including_this_one() -> None:
    store = LocalCoordinator()
    for members in [(1, 2), (0, 0, 1), (0, 3), (-1, 0)]:
        with pytest.raises(ValueError, match=r"members .* must be distinct processes of the job's 3 and include "
                                             r"this one \(0\)"):
            Peers(_Process(store, 0, 3), "k", members=members)
    assert Peers(_Process(store, 2, 3), "k", members=(2, 0)).processes() == (0, 2)
    assert Peers(_Process(store, 2, 3), "k").processes() == (0, 1, 2)


@pytest.mark.unit
def test_read_step_among_processes_needs_their_shared_key(tmp_path) -> None:
    from reprieve.checkpoint import CheckpointManager

    mgr = CheckpointManager(str(tmp_path))
    with pytest.raises(ValueError, match=r"read_step: among= needs key="):
        mgr.read_step(1, 1, {}, among=[0, 1])
    mgr.close()


@pytest.mark.integration
@pytest.mark.timeout(30)
def test_a_piece_changed_after_its_checksum_was_taken_is_refused_and_the_rest_arrives() -> None:
    # The owner's landing buffer changed under the exchange (a donated array's buffer reused by a training step):
    # the needer refuses that piece (its crc32c is the owner's at ready) and takes the other one. 32 MiB pieces:
    # more than loopback's socket buffers hold, so the changed last byte is still unsent when it changes.
    n = 32 * MiB
    region = ((0, 2 * n),)
    pieces = [Piece(0, region, ((0, n),), n, (0, 1), owner=0), Piece(0, region, ((n, 2 * n),), n, (0, 1), owner=1)]
    data = np.random.default_rng(3).integers(0, 255, 2 * n, dtype=np.uint8)
    buffers = [np.zeros(2 * n, np.uint8) for _ in range(2)]
    store = LocalCoordinator()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        made = [pool.submit(Exchange, Peers(_Process(store, p, 2), "test", mode="on", timeout_s=10), pieces,
                            lambda pc, p=p: buffers[p][local_slices(pc.part, pc.region)]) for p in (0, 1)]
        ex = [f.result() for f in made]
        assert ex[0].expected() == {(0, region, ((n, 2 * n),))}
        buffers[0][:n], buffers[1][n:] = data[:n], data[n:]
        ex[0].ready()
        ex[1].ready()
        buffers[0][n - 1] ^= 0xFF  # after the owner took its checksum, before it could send that byte
        failed = [pool.submit(e.receive, pool) for e in ex]
        got = [f.result() for f in failed]
        for e in ex:
            e.close()
    assert got[0] == []
    assert buffers[0][n:].tobytes() == data[n:].tobytes()
    assert [pc for pc, _ in got[1]] == [pieces[0]]
    assert "from process 0" in got[1][0][1] and "fails its checksum" in got[1][0][1]


def _two_pieces(n: int) -> list[Piece]:
    """Two ``n``-byte halves of one region both processes hold, owned by process 0 and 1."""
    region = ((0, 2 * n),)
    return [Piece(0, region, ((0, n),), n, (0, 1), owner=0), Piece(0, region, ((n, 2 * n),), n, (0, 1), owner=1)]


@pytest.mark.integration
@pytest.mark.timeout(30)
def test_a_process_that_never_publishes_is_read_around_after_one_bounded_wait(caplog) -> None:
    # Process 1 never comes to the exchange (it died before it, or runs another version): process 0 waits for its
    # address once, for connect_s, then expects nothing from it (it reads that piece from storage itself) and
    # does not wait for it to take the piece it owns either.
    n = 2 * MiB
    pieces = _two_pieces(n)
    buf = np.zeros(2 * n, np.uint8)
    store = LocalCoordinator()
    t = time.monotonic()
    ex = Exchange(Peers(_Process(store, 0, 2), "test", mode="on", timeout_s=20, connect_s=0.5), pieces,
                  lambda pc: buf[local_slices(pc.part, pc.region)])
    assert ex.expected() == set()  # the piece process 1 owns is read from storage, not awaited
    ex.ready()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert ex.receive(pool) == []
    ex.close()
    took = time.monotonic() - t
    assert 0.5 <= took < 5, took  # the address's wait, then nothing: not the 20 s timeout, not 30 s a process
    assert "process 1 did not publish its address" in caplog.text


@pytest.mark.integration
@pytest.mark.timeout(30)
def test_a_process_with_read_once_off_turns_the_exchange_off_for_all_at_once(caplog) -> None:
    # Process 1 has read_once off: it says so, and process 0 (on) turns the exchange off at once instead of
    # waiting connect_s for an address that never comes; neither expects anything from the other.
    caplog.set_level(logging.INFO, logger="reprieve.checkpoint.exchange")
    n = 2 * MiB
    pieces = _two_pieces(n)
    buffers = [np.zeros(2 * n, np.uint8) for _ in range(2)]
    store = LocalCoordinator()
    t = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        made = [pool.submit(Exchange, Peers(_Process(store, p, 2), "test", mode=mode, timeout_s=20, connect_s=15),
                            pieces, lambda pc, p=p: buffers[p][local_slices(pc.part, pc.region)])
                for p, mode in ((0, "on"), (1, "off"))]
        ex = [f.result() for f in made]
        for e in ex:
            assert e.expected() == set()
            e.ready()
            assert e.receive(pool) == []
            e.close()
    assert time.monotonic() - t < 5  # not connect_s
    assert ex[1].address is None  # the process with it off serves nothing
    assert "restore exchange: off (read_once 0=on, 1=off" in caplog.text
