"""The real nodes' cluster DNS (pure): Kubernetes' DNS records from Services and EndpointSlices, and DNS messages.

What CoreDNS's ``kubernetes`` plugin answers for the names a Reprieve job uses, and nothing else (the cluster has
no upstream: every other name is NXDOMAIN, so nothing resolves to an address outside the cluster):

- ``<svc>.<ns>.svc.<domain>``: a ClusterIP Service's IP; for a headless Service every endpoint address (ready
  ones, or all of them when the Service publishes not-ready addresses, as the EndpointSlice controller marks);
- ``<hostname>.<svc>.<ns>.svc.<domain>``: an endpoint with a hostname (a pod whose ``spec.subdomain`` names
  that headless Service and ``spec.hostname`` is set), e.g. ``J-0.J.NS.svc.cluster.local`` for worker 0.

Only A (and ANY treated as A) queries are answered with records; AAAA and other types of an existing name get an
empty NOERROR, like CoreDNS for an IPv4-only cluster. Names are case-insensitive.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TYPE_A, TYPE_ANY = 1, 255
RCODE_OK, RCODE_FORMERR, RCODE_NXDOMAIN, RCODE_NOTIMP = 0, 1, 3, 4
TTL_S = 5  # short, like CoreDNS's default 5 s: a restarted gang's new pod IPs are seen quickly

Records = Mapping[str, tuple[str, ...]]  # lower-case FQDN without the trailing dot -> IPv4 addresses


def records(services: Iterable[dict], slices: Iterable[dict], domain: str = "cluster.local") -> dict[str, tuple[str, ...]]:
    """The A records of the cluster, from Service and EndpointSlice objects (as JSON dicts)."""
    out: dict[str, list[str]] = {}
    headless: dict[tuple[str, str], bool] = {}  # (ns, svc) -> publishNotReadyAddresses
    for svc in services:
        meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        ip = spec.get("clusterIP")
        if ip == "None":
            headless[(ns, name)] = bool(spec.get("publishNotReadyAddresses"))
            out.setdefault(f"{name}.{ns}.svc.{domain}".lower(), [])
        elif ip:
            out[f"{name}.{ns}.svc.{domain}".lower()] = [ip]
    for sl in slices:
        meta = sl.get("metadata") or {}
        ns = meta.get("namespace", "")
        svc = (meta.get("labels") or {}).get("kubernetes.io/service-name", "")
        if (ns, svc) not in headless or sl.get("addressType") != "IPv4":
            continue
        publish_not_ready = headless[(ns, svc)]
        for ep in sl.get("endpoints") or []:
            ready = (ep.get("conditions") or {}).get("ready")
            if not publish_not_ready and ready is False:
                continue
            addrs = [a for a in ep.get("addresses") or [] if a]
            out[f"{svc}.{ns}.svc.{domain}".lower()].extend(addrs)
            if ep.get("hostname") and addrs:
                out.setdefault(f"{ep['hostname']}.{svc}.{ns}.svc.{domain}".lower(), []).extend(addrs[:1])
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}


@dataclass(frozen=True)
class Query:
    id: int
    flags: int
    name: str      # as asked, without the trailing dot
    qtype: int
    qclass: int
    question: bytes  # the raw question section, echoed in the answer


class DNSFormatError(ValueError):
    """Not a DNS query this server can read."""


def parse_query(data: bytes) -> Query:
    """The first question of a DNS query message.

    Raises:
        DNSFormatError: truncated or malformed message, compression in the question, or no question.
    """
    if len(data) < 12:
        raise DNSFormatError(f"message of {len(data)} bytes is shorter than a DNS header")
    qid, flags, qdcount = struct.unpack("!HHH", data[:6])
    if qdcount < 1:
        raise DNSFormatError("no question")
    labels, pos = [], 12
    while True:
        if pos >= len(data):
            raise DNSFormatError("question name runs past the end of the message")
        n = data[pos]
        if n & 0xC0:
            raise DNSFormatError("compressed name in a question")
        pos += 1
        if n == 0:
            break
        labels.append(data[pos:pos + n].decode("ascii", "replace"))
        pos += n
    if pos + 4 > len(data):
        raise DNSFormatError("question without type and class")
    qtype, qclass = struct.unpack("!HH", data[pos:pos + 4])
    return Query(qid, flags, ".".join(labels), qtype, qclass, data[12:pos + 4])


def answer(query: Query, table: Records, domain: str = "cluster.local") -> bytes:
    """The response message to ``query`` from the record ``table`` (authoritative for ``domain``)."""
    name = query.name.rstrip(".").lower()
    addrs = table.get(name)
    rcode = RCODE_OK
    if query.qclass != 1:
        rcode, addrs = RCODE_NOTIMP, None
    elif addrs is None:
        rcode = RCODE_NXDOMAIN
    answers = list(addrs or ()) if query.qtype in (TYPE_A, TYPE_ANY) else []
    rd = query.flags & 0x0100
    aa = 0x0400 if name == domain or name.endswith("." + domain) else 0
    flags = 0x8000 | aa | rd | rcode  # QR, AA for our zone, RD echoed, RA clear (no recursion: no upstream)
    out = [struct.pack("!HHHHHH", query.id, flags, 1, len(answers), 0, 0), query.question]
    for ip in answers:
        out.append(struct.pack("!HHHIH", 0xC00C, TYPE_A, 1, TTL_S, 4) + bytes(int(x) for x in ip.split(".")))
    return b"".join(out)


def error_reply(data: bytes, rcode: int = RCODE_FORMERR) -> bytes | None:
    """A bare error response echoing the id of a message that could not be parsed (None: not even a header)."""
    if len(data) < 2:
        return None
    return data[:2] + struct.pack("!HHHHH", 0x8000 | rcode, 0, 0, 0, 0)
