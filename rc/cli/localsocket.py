"""The client's side of the local socket: a token from the kernel's word.

`rc` asks a controller's local Unix socket (rc.proto.localsocket) for a
token for the Unix user it runs as when RC_CONTROLLER (or --controller, or
the config file's controller) is `unix:///PATH`, or when no controller is
configured at all and the default socket ($RC_SOCKET, else
/run/rc/rc.sock) exists. The token and the controller's HTTP URL are
cached, mode 0600, in the user's runtime directory ($XDG_RUNTIME_DIR/rc,
else /tmp/rc-UID; made 0700 and used only when this user owns it and no
one else may enter it) and reused until an hour before they expire. When
the controller refuses the cached token (401: it restarted), rc asks the
socket again once. The token is never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rc.proto import localsocket
from rc.proto.client import Client, Response, parse_controller_url
from rc.proto.errors import ApiError, TransportError
from rc.proto.model import Role
from rc.proto.wire import LocalSession

__all__ = ["REFRESH_BEFORE_S", "LocalClient", "cache_dir", "session"]

REFRESH_BEFORE_S = 3600.0
"""A cached token this close to its expiry (s) is replaced by a fresh one."""


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


def session(socket_path: str, fresh: bool = False) -> LocalSession:
    """A token for this Unix user from the socket at `socket_path`: the
    cached one unless `fresh` or near its expiry, else a new one (cached).
    Raises what rc.proto.localsocket.ask raises."""
    directory = cache_dir()
    cached = _cache_file(directory, socket_path) if directory is not None else None
    if cached is not None and not fresh:
        got = _read_cached(cached, time.time())
        if got is not None:
            return got
    got = localsocket.ask(socket_path)
    if cached is not None:
        _write_cached(cached, got, socket_path)
    return got


class LocalClient(Client):
    """A Client whose token and URL came from the local socket at
    `socket_path`: a request the controller refuses with 401 (its tokens
    from the socket end when it restarts), or a controller no longer at the
    cached URL (it restarted on another port), gets a fresh token and URL
    from the socket and is sent once more."""

    def __init__(self, socket_path: str, got: LocalSession, **kw: Any) -> None:
        super().__init__(got.url, got.token, **kw)
        self.socket_path = socket_path
        self._renewed = False

    def _renew(self, e: Exception) -> bool:
        """Ask the socket again (once per client) after `e`; False when that
        was done already or `e` is no reason to."""
        stale = isinstance(e, TransportError) or (isinstance(e, ApiError) and e.status == 401)
        if self._renewed or not stale:
            return False
        self._renewed = True
        got = session(self.socket_path, fresh=True)
        self.token = got.token
        url = parse_controller_url(got.url)
        if url != self.url:
            self.close_all()
            self.url = url
        return True

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Response:
        try:
            return super().request(method, path, body, **kw)
        except (ApiError, TransportError) as e:
            if not self._renew(e):
                raise
        return super().request(method, path, body, **kw)

    def stream(self, method: str, path: str, **kw: Any) -> Iterator[bytes]:
        chunks = super().stream(method, path, **kw)
        try:
            first = next(chunks)
        except StopIteration:
            return
        except (ApiError, TransportError) as e:
            if not self._renew(e):
                raise
            yield from super().stream(method, path, **kw)
            return
        yield first
        yield from chunks
