"""Wire records of who calls and what admins do: whoami, local sessions,
sign-in, tokens, events, drain and undrain."""

from __future__ import annotations

from dataclasses import dataclass

from rc.proto.model import Event, Role, Token


@dataclass(frozen=True, slots=True)
class WhoAmI:
    """GET /v1/whoami: the caller's token name and role (never the secret),
    a worker token's bound host, and the Unix user its jobs run as; who it
    is, `principal` (rc.proto.model.Principal: `token:<id>` or `uid:<uid>`,
    what a job's `owner` is compared with), and its display `label`
    ("alice", "alice (token laptop)")."""

    name: str
    role: Role
    host: str = ""
    unix_user: str = ""
    principal: str = ""
    label: str = ""


@dataclass(frozen=True, slots=True)
class LocalSession:
    """The one JSON line the controller's local Unix socket answers
    (rc.proto.localsocket): a bearer token for the Unix user the kernel says
    is on the other end (SO_PEERCRED), valid until `expires_at` (seconds
    since the epoch) and only in the controller's memory, for the HTTP API
    at `url`. name and unix_user are that user's name; role is user (admin
    for uid 0). A refusal is the error shape {"error", "message"} instead."""

    token: str
    name: str
    role: Role
    unix_user: str
    expires_at: float
    url: str


@dataclass(frozen=True, slots=True)
class SignInCode:
    """POST /v1/dashboard/code: a one-time code for the dashboard, acting as
    the caller who asked (rc.controller.signin), valid once until
    `expires_at` (seconds since the epoch, `expires_in_seconds` from now).
    Not a token: it opens nothing but POST /v1/dashboard/session."""

    code: str
    expires_at: float
    expires_in_seconds: float


@dataclass(frozen=True, slots=True)
class SignInRequest:
    """POST /v1/dashboard/session: the code `rc dashboard` printed."""

    code: str


@dataclass(frozen=True, slots=True)
class SignInSession:
    """POST /v1/dashboard/session: a session token acting as the code's
    caller (`name`, `role`), in the controller's memory only, valid until
    `expires_at` (seconds since the epoch; never past the caller's own
    token)."""

    token: str
    name: str
    role: Role
    expires_at: float


@dataclass(frozen=True, slots=True)
class TokenCreate:
    """POST /v1/tokens. expires_in_seconds 0 means never. `unix_user`: whom
    the token's jobs run as ("": the token's own name, which must then be a
    Unix user name; root only when given here; none for a worker token)."""

    name: str
    role: Role
    expires_in_seconds: int = 0
    unix_user: str = ""


@dataclass(frozen=True, slots=True)
class TokenCreated:
    """The only response that ever carries a token's secret."""

    token: Token
    secret: str


@dataclass(frozen=True, slots=True)
class TokenList:
    """GET /v1/tokens."""

    tokens: tuple[Token, ...]


@dataclass(frozen=True, slots=True)
class EventList:
    """GET /v1/events: feed rows with id > after, oldest first."""

    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """POST /v1/devices/{id}/drain."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class UndrainRequest:
    """POST /v1/devices/{id}/undrain: `force` undrains a device a GPU health
    rule drained without re-probing it (README "GPU health")."""

    force: bool = False


@dataclass(frozen=True, slots=True)
class ActionResult:
    """The answer to an admin verb: what was done, in words. `already`: the
    effect was in place before (drain a draining device, undrain one that is
    not): nothing changed and no event was recorded; the message says since
    when and by whom where it knows."""

    ok: bool
    message: str = ""
    already: bool = False


@dataclass(frozen=True, slots=True)
class TokenRevoked:
    """DELETE /v1/tokens/{name}[?keep_jobs=true]: the token is revoked; the
    ids of the queued jobs and holds of its name that were cancelled with it
    (none with keep_jobs)."""

    ok: bool
    message: str = ""
    cancelled_job_ids: tuple[int, ...] = ()
