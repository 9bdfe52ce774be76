"""Builds the Starlette app: routes, the one error shape, the instance header.

No business logic lives here: the routes come from the route
table (rc.controller.api.routes), their handlers are in rc.controller.api,
state changes in rc.controller.store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rc.controller.api import stream
from rc.controller.api.routes import ROUTES
from rc.controller.core import Controller
from rc.controller.errors import NotLeader, Refused
from rc.proto.errors import STATUS, ErrorCode
from rc.proto.wire import INSTANCE_HEADER

__all__ = ["Gate", "build_app", "error_response", "standby_response"]

log = logging.getLogger("rc.http")

_FRAMEWORK_CODES = {
    STATUS[code]: code
    for code in (
        ErrorCode.BAD_REQUEST,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.FORBIDDEN,
        ErrorCode.NOT_FOUND,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.BODY_TOO_LARGE,
    )
}
"""The code of a refusal Starlette itself makes (no route, wrong method...), by its status."""


def error_response(status: int, code: str, message: str) -> Response:
    """The single error shape: {"error": code, "message": text} (docs/design.md#the-wire)."""
    return Response(
        orjson.dumps({"error": code, "message": message}),
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


class Gate(Protocol):
    """Whether this controller is the active one (rc.controller.serve): while
    `open` is False every request is answered standby_response."""

    open: bool

    def active_url(self) -> str | None:
        """The active controller's advertised URL, or None when none is active."""
        ...


STANDBY_RETRY_AFTER_S = 1
"""Retry-After of a standby's answers, seconds."""


def standby_response(active: str | None) -> Response:
    """503 standby, naming the active controller's URL (`active`, null when
    no controller is active right now, e.g. during a takeover), with
    Retry-After: the standby contract (README "More than one box")."""
    where = f"the active controller is {active}" if active else "no controller is active right now"
    return Response(
        orjson.dumps(
            {
                "error": ErrorCode.STANDBY,
                "message": f"this controller is a standby; {where}",
                "active": active,
            }
        ),
        status_code=503,
        media_type="application/json",
        headers={"Cache-Control": "no-store", "Retry-After": str(STANDBY_RETRY_AFTER_S)},
    )


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return error_response(exc.status, exc.code, exc.message)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _FRAMEWORK_CODES.get(exc.status_code, ErrorCode.BAD_REQUEST)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, code, message)


class _Envelope:
    """Outermost middleware: the instance header on every response, and any
    unexpected exception turned into a 500 in the error shape (logged once,
    never a traceback to the client). Every response also says
    `X-Content-Type-Options: nosniff`: besides its usual meaning, it keeps
    browsers from holding back the first bytes of a streamed log to sniff them
    (the dashboard's live log tail)."""

    def __init__(
        self,
        app: ASGIApp,
        instance: str,
        count: Callable[[str], None] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.app = app
        self.count = count
        self.gate = gate
        """While gate.open is False, every request (HTTP or websocket) is
        answered 503 standby, without the instance header: a standby is no
        controller instance a worker registers with."""
        """Called with each HTTP request's path (Metrics.count_request)."""
        self.headers = [
            (INSTANCE_HEADER.lower().encode(), instance.encode()),
            (b"x-content-type-options", b"nosniff"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.gate is not None and not self.gate.open and scope["type"] in ("http", "websocket"):
            await _answer_standby(scope, receive, send, self.gate.active_url())
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.count is not None:
            self.count(scope["path"])
        started = False

        async def send_with_header(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        try:
            await self.app(scope, receive, send_with_header)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not started:
                resp = error_response(
                    500, ErrorCode.INTERNAL, "internal error (the controller log has the details)"
                )
                await resp(scope, receive, send_with_header)


async def _answer_standby(scope: Scope, receive: Receive, send: Send, active: str | None) -> None:
    resp = standby_response(active)
    if scope["type"] == "http":
        await resp(scope, receive, send)
        return
    # a websocket upgrade (the relay): the same 503 where the server can send
    # an HTTP answer to an upgrade (Hypercorn can), else the upgrade is refused
    if "websocket.http.response" in scope.get("extensions", {}):
        await send(
            {
                "type": "websocket.http.response.start",
                "status": resp.status_code,
                "headers": resp.raw_headers,
            }
        )
        await send({"type": "websocket.http.response.body", "body": resp.body})
    else:
        await send({"type": "websocket.close", "code": 1013})


async def _not_leader(request: Request, exc: Exception) -> Response:
    # a write fenced: this controller has just lost its lease and steps down
    return standby_response(None)


async def _internal(request: Request, exc: Exception) -> Response:
    return error_response(
        500, ErrorCode.INTERNAL, "internal error (the controller log has the details)"
    )


def build_app(ctl: Controller, gate: Gate | None = None) -> ASGIApp:
    """The ASGI application serving `ctl`; with a `gate` (standby
    controllers on PostgreSQL) it answers 503 standby while the gate is closed."""
    app = Starlette(
        routes=[endpoint.route() for endpoint in ROUTES],
        exception_handlers={
            Refused: _refused,
            NotLeader: _not_leader,
            HTTPException: _http_exception,
            Exception: _internal,
        },
    )
    app.state.ctl = ctl
    app.state.routes = ROUTES
    app.state.stream = stream.Broadcaster(ctl)
    return _Envelope(app, ctl.instance, ctl.metrics.count_request, gate)
