"""Transactions on API tokens. Only sha256 hashes are stored.

Each returns what the controller's in-memory token map (rc.controller.auth
TokenCache) needs to follow the change, so no change rebuilds the map.
"""

from __future__ import annotations

from rc.controller.errors import Refused
from rc.controller.store import events, jobs, rows
from rc.controller.store.db import Tx
from rc.proto.errors import ErrorCode
from rc.proto.model import EventKind, Principal, Role, Token

__all__ = [
    "REVOKED_REASON",
    "bind_host",
    "count",
    "create",
    "listing",
    "live",
    "revoke",
    "rotate",
]

REVOKED_REASON = "token revoked"
"""The kill reason of the queued jobs a revoke cancels."""


def create(
    tx: Tx,
    name: str,
    role: Role,
    secret_hash: str,
    created_by: str,
    expires_at: float | None,
    unix_user: str = "",
):
    """Store a new token whose jobs run as `unix_user` ("" for a worker
    token); returns it (rows.LiveToken). 409 token_exists when a live token
    has this name."""
    if tx.one("token_live_by_name", (name,)) is not None:
        raise Refused(ErrorCode.TOKEN_EXISTS, f"a token named {name!r} already exists")
    tx.change(
        "token_insert", (name, role.value, secret_hash, created_by, tx.now, expires_at, unix_user)
    )
    runs_as = f" (its jobs run as {unix_user})" if unix_user and unix_user != name else ""
    events.record(
        tx,
        EventKind.TOKEN_CREATED,
        actor=created_by,
        text=f"{created_by or 'rc serve'} created {role.value} token {name!r}{runs_as}",
    )
    tx.notify("tokens")
    return rows.live_token(tx.one("token_live_by_name", (name,)))


def revoke(tx: Tx, name: str, actor: str, keep_jobs: bool = False) -> tuple[str, list[int]]:
    """Revoke the live token with this name and, unless `keep_jobs`, cancel
    the queued jobs and holds it owns (its principal, token:<id>: those it
    submitted and those an admin submitted as it, `--as token:NAME`), with
    kill reason REVOKED_REASON; never another principal's, whatever its
    name (a local user called like the token keeps its jobs). Running ones
    go on. Its jobs' labels become "svc (revoked token ci)", so a later
    token of the same name is never read as their owner. Returns (the
    token's secret hash, the cancelled job ids).
    404 when there is no such token; 409 last_admin_token when it is the last
    live (unrevoked, unexpired) admin token, which would leave nobody able to
    administer the controller."""
    live_rows = tx.all("tokens_live")

    def usable_admin(r) -> bool:
        return r["role"] == Role.ADMIN.value and (
            r["expires_at"] is None or r["expires_at"] > tx.now
        )

    target = [r for r in live_rows if r["name"] == name]
    if (
        target
        and usable_admin(target[0])
        and not any(usable_admin(r) for r in live_rows if r["name"] != name)
    ):
        raise Refused(
            ErrorCode.LAST_ADMIN_TOKEN,
            f"token {name!r} is the last live admin token; revoking it would leave nobody "
            "able to administer rc (create another with `rc token create NAME --role admin` "
            "first)",
        )
    if not target or tx.exec("token_revoke", (tx.now, name)) == 0:
        raise Refused(ErrorCode.NOT_FOUND, f"no live token named {name!r}")
    cancelled = []
    owner = str(Principal.of_token(target[0]["id"]))
    tx.exec("jobs_relabel_revoked", (owner,))
    if not keep_jobs:
        for row in tx.all("jobs_queued_of_owner", (owner,)):
            if jobs.cancel_queued(tx, row["id"], REVOKED_REASON):
                cancelled.append(row["id"])
    text = f"{actor} revoked token {name!r}"
    if cancelled:
        text += f"; cancelled {len(cancelled)} queued job{'s' if len(cancelled) > 1 else ''}"
    events.record(tx, EventKind.TOKEN_REVOKED, actor=actor, text=text)
    tx.notify("tokens")
    if cancelled:
        tx.schedule = True  # jobs that waited behind them may start
    return target[0]["secret_hash"], cancelled


def rotate(tx: Tx, name: str, secret_hash: str, actor: str) -> tuple[str, rows.LiveToken]:
    """Give the live token `name` a new secret (`secret_hash`): the old
    secret stops working at once, and the token keeps its id, so it stays
    the same principal (token:<id>) and keeps its jobs, unlike a revoke and
    a new token of that name, which would be a new principal owning none of
    them. Returns (the old secret's hash, the token as it is now:
    rows.LiveToken). 404 when there is no live token of that name."""
    old = tx.one("token_live_by_name", (name,))
    if old is None or tx.exec("token_rotate", (secret_hash, name)) == 0:
        raise Refused(ErrorCode.NOT_FOUND, f"no live token named {name!r}")
    events.record(
        tx,
        EventKind.TOKEN_CREATED,
        actor=actor,
        text=f"{actor} gave {old['role']} token {name!r} a new secret (the old one stops working)",
    )
    tx.notify("tokens")
    return old["secret_hash"], rows.live_token(tx.one("token_live_by_name", (name,)))


def bind_host(tx: Tx, token_id: int, host: str) -> rows.LiveToken | None:
    """Bind a worker token to `host` at its first registration; returns the
    token (rows.LiveToken, its `host` the bound one), or None when it is no
    longer live."""
    # no row changes when an earlier registration bound it already: the row
    # returned says to which host, and the caller checks it is this one
    tx.exec("token_bind_host", (host, token_id))
    tx.notify("tokens")
    row = tx.one("token_live_by_id", (token_id,))
    return None if row is None else rows.live_token(row)


def live(tx: Tx) -> list[rows.LiveToken]:
    """Every token that is not revoked (for the in-memory token map)."""
    return [rows.live_token(r) for r in tx.all("tokens_live")]


def listing(tx: Tx) -> list[Token]:
    """Every token, live ones first, then by name (never a secret)."""
    return [rows.token(r) for r in tx.all("tokens_all")]


def count(tx: Tx) -> int:
    """How many tokens were ever created (revoked ones included)."""
    return tx.scalar("tokens_count")
