"""The usage ledger and fair-share weights (README "Who used the devices",
"Sharing fairly")."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from rc.controller import charts
from rc.controller.api import caller, ctl, json_body, query_int, reply
from rc.controller.auth import TOKEN_NAME_RE
from rc.controller.errors import Refused
from rc.controller.store import usage
from rc.proto.duration import DurationError, parse_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import valid_unix_user
from rc.proto.wire import ShareList, ShareView

__all__ = [
    "CHART_DAYS_MAX",
    "SINCE_DEFAULT_S",
    "SINCE_MAX_S",
    "get_usage",
    "list_shares",
    "set_share",
    "since_of",
    "usage_chart",
]

CHART_DAYS_MAX = 90
"""The usage picture shows at most this many days (400 beyond)."""

SINCE_DEFAULT_S = 30 * 86400.0
"""The ledger's window unless told: the last 30 days."""
SINCE_MAX_S = 3660 * 86400.0
"""The longest window the ledger takes: about ten years (400 beyond)."""


def since_of(text: str | None) -> float:
    """A window's length in seconds from `since` ("30d", "12h", seconds);
    400 bad_request when it does not parse or is 0 or above SINCE_MAX_S."""
    if text is None or text == "":
        return SINCE_DEFAULT_S
    try:
        seconds = parse_duration(text)
    except DurationError as e:
        raise Refused(ErrorCode.BAD_REQUEST, f"since: {e}") from None
    if not 0 < seconds <= SINCE_MAX_S:
        raise Refused(ErrorCode.BAD_REQUEST, f"since {text!r} is outside 1s..3660d")
    return seconds


def _account(name: str) -> bool:
    """Whether `name` may name an account of the ledger and fair share: a
    Unix user name (what jobs are counted to), or a token's name (weights
    set before schema 10 were set by submitter name)."""
    return valid_unix_user(name) or bool(TOKEN_NAME_RE.fullmatch(name))


def _user_param(request: Request) -> str:
    name = request.query_params.get("user", "")
    if name and not _account(name):
        raise Refused(ErrorCode.BAD_REQUEST, f"user {name[:40]!r} is not a valid name")
    return name


async def get_usage(request: Request):
    """GET /v1/usage?by=user|host|device|day|week&since=30d&user=U: the ledger
    (rc.controller.store.usage.report) over the last `since`."""
    c = ctl(request)
    seconds = since_of(request.query_params.get("since"))
    by = request.query_params.get("by", "user")
    user = _user_param(request)
    got = await c.db.read(
        lambda tx: usage.report(tx, tx.now - seconds, by, user, c.retention.horizon(tx.now))
    )
    return reply(got)


async def usage_chart(request: Request):
    """GET /v1/usage/chart.svg?days=14: the dashboard's usage picture
    (rc.controller.charts.usage_svg over usage.daily), 1..CHART_DAYS_MAX days."""
    c = ctl(request)
    days = query_int(request, "days", 14, 1, CHART_DAYS_MAX)
    names, seconds, waits = await c.db.read(usage.daily, days)
    svg = charts.usage_svg(names, seconds, waits)
    return Response(svg, media_type="image/svg+xml", headers={"Cache-Control": "no-store"})


async def list_shares(request: Request):
    """GET /v1/shares: fair share's standings and every weight an admin set."""
    c = ctl(request)
    shares = c.policy.shares

    def read(tx):
        w = usage.weights(tx)
        standing = shares.standings(tx) if shares is not None else {}
        users = sorted(set(standing) | set(w))
        out = []
        for u in users:
            s = standing.get(u)
            if s is None:
                out.append(ShareView(u, w.get(u, 1.0), 0.0, 0.0, 0.0, 0))
            else:
                out.append(ShareView(u, s.weight, s.entitled, s.share, round(s.usage, 3), s.adjust))
        return ShareList(shares.half_life if shares is not None else 0.0, tuple(out))

    return reply(await c.db.read(read))


async def set_share(request: Request):
    """POST /v1/shares/{user} (admin): set a user's fair-share weight."""
    c = ctl(request)
    caller(request)
    user = request.path_params["user"]
    if not _account(user):
        raise Refused(ErrorCode.BAD_REQUEST, f"user {user[:40]!r} is not a valid name")
    req = await json_body(request, c.cfg.limits.body_bytes)
    await c.db.write(usage.set_weight, user, req.weight)
    if c.policy.shares is not None:
        c.policy.shares.invalidate()
    await c.kick()
    return await list_shares(request)
