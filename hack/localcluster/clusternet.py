"""The real nodes' network namespace and what lives in it: the API server's Service IP and the cluster DNS.

``python -m localcluster.clusternet`` is started by :class:`localcluster.cluster.Cluster` under
``unshare --net``, so it creates (and, being its first process, holds) a network namespace of its own: the
*cluster network*. Every real node's containerd and kubelet join it, the CNI bridge ``rpv0`` that gives pods their
addresses is created in it, and it has no link to anything else: nothing routes out of it. In it this process

- brings ``lo`` up and adds the Service IPs ``10.96.0.1`` (the ``kubernetes`` Service) and ``10.96.0.10``
  (``kube-dns``) to it;
- forwards TCP ``10.96.0.1:443`` to the API server on the host's ``127.0.0.1:<port>`` (the one thing that crosses
  namespaces: a socket made in the host namespace through ``setns`` on a thread, see :func:`host_connect`), which
  stands in for kube-proxy's rule for that Service; kubelets and pods alike use it;
- answers DNS on ``10.96.0.10:53`` (UDP and TCP) from Services and EndpointSlices it watches (:mod:`.dns`):
  the small cluster DNS a kind cluster gets from CoreDNS;
- serves an HTTP CONNECT proxy on the host's ``127.0.0.1:<port>`` that the API server uses (``HTTPS_PROXY``) to
  reach kubelets for ``kubectl logs``/``exec``; it dials only real nodes' addresses, from inside the namespace.

It exits on SIGTERM or when its parent dies; the namespace, the bridge and every veth go with the last process.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localcluster import dns

log = logging.getLogger("localcluster.clusternet")

API_VIP, DNS_VIP = "10.96.0.1", "10.96.0.10"
NODE_PREFIX = "10.243.0."  # real nodes' addresses (realnodespec.node_ip): all the kubelet proxy may dial
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """Move the calling *thread* into the namespace ``fd`` refers to."""
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def daemon_prologue(name: str) -> threading.Event:
    """The start of a helper process run inside the cluster network (this module's and :mod:`.hostforward`'s
    ``main``): log lines tagged ``name``, SIGTERM when the parent dies; the Event is set on SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    die_with_parent()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def in_host_ns(host_ns_fd: int, make: Callable[[], socket.socket]) -> socket.socket:
    """A socket made by ``make`` in the host's network namespace (on a short-lived thread that enters it)."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            setns(host_ns_fd)
            result["sock"] = make()
        except OSError as err:
            result["err"] = err

    t = threading.Thread(target=run, name="host-ns")
    t.start()
    t.join()
    if "err" in result:
        raise result["err"]
    sock: socket.socket = result["sock"]
    return sock


def host_connect(host_ns_fd: int, address: tuple[str, int], timeout: float = 10.0) -> socket.socket:
    """A TCP connection made from the host's network namespace."""
    sock = in_host_ns(host_ns_fd, lambda: socket.create_connection(address, timeout=timeout))
    sock.settimeout(None)
    return sock


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _serve_forward(listener: socket.socket, host_ns_fd: int, target: tuple[str, int]) -> None:
    def handle(conn: socket.socket) -> None:
        try:
            up = host_connect(host_ns_fd, target)
        except OSError as err:
            log.warning("forward to %s:%d failed: %s", *target, err)
            conn.close()
            return
        back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
        back.start()
        _pump(conn, up)
        back.join()
        conn.close()
        up.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True, name="forward").start()


def _serve_kubelet_proxy(listener: socket.socket, api_client: Any) -> None:
    """An HTTP CONNECT proxy on the host's loopback for the API server's connections to kubelets (``kubectl logs``,
    ``exec``): it dials only real nodes' addresses (10.243.0.0/24), from inside the cluster network."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def node_address(name: str) -> str | None:
        if name.startswith(NODE_PREFIX):
            return name
        try:
            node = core.read_node(name, _request_timeout=10)
        except Exception:  # noqa: BLE001 - unknown node: refused below
            return None
        for addr in (node.status.addresses or []) if node.status else []:
            if addr.type == "InternalIP" and addr.address.startswith(NODE_PREFIX):
                return str(addr.address)
        return None

    def handle(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 8192:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(line) < 2 or line[0] != "CONNECT":
                conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                return
            host, _, port = line[1].rpartition(":")
            address = node_address(host.strip("[]"))
            if address is None or not port.isdigit():
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\n\r\nonly real nodes of this cluster\r\n")
                return
            try:
                up = socket.create_connection((address, int(port)), timeout=10)
            except OSError as err:
                conn.sendall(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{err}\r\n".encode())
                return
            up.settimeout(None)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rest = head.split(b"\r\n\r\n", 1)[1]
            if rest:
                up.sendall(rest)
            back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
            back.start()
            _pump(conn, up)
            back.join()
            up.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True, name="kubelet-proxy").start()


class DNSServer:
    """Answers from a record table that the watch threads replace as Services and EndpointSlices change."""

    def __init__(self, domain: str = "cluster.local") -> None:
        self.domain = domain
        self.table: dns.Records = {}
        self._objects: dict[str, dict[str, dict]] = {"services": {}, "endpointslices": {}}
        self._lock = threading.Lock()

    def reply(self, data: bytes) -> bytes | None:
        try:
            return dns.answer(dns.parse_query(data), self.table, self.domain)
        except dns.DNSFormatError:
            return dns.error_reply(data)

    def update(self, kind: str, event: str, obj: dict) -> None:
        with self._lock:
            store = self._objects[kind]
            uid = obj["metadata"]["uid"]
            if event == "DELETED":
                store.pop(uid, None)
            else:
                store[uid] = obj
            self.table = dns.records(self._objects["services"].values(), self._objects["endpointslices"].values(),
                                     self.domain)

    def replace(self, kind: str, items: list[dict]) -> None:
        with self._lock:
            self._objects[kind] = {o["metadata"]["uid"]: o for o in items}
        if items:
            self.update(kind, "ADDED", items[0])

    def serve_udp(self, sock: socket.socket) -> None:
        while True:
            data, peer = sock.recvfrom(4096)
            out = self.reply(data)
            if out is not None:
                sock.sendto(out, peer)

    def serve_tcp(self, listener: socket.socket) -> None:
        def handle(conn: socket.socket) -> None:
            with conn:
                try:
                    while True:
                        head = conn.recv(2, socket.MSG_WAITALL)
                        if len(head) < 2:
                            return
                        data = conn.recv(struct.unpack("!H", head)[0], socket.MSG_WAITALL)
                        out = self.reply(data)
                        if out is None:
                            return
                        conn.sendall(struct.pack("!H", len(out)) + out)
                except OSError:
                    return

        while True:
            conn, _ = listener.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True, name="dns-tcp").start()

    def watch(self, api_client: Any, kind: str, stop: threading.Event) -> None:
        """List + watch ``kind`` (services | endpointslices) cluster-wide, forever."""
        from kubernetes import client, watch

        lister = (client.CoreV1Api(api_client).list_service_for_all_namespaces if kind == "services"
                  else client.DiscoveryV1Api(api_client).list_endpoint_slice_for_all_namespaces)
        while not stop.is_set():
            try:
                resp = lister(_preload_content=False, _request_timeout=15)
                data = json.loads(resp.data)  # type: ignore[union-attr]  # raw urllib3 response
                self.replace(kind, data["items"])
                rv = data["metadata"]["resourceVersion"]
                for ev in watch.Watch().stream(lister, resource_version=rv, timeout_seconds=60,
                                               _request_timeout=75):
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.update(kind, ev["type"], ev["raw_object"])
            except Exception as err:  # noqa: BLE001 - relist after any error, like an informer
                if not stop.is_set():
                    log.info("%s watch restarting after %r", kind, err)
                    stop.wait(1.0)


def _listen(family_type: int, address: tuple[str, int]) -> socket.socket:
    s = socket.socket(socket.AF_INET, family_type)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(address)
    if family_type == socket.SOCK_STREAM:
        s.listen(128)
    return s


def setup_links() -> None:
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{API_VIP}/32", "dev", "lo"],
                ["ip", "addr", "add", f"{DNS_VIP}/32", "dev", "lo"]):
        subprocess.run(cmd, check=True, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.clusternet", description=__doc__.split("\n")[0])
    parser.add_argument("--host-netns-fd", type=int, required=True, help="open fd of the host's network namespace")
    parser.add_argument("--api-port", type=int, required=True, help="the API server's port on the host's 127.0.0.1")
    parser.add_argument("--kubeconfig", required=True, help="admin kubeconfig whose server is https://10.96.0.1")
    parser.add_argument("--kubelet-proxy-port", type=int, default=0,
                        help="port on the host's 127.0.0.1 for the API server's CONNECT proxy to kubelets (0: none)")
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args(argv)
    stop = daemon_prologue("clusternet")
    try:
        setup_links()
        api = _listen(socket.SOCK_STREAM, (API_VIP, 443))
        udp, tcp = _listen(socket.SOCK_DGRAM, (DNS_VIP, 53)), _listen(socket.SOCK_STREAM, (DNS_VIP, 53))
        proxy = None
        if args.kubelet_proxy_port:
            proxy = in_host_ns(args.host_netns_fd,
                               lambda: _listen(socket.SOCK_STREAM, ("127.0.0.1", args.kubelet_proxy_port)))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or ""
        log.error("cannot set up the cluster network namespace: %s %s", err, detail)
        return 1
    server = DNSServer()
    threads = [threading.Thread(target=_serve_forward, args=(api, args.host_netns_fd, ("127.0.0.1", args.api_port)),
                                daemon=True, name="api-forward"),
               threading.Thread(target=server.serve_udp, args=(udp,), daemon=True, name="dns-udp"),
               threading.Thread(target=server.serve_tcp, args=(tcp,), daemon=True, name="dns-tcp")]
    for t in threads:
        t.start()
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=args.kubeconfig)
    if proxy is not None:
        threading.Thread(target=_serve_kubelet_proxy, args=(proxy, api_client), daemon=True,
                         name="kubelet-proxy").start()
    for kind in ("services", "endpointslices"):
        threading.Thread(target=server.watch, args=(api_client, kind, stop), daemon=True, name=f"watch-{kind}").start()
    Path(args.ready_file).write_text(str(os.getpid()))
    log.info("cluster network up: API %s:443 -> 127.0.0.1:%d, DNS %s:53", API_VIP, args.api_port, DNS_VIP)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
