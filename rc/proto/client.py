"""A small HTTP/1.1 client for the controller, on http.client (stdlib only).

Shared by the worker and the CLI. It sends the bearer token, encodes and
decodes JSON, raises `ApiError(status, code, message)` for the controller's
error envelope and `TransportError` when the controller cannot be reached,
applies a connect timeout and a separate read timeout, and remembers the
controller instance id of the last response (docs/design.md#the-wire).

Connections are kept alive, one per thread.

A client may be given a comma-separated list of controller URLs (one active
controller and its standbys, in order of preference). It talks to one of
them at a time; when that one cannot be reached (TransportError) or answers
503 `standby`, it moves to the active controller the answer names if that is
one of the list, else to the next URL, and sends the request again, cycling
with a backoff of 0.2 s doubling to 2 s until the request's own deadline
(its read timeout, plus the connect timeout). Every rc route is safe to
retry (idempotency keys, offsets). A client of a single URL never retries
on another and behaves as one always did. Parsing a controller URL list and
the TLS context are rc.proto.urls, re-exported here.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rc.proto import INSTANCE_HEADER
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.urls import ControllerURL, parse_controller_url, parse_controller_urls, tls_context

if TYPE_CHECKING:
    from rc.proto.calls import Call


__all__ = [
    "STANDBY",
    "Client",
    "ControllerURL",
    "Response",
    "parse_controller_url",
    "parse_controller_urls",
    "segment",
    "tls_context",
]


def segment(text: str) -> str:
    """One path segment as typed by a user (a device id, a token name),
    percent-encoded so that '/', '?', '#', spaces and non-ASCII stay inside it:
    `rc clear 'gpu1:gpu0/drain?'` names a device, never another route."""
    return urllib.parse.quote(text, safe=":@")


CONNECT_TIMEOUT_S = 5.0


READ_TIMEOUT_S = 120.0


FAILOVER_BACKOFF_MIN_S = 0.2


FAILOVER_BACKOFF_MAX_S = 2.0


STANDBY = "standby"
"""The error code of a controller that is not the active one (HTTP 503)."""


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
    """Talks to one controller (of a list: see the module docstring) with one token.

    `url` is a URL, a comma-separated list of them (parse_controller_urls),
    a ControllerURL or a list of ControllerURL. `timeout` is the read
    timeout in seconds for ordinary requests (long polls and streams pass
    their own); `connect_timeout` bounds the TCP and TLS handshake. `cacert`
    is a PEM file to verify an https controller with (default: the system
    store). `url` is the controller talked to now; `urls` the whole list.
    """

    def __init__(
        self,
        url: str | ControllerURL | list[ControllerURL],
        token: str = "",
        *,
        timeout: float = READ_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        cacert: str | None = None,
    ) -> None:
        if isinstance(url, ControllerURL):
            self.urls = [url]
        elif isinstance(url, list):
            if not url:
                raise RcError("no controller URL given")
            self.urls = list(url)
        else:
            self.urls = parse_controller_urls(url)
        self._current = 0
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
        self.headers: dict[str, str] = {}
        """Headers sent on every request besides Accept and the token (rc mcp
        names itself with rc.proto.VIA_HEADER)."""
        self.last_response: float = 0.0
        """time.monotonic() of the last response of any status (contact)."""
        self.on_new_instance: Callable[[str], None] | None = None
        """Called with the new id when a response comes from another controller
        instance than the one before (a restart, a failover), on the thread
        that got it; it must be quick and must not raise."""
        self.on_waiting: Callable[[str], None] | None = None
        """Called once per request, with what each URL answered, when a whole
        round of the list failed and the request goes on trying (the CLI says
        so on stderr instead of staying silent until the deadline)."""
        self.abandon: threading.Event | None = None
        """Once set (a worker shutting down), a request tries each URL of the
        list once more at most, without backoff, instead of cycling on."""

    @property
    def url(self) -> ControllerURL:
        """The controller this client talks to now (one of `urls`)."""
        return self.urls[self._current]

    @url.setter
    def url(self, url: ControllerURL) -> None:
        """Talk to `url` alone from now on (a list of one)."""
        self.urls = [url]
        self._current = 0

    def _move(self, failed: ControllerURL, active: str | None) -> None:
        """After `failed` did not serve a request: talk to `active` (a URL a
        standby named) when it is one of the list, else to the URL after
        `failed`. Another thread that moved already is not undone."""
        with self._lock:
            if self.urls[self._current] != failed:
                return
            named = None
            if active:
                try:
                    named = parse_controller_url(active)
                except RcError:
                    named = None
            if named is not None and named in self.urls and named != failed:
                self._current = self.urls.index(named)
            else:
                self._current = (self._current + 1) % len(self.urls)

    def failover(self, attempt, deadline: float):
        """Run `attempt(url)` against the current controller and return what it
        returns; when the client has a list of URLs and it raises
        TransportError or ApiError `standby`, move (see `_move`) and run it
        again, with backoff after each round of the list, until time.monotonic()
        passes `deadline`. Then the last error is raised (a TransportError
        naming every URL's last failure when none could be reached)."""
        if len(self.urls) == 1:
            return attempt(self.url)
        backoff = FAILOVER_BACKOFF_MIN_S
        tried = rounds = 0
        failures: dict[ControllerURL, str] = {}
        while True:
            url = self.url
            try:
                return attempt(url)
            except TransportError as e:
                failures[url] = str(e)
                last: RcError = e
                active = None
            except ApiError as e:
                if e.code != STANDBY:
                    raise
                failures[url] = f"{url}: a standby"
                last = e
                active = getattr(e, "active", None)
            self._move(url, active)
            tried += 1
            now = time.monotonic()
            abandon = self.abandon
            if now >= deadline or (
                tried >= len(self.urls) and abandon is not None and abandon.is_set()
            ):
                if isinstance(last, TransportError) and len(failures) > 1:
                    raise TransportError(
                        "no controller of the list answered ("
                        + "; ".join(failures[u] for u in self.urls if u in failures)
                        + ")"
                    ) from None
                raise last
            if tried >= len(self.urls):
                if rounds == 0 and self.on_waiting is not None:
                    self.on_waiting("; ".join(failures[u] for u in self.urls if u in failures))
                rounds += 1
                tried = 0
                pause = min(backoff, max(0.0, deadline - now))
                if abandon is not None:
                    abandon.wait(pause)
                else:
                    time.sleep(pause)
                backoff = min(backoff * 2, FAILOVER_BACKOFF_MAX_S)

    def deadline(self, read_timeout: float | None) -> float:
        """The time.monotonic() until which a request of this read timeout
        (seconds; None: the client's) goes on trying the list's controllers."""
        t = self.timeout if read_timeout is None else read_timeout
        return time.monotonic() + t + self.connect_timeout

    # -- connections -----------------------------------------------------

    def new_connection(
        self, read_timeout: float, url: ControllerURL | None = None
    ) -> http.client.HTTPConnection:
        """A fresh, unpooled connection to the controller (for streamed bodies, which
        need a connection of their own); `read_timeout` in seconds, None for none;
        `url` one of `urls` (default: the current one)."""
        url = url or self.url
        if self._ssl is not None:
            return _TLSConnection(url.host, url.port, self.connect_timeout, read_timeout, self._ssl)
        conn = _Connection(url.host, url.port, self.connect_timeout, read_timeout)
        return conn

    def _pooled(
        self, read_timeout: float, url: ControllerURL
    ) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(conn, "rc_url", url) != url:
            self.close()  # kept alive to the controller this client moved away from
            conn = None
        if conn is not None:
            conn.read_timeout = read_timeout
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            return conn, True
        conn = self.new_connection(read_timeout, url)
        conn.rc_url = url
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
        """The headers every request carries (Accept, the bearer token,
        `headers`), plus `extra`."""
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if self.headers:
            h.update(self.headers)
        if extra:
            h.update(extra)
        return h

    def path(
        self, path: str, params: dict[str, Any] | None = None, url: ControllerURL | None = None
    ) -> str:
        """The request target for an API path with optional query parameters
        (on `url`, default: the current controller)."""
        target = (url or self.url).prefix + path
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
        retry: writes carry idempotency keys or offsets). With a list of URLs
        the request follows the controllers (see `failover`).
        """
        h = self.auth_headers(headers)
        data = raw
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        elif raw is not None:
            h.setdefault("Content-Type", "application/octet-stream")
        read_timeout = self.timeout if timeout is None else timeout

        def attempt(url: ControllerURL) -> Response:
            return self._request_once(
                url, method, self.path(path, params, url), data, h, read_timeout
            )

        return self.failover(attempt, self.deadline(read_timeout))

    def _request_once(
        self,
        url: ControllerURL,
        method: str,
        target: str,
        data: bytes | None,
        h: dict[str, str],
        read_timeout: float,
    ) -> Response:
        for attempt in (0, 1):
            conn, reused = self._pooled(read_timeout, url)
            try:
                conn.request(method, target, body=data, headers=h)
                resp = conn.getresponse()
                payload = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if reused and attempt == 0:
                    continue
                raise TransportError(f"{url}: connection lost: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise TransportError(f"{url}: {_describe(e, self.cacert)}") from None
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
            before, self.instance = self.instance, inst
            if before and inst != before and self.on_new_instance is not None:
                self.on_new_instance(inst)
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

    def call(
        self,
        call: Call,
        *ids: object,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send `call` (rc.proto.calls) with its path parameters `ids`, in the
        template's order, and return the answer: the decoded JSON body (None
        for an empty one), or the raw bytes of a route that answers bytes.

        `body`: the call's request record, a dict of its fields, or bytes for
        a raw body (Call.payload); `params`: query parameters of the call
        (None values are left out); `timeout`: the read timeout in seconds
        (None: the client's). Raises ApiError and TransportError as `request`
        does, TypeError for what the call does not take (a bug in the caller).
        """
        return call.read(self.call_response(call, *ids, body=body, params=params, timeout=timeout))

    def call_response(
        self,
        call: Call,
        *ids: object,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Send `call` as `call` does and return the whole Response (status,
        headers, raw body): a long poll tells 200 from 204 by it."""
        data, raw = call.payload(body)
        return self.request(
            call.method,
            call.target(*ids),
            data,
            raw=raw,
            params=call.check_query(params),
            timeout=timeout,
        )

    def call_stream(
        self,
        call: Call,
        *ids: object,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Iterator[bytes]:
        """Open `call`'s streamed answer and yield its chunks (`stream`)."""
        return self.stream(
            call.method, call.target(*ids), params=call.check_query(params), timeout=timeout
        )

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
        Opening the stream follows a list of controllers (see `failover`); a
        stream that breaks later raises TransportError (the caller resumes
        by offset, on whichever controller then answers).
        """
        h = self.auth_headers(headers)
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        read_timeout = self.timeout if timeout is None else timeout
        opened: list[tuple[http.client.HTTPConnection, ControllerURL]] = []

        def attempt(url: ControllerURL):
            conn = self.new_connection(read_timeout, url)
            try:
                try:
                    conn.request(method, self.path(path, params, url), body=body, headers=h)
                    resp = conn.getresponse()
                except (OSError, http.client.HTTPException) as e:
                    raise TransportError(f"{url}: {_describe(e, self.cacert)}") from None
                hdrs = {k.lower(): v for k, v in resp.getheaders()}
                if resp.status >= 400:
                    self.check_response(resp.status, hdrs, resp.read())
                self.check_response(resp.status, hdrs, b"")
            except BaseException:
                conn.close()
                raise
            opened.append((conn, url))
            return resp

        resp = self.failover(attempt, self.deadline(read_timeout))
        conn, url = opened[-1]
        try:
            while True:
                try:
                    chunk = resp.read1(65536)
                except (OSError, http.client.HTTPException) as e:
                    raise TransportError(
                        f"{url}: stream broke: {_describe(e, self.cacert)}"
                    ) from None
                if not chunk:
                    return
                yield chunk
        finally:
            conn.close()


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
    """The ApiError of an error envelope; a `standby` one carries the URL of
    the active controller it names as `.active` (None when it names none)."""
    try:
        obj = json.loads(payload)
        if isinstance(obj, dict) and isinstance(obj.get("error"), str):
            err = ApiError(status, obj["error"], str(obj.get("message", "")))
            if err.code == STANDBY:
                active = obj.get("active")
                err.active = active if isinstance(active, str) and active else None
            return err
    except ValueError:
        pass
    text = payload[:200].decode("utf-8", "replace").strip()
    return ApiError(status, "http_" + str(status), text or f"controller returned {status}")
