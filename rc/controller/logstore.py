"""Job logs: one append-only file per job under DATA/logs (docs/design.md#the-store).

An append names the byte offset of the job's output stream it starts at:
- offset == stored size: the bytes are appended;
- offset < stored size: the overlap was stored by an earlier attempt of the
  same append and is skipped, only the new tail is written (a retried upload
  never duplicates bytes);
- offset > stored size: bytes would be missing, so it is refused with the
  stored size (409 offset_gap) and the worker resends from there.

Every append is fdatasync'd before it is acknowledged. A per-job cap bounds
the disk: the bytes up to the cap are kept, then one marker line saying how
much was dropped, and later appends are acknowledged and dropped.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from rc.controller.errors import Refused
from rc.proto.errors import ErrorCode

__all__ = ["TRUNCATION_MARKER", "LogStore"]

TRUNCATION_MARKER = (
    b"\n[rc: log truncated at %d bytes (the per-job cap); later output was dropped]\n"
)


class LogStore:
    """Append-only job logs with offset-idempotent appends.

    `cap` is the per-job limit in bytes; `on_append(job_id)` is called after
    bytes were durably stored (to wake followers).
    """

    def __init__(self, root: str | Path, cap: int, on_append: Callable[[int], None]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.cap = cap
        self.on_append = on_append
        self._locks: dict[int, asyncio.Lock] = {}

    def path(self, job_id: int) -> Path:
        return self.root / f"{job_id}.log"

    def size(self, job_id: int) -> int:
        """Bytes stored for a job (0 when it has no log yet)."""
        try:
            return self.path(job_id).stat().st_size
        except FileNotFoundError:
            return 0

    def truncated(self, job_id: int) -> bool:
        """Whether the job's log reached the cap."""
        return self.size(job_id) > self.cap

    async def append(self, job_id: int, offset: int, data: bytes) -> int:
        """Store `data`, which starts at stream `offset`; return the next offset.

        Raises Refused(409 offset_gap) when offset is past the stored size.
        """
        lock = self._locks.get(job_id)
        if lock is None:
            lock = self._locks[job_id] = asyncio.Lock()
        async with lock:
            try:
                end, wrote = await asyncio.to_thread(self._append, job_id, offset, data)
            finally:
                if not lock._waiters:  # nobody queued behind us: forget the lock
                    self._locks.pop(job_id, None)
        if wrote:
            self.on_append(job_id)
        return end

    def _append(self, job_id: int, offset: int, data: bytes) -> tuple[int, bool]:
        path = self.path(job_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            size = os.fstat(fd).st_size
            if size > self.cap:  # already truncated: acknowledge and drop
                return offset + len(data), False
            if offset > size:
                raise Refused(
                    ErrorCode.OFFSET_GAP,
                    f"append at offset {offset} but job {job_id}'s log holds {size} bytes; "
                    f"resend from {size}",
                )
            tail = data[size - offset :]
            if not tail:
                return offset + len(data), False
            room = self.cap - size
            if len(tail) > room:
                _write_all(fd, tail[:room])
                _write_all(fd, TRUNCATION_MARKER % self.cap)
            else:
                _write_all(fd, tail)
            os.fdatasync(fd)
            return offset + len(data), True
        finally:
            os.close(fd)

    def read(self, job_id: int, offset: int, limit: int) -> bytes:
        """Up to `limit` stored bytes from `offset` (b"" at the end or no log)."""
        try:
            with open(self.path(job_id), "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
