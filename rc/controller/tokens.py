"""Transactions on API tokens (DESIGN.md §6.1). Only sha256 hashes are stored."""

from __future__ import annotations

from rc.controller import feed
from rc.controller.db import Tx
from rc.controller.errors import Refused
from rc.proto.errors import ErrorCode
from rc.proto.model import EventKind, Role

__all__ = ["bind_host", "create", "live", "revoke"]


def create(
    tx: Tx, name: str, role: Role, secret_hash: str, created_by: str, expires_at: float | None
) -> None:
    """Store a new token. 409 token_exists when a live token has this name."""
    if tx.one("token_live_by_name", (name,)) is not None:
        raise Refused.conflict(ErrorCode.TOKEN_EXISTS, f"a token named {name!r} already exists")
    tx.exec("token_insert", (name, role.value, secret_hash, created_by, tx.now, expires_at))
    feed.record(
        tx,
        EventKind.TOKEN_CREATED,
        actor=created_by,
        text=f"{created_by or 'rc serve'} created {role.value} token {name!r}",
    )
    tx.notify("tokens")


def revoke(tx: Tx, name: str, actor: str) -> None:
    """Revoke the live token with this name. 404 when there is none; 409
    last_admin_token when it is the last live (unrevoked, unexpired) admin
    token, which would leave nobody able to administer the controller."""
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
        raise Refused.conflict(
            ErrorCode.LAST_ADMIN_TOKEN,
            f"token {name!r} is the last live admin token; revoking it would leave nobody "
            "able to administer rc (create another with `rc token create NAME --role admin` "
            "first)",
        )
    if tx.exec("token_revoke", (tx.now, name)) == 0:
        raise Refused.not_found(f"no live token named {name!r}")
    feed.record(tx, EventKind.TOKEN_REVOKED, actor=actor, text=f"{actor} revoked token {name!r}")
    tx.notify("tokens")


def bind_host(tx: Tx, token_id: int, host: str) -> str:
    """Bind a worker token to `host` at its first registration; returns the bound host."""
    tx.exec("token_bind_host", (host, token_id))
    tx.notify("tokens")
    return tx.scalar("token_host", (token_id,))


def live(tx: Tx):
    """Every token row that is not revoked (for the in-memory cache)."""
    return tx.all("tokens_live")
