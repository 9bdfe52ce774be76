"""The controller's local Unix socket: identity from the kernel
(docs/design.md#identity-and-ownership).

On the controller's own box, `rc serve` also listens on a Unix socket
(DEFAULT_SOCKET_PATH when run as root). On each connection the controller
reads the peer's uid with SO_PEERCRED, never anything the client sends, and
answers one JSON line, a wire.LocalSession: a short-lived bearer token for
that Unix user and the controller's HTTP URL (or the error shape). The
client then uses the HTTP API with that token as with any other. This
module is the client's half: `ask(path)`.
"""

from __future__ import annotations

import json
import os
import socket
import time

from rc.proto.codec import decode
from rc.proto.errors import STATUS, ApiError, ErrorCode, RcError, TransportError, WireError
from rc.proto.wire import LocalSession

__all__ = [
    "ANSWER_MAX_BYTES",
    "ASK_TIMEOUT_S",
    "DEFAULT_SOCKET_PATH",
    "SCHEME",
    "SESSION_S",
    "ask",
    "default_socket",
    "socket_path",
]

DEFAULT_SOCKET_PATH = "/run/rc/rc.sock"
"""Where `rc serve` run as root listens, and where a client looks when no
controller is configured ($RC_SOCKET names another path for both)."""
SCHEME = "unix://"
"""RC_CONTROLLER=unix:///run/rc/rc.sock names a local socket."""
SESSION_S = 12 * 3600.0
"""How long a token from the socket is valid (s); a controller restart ends it sooner."""
ASK_TIMEOUT_S = 5.0
"""The most a client waits for the socket's answer (s)."""
ANSWER_MAX_BYTES = 64 << 10
"""The longest answer a client reads."""


def default_socket() -> str:
    """The default socket path: $RC_SOCKET, else DEFAULT_SOCKET_PATH."""
    return os.environ.get("RC_SOCKET", "").strip() or DEFAULT_SOCKET_PATH


def socket_path(controller: str) -> str | None:
    """The socket path of a `unix:///PATH` controller address, else None.
    Raises RcError for a unix:// address with no absolute path."""
    if not controller.startswith(SCHEME):
        return None
    path = controller[len(SCHEME) :]
    if not path.startswith("/"):
        raise RcError(f"controller {controller!r}: a socket address is unix:///ABSOLUTE/PATH")
    return path


def ask(path: str, timeout: float = ASK_TIMEOUT_S) -> LocalSession:
    """Connect to the socket at `path` and read its one line. Sends nothing:
    the controller knows who is asking from the kernel.

    Raises ApiError for the controller's refusal (403 forbidden: not one of
    its local users), TransportError when the socket cannot be reached, and
    RcError when it answers something that is not a LocalSession."""
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            buf = b""
            while b"\n" not in buf and len(buf) < ANSWER_MAX_BYTES:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
    except FileNotFoundError:
        raise TransportError(f"{SCHEME}{path}: no such socket (is rc serve running?)") from None
    except PermissionError:
        raise TransportError(
            f"{SCHEME}{path}: permission denied (the socket or its directory is not "
            "open to this user)"
        ) from None
    except ConnectionRefusedError:
        raise TransportError(f"{SCHEME}{path}: connection refused (is rc serve running?)") from None
    except OSError as e:
        raise TransportError(f"{SCHEME}{path}: {e.strerror or e}") from None
    line = buf.partition(b"\n")[0]
    try:
        data = json.loads(line)
    except ValueError:
        raise RcError(f"{SCHEME}{path}: the answer is not an rc controller's") from None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        code = data["error"]
        try:
            status = STATUS[ErrorCode(code)]
        except ValueError:
            status = 403
        raise ApiError(status, code, str(data.get("message", "")))
    try:
        return decode(LocalSession, data)
    except WireError as e:
        raise RcError(f"{SCHEME}{path}: the answer is not an rc controller's ({e})") from None
