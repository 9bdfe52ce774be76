"""The relay: terminals and pipes spliced in controller memory (docs/design.md#the-relay).

A *session* joins a client and a worker through two pipes: output (worker →
client) and input (client → worker). Each pipe has a writing half and a
reading half, each one streamed HTTP request (rc.controller.api.relay):

    client GET  .../tty/out  ⇐  out pipe  ⇐  worker POST .../tty/out
    client POST .../tty/in   ⇒  in pipe   ⇒  worker GET  .../tty/in

Rules:
- Nothing is stored and nothing touches the database: the routes check once,
  at connect, that the job exists and who may attach; after that a session
  lives in this process's memory only.
- Either side may connect first. Each half takes at most one connection at a
  time (a second one is refused 409 conflict). A job's session that ended
  before its worker came is started afresh at the next connection.
- Every pipe is bounded (`PIPE_BYTES`): a writer waits while it is full, so a
  slow reader slows the remote process down instead of growing memory.
  Keystrokes typed before the other side arrives wait in the pipe.
- The output direction ending ends the session: cleanly once the worker's
  output ended and the client read all of it; abruptly when either output
  half goes away. The input direction ending is only end of file for the
  process.
- A session where only one side (client or worker) is attached, or nobody,
  for `alone_timeout` seconds is ended and its memory freed.
- An ended session is remembered (without its buffers) for `ENDED_LINGER_S`,
  so a late connection is told it ended instead of starting a new one, and a
  session inside a hold keeps its exit code for the client to read.

Sessions inside a hold (`rc shell HOLD`, `rc exec HOLD`, `rc cp --hold`, and
each connection of `rc forward HOLD`, a pipe session whose start names a
loopback port instead of a command) are started here too: `open_in_hold` records one, `starts_for(worker)` hands it to
the hold's worker through its long poll until the worker acknowledges it, and
`report` records what the worker says about it (running, ended with an exit
code and a pipe session's stderr tail).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rc.controller.errors import Refused
from rc.proto.errors import ErrorCode
from rc.proto.model import Stdio
from rc.proto.wire import SessionReport, SessionRequest, SessionStart, SessionView

__all__ = [
    "ENDED_LINGER_S",
    "HALVES",
    "PIPE_BYTES",
    "REDELIVER_S",
    "Ended",
    "Pipe",
    "Relay",
    "Session",
]

PIPE_BYTES = 1 << 20
"""Bytes one direction of a session buffers before its writer waits."""
READ_BYTES = 1 << 20
"""Most bytes handed to a reader at once."""
ENDED_LINGER_S = 600.0
"""How long an ended session is remembered (its outcome, not its buffers)."""
REDELIVER_S = 10.0
"""A session start the worker has not acknowledged is handed out again after this."""
REPORT_GRACE_S = 30.0
"""After a session's streams ended, how long its worker has to say how it
ended before the session is marked ended without an exit code."""
WATCH_TICK_S = 1.0
STDERR_KEEP_BYTES = 64 << 10
"""Most stderr (characters) a session inside a hold keeps."""

HALVES = ("client_out", "client_in", "worker_out", "worker_in")
"""The four connections of a session, named side_direction."""


class Ended(Exception):
    """The session ended while a half was waiting; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Pipe:
    """One direction of a session: a bounded FIFO of byte chunks.

    `put` waits while `limit` bytes are queued; `get` waits for bytes and
    returns None at end of file (after `close`). `breaks(reason)` wakes both
    sides with Ended: queued bytes are dropped.
    """

    def __init__(self, limit: int = PIPE_BYTES) -> None:
        self.limit = limit
        self.size = 0
        self.total = 0
        self.eof = False
        self.broken: str | None = None
        self._chunks: deque[bytes] = deque()
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    async def put(self, data: bytes) -> None:
        """Queue `data` (waits while the pipe is full). Raises Ended."""
        while True:
            if self.broken is not None:
                raise Ended(self.broken)
            if self.size < self.limit:
                break
            self._writable.clear()
            await self._writable.wait()
        if data:
            self._chunks.append(data)
            self.size += len(data)
            self._readable.set()

    async def get(self, limit: int = READ_BYTES) -> bytes | None:
        """Up to `limit` queued bytes (waiting for some); None at end of file.
        Raises Ended."""
        while not self._chunks:
            if self.broken is not None:
                raise Ended(self.broken)
            if self.eof:
                return None
            self._readable.clear()
            await self._readable.wait()
        if self.broken is not None:
            raise Ended(self.broken)
        first = self._chunks.popleft()
        if len(first) > limit:
            self._chunks.appendleft(first[limit:])
            first = first[:limit]
        parts, n = [first], len(first)
        while self._chunks and n + len(self._chunks[0]) <= limit:
            part = self._chunks.popleft()
            parts.append(part)
            n += len(part)
        self.size -= n
        self.total += n
        self._writable.set()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def offer(self, data: bytes) -> bool:
        """Queue `data` now if the pipe is open and has room (the controller's
        own lines into a terminal); False, and nothing queued, otherwise."""
        if self.broken is not None or self.eof or self.size >= self.limit or not data:
            return False
        self._chunks.append(data)
        self.size += len(data)
        self._readable.set()
        return True

    def close(self) -> None:
        """The writer is done: the reader gets end of file after the queued bytes."""
        self.eof = True
        self._readable.set()

    def breaks(self, reason: str) -> None:
        """End both sides now (queued bytes are dropped)."""
        if self.broken is None:
            self.broken = reason
        self._chunks.clear()
        self.size = 0
        self._readable.set()
        self._writable.set()


@dataclass(eq=False)
class Session:
    """One terminal or pipe session.

    key is (job id, session id); session id 0 is a job's own stdio, any other
    a session inside the hold `key[0]`. `owner` is its job's owner (a
    principal's stored form: who may attach, and whom the per-user caps
    count it to), `label` that owner's display label. `start` is set for sessions inside a
    hold (what the worker is told to run), with their lifecycle in `state`
    (starting, running, ended), `exit_code`, `reason` and `stderr`.
    """

    key: tuple[int, int]
    owner: str
    worker: str
    stdio: Stdio
    created: float
    label: str = ""
    out: Pipe = field(default_factory=Pipe)
    inp: Pipe = field(default_factory=Pipe)
    attached: set[str] = field(default_factory=set)
    used: set[str] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    end_reason: str = ""
    clean: bool = False
    ended_at: float = 0.0
    alone_since: float | None = None
    start: SessionStart | None = None
    delivered_at: float = 0.0
    acked: bool = False
    state: str = "starting"
    exit_code: int | None = None
    reason: str = ""
    stderr: str = ""
    stderr_dropped: int = 0

    @property
    def name(self) -> str:
        job, sid = self.key
        return f"session {sid} of hold {job}" if sid else f"job {job}'s {self.stdio.value} session"

    @property
    def ended(self) -> bool:
        return self.done.is_set()

    @property
    def forward(self) -> bool:
        """One connection of a port forward (its start names a port)."""
        return self.start is not None and self.start.port > 0

    def view(self) -> SessionView:
        job, sid = self.key
        return SessionView(
            session_id=sid,
            hold_id=job,
            device_id=self.start.device_id if self.start else "",
            stdio=self.stdio,
            state=self.state,
            exit_code=self.exit_code,
            reason=self.reason,
            stderr=self.stderr,
            stderr_dropped=self.stderr_dropped,
        )


class Relay:
    """Every session of this controller process.

    `alone_timeout` (seconds) ends a session only one side attends;
    `per_user` caps the sessions an owner (a principal) has open, forward
    connections aside, and `forwards_per_user` those (429 limit_exceeded;
    0: no cap);
    `notify(keys)` announces session changes ("session:<job>.<sid>" and
    "worker:<id>" for a new start) to long polls; `clock` is monotonic seconds.
    """

    def __init__(
        self,
        alone_timeout: float,
        per_user: int,
        notify: Callable[[list[str]], None] = lambda keys: None,
        clock: Callable[[], float] = time.monotonic,
        forwards_per_user: int = 0,
    ) -> None:
        self.alone_timeout = alone_timeout
        self.per_user = per_user
        self.forwards_per_user = forwards_per_user
        self.notify = notify
        self.clock = clock
        self.sessions: dict[tuple[int, int], Session] = {}
        self._ids = itertools.count(1)
        self._watch: asyncio.Task | None = None
        self.idle = None
        """The controller's rc.controller.idle.IdleWatch (None: no idle rule)."""
        self.wall: Callable[[], float] = time.time
        """Wall clock for the idle watch (the controller's)."""

    # -- sessions ----------------------------------------------------------

    def _new(
        self,
        key: tuple[int, int],
        owner: str,
        worker: str,
        stdio: Stdio,
        port: int = 0,
        label: str = "",
    ) -> Session:
        forward = bool(port)
        live = sum(
            1
            for s in self.sessions.values()
            if s.owner == owner and not s.ended and s.forward == forward
        )
        cap, what = (
            (self.forwards_per_user, "forward connections")
            if forward
            else (self.per_user, "terminal or pipe sessions")
        )
        if cap and live >= cap:
            raise Refused(
                ErrorCode.LIMIT_EXCEEDED,
                f"{label or owner} already has {live} {what} open (the limit is {cap})",
                status=429,
            )
        s = Session(key, owner, worker, stdio, self.clock(), label)
        s.alone_since = s.created
        self.sessions[key] = s
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._watch_loop(), name="rc-relay-watch")
        return s

    def for_job(
        self, job_id: int, owner: str, worker: str, stdio: Stdio, label: str = ""
    ) -> Session:
        """The session of a tty or pipe job, created at its first connection.

        A session that ended before any worker half came is replaced by a
        fresh one: its client attached while the job was assigned (`rc run
        --tty` does, to send its window size ahead) and left when the job
        went back to the queue, and nothing of the job was ever in it.

        Raises Refused 409 session_ended when it already ended, 429 past the
        per-user limit.
        """
        s = self.sessions.get((job_id, 0))
        if s is None or (s.ended and not s.used & {"worker_out", "worker_in"}):
            return self._new((job_id, 0), owner, worker, stdio, label=label)
        if s.ended:
            raise Refused(ErrorCode.SESSION_ENDED, f"{s.name} has ended ({s.end_reason})")
        return s

    def live_job_session(self, job_id: int) -> Session | None:
        """The session of a tty or pipe job while it has not ended (its
        output may wait for the client after the job itself has ended)."""
        s = self.sessions.get((job_id, 0))
        return None if s is None or s.ended else s

    def open_in_hold(
        self,
        hold_id: int,
        device_ids: tuple[str, ...],
        worker: str,
        owner: str,
        req: SessionRequest,
        label: str = "",
    ) -> Session:
        """Record a session to start inside a running hold (on all of its
        devices, in its order) for its owner (principal `owner`, shown as
        `label`) and wake its worker."""
        sid = next(self._ids)
        s = self._new((hold_id, sid), owner, worker, req.stdio, req.port, label)
        s.start = SessionStart(
            session_id=sid,
            hold_id=hold_id,
            device_id=device_ids[0],
            device_ids=device_ids,
            stdio=req.stdio,
            command=req.command,
            cwd=req.cwd,
            env=dict(req.env),
            submitter=label or owner,
            rows=req.rows,
            cols=req.cols,
            port=req.port,
        )
        self.notify([f"worker:{worker}"])
        return s

    def say(self, hold_id: int, line: str) -> int:
        """Write `line` into the output of every open terminal session of the
        hold (the idle rule's warning and release); pipe sessions (exec, cp,
        forward) carry data and are left alone. Returns how many got it."""
        data = b"\r\n" + line.encode() + b"\r\n"
        return sum(
            1
            for (job, sid), s in self.sessions.items()
            if job == hold_id and sid and not s.ended and s.stdio is Stdio.TTY and s.out.offer(data)
        )

    def open_sessions(self) -> int:
        """Sessions not ended yet (the rc_relay_sessions metric)."""
        return sum(1 for s in self.sessions.values() if not s.ended)

    def get(self, job_id: int, sid: int) -> Session | None:
        """A session by key, ended ones included while remembered."""
        return self.sessions.get((job_id, sid))

    def starts_for(self, worker: str) -> tuple[SessionStart, ...]:
        """Session starts to hand this worker now: never delivered, or not
        acknowledged `REDELIVER_S` after the last delivery (the worker never
        starts a session twice)."""
        now = self.clock()
        out = []
        for s in self.sessions.values():
            if (
                s.start is not None
                and s.worker == worker
                and not s.acked
                and not s.ended
                and now - s.delivered_at >= REDELIVER_S
            ):
                s.delivered_at = now
                out.append(s.start)
        return tuple(out)

    def report(self, s: Session, rep: SessionReport) -> None:
        """What the worker says about a session inside a hold. An ended session
        stays ended; a report for it is kept only if it adds the exit code."""
        s.acked = True
        if s.state == "ended" and rep.state != "ended":
            return
        s.state = rep.state
        if rep.state == "ended":
            s.exit_code = rep.exit_code
            s.reason = rep.reason
            s.stderr = rep.stderr[-STDERR_KEEP_BYTES:]
            s.stderr_dropped = rep.stderr_dropped + max(0, len(rep.stderr) - STDERR_KEEP_BYTES)
            if not {"worker_out"} & (s.used | s.attached):
                s.out.close()  # it never ran: its (empty) output is complete
        self._changed(s)

    def _changed(self, s: Session) -> None:
        job, sid = s.key
        self.notify([f"session:{job}.{sid}"])

    # -- halves ------------------------------------------------------------

    def attach(self, s: Session, half: str) -> None:
        """Connect a half. Raises Refused 409 when the session ended, the half
        is connected already, or (input) its direction was already closed."""
        if s.ended:
            raise Refused(ErrorCode.SESSION_ENDED, f"{s.name} has ended ({s.end_reason})")
        if half in s.attached:
            raise Refused(
                ErrorCode.CONFLICT, f"{s.name} already has a {half.replace('_', ' ')} connection"
            )
        if half in s.used:
            raise Refused(
                ErrorCode.SESSION_ENDED,
                f"the {half.replace('_', ' ')} half of {s.name} was closed and cannot be reopened",
            )
        s.attached.add(half)
        s.used.add(half)
        if half.startswith("worker"):
            s.acked = True
        self._recheck(s)

    def detach(self, s: Session, half: str) -> None:
        """A half's connection is gone."""
        s.attached.discard(half)
        self._recheck(s)
        if s.ended and not s.attached:
            s.out.breaks(s.end_reason)  # nobody will read what is left: free it

    def _recheck(self, s: Session) -> None:
        sides = {h.partition("_")[0] for h in s.attached}
        if sides == {"client", "worker"}:
            s.alone_since = None
        elif s.alone_since is None:
            s.alone_since = self.clock()

    def finish(self, s: Session, reason: str, clean: bool = False) -> None:
        """End a session: every waiting half wakes; queued bytes are dropped
        unless the output was complete (`clean`)."""
        if s.ended:
            return
        s.end_reason = reason
        s.clean = clean
        s.ended_at = self.clock()
        if not clean or "client_out" not in s.attached:
            s.out.breaks(reason)
        s.inp.breaks(reason)
        s.done.set()
        self._changed(s)

    def shutdown(self, reason: str = "the controller is shutting down") -> None:
        """End every session (the controller is stopping)."""
        for s in list(self.sessions.values()):
            self.finish(s, reason)

    # -- time ----------------------------------------------------------------

    def tick(self, now: float) -> None:
        """End sessions left alone too long; forget ended ones after their linger."""
        for key, s in list(self.sessions.items()):
            if s.ended:
                if (
                    s.start is not None
                    and s.state != "ended"
                    and now - s.ended_at >= REPORT_GRACE_S
                ):
                    s.state = "ended"
                    s.reason = f"the worker did not say how it ended ({s.end_reason})"
                    self._changed(s)
                if not s.attached and now - s.ended_at >= ENDED_LINGER_S:
                    del self.sessions[key]
                continue
            if s.alone_since is not None and now - s.alone_since >= self.alone_timeout:
                sides = {h.partition("_")[0] for h in s.attached}
                waited = f"{self.alone_timeout:g}s"
                if sides == {"client"}:
                    why = f"the worker did not attach within {waited}"
                elif sides == {"worker"}:
                    why = f"no client attached within {waited}"
                else:
                    why = f"nobody attached within {waited}"
                self.finish(s, why)
                if s.start is not None and s.state != "ended":
                    s.state, s.reason = "ended", why
                    self._changed(s)

    async def _watch_loop(self) -> None:
        while self.sessions:
            await asyncio.sleep(WATCH_TICK_S)
            self.tick(self.clock())
