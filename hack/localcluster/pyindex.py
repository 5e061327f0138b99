"""The local package index: pypiserver's WSGI app served over TLS on the host's loopback.

``python hack/localcluster/pyindex.py --port P --root DIR --cert C --key K --htpasswd F`` runs in the release
tools' venv (hack/install-release-tools.sh: pypiserver, passlib), which has none of the project's packages: this
file imports only the standard library and pypiserver. pypiserver's own command line has no TLS, so the app is
served here by the standard library's WSGI server on a TLS socket, a thread per connection. Every action (list,
download, upload) asks for basic auth; an upload of a file the index already has is refused (400), as PyPI does.
``--extra-root`` directories (the release tools' wheelhouse) are served beside ``--root``; uploads go to ``--root``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socketserver
import ssl
import sys
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        logging.getLogger("pyindex.access").info(format, *args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyindex", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--root", required=True, help="directory of the packages (uploads land here)")
    p.add_argument("--extra-root", action="append", default=[],
                   help="another directory of packages, served read-only (repeatable)")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--htpasswd", required=True)
    p.add_argument("--ready-file", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pyindex %(levelname)s %(message)s")
    import pypiserver

    Path(args.root).mkdir(parents=True, exist_ok=True)
    app = pypiserver.app(roots=[args.root, *args.extra_root], password_file=args.htpasswd,
                         authenticate=["download", "list", "update"], disable_fallback=True, overwrite=False)
    server = make_server("127.0.0.1", args.port, app, server_class=_ThreadingWSGIServer,
                         handler_class=_QuietHandler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    Path(args.ready_file).write_text("ready")
    logging.getLogger("pyindex").info("pypiserver %s on https://127.0.0.1:%d/ (roots %s)", pypiserver.__version__,
                                      args.port, [args.root, *args.extra_root])
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
