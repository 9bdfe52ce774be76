"""Identity and tokens, and the activity feed (docs/design.md#identity-and-ownership)."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request

from rc.controller.api import (
    caller,
    ctl,
    json_body,
    query_bool,
    query_float,
    query_int,
    reply,
)
from rc.controller.auth import TOKEN_NAME_RE, hash_secret, new_secret
from rc.controller.errors import Refused
from rc.controller.store import events as feed
from rc.controller.store import tokens
from rc.proto.errors import ErrorCode
from rc.proto.model import ROOT, Role, valid_unix_user
from rc.proto.wire import (
    EventList,
    TokenCreated,
    TokenList,
    TokenRevoked,
    WhoAmI,
)

__all__ = [
    "create_token",
    "events",
    "list_tokens",
    "revoke_token",
    "rotate_token",
    "token_unix_user",
    "whoami",
]


async def whoami(request: Request):
    """GET /v1/whoami: the caller's token name and role, and who it is: its
    principal and display label."""
    who = caller(request)
    return reply(WhoAmI(who.name, who.role, who.host, who.unix_user, who.principal, who.label))


async def create_token(request: Request):
    """POST /v1/tokens (admin): the response is the only place the secret appears."""
    c = ctl(request)
    who = caller(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    if not TOKEN_NAME_RE.fullmatch(req.name):
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"token name {req.name!r} is not valid "
            "(letters, digits, '.', '_', '@', '-'; at most 64)",
        )
    if req.expires_in_seconds < 0:
        raise Refused(ErrorCode.BAD_REQUEST, "expires_in_seconds cannot be negative")
    unix_user = token_unix_user(req.name, req.role, req.unix_user)
    secret = new_secret()
    expires = c.clock() + req.expires_in_seconds if req.expires_in_seconds else None
    live = await c.db.write(
        tokens.create, req.name, req.role, hash_secret(secret), who.label, expires, unix_user
    )
    c.tokens.put(live)
    return reply(TokenCreated(live.token, secret), 201)


def token_unix_user(name: str, role: Role, unix_user: str) -> str:
    """Whom a new token's jobs run as: `unix_user` when given, else the
    token's own name; "" for a worker token. 400 bad_request when that is
    not a Unix user name (valid_unix_user), when a worker token is given one, and
    for root unless it was given explicitly (`--unix-user root`)."""
    if role is Role.WORKER:
        if unix_user:
            raise Refused(
                ErrorCode.BAD_REQUEST, "a worker token runs no jobs of its own: give no unix_user"
            )
        return ""
    chosen = unix_user or name
    if not valid_unix_user(chosen):
        said = f"unix_user {chosen[:40]!r}" if unix_user else f"token name {chosen!r}"
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"{said} is not a Unix user name (no whitespace, control characters, '/', ':' "
            "or ','; not starting with '-', '+' or '~'; not digits only; at most 32 bytes): "
            + (
                "give the user's login name"
                if unix_user
                else "give --unix-user NAME (unix_user) to say whom its jobs run as"
            ),
        )
    if chosen == ROOT and not unix_user:
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"token {name!r} would run its jobs as root: give --unix-user root "
            "(unix_user) to mean it",
        )
    return chosen


async def list_tokens(request: Request):
    """GET /v1/tokens (admin): names, roles, dates; never secrets."""
    c = ctl(request)
    found = await c.db.read(tokens.listing)
    return reply(TokenList(tuple(found)))


async def rotate_token(request: Request):
    """POST /v1/tokens/{name}/rotate (admin): a new secret for a live token,
    the only response carrying it; the old secret stops working at once and
    the token stays the same principal, its jobs its own (rc up re-keys the
    client config's token so)."""
    c = ctl(request)
    who = caller(request)
    secret = new_secret()
    old_hash, live = await c.db.write(
        tokens.rotate, request.path_params["name"], hash_secret(secret), who.label
    )
    gone = c.tokens.drop(old_hash)
    if gone is not None:
        c.signin.end_token(gone.token_id)  # sessions opened with the old secret end too
    c.tokens.put(live)
    return reply(TokenCreated(live.token, secret))


async def revoke_token(request: Request):
    """DELETE /v1/tokens/{name}?keep_jobs=BOOL (admin): the token stops
    working at once; the queued jobs and holds it owns (its principal, never
    a name's) are cancelled ("token revoked") unless keep_jobs=true.
    Running ones go on."""
    c = ctl(request)
    who = caller(request)
    name = request.path_params["name"]
    keep = query_bool(request, "keep_jobs", False)
    secret_hash, cancelled = await c.db.write(tokens.revoke, name, who.label, keep)
    gone = c.tokens.drop(secret_hash)
    if gone is not None:
        c.signin.end_token(gone.token_id)  # its dashboard sessions end with it
    message = f"revoked token {name!r}"
    if cancelled:
        ids = ", ".join(str(j) for j in cancelled)
        n = len(cancelled)
        message += f"; cancelled its {n} queued job{'s' if n > 1 else ''} ({ids})"
    elif not keep:
        message += "; it had no queued job"
    return reply(TokenRevoked(True, message, tuple(cancelled)))


async def events(request: Request):
    """GET /v1/events?after=ID&since=SECONDS&limit=N&wait=S: feed rows, oldest first.

    `since` keeps rows newer than that many seconds ago; with `wait`, a long
    poll that answers as soon as a row after `after` exists.
    """
    c = ctl(request)
    after = query_int(request, "after", 0, 0, 1 << 62)
    limit = query_int(request, "limit", 100, 1, 1000)
    since = query_float(request, "since", 0.0, 0.0, 1e10)
    wait = query_float(request, "wait", 0.0, 0.0, 60.0)
    deadline = time.monotonic() + wait
    while True:
        ev = c.hub.waiter("events")
        since_at = c.clock() - since if since else 0.0
        found = await c.db.read(feed.since, after, since_at, limit)
        left = deadline - time.monotonic()
        if found or left <= 0 or c.hub.closing:
            return reply(EventList(tuple(found)))
        try:
            await asyncio.wait_for(ev.wait(), left)
        except TimeoutError:
            return reply(EventList(()))
