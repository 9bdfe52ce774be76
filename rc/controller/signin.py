"""One-time sign-in codes for the dashboard (README "Dashboard and metrics").

A socket user has no token to paste into the dashboard's login card: the
socket's tokens stay inside `rc`. So `rc dashboard` asks, as that caller,
`POST /v1/dashboard/code` for a code, and prints the dashboard's URL with
the code in its fragment (`http://HOST:PORT/#code=...`). The page takes
the code out of the address bar and sends it once to `POST
/v1/dashboard/session`, which needs no token (the code is the credential)
and answers a session token: the page keeps it in the tab's
sessionStorage, as a pasted token.

The rules:

- A code is single use and valid CODE_S seconds. It is not a token: it
  opens nothing but this exchange, it is kept in memory only and by its
  sha256, never in the database, and never logged. Used, expired, unknown
  or dropped, it is refused the same way (401, one message).
- The session acts as exactly the caller who asked for the code (the same
  Caller: name, role, Unix user, token id...) and expires no later than
  that caller's own token, at most SESSION_S after the exchange. Like the
  socket's tokens it lives in the controller's memory only (TokenCache
  .put_session): a controller restart ends it, and the page asks for a
  token again. Revoking the API token it came from ends it at once.
- Each caller has at most CODES_PER_CALLER live codes and
  SESSIONS_PER_CALLER live sessions; a new one drops the oldest, so nobody
  can grow the maps.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections import deque
from collections.abc import Callable

from rc.controller.auth import Caller, TokenCache, hash_secret, new_secret
from rc.controller.errors import Refused
from rc.proto.errors import ErrorCode
from rc.proto.model import Principal

__all__ = [
    "CODES_PER_CALLER",
    "CODE_PREFIX",
    "CODE_S",
    "SESSIONS_PER_CALLER",
    "SESSION_S",
    "SignIn",
]

CODE_S = 120.0
"""How long a sign-in code is valid (s), once."""
SESSION_S = 12 * 3600.0
"""The longest a dashboard session from a code lasts (s); never past the
caller's own token."""
CODES_PER_CALLER = 8
"""Most live codes one caller has at once (the oldest goes)."""
SESSIONS_PER_CALLER = 8
"""Most live dashboard sessions from codes one caller has at once (the oldest goes)."""
CODE_PREFIX = "rcc_"
"""A code looks like rcc_ and 22 url-safe characters (128 bits): never like a token."""
REFUSED = (
    "this sign-in code was already used, has expired or is not one of this controller's: "
    "run rc dashboard again for a new one"
)

Whose = str
"""Whose codes and sessions a bound counts: the caller's principal
(`token:<id>`, or `uid:<uid>` for a socket user), never a name."""


def _whose(caller: Caller) -> Whose:
    return caller.principal


class SignIn:
    """The live codes and the sessions they opened, for `tokens` (the
    controller's TokenCache); `clock()` is wall time (s)."""

    def __init__(self, tokens: TokenCache, clock: Callable[[], float]) -> None:
        self.tokens = tokens
        self.clock = clock
        self._codes: dict[str, tuple[Caller, float]] = {}  # sha256 of a code → (caller, until)
        self._codes_of: dict[Whose, deque[str]] = {}
        self._sessions_of: dict[Whose, deque[tuple[str, float]]] = {}  # (token hash, until)

    def mint(self, caller: Caller) -> tuple[str, float]:
        """A fresh code for `caller` and when it expires (s since the epoch)."""
        now = self.clock()
        self._forget_expired(now)
        code = CODE_PREFIX + secrets.token_urlsafe(16)
        digest = hash_secret(code)
        until = now + CODE_S
        mine = self._codes_of.setdefault(_whose(caller), deque())
        while len(mine) >= CODES_PER_CALLER:
            self._codes.pop(mine.popleft(), None)
        mine.append(digest)
        self._codes[digest] = (caller, until)
        return code, until

    def exchange(self, code: str) -> tuple[str, Caller]:
        """Spend `code`: the secret of a new session token and the Caller it
        acts as. Raises Refused 401 unauthorized (one message whatever the
        cause) for a code that is unknown, used, expired or dropped."""
        now = self.clock()
        self._forget_expired(now)
        digest = hash_secret(code)
        hit = self._codes.pop(digest, None)
        if hit is None:
            raise Refused(ErrorCode.UNAUTHORIZED, REFUSED)
        caller, until = hit
        mine = self._codes_of.get(_whose(caller))
        if mine is not None:
            if digest in mine:
                mine.remove(digest)
            if not mine:
                del self._codes_of[_whose(caller)]
        own = math.inf if caller.expires_at is None else caller.expires_at
        if until <= now or own <= now:
            raise Refused(ErrorCode.UNAUTHORIZED, REFUSED)
        ends = min(own, now + SESSION_S)
        secret = new_secret()
        session = dataclasses.replace(caller, expires_at=ends)
        held = self._sessions_of.setdefault(_whose(caller), deque())
        while len(held) >= SESSIONS_PER_CALLER:
            self.tokens.drop(held.popleft()[0])
        token_hash = hash_secret(secret)
        held.append((token_hash, ends))
        self.tokens.put_session(token_hash, session)
        return secret, session

    def end_token(self, token_id: int) -> None:
        """The API token `token_id` was revoked: its codes and the sessions
        they opened end with it. (Token id 0, the local socket's, is never
        revoked: its tokens only expire.)"""
        if token_id == 0:
            return
        whose = str(Principal.of_token(token_id))
        for digest in self._codes_of.pop(whose, ()):
            self._codes.pop(digest, None)
        for token_hash, _ in self._sessions_of.pop(whose, ()):
            self.tokens.drop(token_hash)

    def live(self) -> tuple[int, int]:
        """(live codes, live sessions), as of the last mint or exchange."""
        return len(self._codes), sum(len(s) for s in self._sessions_of.values())

    def _forget_expired(self, now: float) -> None:
        for whose, mine in list(self._codes_of.items()):
            while mine and self._codes.get(mine[0], (None, 0.0))[1] <= now:
                self._codes.pop(mine.popleft(), None)
            if not mine:
                del self._codes_of[whose]
        for whose, held in list(self._sessions_of.items()):
            while held and held[0][1] <= now:
                self.tokens.drop(held.popleft()[0])
            if not held:
                del self._sessions_of[whose]
