"""Sessions inside a hold: `rc shell HOLD`, `rc exec HOLD`, `rc cp --hold`,
and each connection of `rc forward HOLD` (rc.worker.forward: no process, a
loopback socket) (docs/design.md#the-relay). The dispatch (rc.worker.dispatch)
hands them over from Assignments.sessions, each once, on its own thread.

A session runs on the hold's devices (the hold's RC_DEVICES and
CUDA_VISIBLE_DEVICES) with RC_JOB_ID set to the hold's id, under the hold's lease, and ends when the
hold ends: the session watches the hold, and the hold's teardown sweeps every
process carrying its RC_JOB_ID anyway. Either way the session reports the
hold's end as its reason (JobRun.ending: "hold 17 expired (ttl 30m)"), not
the signal that ended its process. The process itself is a Terminal
(rc.worker.terminal) or Pipes (rc.worker.attached), dialled to the relay
first. Its outcome goes to
POST /v1/jobs/{hold}/sessions/{sid}/status.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rc.proto import calls
from rc.proto.client import Client
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.model import JobKind, Stdio
from rc.proto.wire import SessionStart
from rc.worker import supervise
from rc.worker.account import CannotRunAs
from rc.worker.attached import Halves, Pipes, Process
from rc.worker.cgroups import Tracker
from rc.worker.clock import SYSTEM, Clock
from rc.worker.config import WorkerConfig
from rc.worker.forward import run_forward
from rc.worker.launch import READER_DRAIN_S, cannot_start, job_env, label, working_dir
from rc.worker.runs import Runs
from rc.worker.terminal import TTY_DRAIN_S, Terminal, end_terminal_session, login_shell

__all__ = ["SessionContext", "run_session"]

log = logging.getLogger("rc.worker.sessions")

HOLD_WAIT_S = 30.0
"""How long a session waits for its hold to be running on this worker."""
HOLD_POLL_S = 0.05
"""How often a session looks for its hold's run while it waits for it."""
REPORT_ATTEMPTS = 5
"""Tries of a session's status report (0.2 s doubling between them)."""
STDERR_TAIL_BYTES = 64 << 10
"""Stderr a pipe session inside a hold keeps for its final report."""


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a session inside a hold needs of its worker (rc.worker.agent
    builds one).

    cfg: the worker's configuration (host, kill_grace). client: the
    controller (the relay, the session's status). clock: its time. markers:
    RC_HOST and RC_WORKER_INSTANCE (rc.worker.job.JobContext). tracker: how
    it tracks processes (each session gets a cgroup of its own). runs: the
    worker's jobs (rc.worker.runs), where a session finds its hold.
    stopping(): the worker is shutting down.
    """

    cfg: WorkerConfig
    client: Client
    clock: Clock
    markers: Mapping[str, str]
    tracker: Tracker
    runs: Runs
    stopping: Callable[[], bool]


class _StderrTail:
    """The last `limit` bytes written, and how many came before them."""

    def __init__(self, limit: int = STDERR_TAIL_BYTES) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.dropped = 0
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock:
            self.buf += data
            extra = len(self.buf) - self.limit
            if extra > 0:
                del self.buf[:extra]
                self.dropped += extra


def _report(
    ctx: SessionContext,
    st: SessionStart,
    state: str,
    exit_code: int | None = None,
    reason: str = "",
    tail: _StderrTail | None = None,
) -> None:
    body = {"state": state, "exit_code": exit_code, "reason": reason[:4000]}
    if tail is not None:
        body["stderr"] = tail.buf.decode("utf-8", "replace")
        body["stderr_dropped"] = tail.dropped
    delay = 0.2
    for _ in range(REPORT_ATTEMPTS):
        try:
            ctx.client.call(calls.SESSION_REPORT, st.hold_id, st.session_id, body=body)
            return
        except ApiError as e:
            if e.status < 500:
                log.warning(
                    "session %d of hold %d: report refused: %s", st.session_id, st.hold_id, e
                )
                return
        except TransportError:
            pass
        ctx.clock.sleep(delay)
        delay *= 2
    log.warning("session %d of hold %d: could not report %s", st.session_id, st.hold_id, state)


def run_session(ctx: SessionContext, st: SessionStart) -> None:
    """Run session `st` to its end, its outcome reported (a worker error
    too), on the calling thread."""
    try:
        _session(ctx, st)
    except Exception as e:  # a bug must still end in a report
        log.exception("session %d of hold %d: worker error", st.session_id, st.hold_id)
        _report(ctx, st, "ended", None, f"worker error: {e}")
    finally:
        # the kept-alive connection of this thread's reports: the client
        # keeps one per thread until closed, and a thread per session (a
        # forward's every connection) would leak one each
        ctx.client.close()


def _hold_run(ctx: SessionContext, hold_id: int, timeout: float = HOLD_WAIT_S):
    """The hold's JobRun once its devices are acquired (their acquire hooks,
    where they have one, succeeded), or None if that does not happen within
    `timeout` seconds (a session may come with the hold's own assignment)."""
    deadline = ctx.clock.monotonic() + timeout
    while True:
        run = ctx.runs.get(hold_id)
        if run is not None and run.a.kind is JobKind.HOLD and run.acquired.is_set():
            return run
        if ctx.clock.monotonic() >= deadline or ctx.stopping():
            return None
        SYSTEM.sleep(HOLD_POLL_S)  # a real tick: the deadline above is the clock's


def _session(ctx: SessionContext, st: SessionStart) -> None:
    hold = _hold_run(ctx, st.hold_id)
    if hold is None:
        _report(ctx, st, "ended", None, f"hold {st.hold_id} is not running on {ctx.cfg.host}")
        return
    if st.port:
        run_forward(ctx, st, hold, _report)
        return
    user = hold.account  # a session runs as its hold's Unix user
    if user is None:
        _report(ctx, st, "ended", None, f"hold {st.hold_id} has no Unix user to run as")
        return
    env = job_env(hold.clean_env(), st.env, st.hold_id, hold.device_ids, hold.cuda, ctx.markers)
    try:
        cwd, note = working_dir(st.cwd, ctx.cfg.host, user)
    except CannotRunAs as e:
        _report(ctx, st, "ended", 126, f"cannot start: {e}")
        return
    hung = threading.Event()
    paths = calls.SESSION_RELAY.at(st.hold_id, st.session_id)
    try:
        halves = Halves.connect(
            ctx.client, paths, lambda reason: hung.set(), threading.Event(), ctx.clock
        )
    except RcError as e:
        _report(ctx, st, "ended", None, f"cannot attach to the relay: {e}")
        return
    tail = None
    if st.stdio is Stdio.TTY:
        proc: Process = Terminal(halves, lambda sending: None, (st.rows, st.cols))
        env.setdefault("TERM", "xterm")
        argv = list(st.command) or login_shell(user)
    else:
        tail = _StderrTail()
        proc = Pipes(halves, lambda sending: None, tail.write)
        argv = list(st.command)
    cgroup = ctx.tracker.create(f"session-{st.hold_id}-{st.session_id}")
    try:
        proc.start(argv, env, cwd, note, user, cgroup)
    except OSError as e:
        # nothing ran, so its (empty) output is complete: end it cleanly, so a
        # client attaching only now still reads that end instead of a break
        proc.output_ended = True
        proc.finish()
        if cgroup is not None:
            cgroup.remove()
        failed = cannot_start(e)
        _report(ctx, st, "ended", failed.exit_code, failed.reason, tail)
        return
    _report(ctx, st, "running")
    why = None
    while True:
        outcome = proc.group.wait(0.1)
        if outcome is not None:
            break
        if hung.is_set():
            why = f"{'terminal hung up' if st.stdio is Stdio.TTY else 'pipe closed'}: {halves.hung_up}"
        elif hold.ending is not None or ctx.runs.get(st.hold_id) is not hold:
            why = hold.ending or f"hold {st.hold_id} ended"
        elif ctx.stopping():
            why = "the worker is shutting down"
        if why is not None:
            proc.hangup()
            outcome, _ = supervise.kill_group(proc.group, ctx.cfg.kill_grace)
            break
    if why is None and outcome is not None and outcome.signal and hold.ending is not None:
        why = hold.ending  # the hold's teardown (its RC_JOB_ID sweep) got here first
    stragglers, _ = proc.leftovers(ctx.cfg.kill_grace) if why is None else (0, [])
    proc.drain(TTY_DRAIN_S if st.stdio is Stdio.TTY else READER_DRAIN_S)
    if st.stdio is Stdio.TTY:
        end_terminal_session(proc.group.pgid, ctx.cfg.kill_grace)
    proc.finish()
    if cgroup is not None:  # what left its group and session still ends with it
        try:
            if not cgroup.kill():
                cgroup.remove()
        except OSError as e:
            log.warning("session %d of hold %d: cgroup: %s", st.session_id, st.hold_id, e)
    result = label(outcome, why, stragglers, False)
    _report(ctx, st, "ended", result.exit_code, result.reason, tail)
