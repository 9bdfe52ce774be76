"""The local Unix socket: who is calling, from the kernel
(docs/design.md#identity-and-ownership).

Besides its HTTP listener, `rc serve` listens on a Unix socket (mode 0666)
on its own box. This is not a second HTTP server: on each connection the
controller reads the peer's uid with SO_PEERCRED, looks it up in the
password database, applies `--local-users`, and answers one JSON line, a
wire.LocalSession: a fresh bearer token for that Unix user (name and
unix_user its login name, role user; admin for uid 0) valid for
SESSION_S, and the HTTP URL to use it with. The caller behind that token
is the principal `uid:<uid>` (rc.proto.model.Principal): its jobs are
owned by the uid, never by the name, so a local user named like an API
token (`admin`, `worker-HOST`, `ci`) gets nothing of that token's. Then it closes. Nothing the
client sends is read, so nothing it says can claim an identity.

Why a token rather than a second API on the socket: the HTTP path, its
authentication and every route stay exactly as they are; only where the
identity comes from differs. The tokens live in the controller's memory
only (TokenCache.put), hashed like the others, never in the database: a
restart ends them and the client asks the socket again. At most
SESSIONS_PER_UID live at once per Unix user (a new one drops the oldest),
so a local user looping on the socket cannot grow the map.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import socket
import stat
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from rc.controller.auth import Caller, TokenCache, hash_secret, new_secret
from rc.controller.errors import StartupError
from rc.proto.errors import ErrorCode
from rc.proto.localsocket import SESSION_S
from rc.proto.model import Role, valid_unix_user
from rc.proto.wire import LocalSession

__all__ = ["SESSIONS_PER_UID", "LocalSocket", "LocalUsers", "peer_uid"]

log = logging.getLogger("rc.localsocket")

SESSIONS_PER_UID = 16
"""Most live socket tokens one Unix user has at once (the oldest goes)."""
WRITE_TIMEOUT_S = 5.0
"""The most the controller waits for a peer to take its answer (s)."""
PATH_MAX_BYTES = 107
"""The longest Unix socket path Linux takes (sun_path less its NUL)."""
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket,
    as the kernel recorded it at connect (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(raw)[1]


@dataclass(frozen=True, slots=True)
class LocalUsers:
    """Who may take a token from the socket (`rc serve --local-users`):
    every local user ("all"), or the members of one group ("group:NAME",
    primary or supplementary). Root and the controller's own user always
    may: they can read the data dir's admin token anyway."""

    group: str = ""

    @classmethod
    def parse(cls, text: str) -> LocalUsers:
        """ "all" or "group:NAME". Raises StartupError for anything else or a
        group this host does not know."""
        if text == "all":
            return cls()
        kind, sep, name = text.partition(":")
        if kind != "group" or not sep or not name:
            raise StartupError(f"--local-users {text!r}: use all or group:NAME")
        try:
            grp.getgrnam(name)
        except KeyError:
            raise StartupError(f"--local-users {text!r}: no group {name!r} on this host") from None
        return cls(name)

    def admits(self, uid: int, entry: pwd.struct_passwd) -> bool:
        """Whether the user `entry` (uid `uid`) may take a token."""
        if not self.group or uid in (0, os.geteuid()):
            return True
        try:
            gid = grp.getgrnam(self.group).gr_gid
        except KeyError:  # the group went away: nobody but root and us
            return False
        return gid in os.getgrouplist(entry.pw_name, entry.pw_gid)


class LocalSocket:
    """The socket at `path`, handing out tokens into `tokens` for the HTTP
    API at `url()`; `clock()` is wall time (s)."""

    def __init__(
        self,
        path: str,
        users: LocalUsers,
        tokens: TokenCache,
        clock: Callable[[], float],
        url: Callable[[], str],
    ) -> None:
        self.path = path
        self.users = users
        self.tokens = tokens
        self.clock = clock
        self.url = url
        self._server: asyncio.AbstractServer | None = None
        self._inode: tuple[int, int] | None = None
        self._issued: dict[int, deque[tuple[str, float]]] = {}

    async def start(self) -> None:
        """Bind and listen (mode 0666; a missing parent directory is made
        0755). Raises StartupError when the path is another live socket, is
        not a socket, or cannot be bound."""
        if len(os.fsencode(self.path)) > PATH_MAX_BYTES:
            raise StartupError(
                f"--socket {self.path}: a Unix socket path is at most {PATH_MAX_BYTES} bytes"
            )
        parent = os.path.dirname(self.path) or "."
        try:
            os.makedirs(parent, mode=0o755, exist_ok=True)
        except OSError as e:
            raise StartupError(
                f"--socket {self.path}: cannot make {parent}: {e.strerror}"
            ) from None
        self._clear_stale()
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=self.path)
            os.chmod(self.path, 0o666)
            st = os.stat(self.path)
        except OSError as e:
            raise StartupError(f"--socket {self.path}: cannot listen: {e.strerror or e}") from None
        self._inode = (st.st_dev, st.st_ino)

    def _clear_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise StartupError(f"--socket {self.path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(self.path)
            except OSError:
                os.unlink(self.path)  # nobody listens: left by a controller that died
                return
        raise StartupError(
            f"--socket {self.path}: another rc serve listens there (give this one --socket PATH)"
        )

    async def stop(self) -> None:
        """Stop listening and remove the socket (when it is still ours)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer.get_extra_info("socket"))
            writer.write(orjson.dumps(self.answer(uid)) + b"\n")
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
            log.info("local socket: a peer went away before its answer: %s", e)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def answer(self, uid: int) -> dict | LocalSession:
        """The answer for a peer with this uid: a LocalSession with a fresh
        token, or the error shape (403 forbidden) saying why not."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return _refusal(f"uid {uid} has no entry in this host's password database")
        name = entry.pw_name
        if not valid_unix_user(name):
            return _refusal(
                f"Unix user {name!r} has a name rc cannot take (control characters, '/', "
                "whitespace, ':' or ',', a leading '-', '+' or '~', digits only, or over "
                "32 bytes); ask an admin for a token"
            )
        if not self.users.admits(uid, entry):
            return _refusal(
                f"{name} is not in group {self.users.group}, the local users of this "
                "controller (rc serve --local-users); ask an admin for a token"
            )
        now = self.clock()
        secret = new_secret()
        digest = hash_secret(secret)
        expires = now + SESSION_S
        role = Role.ADMIN if uid == 0 else Role.USER
        self._remember(uid, digest, expires, now)
        self.tokens.put_session(digest, Caller(0, name, role, "", expires, name, uid))
        return LocalSession(secret, name, role, name, expires, self.url())

    def _remember(self, uid: int, digest: str, expires: float, now: float) -> None:
        for other, issued in list(self._issued.items()):  # forget what expired
            while issued and issued[0][1] <= now:
                self.tokens.drop(issued.popleft()[0])
            if not issued:
                del self._issued[other]
        mine = self._issued.setdefault(uid, deque())
        while len(mine) >= SESSIONS_PER_UID:
            self.tokens.drop(mine.popleft()[0])
        mine.append((digest, expires))


def _refusal(message: str) -> dict:
    return {"error": ErrorCode.FORBIDDEN.value, "message": message}
