"""The relay's wire, shared by the worker and the CLI (docs/design.md#the-relay).

A terminal or pipe session is four streamed HTTP/1.1 requests spliced in the
controller's memory: the client reads output with GET .../tty/out and writes
input with POST .../tty/in; the worker writes output with POST .../tty/out and
reads input with GET .../tty/in. Both of the worker's halves dial out.

`Upload` is one streamed POST half: a chunked request body sent piece by
piece. The relay answers its headers as soon as the half is attached and keeps
the response open (HTTP/1.1 full duplex, which Hypercorn's h11 protocol does):
when the half ends the relay writes one JSON line saying why (`{"ok": true}`
after a complete body, `{"ended": "<reason>"}` when the session ended first),
so the writer learns at once that nobody reads any more, even while it has
nothing to send. `Download` is one streamed GET half; a stream that stops
without its closing chunk raises TransportError (the session broke rather
than ended).

Input frames in tty mode are newline-delimited JSON: `{"t":"d","b":"<base64>"}`
for keystrokes and `{"t":"r","rows":R,"cols":C}` for the window size; an
unknown `t` is skipped, malformed JSON or a line over MAX_FRAME_LINE is an
error. Pipe mode and all output are raw bytes.

Relay sockets have no read timeout (a terminal may be silent for hours);
TCP keepalive notices a peer that vanished without closing.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import threading
from typing import Any

from rc.proto.client import Client, _describe
from rc.proto.errors import RcError, TransportError

__all__ = [
    "MAX_FRAME_LINE",
    "READ_CHUNK",
    "Download",
    "FrameDecoder",
    "FrameError",
    "Upload",
    "data_frame",
    "resize_frame",
]

MAX_FRAME_LINE = 1 << 20
"""Longest input frame line, in bytes; a longer one raises FrameError."""
READ_CHUNK = 1 << 20
"""Most bytes one read of a relay stream returns."""
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3


class FrameError(RcError):
    """A tty input frame is malformed (bad JSON, missing fields, too long)."""


def data_frame(data: bytes) -> bytes:
    """The frame carrying keystrokes `data`."""
    return b'{"t":"d","b":"' + base64.b64encode(data) + b'"}\n'


def resize_frame(rows: int, cols: int) -> bytes:
    """The frame announcing a window of `rows` x `cols` characters."""
    return b'{"t":"r","rows":%d,"cols":%d}\n' % (rows, cols)


class FrameDecoder:
    """Turns a stream of frame bytes into events.

    `feed(data)` returns a list of ("d", bytes) and ("r", rows, cols) events for
    every complete line; raises FrameError for a malformed one.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        self._buf += data
        events: list[tuple] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_FRAME_LINE:
                    raise FrameError(f"an input frame is longer than {MAX_FRAME_LINE} bytes")
                return events
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if line.strip():
                ev = _frame(line)
                if ev is not None:
                    events.append(ev)


def _frame(line: bytes) -> tuple | None:
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise FrameError(f"an input frame is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise FrameError("an input frame must be a JSON object")
    kind = obj.get("t")
    if kind == "d":
        try:
            return ("d", base64.b64decode(obj["b"], validate=True))
        except (KeyError, TypeError, ValueError):
            raise FrameError('a data frame needs base64 text in "b"') from None
    if kind == "r":
        rows, cols = obj.get("rows"), obj.get("cols")
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 65536 for v in (rows, cols)
        ):
            raise FrameError("a resize frame needs integer rows and cols in 0..65535")
        return ("r", rows, cols)
    return None  # a frame kind this end does not know: skipped


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
    ):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class _Half:
    """What both halves share: closing from any thread. Another thread may be
    blocked reading the response, so closing only shuts the socket down (the
    reader wakes up with end of file) and leaves releasing the response to
    whoever is reading it."""

    sock: socket.socket
    resp: http.client.HTTPResponse
    _reading = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()  # the descriptor goes once the response is released
        if not self._reading:
            self._release()

    def _release(self) -> None:
        with contextlib.suppress(Exception):
            self.resp.close()


def _send_all(sock: socket.socket, parts: list[bytes]) -> None:
    """sendmsg until every byte of `parts` is out (no joining copy; TLS
    sockets cannot sendmsg, so they get the parts joined)."""
    if isinstance(sock, ssl.SSLSocket):
        sock.sendall(b"".join(parts))
        return
    views = [memoryview(p) for p in parts if p]
    while views:
        n = sock.sendmsg(views)
        while n and views:
            if n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0


def _open(client: Client, method: str, path: str, headers: dict[str, str]):
    """Send a request's head on a fresh connection and read the response head.

    Returns (connection, socket, response). Raises ApiError for an error
    status (the relay refused the half) and TransportError when the
    controller cannot be reached or does not answer within the client's
    timeout. After the answer the socket has no timeout (keepalive instead).
    """
    return client.failover(
        lambda url: _open_at(client, url, method, path, headers), client.deadline(None)
    )


def _open_at(client: Client, url, method: str, path: str, headers: dict[str, str]):
    """`_open` on the controller at `url` (one of client.urls)."""
    conn = client.new_connection(client.timeout, url)
    try:
        conn.putrequest(method, client.path(path, url=url), skip_accept_encoding=True)
        for k, v in client.auth_headers(headers).items():
            conn.putheader(k, v)
        conn.endheaders()
        sock = conn.sock
        _keepalive(sock)
        resp = conn.getresponse()
        sock.settimeout(None)
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        raise TransportError(f"{url}: {_describe(e)}") from None
    if resp.status >= 400:
        try:
            payload = resp.read()
        except (OSError, http.client.HTTPException):
            payload = b""
        conn.close()
        client.check_response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload)
    return conn, sock, resp


class Upload(_Half):
    """One streamed POST half. Thread-safe `send`; `finish` ends the body.

    `send` and `finish` raise TransportError once the connection is gone
    (the relay ended the half: see `outcome()` for why).
    """

    def __init__(self, client: Client, path: str, content_type: str = "application/octet-stream"):
        self.client = client
        self.path = path
        self._lock = threading.Lock()
        self.sent = 0
        self.finished = False
        self.conn, self.sock, self.resp = _open(
            client, "POST", path, {"Content-Type": content_type, "Transfer-Encoding": "chunked"}
        )

    def send(self, data: bytes) -> None:
        """Send `data` as one chunk (nothing for empty data)."""
        if not data:
            return
        with self._lock:
            if self.finished:
                raise TransportError(f"{self.path}: the upload has already ended")
            try:
                _send_all(self.sock, [b"%x\r\n" % len(data), data, b"\r\n"])
            except OSError as e:
                raise TransportError(
                    f"{self.path}: the relay closed the stream ({_describe(e)})"
                ) from None
            self.sent += len(data)

    def finish(self) -> None:
        """End the body (the reader sees end of file). Idempotent."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
            try:
                self.sock.sendall(b"0\r\n\r\n")
            except OSError as e:
                raise TransportError(
                    f"{self.path}: the relay closed the stream ({_describe(e)})"
                ) from None

    def outcome(self) -> dict[str, Any]:
        """Block until the relay ends this half; its JSON line (`{"ok": true}`
        or `{"ended": reason}`), or `{"ended": <what broke>}` if none came."""
        self._reading = True
        try:
            body = self.resp.read()
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            return {"ended": f"the connection to the relay broke ({_describe(e)})"}
        finally:
            self._reading = False
            self._release()
        try:
            obj = json.loads(body.splitlines()[-1]) if body.strip() else None
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return obj
        return {"ended": "the relay closed the stream"}


class Download(_Half):
    """One streamed GET half; iterate or `read()` for chunks.

    `read` returns b"" once the relay ended the stream cleanly and raises
    TransportError when it broke (no closing chunk, connection lost).
    """

    def __init__(self, client: Client, path: str):
        self.path = path
        self.received = 0
        self.conn, self.sock, self.resp = _open(client, "GET", path, {"Accept": "*/*"})

    def read(self, n: int = READ_CHUNK) -> bytes:
        self._reading = True
        try:
            data = self.resp.read1(n)
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            self._release()
            raise TransportError(f"{self.path}: the stream broke ({_describe(e)})") from None
        finally:
            self._reading = False
        if not data:
            self._release()
        self.received += len(data)
        return data

    def __iter__(self):
        while True:
            data = self.read()
            if not data:
                return
            yield data
