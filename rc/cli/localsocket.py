"""The client's side of the local socket: a token from the kernel's word.

`rc` asks a controller's local Unix socket (rc.proto.localsocket) for a
token for the Unix user it runs as when RC_CONTROLLER (or --controller, or
the config file's controller) is `unix:///PATH`, or when no controller is
configured at all and the default socket ($RC_SOCKET, else
/run/rc/rc.sock) exists. The token and the controller's HTTP URL are
cached, mode 0600, in the user's runtime directory ($XDG_RUNTIME_DIR/rc,
else /tmp/rc-UID; made 0700 and used only when this user owns it and no
one else may enter it) and reused until an hour before they expire. Whenever
the controller refuses the token (401: it restarted, and its socket tokens
with it), rc asks the socket again, waiting for it while the controller
comes back (LocalClient), so an attached `rc run`, `rc logs -f` or `rc
hold` rides out a restart as a client with a config file's token does. The
token is never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rc.proto import localsocket
from rc.proto.client import Client, Response, parse_controller_url
from rc.proto.errors import ApiError, TransportError
from rc.proto.model import Role
from rc.proto.wire import LocalSession

__all__ = [
    "REFRESH_BEFORE_S",
    "RENEW_BACKOFF_MAX_S",
    "RENEW_BACKOFF_MIN_S",
    "TRANSPORT_ASK_GAP_S",
    "LocalClient",
    "cache_dir",
    "session",
]

REFRESH_BEFORE_S = 3600.0
"""A cached token this close to its expiry (s) is replaced by a fresh one."""
RENEW_BACKOFF_MIN_S = 0.2
RENEW_BACKOFF_MAX_S = 2.0
"""After a 401, the socket is asked again after these pauses (s), doubling,
while it does not answer (the controller restarting)."""
TRANSPORT_ASK_GAP_S = 2.0
"""After a transport failure the socket is asked where the controller is
now at most once per this long (s) after it last answered: each answer is a
fresh token, and the socket's tokens per user are bounded."""


def cache_dir() -> Path | None:
    """The user's private directory for the cached token, made if missing
    (0700); None (with a warning on stderr) when it is not usable safely:
    not a directory, owned by someone else, or open to others."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    base = Path(runtime) / "rc" if runtime and os.path.isdir(runtime) else None
    path = base or Path(f"/tmp/rc-{os.geteuid()}")
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        _warn(f"not caching the local socket's token: {path}: {e.strerror or e}")
        return None
    if not stat.S_ISDIR(st.st_mode):
        _warn(f"not caching the local socket's token: {path} is not a directory")
        return None
    if st.st_uid != os.geteuid():
        _warn(f"not caching the local socket's token: {path} belongs to uid {st.st_uid}")
        return None
    if st.st_mode & 0o077:
        _warn(
            f"not caching the local socket's token: {path} is open to others "
            f"(mode {stat.S_IMODE(st.st_mode):04o})"
        )
        return None
    return path


def _warn(text: str) -> None:
    print(f"rc: warning: {text}", file=sys.stderr)


def _cache_file(directory: Path, socket_path: str) -> Path:
    digest = hashlib.sha256(socket_path.encode()).hexdigest()[:16]
    return directory / f"socket-{digest}.json"


def _read_cached(path: Path, now: float) -> LocalSession | None:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        data = json.loads(path.read_text())
        got = LocalSession(
            token=str(data["token"]),
            name=str(data["name"]),
            role=Role(data["role"]),
            unix_user=str(data["unix_user"]),
            expires_at=float(data["expires_at"]),
            url=str(data["url"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return got if got.expires_at - REFRESH_BEFORE_S > now else None


def _write_cached(path: Path, got: LocalSession, socket_path: str) -> None:
    body = json.dumps(
        {
            "socket": socket_path,
            "token": got.token,
            "name": got.name,
            "role": str(got.role),
            "unix_user": got.unix_user,
            "expires_at": got.expires_at,
            "url": got.url,
        }
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except OSError as e:
        _warn(f"could not cache the local socket's token in {path.parent}: {e.strerror or e}")
        try:
            os.unlink(tmp)
        except OSError:
            pass


def session(socket_path: str, refused: str = "") -> LocalSession:
    """A token for this Unix user from the socket at `socket_path`: the
    cached one unless it is `refused` (the token the controller has just
    refused: another rc process may have cached a fresh one since) or near
    its expiry, else a new one (cached). Raises what
    rc.proto.localsocket.ask raises."""
    directory = cache_dir()
    cached = _cache_file(directory, socket_path) if directory is not None else None
    if cached is not None:
        got = _read_cached(cached, time.time())
        if got is not None and got.token != refused:
            return got
    got = localsocket.ask(socket_path)
    if cached is not None:
        _write_cached(cached, got, socket_path)
    return got


class LocalClient(Client):
    """A Client whose token and URL came from the local socket at
    `socket_path`, and come from it again whenever the controller stops
    taking them (its socket tokens end when it restarts).

    After a 401, the request asks the socket again (`session`, which takes
    a token another rc process cached meanwhile if there is one) and is
    sent once more, as often as it takes until the request's deadline (its
    read timeout plus the connect timeout, as a list of controllers is
    followed): while the controller restarts its socket may be missing or
    refuse connections, and is asked again after a backoff of 0.2 s
    doubling to 2 s (`on_waiting` is told once). The socket still missing
    at the deadline raises its TransportError, which rc's followers (rc
    run, rc logs -f, rc hold...) retry as any lost controller; a socket
    that refuses this user (403) is final. After a TransportError the
    socket is asked once (at most once per TRANSPORT_ASK_GAP_S after it
    answered) in case the controller now listens at another URL; if it
    does, the request is sent there once more. Safe from several threads:
    one renews while the others wait for its token."""

    def __init__(self, socket_path: str, got: LocalSession, **kw: Any) -> None:
        super().__init__(got.url, got.token, **kw)
        self.socket_path = socket_path
        self._renewing = threading.Lock()
        self._answered_at = -TRANSPORT_ASK_GAP_S  # time.monotonic() of the socket's last answer

    def _take(self, got: LocalSession) -> None:
        """Use the token and URL of a socket's answer from now on."""
        self.token = got.token
        url = parse_controller_url(got.url)
        if url != self.url:
            self.close_all()
            self.url = url

    def _renew(self, refused: str, refusal: ApiError, deadline: float, tries: int) -> None:
        """After the controller refused token `refused` (401 `refusal`; the
        `tries`-th time in this request), take a token it may know from the
        socket, waiting for the socket with backoff until time.monotonic()
        passes `deadline`. Raises `refusal` when the deadline passed first
        while the socket answered (its tokens are refused too), the
        socket's TransportError when it never answered, and its ApiError
        when it refused this user."""
        backoff = RENEW_BACKOFF_MIN_S
        if tries > 1:  # a token fresh from the socket was refused too: not in a tight loop
            pause = min(RENEW_BACKOFF_MIN_S * 2 ** min(tries - 2, 4), RENEW_BACKOFF_MAX_S)
            if time.monotonic() + pause > deadline:
                raise refusal
            time.sleep(pause)
        said = False
        with self._renewing:
            while True:
                if self.token != refused:
                    return  # another thread renewed it meanwhile
                try:
                    got = session(self.socket_path, refused=refused)
                except TransportError as e:
                    now = time.monotonic()
                    if now >= deadline:
                        raise
                    if not said and self.on_waiting is not None:
                        self.on_waiting(str(e))
                        said = True
                    time.sleep(min(backoff, deadline - now))
                    backoff = min(backoff * 2, RENEW_BACKOFF_MAX_S)
                    continue
                self._answered_at = time.monotonic()
                self._take(got)
                return

    def _moved(self) -> bool:
        """After a TransportError: whether the socket now names another URL
        (the controller restarted elsewhere), which is then used. Asks at
        most once per TRANSPORT_ASK_GAP_S after an answer; an unreachable
        socket says no."""
        with self._renewing:
            if time.monotonic() - self._answered_at < TRANSPORT_ASK_GAP_S:
                return False
            before = self.url
            try:
                got = session(self.socket_path, refused=self.token)
            except (TransportError, ApiError):
                return False
            self._answered_at = time.monotonic()
            self._take(got)
            return self.url != before

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Response:
        deadline = self.deadline(kw.get("timeout"))
        tries = moved = 0
        while True:
            token = self.token
            try:
                return super().request(method, path, body, **kw)
            except ApiError as e:
                if e.status != 401:
                    raise
                tries += 1
                self._renew(token, e, deadline, tries)
            except TransportError:
                if moved or not self._moved():
                    raise
                moved = True

    def stream(self, method: str, path: str, **kw: Any) -> Iterator[bytes]:
        deadline = self.deadline(kw.get("timeout"))
        tries = moved = 0
        while True:
            token = self.token
            chunks = super().stream(method, path, **kw)
            try:
                first = next(chunks)
            except StopIteration:
                return
            except ApiError as e:
                if e.status != 401:
                    raise
                tries += 1
                self._renew(token, e, deadline, tries)
                continue
            except TransportError:
                if moved or not self._moved():
                    raise
                moved = True
                continue
            yield first
            yield from chunks
            return
