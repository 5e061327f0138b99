"""A TCP relay that a test cuts: a storage or a peer that goes away half-way through a read (issue 49's bad
input), with the real client and the real server on either side."""

from __future__ import annotations

import contextlib
import socket
import threading


class CutRelay:
    """A TCP relay to ``port`` on loopback that can stop serving: once ``budget`` bytes have come back from the
    store (None: no limit) it closes every connection and answers new ones by closing them, as a store that goes
    away half-way through a read does."""

    def __init__(self, port: int) -> None:
        self.target, self.budget, self.sent = port, None, 0
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def serving(self) -> bool:
        return self.budget is None or self.sent < self.budget

    def cut_after(self, budget: int | None) -> None:
        with self.lock:
            self.budget, self.sent = budget, 0

    def _accept(self) -> None:
        while True:
            client, _ = self.sock.accept()
            if not self.serving():
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                with self.lock:
                    if counted:
                        self.sent += len(data)
                    cut = not self.serving()
                if cut:
                    with self.lock:
                        for c in self.conns:  # shutdown, not only close: it wakes a recv blocked on it, and sends FIN
                            with contextlib.suppress(OSError):
                                c.shutdown(socket.SHUT_RDWR)
                            c.close()
                        self.conns.clear()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()

