"""A loopback TCP proxy a test can cut, to partition a worker from its controller."""

from __future__ import annotations

import socket
import threading


class Proxy:
    """Forwards 127.0.0.1:port → the controller; `pause()` holds all traffic."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.closed = False
        self.dropping = False
        self.cut = 0  # replies dropped so far
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self) -> None:
        self.flowing.clear()

    def drop_next_reply(self) -> None:
        """The next connection's first reply is cut: the request reaches the
        controller, and the client's connection is closed as the answer
        comes back (a client partitioned right after it sent)."""
        self.dropping = True

    def resume(self) -> None:
        self.flowing.set()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                # accept() may still take a connection after close() (closing a
                # listener does not wake a thread blocked in accept): drop it
                if self.closed:
                    client.close()
                    upstream.close()
                    return
                self.socks += [client, upstream]
                drop, self.dropping = self.dropping, False
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            back = self._cut if drop else self._pump
            threading.Thread(target=back, args=(upstream, client), daemon=True).start()

    def _cut(self, upstream: socket.socket, client: socket.socket) -> None:
        """The reply arrives and is dropped: both connections are closed."""
        try:
            if upstream.recv(65536):
                self.cut += 1
        except OSError:
            pass
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self.closed = True
            socks, self.socks = self.socks, []
        self.resume()
        self.listener.close()
        for s in socks:
            s.close()
