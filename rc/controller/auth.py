"""Who is calling: bearer tokens → a Caller, and the role rules
(docs/design.md#identity-and-ownership).

Secrets look like `rc_<43 url-safe characters>`; the database keeps their
sha256 only. Lookups go through an in-memory map from hash to token, loaded
whole at start and then kept up to date one token at a time (create, revoke,
a worker token's binding to its host: O(1) each); the stored hash is compared
with hmac.compare_digest. A token is never logged or echoed.

Roles: admin passes every route; otherwise the token's role must be one the
route allows. 401 unauthorized for a missing, malformed, unknown, revoked or
expired token; 403 forbidden for the wrong role.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rc.controller.errors import Refused
from rc.proto.errors import ErrorCode
from rc.proto.model import TOKEN_NAME_RE, Principal, Role, token_label

if TYPE_CHECKING:
    from rc.controller.store.rows import LiveToken

__all__ = ["TOKEN_NAME_RE", "Caller", "TokenCache", "hash_secret", "new_secret"]

SECRET_PREFIX = "rc_"


def new_secret() -> str:
    """A fresh token secret (256 bits of randomness)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The stored form of a secret: sha256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: token id (0 for a token of the local
    socket), name (the token's, or the socket user's login name), role,
    bound host (workers), expiry, the Unix user its jobs run as, and for a
    socket user its uid.

    Who it is, is `principal` (rc.proto.model.Principal, in its stored
    form): `uid:<uid>` for a socket user, else `token:<token_id>`. Nothing
    decides ownership by `name` (`owns`); `label` is how people see it."""

    token_id: int
    name: str
    role: Role
    host: str = ""
    expires_at: float | None = None
    unix_user: str = ""
    uid: int | None = None

    @property
    def admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def principal(self) -> str:
        """`uid:<uid>` (a socket user) or `token:<token_id>`; "" for a
        caller that is neither (token id 0 and no uid: one built by hand),
        which owns nothing and may submit nothing."""
        if self.uid is not None:
            return str(Principal.of_uid(self.uid))
        return str(Principal.of_token(self.token_id)) if self.token_id > 0 else ""

    @property
    def label(self) -> str:
        """Its display label: a socket user's login name ("alice"), a
        token's Unix user and name ("alice (token laptop)": token_label)."""
        return self.name if self.uid is not None else token_label(self.name, self.unix_user)

    def owns(self, owner: str) -> bool:
        """Whether this caller may act on what `owner` (a principal's stored
        form) owns: an admin, or that very principal. Nothing else."""
        return self.admin or (bool(owner) and self.principal == owner)


class TokenCache:
    """hash → Caller for every live token. `load()` replaces the whole map
    (at start); `put()`, `put_session()` and `drop()` change one token each."""

    def __init__(self) -> None:
        self._by_hash: dict[str, tuple[str, Caller]] = {}

    def load(self, live: Iterable[LiveToken]) -> None:
        """Replace the map with the live tokens `live` (store.tokens.live)."""
        self._by_hash = {t.secret_hash: _entry(t) for t in live}

    def put(self, live: LiveToken) -> None:
        """Add one live token, or replace it (the same hash)."""
        self._by_hash[live.secret_hash] = _entry(live)

    def put_session(self, secret_hash: str, caller: Caller) -> None:
        """Add a token the local socket issued: in memory only, never in the
        database (rc.controller.localsocket)."""
        self._by_hash[secret_hash] = (secret_hash, caller)

    def drop(self, secret_hash: str) -> Caller | None:
        """Forget one token (revoked); returns its Caller, None for an
        unknown hash."""
        hit = self._by_hash.pop(secret_hash, None)
        return hit[1] if hit is not None else None

    def __len__(self) -> int:
        return len(self._by_hash)

    def authenticate(self, header: str | None, now: float) -> Caller:
        """The Caller for an Authorization header value. Raises Refused(401)."""
        if not header:
            raise Refused(ErrorCode.UNAUTHORIZED, "missing bearer token (set RC_TOKEN)")
        scheme, _, secret = header.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise Refused(ErrorCode.UNAUTHORIZED, "Authorization must be 'Bearer <token>'")
        digest = hash_secret(secret)
        hit = self._by_hash.get(digest)
        if hit is None or not hmac.compare_digest(hit[0], digest):
            raise Refused(ErrorCode.UNAUTHORIZED, "unknown or revoked token")
        caller = hit[1]
        if caller.expires_at is not None and now >= caller.expires_at:
            raise Refused(ErrorCode.UNAUTHORIZED, f"token {caller.name!r} has expired")
        return caller


def _entry(live: LiveToken) -> tuple[str, Caller]:
    t = live.token
    return (
        live.secret_hash,
        Caller(t.id, t.name, t.role, t.host, t.expires_at, t.unix_user),
    )


def require(caller: Caller, *roles: Role) -> Caller:
    """Admin passes; anyone else must hold one of `roles`. Raises Refused(403)."""
    if caller.role is Role.ADMIN or caller.role in roles:
        return caller
    allowed = " or ".join(r.value for r in roles) or "admin"
    article = "an" if allowed.startswith("admin") else "a"  # "a user", "a worker"
    # which kind of caller, never the bare name: a local user called like a
    # worker token read as if told about that token
    who = f"the local user {caller.name}" if caller.uid is not None else f"token {caller.name!r}"
    raise Refused(
        ErrorCode.FORBIDDEN,
        f"this route needs {article} {allowed} token; {who} has the role {caller.role.value}",
    )
