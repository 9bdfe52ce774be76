"""An exclusive lock on a file that names its holder's pid (standard library only).

`take(path)` is what keeps one `rc serve` per data dir (DATA/serve.lock) and
one `rc worker` per host on a machine (rc.worker.hostlock): flock(LOCK_EX |
LOCK_NB) on a 0600 file, opened without following a symlink and close-on-exec
(so nothing the process starts inherits it), with the holder's pid written
in it for the refusal message. The kernel drops the lock when the process
ends, however it ends (kill -9 included).

`release(fd, path, remove=True)` also removes the file, so that lock files
of hosts that come and go do not pile up in a temporary directory. Removing
a lock file is safe only because every taker checks, once it holds the lock,
that the file it locked is still the one at `path` (same device and inode),
and starts over otherwise: a taker that opened the file just before its
holder removed it then locks an orphan, notices, and opens (creates) the
file anew. Only a holder ever removes the file, and only while holding it.
"""

from __future__ import annotations

import fcntl
import os

__all__ = ["TAKE_ATTEMPTS", "LockBusy", "release", "take"]

TAKE_ATTEMPTS = 100
"""How many times `take` starts over when the file it locked was removed
(each time means its holder let go and removed it at that very moment)."""


class LockBusy(Exception):
    """Another process holds the lock; `pid` is its pid (0: unknown)."""

    def __init__(self, path: str, pid: int) -> None:
        super().__init__(f"{path} is locked by pid {pid or 'unknown'}")
        self.path = path
        self.pid = pid


def take(path: str) -> int:
    """Lock `path` for this process and write its pid there; returns the fd,
    to keep open as long as the lock is held. Raises LockBusy when another
    process holds it, OSError when the file cannot be opened or locked (or
    kept being removed under us TAKE_ATTEMPTS times)."""
    for _ in range(TAKE_ATTEMPTS):
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
        if not _is_at(fd, path):  # its holder removed it as it let go: lock the new one
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd
    raise OSError(f"{path} was removed {TAKE_ATTEMPTS} times while being locked")


def release(fd: int, path: str, remove: bool = False) -> None:
    """Let go of a lock `take(path)` returned; with `remove`, first delete the
    file (still holding the lock, and only if it is still the file locked)."""
    try:
        if remove and _is_at(fd, path):
            os.unlink(path)
    except OSError:
        pass  # the lock itself goes with the fd either way
    finally:
        os.close(fd)


def _is_at(fd: int, path: str) -> bool:
    """Whether `path` names the very file open as `fd`."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(fd: int) -> int:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0
