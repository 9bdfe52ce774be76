"""An exclusive lock on a file that names its holder's pid (standard library only).

`take(path)` is what keeps one `rc serve` per data dir (DATA/serve.lock) and
one `rc worker` per host on a machine (rc.worker.hostlock): flock(LOCK_EX |
LOCK_NB) on a 0600 file, opened without following a symlink and close-on-exec
(so nothing the process starts inherits it), with the holder's pid written
in it for the refusal message. The kernel drops the lock when the process
ends, however it ends (kill -9 included); the file is never removed, since
removing a lock file races with its next taker.
"""

from __future__ import annotations

import fcntl
import os

__all__ = ["LockBusy", "take"]


class LockBusy(Exception):
    """Another process holds the lock; `pid` is its pid (0: unknown)."""

    def __init__(self, path: str, pid: int) -> None:
        super().__init__(f"{path} is locked by pid {pid or 'unknown'}")
        self.path = path
        self.pid = pid


def take(path: str) -> int:
    """Lock `path` for this process and write its pid there; returns the fd,
    to keep open as long as the lock is held. Raises LockBusy when another
    process holds it, OSError when the file cannot be opened or locked."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        raise LockBusy(path, pid) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> int:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0
