"""Shipping a job's output to the controller (inventory §6.4 log batching).

Bytes written to a LogSink are uploaded in order by one thread per job: a
batch goes out when 64 KiB are waiting or 1 s after its first byte, whichever
is first. Every upload names the stream offset it starts at, so a retry after
a lost answer can never duplicate or drop bytes (the controller skips what it
already has). Bytes leave the sink only once the controller acknowledged them.

Memory is bounded: at most `max_buffer` bytes wait in memory; past that,
`write` blocks, which stalls the job's output pipe (backpressure), unless a
spool is attached (rc.worker.spool), which takes the overflow on disk.
"""

from __future__ import annotations

import logging
import threading
import time

from rc.proto.client import Client
from rc.proto.errors import ApiError, TransportError

__all__ = ["LogSink", "BATCH_BYTES", "BATCH_SECONDS", "CHUNK_MAX"]

log = logging.getLogger("rc.worker.logs")

BATCH_BYTES = 64 << 10
BATCH_SECONDS = 1.0
CHUNK_MAX = 1 << 20
"""Largest single upload (the controller's log chunk limit)."""
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0


class LogSink:
    """An ordered, offset-idempotent uploader for one job's output."""

    def __init__(
        self,
        client: Client,
        job_id: int,
        *,
        max_buffer: int = 4 << 20,
        batch_bytes: int = BATCH_BYTES,
        batch_seconds: float = BATCH_SECONDS,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.max_buffer = max_buffer
        self.batch_bytes = batch_bytes
        self.batch_seconds = batch_seconds
        self.offset = 0          # stream offset of buf[0]
        self.buf = bytearray()
        self.first_at: float | None = None
        self.closing = False
        self.abandon = False
        self.lost = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"rc-logs-{job_id}", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        """Queue output bytes; blocks while `max_buffer` bytes are waiting."""
        if not data:
            return
        with self._cond:
            while len(self.buf) >= self.max_buffer and not self.abandon:
                self._cond.wait(0.5)
            if self.abandon:
                self.lost += len(data)
                return
            if self.first_at is None:
                self.first_at = time.monotonic()
            self.buf += data
            if len(self.buf) >= self.batch_bytes:
                self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Flush everything; True when every byte was acknowledged within
        `timeout` seconds (else the rest is abandoned and counted lost)."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                self.abandon = True
                self.lost += len(self.buf)
                self._cond.notify_all()
            self._thread.join(RETRY_MAX_S + 1)
            return False
        return self.lost == 0

    def _next_chunk(self) -> tuple[int, bytes] | None:
        with self._cond:
            while True:
                if self.abandon:
                    return None
                if self.buf:
                    due = self.first_at is not None and (
                        time.monotonic() - self.first_at >= self.batch_seconds
                    )
                    if self.closing or due or len(self.buf) >= self.batch_bytes:
                        return self.offset, bytes(self.buf[:CHUNK_MAX])
                    self._cond.wait(self.batch_seconds - (time.monotonic() - self.first_at))
                    continue
                if self.closing:
                    return None
                self._cond.wait()

    def _acked(self, n: int) -> None:
        with self._cond:
            del self.buf[:n]
            self.offset += n
            self.first_at = time.monotonic() if self.buf else None
            self._cond.notify_all()

    def _run(self) -> None:
        path = f"/v1/jobs/{self.job_id}/logs"
        while True:
            nxt = self._next_chunk()
            if nxt is None:
                return
            offset, chunk = nxt
            delay = RETRY_MIN_S
            while True:
                try:
                    self.client.request("POST", path, raw=chunk, params={"offset": offset})
                    self._acked(len(chunk))
                    break
                except ApiError as e:
                    if e.status >= 500:
                        pass
                    else:
                        # The controller refused these bytes for good (job gone,
                        # gap): drop them rather than block the job forever.
                        log.error("job %d: log upload refused (%s); %d bytes dropped",
                                  self.job_id, e, len(chunk))
                        with self._cond:
                            self.lost += len(chunk)
                        self._acked(len(chunk))
                        break
                except TransportError as e:
                    log.debug("job %d: log upload failed: %s", self.job_id, e)
                with self._cond:
                    if self.abandon:
                        return
                    self._cond.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
