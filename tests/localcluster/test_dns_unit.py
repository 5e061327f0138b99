"""The real nodes' cluster DNS (localcluster.dns): records from Services/EndpointSlices and the wire format."""

from __future__ import annotations

import socket
import struct

import pytest
from localcluster import dns

pytestmark = pytest.mark.unit


def svc(name: str, ns: str = "t", *, cluster_ip: str = "None", publish: bool = False) -> dict:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": cluster_ip, "publishNotReadyAddresses": publish}}


def eps(service: str, ns: str = "t", *endpoints: tuple[str, str | None, bool]) -> dict:
    return {"metadata": {"name": f"{service}-abc", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], **({"hostname": host} if host else {}),
                           "conditions": {"ready": ready}} for ip, host, ready in endpoints]}


def query(name: str, qtype: int = dns.TYPE_A, qid: int = 7) -> bytes:
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack("!HH", qtype, 1)


def decode(msg: bytes) -> tuple[int, int, list[str]]:
    qid, flags, _, ancount = struct.unpack("!HHHH", msg[:8])
    ips = [socket.inet_ntoa(msg[-4 * (i + 1):len(msg) - 4 * i]) for i in reversed(range(ancount))]
    return qid, flags & 0xF, ips


def test_headless_worker_names_resolve_to_their_pods_not_ready_ones_included_when_published() -> None:
    table = dns.records([svc("j", publish=True)],
                        [eps("j", "t", ("10.244.1.5", "j-0", False), ("10.244.2.7", "j-1", True))])
    assert table["j-0.j.t.svc.cluster.local"] == ("10.244.1.5",)
    assert table["j-1.j.t.svc.cluster.local"] == ("10.244.2.7",)
    assert table["j.t.svc.cluster.local"] == ("10.244.1.5", "10.244.2.7")


def test_not_ready_endpoints_are_left_out_unless_published() -> None:
    table = dns.records([svc("j")], [eps("j", "t", ("10.244.1.5", "j-0", False), ("10.244.2.7", "j-1", True))])
    assert "j-0.j.t.svc.cluster.local" not in table
    assert table["j.t.svc.cluster.local"] == ("10.244.2.7",)


def test_cluster_ip_services_and_slices_of_other_services() -> None:
    table = dns.records([svc("kubernetes", "default", cluster_ip="10.96.0.1")], [eps("other", "t", ("1.2.3.4", "x", True))])
    assert table == {"kubernetes.default.svc.cluster.local": ("10.96.0.1",)}


def test_answer_a_record_case_insensitive_with_id_echoed() -> None:
    table = {"j-0.j.t.svc.cluster.local": ("10.244.1.5",)}
    qid, rcode, ips = decode(dns.answer(dns.parse_query(query("J-0.j.T.svc.cluster.local", qid=4242)), table))
    assert (qid, rcode, ips) == (4242, dns.RCODE_OK, ["10.244.1.5"])


def test_unknown_names_are_nxdomain_and_other_types_of_known_names_empty() -> None:
    table = {"j-0.j.t.svc.cluster.local": ("10.244.1.5",)}
    assert decode(dns.answer(dns.parse_query(query("pypi.org")), table))[1:] == (dns.RCODE_NXDOMAIN, [])
    aaaa = dns.answer(dns.parse_query(query("j-0.j.t.svc.cluster.local", qtype=28)), table)
    assert decode(aaaa)[1:] == (dns.RCODE_OK, [])


def test_malformed_messages_are_refused_clearly() -> None:
    with pytest.raises(dns.DNSFormatError, match="shorter than a DNS header"):
        dns.parse_query(b"\x01\x02")
    with pytest.raises(dns.DNSFormatError, match="runs past the end"):
        dns.parse_query(query("a.b")[:-8])
    reply = dns.error_reply(b"\x12\x34garbage")
    assert reply is not None and reply[:2] == b"\x12\x34" and reply[3] & 0xF == dns.RCODE_FORMERR
