"""A small HTTP/1.1 client for the controller, on http.client (stdlib only).

Shared by the worker and the CLI. It sends the bearer token, encodes and
decodes JSON, raises `ApiError(status, code, message)` for the controller's
error envelope and `TransportError` when the controller cannot be reached,
applies a connect timeout and a separate read timeout, and remembers the
controller instance id of the last response (docs/design.md#the-wire).

Connections are kept alive, one per thread.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rc.proto import INSTANCE_HEADER
from rc.proto.errors import ApiError, RcError, TransportError

__all__ = ["Client", "ControllerURL", "Response", "parse_controller_url", "segment", "tls_context"]


def segment(text: str) -> str:
    """One path segment as typed by a user (a device id, a token name),
    percent-encoded so that '/', '?', '#', spaces and non-ASCII stay inside it:
    `rc clear 'gpu1:gpu0/drain?'` names a device, never another route."""
    return urllib.parse.quote(text, safe=":@")


CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ControllerURL:
    """A parsed controller address: scheme http or https, host, port, path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"


def parse_controller_url(text: str) -> ControllerURL:
    """Parse "http://host:port[/prefix]" (https too; port defaults 80/443).

    Raises RcError naming the problem for anything else.
    """
    raw = text.strip()
    if "://" not in raw:
        raise RcError(f"controller URL {text!r} has no scheme (expected http://HOST:PORT)")
    try:
        u = urllib.parse.urlsplit(raw)
        port = u.port
    except ValueError as e:
        raise RcError(f"controller URL {text!r} is not valid: {e}") from None
    if u.scheme not in ("http", "https"):
        raise RcError(f"controller URL {text!r}: scheme must be http or https")
    if not u.hostname:
        raise RcError(f"controller URL {text!r} has no host")
    if u.query or u.fragment or u.username or u.password:
        raise RcError(f"controller URL {text!r} may not carry a query, fragment or credentials")
    if port is None:
        port = 443 if u.scheme == "https" else 80
    return ControllerURL(u.scheme, u.hostname, port, u.path.rstrip("/"))


@dataclass(slots=True)
class Response:
    """A complete response: status, lower-cased headers, raw body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON (None for an empty body)."""
        return json.loads(self.body) if self.body else None


class _Connection(http.client.HTTPConnection):
    """HTTPConnection with a connect timeout separate from the read timeout."""

    def __init__(self, host: str, port: int, connect_timeout: float, read_timeout: float):
        super().__init__(host, port, timeout=connect_timeout)
        self.read_timeout = read_timeout

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(self.read_timeout)


class _TLSConnection(http.client.HTTPSConnection):
    def __init__(self, host, port, connect_timeout, read_timeout, context):
        super().__init__(host, port, timeout=connect_timeout, context=context)
        self.read_timeout = read_timeout

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(self.read_timeout)


class Client:
    """Talks to one controller with one token.

    `timeout` is the read timeout in seconds for ordinary requests (long polls
    and streams pass their own); `connect_timeout` bounds the TCP and TLS
    handshake. `cacert` is a PEM file to verify an https controller with
    (default: the system store).
    """

    def __init__(
        self,
        url: str | ControllerURL,
        token: str = "",
        *,
        timeout: float = READ_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        cacert: str | None = None,
    ) -> None:
        self.url = url if isinstance(url, ControllerURL) else parse_controller_url(url)
        self.token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._ssl = None
        self.cacert = cacert or None
        if self.url.scheme == "https":
            self._ssl = tls_context(self.cacert)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[http.client.HTTPConnection] = []
        self.instance: str = ""
        self.last_response: float = 0.0
        """time.monotonic() of the last response of any status (contact)."""

    # -- connections -----------------------------------------------------

    def new_connection(self, read_timeout: float) -> http.client.HTTPConnection:
        """A fresh, unpooled connection to the controller (for streamed bodies, which
        need a connection of their own); `read_timeout` in seconds, None for none."""
        if self._ssl is not None:
            return _TLSConnection(
                self.url.host, self.url.port, self.connect_timeout, read_timeout, self._ssl
            )
        return _Connection(self.url.host, self.url.port, self.connect_timeout, read_timeout)

    def _pooled(self, read_timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.read_timeout = read_timeout
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            return conn, True
        conn = self.new_connection(read_timeout)
        self._local.conn = conn
        with self._lock:
            self._open.append(conn)
        return conn, False

    def close(self) -> None:
        """Close this thread's kept-alive connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                if conn in self._open:
                    self._open.remove(conn)

    def close_all(self) -> None:
        """Close every thread's kept-alive connection (when done with the client)."""
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            conn.close()

    def __del__(self) -> None:
        try:
            self.close_all()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass

    def auth_headers(self, extra: dict[str, str] | None) -> dict[str, str]:
        """The headers every request carries (Accept, the bearer token), plus `extra`."""
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if extra:
            h.update(extra)
        return h

    def path(self, path: str, params: dict[str, Any] | None = None) -> str:
        """The request target for an API path with optional query parameters."""
        target = self.url.prefix + path
        if params:
            q = {k: v for k, v in params.items() if v is not None}
            if q:
                target += "?" + urllib.parse.urlencode(q)
        return target

    # -- requests --------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """Send one request and read the whole response.

        `body` is encoded as JSON; `raw` is sent as is. Returns the Response
        for 2xx; raises ApiError for an error status and TransportError when no
        response arrives. A kept-alive connection the server closed in the
        meantime is retried once on a fresh one (every rc route is safe to
        retry: writes carry idempotency keys or offsets).
        """
        h = self.auth_headers(headers)
        data = raw
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        elif raw is not None:
            h.setdefault("Content-Type", "application/octet-stream")
        target = self.path(path, params)
        read_timeout = self.timeout if timeout is None else timeout
        for attempt in (0, 1):
            conn, reused = self._pooled(read_timeout)
            try:
                conn.request(method, target, body=data, headers=h)
                resp = conn.getresponse()
                payload = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if reused and attempt == 0:
                    continue
                raise TransportError(f"{self.url}: connection lost: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise TransportError(f"{self.url}: {_describe(e, self.cacert)}") from None
            except BaseException:
                # e.g. Ctrl-C mid-request: the connection is mid-exchange and
                # must not be reused (the next request would fail "Request-sent")
                self.close()
                raise
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
            return self.check_response(
                resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
            )
        raise AssertionError("unreachable")

    def check_response(self, status: int, headers: dict[str, str], payload: bytes) -> Response:
        """Note contact and the controller instance from a response; return it as a
        Response for 2xx, raise ApiError for an error status or a redirect."""
        self.last_response = time.monotonic()
        inst = headers.get(INSTANCE_HEADER.lower(), "")
        if inst:
            self.instance = inst
        if status >= 400:
            raise _api_error(status, payload)
        if 300 <= status < 400:  # rc's API never redirects: this is not an rc route
            where = headers.get("location", "")
            raise ApiError(
                status,
                "http_" + str(status),
                f"the controller answered {status}, a redirect{f' to {where}' if where else ''}: "
                "no rc route is at that path",
            )
        return Response(status, headers, payload)

    def get(self, path: str, **kw: Any) -> Any:
        """GET and return the decoded JSON body."""
        return self.request("GET", path, **kw).json()

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        """POST JSON and return the decoded JSON body."""
        return self.request("POST", path, body if body is not None else {}, **kw).json()

    def delete(self, path: str, **kw: Any) -> Any:
        """DELETE and return the decoded JSON body."""
        return self.request("DELETE", path, **kw).json()

    def stream(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Iterator[bytes]:
        """Open a streamed response on a fresh connection and yield its chunks.

        Raises ApiError / TransportError like `request`. The read timeout
        applies to each chunk; closing the generator closes the connection.
        """
        h = self.auth_headers(headers)
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        conn = self.new_connection(self.timeout if timeout is None else timeout)
        try:
            try:
                conn.request(method, self.path(path, params), body=body, headers=h)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise TransportError(f"{self.url}: {_describe(e, self.cacert)}") from None
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            if resp.status >= 400:
                self.check_response(resp.status, hdrs, resp.read())
            self.check_response(resp.status, hdrs, b"")
            while True:
                try:
                    chunk = resp.read1(65536)
                except (OSError, http.client.HTTPException) as e:
                    raise TransportError(
                        f"{self.url}: stream broke: {_describe(e, self.cacert)}"
                    ) from None
                if not chunk:
                    return
                yield chunk
        finally:
            conn.close()


def tls_context(cacert: str | None) -> ssl.SSLContext:
    """A client TLS context verifying with `cacert` (a PEM file) or the system store.

    A CA file that is missing, unreadable or holds no certificate raises
    RcError naming the file and the problem (never a traceback)."""
    try:
        return ssl.create_default_context(cafile=cacert)
    except FileNotFoundError:
        raise RcError(f"CA file {cacert}: no such file") from None
    except IsADirectoryError:
        raise RcError(f"CA file {cacert}: is a directory, not a PEM file") from None
    except OSError as e:
        if isinstance(e, ssl.SSLError):
            why = e.reason or str(e)
            raise RcError(f"CA file {cacert}: not a PEM CA certificate ({why})") from None
        raise RcError(f"CA file {cacert}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise RcError(f"CA file {cacert}: not usable: {e}") from None


def _describe(e: BaseException, cacert: str | None = None) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is the controller running?)"
    if isinstance(e, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host ({e.strerror})"
    if isinstance(e, ssl.SSLCertVerificationError):
        if cacert:
            return (
                f"TLS certificate not trusted ({e.verify_message}) by the CA file {cacert}; "
                "is it the CA that signed the controller's certificate?"
            )
        return f"TLS certificate not trusted ({e.verify_message}); pass --cacert"
    text = str(e) or type(e).__name__
    return text


def _api_error(status: int, payload: bytes) -> ApiError:
    try:
        obj = json.loads(payload)
        if isinstance(obj, dict) and isinstance(obj.get("error"), str):
            return ApiError(status, obj["error"], str(obj.get("message", "")))
    except ValueError:
        pass
    text = payload[:200].decode("utf-8", "replace").strip()
    return ApiError(status, "http_" + str(status), text or f"controller returned {status}")
