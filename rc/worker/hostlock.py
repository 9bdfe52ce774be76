"""One worker per host name on this machine (per user): an exclusive lock.

A second `rc worker` for a host whose worker already runs here would register
the same host again: the controller takes that as the first worker having
restarted, marks its running job lost and quarantines the device, and then
the two processes take turns at the host's jobs. So the worker takes
the lock of `lock_path(host)` (rc.proto.pidlock) before it registers and
holds it for its whole life; a second one finds it taken and refuses to start.

The lock file lives in `lock_dir()`: `<tempdir>/rc-worker-<uid>` (tempdir is
$TMPDIR, else /tmp), made 0700 and refused unless it is a real directory of
this user that nobody else can write. The location does not depend on the
worker's configuration, so two workers for one host are caught whatever their
configs say. The kernel drops the lock when the worker ends, however it
ends, and jobs never inherit it. A worker that exits cleanly also removes
the file (rc.proto.pidlock.release), so the directory does not collect a
file for every host name ever run here; after a kill -9 the file stays and
the next worker for the host reuses it.
"""

from __future__ import annotations

import os
import stat
import tempfile

from rc.proto import pidlock

__all__ = ["HostLock", "HostLockBusy", "lock_dir", "lock_path"]


class HostLockBusy(Exception):
    """Another worker for the host holds the lock; `pid` is its pid (0: unknown)."""

    def __init__(self, host: str, pid: int) -> None:
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(
            f"another rc worker for host {host} is running here ({who}); stop it first, "
            "or give this one another host name with --host NAME (a second rc up on "
            "this machine needs its own)"
        )
        self.host = host
        self.pid = pid


def lock_dir() -> str:
    """The per-user directory of worker lock files (see the module docstring)."""
    return os.path.join(tempfile.gettempdir(), f"rc-worker-{os.getuid()}")


def lock_path(host: str) -> str:
    """The lock file of `host` (a valid rc host name: no '/')."""
    return os.path.join(lock_dir(), f"{host}.lock")


def _safe_dir(path: str) -> None:
    """Make `path` (0700) if missing; raise OSError unless it is a directory
    owned by this user that no one else can write."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise OSError(f"{path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o022:
        raise OSError(f"{path} is writable by others")


class HostLock:
    """The held lock of one host; `acquire()` raises HostLockBusy or OSError."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.path = lock_path(host)
        self.fd: int | None = None

    def acquire(self) -> HostLock:
        _safe_dir(os.path.dirname(self.path))
        try:
            self.fd = pidlock.take(self.path)
        except pidlock.LockBusy as e:
            raise HostLockBusy(self.host, e.pid) from None
        return self

    def release(self) -> None:
        """Drop the lock and remove its file (the process's end drops the
        lock too, but leaves the file)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            pidlock.release(fd, self.path, remove=True)
