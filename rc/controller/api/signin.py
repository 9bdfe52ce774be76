"""POST /v1/dashboard/code and POST /v1/dashboard/session: the dashboard's
one-time sign-in (rc.controller.signin, README "Dashboard and metrics")."""

from __future__ import annotations

from starlette.requests import Request

from rc.controller.api import caller, ctl, json_body, reply
from rc.controller.signin import CODE_S
from rc.proto.wire import SignInCode, SignInSession

__all__ = ["mint_code", "open_session"]


async def mint_code(request: Request):
    """POST /v1/dashboard/code (a user or an admin): a one-time code that
    opens a dashboard session acting as the caller (`rc dashboard`)."""
    code, until = ctl(request).signin.mint(caller(request))
    return reply(SignInCode(code, until, CODE_S), 201)


async def open_session(request: Request):
    """POST /v1/dashboard/session {code} (no token: the code is the
    credential): spend the code for a session token. 401 unauthorized for a
    code that is unknown, used or expired."""
    c = ctl(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    secret, who = c.signin.exchange(req.code)
    return reply(SignInSession(secret, who.name, who.role, who.expires_at), 201)
