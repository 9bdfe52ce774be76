"""The on-disk log spool: where job output waits while the controller is away.

One `Spool` per worker: a directory and a byte budget shared by every job
(`spool_max_bytes`). Each job that needs it gets a `SpoolFile`, a FIFO of bytes
in an unlinked file (nothing is left behind if the worker dies; the space is
freed when the file is closed). Bytes are appended at the tail, read from the
head, and the file is truncated whenever it empties. An append that would
exceed the budget (or the disk) is refused; rc.worker.logsink then drops the
bytes and writes a marker saying how many were lost.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading

__all__ = ["Spool", "SpoolFile"]

log = logging.getLogger("rc.worker.spool")


class Spool:
    """A spool directory with a shared budget of `max_bytes` (0: no spool).

    `directory` "" means a private temporary directory, removed by `close()`.
    """

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._own = not directory
        self.directory = directory
        self.used = 0
        self._lock = threading.Lock()
        self._broken = False

    def _dir(self) -> str:
        if not self.directory:
            self.directory = tempfile.mkdtemp(prefix="rc-spool-")
        else:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        return self.directory

    def open(self, job_id: int) -> SpoolFile | None:
        """A spool file for one job, or None when spooling is off or the
        directory is unusable (logged once)."""
        if self.max_bytes <= 0 or self._broken:
            return None
        try:
            d = self._dir()
            try:
                fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)
            except (AttributeError, OSError):
                fd, path = tempfile.mkstemp(prefix=f"job-{job_id}-", dir=d)
                os.unlink(path)
        except OSError as e:
            log.error(
                "log spool %s unusable (%s): output waits in memory only",
                self.directory or "(temporary)",
                e.strerror or e,
            )
            self._broken = True
            return None
        return SpoolFile(self, fd)

    def reserve(self, n: int) -> bool:
        """Take `n` bytes of the budget; False when they do not fit."""
        with self._lock:
            if self.used + n > self.max_bytes:
                return False
            self.used += n
            return True

    def give_back(self, n: int) -> None:
        """Return `n` bytes to the budget."""
        with self._lock:
            self.used = max(0, self.used - n)

    def close(self) -> None:
        """Remove the private temporary directory, if one was made."""
        if self._own and self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


class SpoolFile:
    """A byte FIFO on disk. Not thread-safe: its LogSink holds a lock around it."""

    def __init__(self, spool: Spool, fd: int) -> None:
        self.spool = spool
        self.fd = fd
        self.head = 0
        self.tail = 0

    @property
    def pending(self) -> int:
        """Bytes written and not yet consumed."""
        return self.tail - self.head

    def append(self, data: bytes | bytearray | memoryview) -> bool:
        """Add bytes at the tail; False (nothing written) when the budget or
        the disk has no room."""
        n = len(data)
        if not self.spool.reserve(n):
            return False
        try:
            view = memoryview(data)
            pos = self.tail
            while view:
                k = os.pwrite(self.fd, view, pos)
                view, pos = view[k:], pos + k
        except OSError as e:
            self.spool.give_back(n)
            log.warning("log spool write failed: %s", e.strerror or e)
            return False
        self.tail += n
        return True

    def peek_into(self, buf: memoryview) -> int:
        """Copy bytes from the head into `buf` without consuming them; how many."""
        n = min(len(buf), self.pending)
        got = 0
        while got < n:
            k = os.preadv(self.fd, [buf[got:n]], self.head + got)
            if k <= 0:
                raise OSError("log spool file is shorter than expected")
            got += k
        return n

    def consume(self, n: int) -> None:
        """Forget `n` bytes from the head (they were delivered)."""
        n = min(n, self.pending)
        self.head += n
        self.spool.give_back(n)
        if self.head == self.tail:
            os.ftruncate(self.fd, 0)
            self.head = self.tail = 0

    def close(self) -> None:
        """Give the pending bytes' budget back and free the file."""
        self.spool.give_back(self.pending)
        self.head = self.tail = 0
        os.close(self.fd)
