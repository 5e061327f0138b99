"""Which process a failed collective names: the peer to report lost at once, before JAX's heartbeat timeout.

A process of the job that dies (SIGKILL, its node gone) resets its gloo connections, and the next collective of
every process that talks to it fails with an error that names the peer's address, e.g. ``Gloo all-reduce failed:
... Read error [127.0.0.1]:2470: Connection reset by peer`` or ``... Connection closed by peer [10.0.3.7]:41230``.
JAX's CPU collectives publish every process's gloo address in the coordination service when a communicator is
set up (``cpu:gloo/<device ids>/<rank>``: gloo's serialized rank, hostname then the listener's ``sockaddr``), so
the address maps to a process index (its listener, or else its host) without waiting for the peer watch's silence threshold (``reprieve.peers``),
which under load can lose the race against JAX's own abort.

Pure functions, table-tested. An address that maps to no process, or to two (processes that share a host and
the port is not a listener's), blames no one: the exit is then attributed as before, by the peer watch or not at
all.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from collections.abc import Mapping

GLOO_PREFIX = "cpu:gloo/"  # where JAX's CPU collectives keep each rank's gloo address (the key-value store)

_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:(\d{1,5})\b")
_AF_INET, _AF_INET6 = 2, 10


def collective_failed(error: BaseException | None) -> bool:
    """Whether ``error`` is what a failed collective raises: a JAX runtime error, or any exception whose text is
    gloo's (a collective's input transfer that fails raises ValueError with gloo's message)."""
    if error is None:
        return False
    if type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
        return True
    return bool(re.search(r"\bGloo\b.* failed", str(error)))


def first_cause(text: str) -> str:
    """An XLA error's text without the ``Error dispatching computation:`` it repeats once per step dispatched
    after the failed one (a loop running ahead of its device stacks dozens)."""
    return re.sub(r"(Error dispatching computation: )+", "", text)


def _ip(text: str) -> str | None:
    """The address in one canonical form (an IPv4-mapped IPv6 address as IPv4); None: not an address."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def named_addresses(text: str) -> list[tuple[str, int]]:
    """Every ``[ip]:port`` an error text names, in order (gloo's form; other bracketed text is skipped)."""
    out = []
    for host, port in _ADDRESS.findall(text):
        ip = _ip(host)
        if ip is not None and 0 < int(port) < 65536:
            out.append((ip, int(port)))
    return out


def rank_address(raw: bytes) -> tuple[str, int] | None:
    """The listener address in one gloo rank record (``size_t`` hostname length, hostname, ``size_t`` address
    length, ``sockaddr_storage`` + sequence number, pair ids), port in network order; None: not one."""
    try:
        (host_len,) = struct.unpack_from("<Q", raw, 0)
        (addr_len,) = struct.unpack_from("<Q", raw, 8 + host_len)
        addr = raw[16 + host_len:16 + host_len + addr_len]
        if len(addr) != addr_len or addr_len < 24:
            return None
        (family,) = struct.unpack_from("<H", addr, 0)
        (port,) = struct.unpack_from(">H", addr, 2)
    except struct.error:
        return None
    if family == _AF_INET:
        ip = _ip(str(ipaddress.IPv4Address(addr[4:8])))
    elif family == _AF_INET6:
        ip = _ip(str(ipaddress.IPv6Address(addr[8:24])))
    else:
        return None
    return (ip, port) if ip is not None and port else None


def gloo_addresses(entries: Mapping[str, bytes], device_process: Mapping[int, int]) -> dict[tuple[str, int], int]:
    """``(ip, port)`` -> process index, from the ``cpu:gloo/<device ids>/<rank>`` entries (rank: the position
    in the device ids) and each device id's process. An address two processes claim is left out."""
    out: dict[tuple[str, int], int] = {}
    clashes: set[tuple[str, int]] = set()
    for key, raw in entries.items():
        parts = key.split("/")
        if len(parts) < 3 or not parts[-1].isdigit():
            continue
        try:
            devices = [int(d) for d in parts[-2].split(",")]
        except ValueError:
            continue
        rank = int(parts[-1])
        address = rank_address(raw)
        if rank >= len(devices) or address is None or devices[rank] not in device_process:
            continue
        process = device_process[devices[rank]]
        if out.get(address, process) != process:
            clashes.add(address)
        out[address] = process
    return {a: p for a, p in out.items() if a not in clashes}


def _swapped(port: int) -> int:
    return ((port & 0xFF) << 8) | (port >> 8)


def blamed_processes(error: str, addresses: Mapping[tuple[str, int], int], own: int) -> tuple[int, ...]:
    """The processes a failed collective's error names (sorted; ``()``: none it can name for sure).

    The address gloo names is the peer's listener when this process connected to it, and the peer's own end of the
    connection (an ephemeral port) when the peer connected here. So a named address is read first with its port
    as printed and byte-swapped (gloo's ``Address::str`` prints the raw ``sin_port``): one process listening there
    is the one. Otherwise by its host alone: one process other than this one (``own``) on that host is the one (a
    pod's IP; every 2-process job). Two candidates, or only this process, name no one."""
    out = set()
    for ip, port in named_addresses(error):
        found = {addresses[(ip, q)] for q in {port, _swapped(port)} if (ip, q) in addresses}
        if not found:
            found = {p for (host, _), p in addresses.items() if host == ip and p != own}
        if len(found) == 1 and own not in found:
            out |= found
    return tuple(sorted(out))
