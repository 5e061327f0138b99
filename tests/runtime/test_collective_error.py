"""reprieve.collective_error: the peer a failed collective names, mapped to a process through the gloo addresses
JAX keeps in the coordination service. The records and error texts are real: captured from a 2-process JAX job
(gloo CPU collectives, two devices a process) whose process 1 was SIGKILLed mid-collective, and from the failed
e2e run of the unwarned node loss (``Read error [127.0.0.1]:2470``)."""

from __future__ import annotations

import pytest
from reprieve.collective_error import (
    blamed_processes,
    collective_failed,
    gloo_addresses,
    named_addresses,
    rank_address,
)

pytestmark = pytest.mark.unit

# cpu:gloo/0,2048/<rank> of that job: hostname "vm", process 0 listens on 127.0.0.1:42301, process 1 on :39215
RANK0 = bytes.fromhex(
    "0200000000000000766d88000000000000000200a53d7f00000100000000000000000f00000000000000801a43c7df550000c9696b6b"
    "0a7f0000f0d954c7df550000001080000000000028000000000000002049640aff7f0000204b640aff7f00008c95ea6a0a7f0000404964"
    "0aff7f0000f47a076a0a7f0000000000000000000000000000000000000100000000000000ffffffffffffffff02000000000000000300"
    "000000000000")
RANK1 = bytes.fromhex(
    "0200000000000000766d88000000000000000200992f7f00000100000000000000000c0000000000000060c57c1a25560000c9698b39"
    "3e7f000050878d1a2556000000108000000000002800000000000000e0e35bdbff7f0000e0e55bdbff7f00008c950a393e7f000000e45b"
    "dbff7f0000f47a27383e7f0000000000000000000000000000000000000100000000000000ffffffffffffffff00000000000000000100"
    "000000000000")
DEVICES = {0: 0, 1: 0, 2048: 1, 2049: 1}  # jax.devices() of that job: id -> process_index
STORE = {"cpu:gloo/0,2048/0": RANK0, "cpu:gloo/0,2048/1": RANK1, "cpu:gloo/1,2049/0": RANK0,
         "cpu:gloo/1,2049/1": RANK1}
# what process 0 raised when process 1 died (gloo prints the port byte-swapped: 39215 = 0x992f -> 0x2f99 = 12185)
CLOSED = ("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer "
          "[127.0.0.1]:12185")

# the survivor's error in the failed e2e run as the notes quote it ("Gloo all-reduce failed ... Read error
# [127.0.0.1]:2470: Connection reset by peer"), with the file:line part gloo puts between
FAILED_RUN = ("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:534] Read error "
              "[127.0.0.1]:2470: Connection reset by peer")


def _rank(family: int, port: bytes, ip: bytes, host: bytes = b"vm") -> bytes:
    """A rank record of gloo's layout with the given sockaddr (ip at 4 for AF_INET, at 8 for AF_INET6)."""
    addr = family.to_bytes(2, "little") + port + (ip + bytes(124) if family == 2 else bytes(4) + ip + bytes(104))
    addr = addr[:128] + (7).to_bytes(8, "little")
    return len(host).to_bytes(8, "little") + host + len(addr).to_bytes(8, "little") + addr + bytes(16)


@pytest.mark.parametrize(("raw", "expected"), [
    (RANK0, ("127.0.0.1", 42301)),
    (RANK1, ("127.0.0.1", 39215)),
    (_rank(2, b"\x1f\x90", bytes([10, 0, 3, 7])), ("10.0.3.7", 8080)),
    (_rank(10, b"\x1f\x90", bytes(15) + b"\x01"), ("::1", 8080)),
    (_rank(10, b"\x1f\x90", bytes(10) + b"\xff\xff" + bytes([10, 0, 3, 7])), ("10.0.3.7", 8080)),  # v4-mapped
    (_rank(1, b"\x1f\x90", bytes(4)), None),  # AF_UNIX: no address
    (_rank(2, b"\x00\x00", bytes([10, 0, 3, 7])), None),  # port 0
    (RANK0[:40], None),  # cut short
    (b"", None),
    (b"not a gloo record at all", None),
])
def test_a_gloo_rank_record_gives_its_listener_address(raw: bytes, expected: tuple[str, int] | None) -> None:
    assert rank_address(raw) == expected


@pytest.mark.parametrize(("text", "expected"), [
    (CLOSED, [("127.0.0.1", 12185)]),
    (FAILED_RUN, [("127.0.0.1", 2470)]),
    ("Write error [10.244.1.9]:41230: Broken pipe", [("10.244.1.9", 41230)]),
    ("Connection closed by peer [::ffff:10.0.0.2]:5000", [("10.0.0.2", 5000)]),
    ("Read error [fe80::1]:7000: Connection reset by peer", [("fe80::1", 7000)]),
    ("[pair.cc:547] nothing named", []),
    ("Read error [999.1.1.1]:2470", []),  # not an address
    ("Read error [127.0.0.1]:0", []),
    ("Gloo context initialization failed ... GetKeyValue() timed out with key: cpu:gloo/0,2048/1", []),
])
def test_the_peer_addresses_an_error_names(text: str, expected: list[tuple[str, int]]) -> None:
    assert named_addresses(text) == expected


def test_the_gloo_entries_map_each_address_to_its_process() -> None:
    assert gloo_addresses(STORE, DEVICES) == {("127.0.0.1", 42301): 0, ("127.0.0.1", 39215): 1}
    assert gloo_addresses(STORE, {0: 0}) == {("127.0.0.1", 42301): 0}  # a device of no known process: left out
    odd = {"cpu:gloo/0,2048/2": RANK0, "cpu:gloo/x/0": RANK0, "cpu:gloo/0,2048/r": RANK0, "other": RANK0,
           "cpu:gloo/0,2048/1": b"junk"}
    assert gloo_addresses(odd, DEVICES) == {}
    clash = {"cpu:gloo/0,2048/0": RANK0, "cpu:gloo/0,2048/1": RANK0}  # two processes claim one address
    assert gloo_addresses(clash, DEVICES) == {}


ADDRESSES = {("127.0.0.1", 42301): 0, ("127.0.0.1", 39215): 1, ("10.0.0.3", 5000): 2}


@pytest.mark.parametrize(("text", "own", "expected"), [
    (CLOSED, 0, (1,)),  # the port as gloo prints it (byte-swapped)
    ("Read error [127.0.0.1]:39215: Connection reset by peer", 0, (1,)),  # the port as it is
    ("Read error [::ffff:127.0.0.1]:39215: Connection reset by peer", 0, (1,)),
    ("Write error [10.0.0.3]:5000: Broken pipe", 0, (2,)),
    ("Read error [10.0.0.3]:5000 ... Connection closed by peer [127.0.0.1]:12185", 0, (1, 2)),
    (CLOSED, 1, ()),  # its own address: no one
    ("Read error [127.0.0.2]:39215: Connection reset by peer", 0, ()),  # another host: no one
    # the peer's end of a connection it opened (not a listener): one process on that host besides this one
    ("Read error [127.0.0.1]:2470: Connection reset by peer", 0, (1,)),
    ("Read error [127.0.0.1]:2470: Connection reset by peer", 2, ()),  # two others on that host: no one
    ("Write error [10.0.0.3]:41230: Broken pipe", 1, (2,)),  # a pod's IP
    ("Write error [10.0.0.3]:41230: Broken pipe", 2, ()),  # its own host: no one
    ("Gloo AllGather failed: timed out", 0, ()),
    ("", 0, ()),
])
def test_a_failed_collective_blames_only_a_process_it_names_for_sure(text: str, own: int,
                                                                      expected: tuple[int, ...]) -> None:
    assert blamed_processes(text, ADDRESSES, own) == expected


def test_an_address_whose_two_port_readings_name_two_processes_blames_no_one() -> None:
    # 0x1234 as printed is process 3's port; byte-swapped (0x3412) it is process 4's: which one died is unknown
    addresses = {("10.0.0.9", 0x1234): 3, ("10.0.0.9", 0x3412): 4}
    assert blamed_processes(f"Read error [10.0.0.9]:{0x1234}: Connection reset by peer", addresses, 0) == ()


class JaxRuntimeError(RuntimeError):
    pass


@pytest.mark.parametrize(("error", "expected"), [
    (JaxRuntimeError("Connection reset by peer"), True),
    (ValueError(CLOSED), True),  # a collective's input transfer that fails: ValueError with gloo's text
    (RuntimeError("UNKNOWN: Gloo all-reduce failed: [pair.cc:534] Read error [127.0.0.1]:2470"), True),
    (ValueError("a bug of the program's"), False),
    (KeyError("Gloo"), False),
    (None, False),
])
def test_what_a_failed_collective_raises(error: BaseException | None, expected: bool) -> None:
    assert collective_failed(error) is expected


def test_the_first_cause_drops_what_xla_repeats_per_step_dispatched_after_the_failed_one() -> None:
    from reprieve.collective_error import first_cause

    stacked = "INTERNAL: " + "Error dispatching computation: " * 37 + FAILED_RUN[len("UNKNOWN: "):]
    assert first_cause(stacked) == "INTERNAL: " + FAILED_RUN[len("UNKNOWN: "):]
    assert first_cause(CLOSED) == CLOSED
