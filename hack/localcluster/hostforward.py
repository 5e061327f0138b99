"""Carry TCP connections from ``127.0.0.1:<port>`` of the cluster network to the host's ``127.0.0.1:<port>``.

``nsenter --net=<cluster network> python -m localcluster.hostforward --host-netns-fd FD --port P --ready-file F``:
the local registry listens on the host's loopback, and real nodes' containerd, which lives in the cluster network
namespace (:mod:`.clusternet`), pulls from the same address through this forwarder, so an image reference is the
same string on both sides. Connections to the host are made from the host namespace on a thread that enters it
(:func:`localcluster.clusternet.host_connect`). It exits on SIGTERM or when its parent dies.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from pathlib import Path

from localcluster.clusternet import _listen, _serve_forward, die_with_parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localcluster.hostforward", description=__doc__.split("\n")[0])
    p.add_argument("--host-netns-fd", type=int, required=True)
    p.add_argument("--port", type=int, action="append", required=True, help="repeatable")
    p.add_argument("--ready-file", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hostforward %(levelname)s %(message)s")
    die_with_parent()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for port in args.port:
        listener = _listen(socket.SOCK_STREAM, ("127.0.0.1", port))
        threading.Thread(target=_serve_forward, args=(listener, args.host_netns_fd, ("127.0.0.1", port)),
                         daemon=True, name=f"forward-{port}").start()
    Path(args.ready_file).write_text("ready")
    logging.getLogger("localcluster.hostforward").info("forwarding 127.0.0.1:%s of the cluster network to the host's", args.port)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
