"""Shipping a job's output to the controller, in batches.

Bytes written to a LogSink are uploaded in order by one thread per job: a
batch goes out when 64 KiB are waiting or 1 s after its first byte, whichever
is first, in chunks of at most 1 MiB. Every upload names the stream offset it
starts at, so a retry after a lost answer can never duplicate or drop bytes
(the controller skips what it already has). Bytes leave the sink only once the
controller acknowledged them.

Memory is bounded: at most `max_buffer` bytes wait in memory, however long a
line is. Past that, while uploads work, `write` blocks (backpressure: the job's
output pipe stalls, nothing is lost). While the controller is unreachable (an
upload failed, or a write has been blocked for SPILL_AFTER_S), waiting bytes go
to the on-disk spool (rc.worker.spool) so the job keeps running and writing;
once anything is on disk, later bytes follow it there, so order is kept, and
the spool drains in order when the controller is back. If the spool is full
while the controller is still away, output is dropped until the controller
answers again, and one marker line in the log says how many bytes were lost
there (lost_marker). Without a spool (spool_max_bytes = 0,
or an unusable directory) writes block until the controller is back.

Log tails (README "Operating a worker"): the job's reports may carry the front of what
the sink holds in memory (`tail`), the controller stores it before it applies
the report, and the reporter hands the acknowledged end back (`tail_stored`):
only then do those bytes leave the sink. The uploader and the reporter may
send the same bytes; both name their stream offset, so the controller skips
the overlap, and every acknowledgement is an offset (`_acked_to`), so neither
can drop bytes the other still holds or reorder them. At the job's end,
`close(hand_off=True)` with a small tail in memory leaves it to the terminal
report instead of uploading it; `release()` (the report settled) sends what
is still unacknowledged through the uploader, as close would have.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from rc.proto import calls
from rc.proto.client import Client
from rc.proto.errors import ApiError, TransportError
from rc.worker.clock import SYSTEM, Clock
from rc.worker.spool import Spool, SpoolFile

__all__ = [
    "BATCH_BYTES",
    "BATCH_SECONDS",
    "CHUNK_MAX",
    "MEMORY_BYTES",
    "RELEASE_FLUSH_S",
    "SPILL_AFTER_S",
    "LogSink",
    "lost_marker",
]

log = logging.getLogger("rc.worker.logs")

BATCH_BYTES = 64 << 10
BATCH_SECONDS = 1.0
CHUNK_MAX = 1 << 20
"""Largest single upload (the controller's log chunk limit)."""
MEMORY_BYTES = 1 << 20
"""Output waiting in memory per job, at most."""
SPILL_AFTER_S = 2.0
"""A write blocked this long on a full buffer goes to the spool instead."""
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0
BLOCKED_TICK_S = 0.1
"""How often a blocked write looks again (real seconds: a tick, not a timer)."""
RELEASE_FLUSH_S = 300.0
"""How long a released hand-off's remaining bytes are tried (as the job's close)."""


def lost_marker(n: int) -> bytes:
    """The line written into a log where `n` bytes of output were dropped."""
    return (
        f"\n[rc: {n} bytes of output lost here: the controller was unreachable and "
        f"the worker's log spool was full]\n"
    ).encode()


class LogSink:
    """An ordered, offset-idempotent uploader for one job's output.

    `batch_seconds`, SPILL_AFTER_S and the retry delays are seconds of
    `clock`; `max_buffer` and `batch_bytes` are bytes.
    """

    def __init__(
        self,
        client: Client,
        job_id: int,
        *,
        spool: Spool | None = None,
        max_buffer: int = MEMORY_BYTES,
        batch_bytes: int = BATCH_BYTES,
        batch_seconds: float = BATCH_SECONDS,
        clock: Clock = SYSTEM,
        tail_limit: Callable[[], int] | None = None,
    ) -> None:
        """`tail_limit()`: how many bytes the controller takes as a report's
        log tail now (0 or None: no tails, so close never hands off)."""
        self.client = client
        self.tail_limit = tail_limit
        self.clock = clock
        self.job_id = job_id
        self.spool = spool
        self.max_buffer = max_buffer
        self.batch_bytes = batch_bytes
        self.batch_seconds = batch_seconds
        self.offset = 0  # stream offset of the first unacknowledged byte
        self.mem = bytearray()
        self.file: SpoolFile | None = None
        self.first_at: float | None = None
        self.failing = False  # the last upload attempt got no answer (or a 5xx)
        self.dropped = 0  # bytes dropped since the last marker
        self.lost = 0  # bytes that will never reach the controller
        self.spilled = 0  # bytes that went through the spool
        self.closing = False
        self.abandon = False
        self.handed = False  # closed, its rest left to the terminal report
        self._chunk: bytearray | None = None  # every upload is copied here: no churn
        self._cond = threading.Condition()
        self._abandoned = threading.Event()
        # The uploader starts with the first byte: a job that prints nothing
        # costs no thread and no buffer.
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        """Start the uploader (with the lock held)."""
        if self._thread is None:
            self._chunk = bytearray(CHUNK_MAX)
            self._thread = threading.Thread(
                target=self._run, name=f"rc-logs-{self.job_id}", daemon=True
            )
            self._thread.start()

    # -- the writer's side ---------------------------------------------------

    def _pending(self) -> int:
        return (self.file.pending if self.file else 0) + len(self.mem)

    def _to_disk(self, data: bytes | bytearray) -> bool:
        if self.file is None:
            if self.spool is None:
                return False
            self.file = self.spool.open(self.job_id)
            if self.file is None:
                self.spool = None
                return False
        if not self.file.append(data):
            return False
        if not self.spilled:
            log.info(
                "job %d: the controller is not taking output; it waits in the disk spool",
                self.job_id,
            )
        self.spilled += len(data)
        return True

    def resume_at(self, offset: int, first: bytes = b"") -> None:
        """Start the stream at byte `offset` of the stored log (a run of a job
        the hardware requeued: its output goes after the earlier runs'),
        beginning with `first` (the restart's separator line). Only before
        any write; ValueError otherwise."""
        with self._cond:
            if self._thread is not None or self.offset:
                raise ValueError("resume_at after output was written")
            self.offset = max(0, offset)
        self.write(first)

    def write(self, data: bytes) -> None:
        """Queue output bytes (see the module docstring for when this blocks)."""
        if not data:
            return
        with self._cond:
            self._start()
            if self.dropped and self.failing:
                # one gap per outage: once output is being dropped, it stays
                # dropped until the controller answers again
                self.dropped += len(data)
                self.lost += len(data)
                return
            payload = lost_marker(self.dropped) + data if self.dropped else data
            blocked_since: float | None = None
            while True:
                if self.abandon:
                    self.lost += len(data)
                    return
                was_empty = self._pending() == 0
                if self.file is not None and self.file.pending:
                    if self._to_disk(payload):
                        break
                elif len(self.mem) + len(payload) <= self.max_buffer or not self.mem:
                    self.mem += payload
                    break
                elif (
                    self.failing
                    or (
                        blocked_since is not None
                        and self.clock.monotonic() - blocked_since >= SPILL_AFTER_S
                    )
                ) and self._to_disk(self.mem):
                    self.mem.clear()
                    continue
                if self.failing and (self.file is not None or self.spool is not None):
                    # the spool is full and the controller away: drop, and say so
                    self.dropped += len(data)
                    self.lost += len(data)
                    return
                if blocked_since is None:
                    blocked_since = self.clock.monotonic()
                self._cond.wait(BLOCKED_TICK_S)
            if self.dropped:
                log.warning(
                    "job %d: %d bytes of output lost: the log spool is full",
                    self.job_id,
                    self.dropped,
                )
            self.dropped = 0
            if was_empty:
                self.first_at = self.clock.monotonic()
            if was_empty or self._pending() >= self.batch_bytes:
                self._cond.notify_all()  # an idle uploader starts the batch_seconds timer

    def close(self, timeout: float, hand_off: bool = False) -> bool:
        """Flush everything; True when every byte was acknowledged within
        `timeout` seconds (real ones: a bounded join of the uploader; else the
        rest is abandoned and counted lost).

        With `hand_off`, when what is left is in memory only, at most
        tail_limit() bytes, and the controller answers: return True at once
        and leave it to the job's terminal report (a log tail); the reporter
        then calls `release()`. No write may follow a close."""
        with self._cond:
            limit = self.tail_limit() if hand_off and self.tail_limit else 0
            if (
                self.mem
                and len(self.mem) <= limit
                and self.file is None
                and not (self.dropped or self.failing or self.lost or self.abandon)
            ):
                self.handed = True
                return True
            self.handed = False
            if self.dropped:
                log.warning(
                    "job %d: %d bytes of output lost: the log spool is full",
                    self.job_id,
                    self.dropped,
                )
                marker = lost_marker(self.dropped)
                if not (self.file is not None and self.file.pending and self._to_disk(marker)):
                    self.mem += marker  # a few bytes over the bound, once
                if self.first_at is None:
                    self.first_at = self.clock.monotonic()
                self.dropped = 0
            self.closing = True
            if self._pending():
                self._start()
            self._cond.notify_all()
        if self._thread is None:  # nothing was ever written
            return self.lost == 0
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                self.abandon = True
                self.lost += self._pending()
                self._cond.notify_all()
            self._abandoned.set()
            self._thread.join(RETRY_MAX_S + 1)
        with self._cond:
            if self.file is not None:
                self.file.close()
                self.file = None
            self.mem = bytearray()
        return self.lost == 0

    def release(self) -> None:
        """The terminal report of a handed-off sink settled (either way):
        what it left unacknowledged goes through the uploader now, as close
        would have sent it (on a thread of its own, RELEASE_FLUSH_S at most).
        A no-op when the sink was not handed off."""
        with self._cond:
            if not self.handed:
                return
            self.handed = False
            if not self._pending():
                self.closing = True
                self._cond.notify_all()
                return
        threading.Thread(
            target=self._flush_released, name=f"rc-logs-{self.job_id}-rest", daemon=True
        ).start()

    def _flush_released(self) -> None:
        if not self.close(RELEASE_FLUSH_S):
            log.error("job %d: %d log bytes could not be delivered", self.job_id, self.lost)

    # -- the reporter's side (log tails) ---------------------------------------

    def tail(self, limit: int) -> tuple[int, bytes] | None:
        """A copy of at most `limit` unacknowledged bytes from the front, with
        their stream offset, when they are in memory (none waits in the
        spool); None when there are none. They stay in the sink until
        `tail_stored` (or the uploader) acknowledges them."""
        with self._cond:
            if limit <= 0 or self.abandon or not self.mem:
                return None
            if self.file is not None and self.file.pending:
                return None
            return self.offset, bytes(self.mem[:limit])

    def tail_stored(self, end: int) -> None:
        """The controller stored the stream up to offset `end` (a report's
        ReportResult.log_size): forget the bytes before it."""
        self._acked_to(end)

    # -- the uploader's side -------------------------------------------------

    def _next_chunk(self) -> tuple[int, memoryview] | None:
        """The next upload: (stream offset, the bytes in the sink's one reusable
        chunk buffer), once a batch is due; None when done."""
        with self._cond:
            while True:
                if self.abandon:
                    return None
                n = self._pending()
                if n:
                    waited = self.clock.monotonic() - (self.first_at or 0.0)
                    if (
                        self.closing
                        or self.failing
                        or n >= self.batch_bytes
                        or waited >= self.batch_seconds
                    ):
                        out = memoryview(self._chunk)
                        if self.file is not None and self.file.pending:
                            return self.offset, out[: self.file.peek_into(out)]
                        k = min(len(self.mem), CHUNK_MAX)
                        with memoryview(self.mem) as view:
                            out[:k] = view[:k]
                        return self.offset, out[:k]
                    self.clock.wait_on(self._cond, self.batch_seconds - waited)
                    continue
                if self.closing:
                    return None
                self._cond.wait()

    def _acked_to(self, end: int) -> int:
        """The controller holds the stream up to offset `end`: forget the
        bytes before it (none if the sink is past it already: a report's tail
        or the uploader was first); how many were forgotten."""
        with self._cond:
            n = min(end - self.offset, self._pending())
            if n <= 0:
                return 0
            # the front is the spool if it holds anything (memory moved there
            # keeps its place), then memory
            k = min(n, self.file.pending) if self.file is not None else 0
            if k:
                self.file.consume(k)
            del self.mem[: n - k]
            self.offset += n
            self.first_at = self.clock.monotonic() if self._pending() else None
            self._cond.notify_all()
            return n

    def _set_failing(self, value: bool) -> None:
        with self._cond:
            if self.failing != value:
                self.failing = value
                self._cond.notify_all()

    def _run(self) -> None:
        delay = RETRY_MIN_S
        while True:
            nxt = self._next_chunk()
            if nxt is None:
                return
            offset, chunk = nxt
            try:
                self.client.call(
                    calls.LOG_APPEND, self.job_id, body=chunk, params={"offset": offset}
                )
            except ApiError as e:
                if e.status < 500:
                    # Refused for good (job gone, gap): drop these bytes rather
                    # than block the job forever.
                    log.error(
                        "job %d: log upload refused (%s); %d bytes dropped",
                        self.job_id,
                        e,
                        len(chunk),
                    )
                    with self._cond:
                        self.lost += self._acked_to(offset + len(chunk))
                    continue
                self._set_failing(True)
            except TransportError as e:
                log.debug("job %d: log upload failed: %s", self.job_id, e)
                self._set_failing(True)
            else:
                self._set_failing(False)
                delay = RETRY_MIN_S
                self._acked_to(offset + len(chunk))
                continue
            if self.clock.wait(self._abandoned, delay):
                return
            delay = min(delay * 2, RETRY_MAX_S)
