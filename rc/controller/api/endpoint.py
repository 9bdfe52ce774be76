"""One endpoint of the HTTP API, as the route table declares it (rc.controller.api.routes).

An `Endpoint` says everything about one route once: its method and path, its
handler, the token roles it admits, what it takes and returns, its query
parameters and the errors it answers with. From the table come the Starlette
routes (`Endpoint.route`), the role check that runs before every handler
(rc.controller.api.authorize), the decoding of a JSON body into the declared
record (rc.controller.api.json_body) and the OpenAPI document
(rc.controller.openapi.document). tests/e2e/test_auth_matrix.py calls every
route as nine kinds of caller and checks the answers against the same table.

Roles: admin passes every route; `roles` lists the others a route admits
(USER, WORKER, ANY), ADMIN alone for an admin-only route, and None (PUBLIC)
for a route that needs no token. A handler of a route with roles reads the
authenticated caller with rc.controller.api.caller(request).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rc.controller.api import authorize
from rc.proto.errors import ErrorCode, statuses
from rc.proto.model import Role

__all__ = [
    "ADMIN",
    "ANY",
    "BAD",
    "METHODS",
    "PATH_PARAM_TYPES",
    "PUBLIC",
    "USER",
    "WAIT",
    "WORKER",
    "Endpoint",
    "Param",
]

USER = (Role.USER,)
WORKER = (Role.WORKER,)
ANY = (Role.USER, Role.WORKER)
ADMIN = (Role.ADMIN,)
PUBLIC = None
"""`roles` of a route that needs no token (the dashboard page, the OpenAPI document)."""

METHODS = ("GET", "POST", "DELETE")
PATH_PARAM_TYPES = {"job_id": "integer", "sid": "integer"}
"""JSON type of a path parameter by name; any other is a string."""
_PATH_PARAM = re.compile(r"{([a-z_]+)}")

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter: name, JSON type ("integer", "string", "boolean"), description."""

    name: str
    type: str
    description: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One route of the API.

    handler: `async def (request) -> Response`, or a raw ASGI app (the relay
    halves, which stream both ways). roles: the token roles admitted besides
    admin (None: public). summary: one line for the OpenAPI document.
    request / response: a wire record (rc.proto.wire), "bytes" (a raw body),
    "text", "html", "svg", "sse", "json" (an untyped JSON object), or None.
    status: the success status. errors: the codes it may refuse with beyond
    the 401 and 403 of every authenticated route and the 404 and 405 of a
    path with parameters; a code is answered with its status in
    rc.proto.errors.STATUS, and `(status, code)` names the code's second
    status (SECOND_STATUS). query_token: the token may come as `?token=`
    (the live stream only: EventSource cannot send headers).

    Raises ValueError for an inconsistent declaration (an unknown method, a
    status the code never has, a public route taking a query token).
    """

    method: str
    path: str
    handler: Handler | ASGIApp
    roles: tuple[Role, ...] | None
    summary: str
    response: Any = None
    status: int = 200
    request: Any = None
    errors: tuple[ErrorCode | tuple[int, ErrorCode], ...] = ()
    params: tuple[Param, ...] = ()
    query_token: bool = False

    def __post_init__(self) -> None:
        where = f"{self.method} {self.path}"
        if self.method not in METHODS:
            raise ValueError(f"{where}: method must be one of {METHODS}")
        if self.roles is None and self.query_token:
            raise ValueError(f"{where}: a public route takes no token at all")
        for status, code in self.refusals():
            if status not in statuses(code):
                raise ValueError(f"{where}: {code} is never answered with {status}")

    @property
    def public(self) -> bool:
        """True when the route needs no token."""
        return self.roles is None

    @property
    def path_params(self) -> dict[str, str]:
        """{name: JSON type} of the path's parameters, in order."""
        return {n: PATH_PARAM_TYPES.get(n, "string") for n in _PATH_PARAM.findall(self.path)}

    def refusals(self) -> list[tuple[int, ErrorCode]]:
        """(status, code) of every error the route declares."""
        out = []
        for e in self.errors:
            status, code = e if isinstance(e, tuple) else (statuses(e)[0], e)
            out.append((status, ErrorCode(code)))
        return out

    def route(self) -> Route:
        """The Starlette route: the role check, then the handler."""
        handler = self.handler
        if inspect.isfunction(handler) or inspect.ismethod(handler):

            async def checked(request: Request) -> Response:
                self.admit(request)
                return await handler(request)

            checked.__name__ = checked.__qualname__ = handler.__name__
            return Route(self.path, checked, methods=[self.method])
        return Route(self.path, _CheckedApp(self, handler), methods=[self.method])

    def admit(self, request: Request) -> None:
        """Note the endpoint on the request and, unless public, authenticate
        the caller and check its role. Raises Refused 401 / 403."""
        request.state.endpoint = self
        if self.roles is not None:
            authorize(request, self.roles, query_token=self.query_token)


class _CheckedApp:
    """A raw ASGI handler behind its endpoint's role check."""

    def __init__(self, endpoint: Endpoint, app: ASGIApp) -> None:
        self.endpoint = endpoint
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.endpoint.admit(Request(scope, receive))
        await self.app(scope, receive, send)


BAD = (ErrorCode.BAD_REQUEST, ErrorCode.BAD_JSON, ErrorCode.BODY_TOO_LARGE)
"""What any route with a JSON body may answer about the body itself."""
WAIT = Param(
    "wait",
    "string",
    "long poll: answer when something changes, at most this long "
    "(a duration such as 30s; at most 60s)",
)
