"""Port forwarding pieces: a far-side TCP server and a running `rc forward`."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import select
import signal
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator

from tests.helpers.harness import Cli


class Lines:
    """Lines of a child's pipe, read with a deadline (no bare sleeps)."""

    def __init__(self, stream) -> None:
        self.fd = stream.fileno()
        self.buf = b""

    def expect(self, pattern: bytes, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.buf)
            if m:
                self.buf = self.buf[m.end() :]
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} within {timeout}s; got {self.buf[-800:]!r}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if ready:
                data = os.read(self.fd, 65536)
                if not data:
                    raise AssertionError(f"the stream ended before {pattern!r}: {self.buf!r}")
                self.buf += data


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    for stream in (p.stdout, p.stderr):
        if stream is not None:
            stream.close()


class _Far(socketserver.BaseRequestHandler):
    """A server on this host (the hold's host here): b"E" echoes until end
    of file then answers the sha256 of it all, after end of file (a half
    close); b"H" holds the connection until it closes. Counts closed
    connections in `server.closed`."""

    def handle(self) -> None:
        sock = self.request
        op = sock.recv(1)
        h = hashlib.sha256()
        while data := sock.recv(1 << 16):
            h.update(data)
            if op == b"E":
                sock.sendall(data)
        if op == b"E":
            sock.sendall(b"sha256:" + h.hexdigest().encode())
        with self.server.lock:
            self.server.closed += 1


class FarServer(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Far)
        self.lock = threading.Lock()
        self.closed = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]


@contextlib.contextmanager
def forwarding(cli: Cli, held: int, spec: str) -> Iterator[tuple[subprocess.Popen, int, Lines]]:
    """`rc forward HELD SPEC` running; yields it, the local port it listens
    on (read from what it prints) and its stderr."""
    p = cli.popen("forward", str(held), spec)
    try:
        err = Lines(p.stderr)
        port = int(err.expect(rb"forwarding 127\.0\.0\.1:(\d+) to ").group(1))
        yield p, port, err
    finally:
        _stop(p)
