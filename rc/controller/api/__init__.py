"""HTTP routes of the controller, one module per group of routes.

Helpers shared by the route modules: authentication, bounded body reading,
strict JSON decoding into rc.proto records, JSON responses. Every route is
declared once, in rc.controller.api.routes (the route table). Every refusal is
a `Refused`, rendered by rc.controller.app as the single error shape.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rc.controller.auth import Caller, require
from rc.controller.core import Controller
from rc.controller.errors import Refused
from rc.proto.codec import decode
from rc.proto.errors import ErrorCode, WireError
from rc.proto.model import Role

__all__ = [
    "Role",
    "authorize",
    "caller",
    "ctl",
    "cut_text",
    "free_text",
    "json_body",
    "path_int",
    "query_bool",
    "query_float",
    "query_int",
    "read_body",
    "reply",
]


def ctl(request: Request) -> Controller:
    """The Controller serving this request."""
    return request.app.state.ctl


def authorize(request: Request, roles: tuple[Role, ...], *, query_token: bool = False) -> Caller:
    """Authenticate the request and check its role (admin always passes);
    the route table runs it before every handler of a route with roles
    (rc.controller.api.endpoint). The caller is kept for `caller(request)`.

    Raises Refused 401 / 403. Tokens travel in the Authorization header only;
    a `?token=` query parameter counts only with `query_token` (the live
    stream, because EventSource cannot send headers), and only when no
    header is present.
    """
    c = ctl(request)
    header = request.headers.get("authorization")
    if header is None and query_token and request.query_params.get("token"):
        header = "Bearer " + request.query_params["token"]
    who = c.tokens.authenticate(header, c.clock())
    request.state.caller = who
    return require(who, *roles)


def caller(request: Request) -> Caller:
    """Who is calling: the caller the route table's role check admitted."""
    return request.state.caller


async def read_body(
    request: Request, limit: int, code: ErrorCode = ErrorCode.BODY_TOO_LARGE
) -> bytes:
    """The whole request body, refusing more than `limit` bytes (413 `code`)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise Refused(ErrorCode.BAD_REQUEST, "Content-Length is not a number") from None
        if n > limit:
            raise Refused(code, f"request body of {n} bytes is over the {limit}-byte limit")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise Refused(code, f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request, limit: int, *, empty_ok: bool = False) -> Any:
    """Decode the body, strictly, into the record the route table declares
    as the route's request (Endpoint.request: one of rc.proto.wire's).

    400 bad_json for malformed JSON, 400 bad_request naming the field for
    unknown fields, missing fields and wrong types. An empty body decodes as
    {} when `empty_ok`.
    """
    raw = await read_body(request, limit)
    if not raw.strip():
        if not empty_ok:
            raise Refused(ErrorCode.BAD_JSON, "the request needs a JSON body")
        raw = b"{}"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise Refused(ErrorCode.BAD_JSON, f"the body is not valid JSON: {e}") from None
    try:
        return decode(request.state.endpoint.request, data)
    except WireError as e:
        raise Refused(ErrorCode.BAD_REQUEST, str(e)) from None


def reply(obj: Any, status: int = 200) -> Response:
    """A JSON response of a record (or plain JSON data).

    orjson serializes the records itself (dataclasses, enums, tuples), about four
    times faster than going through rc.proto.codec.encode first; a property test
    (tests/unit/test_proto.py) holds the two to the same bytes."""
    return Response(
        orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS),
        status_code=status,
        media_type="application/json",
    )


def free_text(what: str, text: str, limit: int) -> str:
    """`text` (free text a person gave: a kill or drain reason) as it is, or
    400 limit_exceeded naming `what` when it is longer than `limit`
    characters. Never cut: a person is told, and sends a shorter one."""
    if len(text) > limit:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"{what} is {len(text)} characters long; the limit is {limit}",
        )
    return text


CUT_MARK = "…"
"""The last character of a worker's detail that was cut to the limit."""


def cut_text(text: str, limit: int) -> str:
    """`text` (a worker's own detail: a fault, why a job ended) cut to at most
    `limit` characters, the last one CUT_MARK when it was cut. A worker's
    report is never refused for its length: it would be retried for good."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + CUT_MARK


def path_int(request: Request, name: str = "job_id") -> int:
    """An integer path parameter; 404 when it is not one (no such job)."""
    raw = request.path_params[name]
    try:
        value = int(raw)
    except ValueError:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {raw!r} (job ids are numbers)") from None
    if value <= 0 or value >= 1 << 62:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {raw!r}")
    return value


def query_float(request: Request, name: str, default: float, lo: float, hi: float) -> float:
    """A numeric query parameter in seconds ("30", "30s", "1m"), clamped to [lo, hi].

    400 bad_request when it does not parse.
    """
    from rc.proto.duration import DurationError, parse_duration

    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = parse_duration(raw)
    except DurationError as e:
        raise Refused(ErrorCode.BAD_REQUEST, f"query parameter {name}: {e}") from None
    return min(max(value, lo), hi)


def query_bool(request: Request, name: str, default: bool) -> bool:
    """A boolean query parameter: true/false (also 1/0, yes/no); 400 otherwise."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    value = _BOOLS.get(raw.lower())
    if value is None:
        raise Refused(ErrorCode.BAD_REQUEST, f"query parameter {name} must be true or false")
    return value


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def query_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter that must lie in [lo, hi] (400 otherwise)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Refused(ErrorCode.BAD_REQUEST, f"query parameter {name} must be an integer") from None
    if not lo <= value <= hi:
        raise Refused(ErrorCode.BAD_REQUEST, f"query parameter {name} must be in {lo}..{hi}")
    return value
