"""Terminal and pipe work on the worker (inventory §6.4, issue 6).

Two kinds of work come here:

- a job whose stdio is tty or pipe (`run_job`, called by JobRun._execute);
- a session inside a hold (rc.worker.sessions, which runs its process with
  the Terminal and Pipes classes here).

Both dial the relay's two worker halves first (POST .../tty/out for output,
GET .../tty/in for input; rc.proto.relay) and only then start the process,
so nothing runs that nobody could reach.

- tty: a pseudo-terminal. The process leads a new session with the terminal
  as its controlling terminal (a short shim does TIOCSCTTY before exec, as
  subprocess cannot do that without preexec_fn in a threaded worker), so
  job control works and ^C/^Z reach the foreground process group. The shim
  also gives the command default signal dispositions and an empty signal
  mask (its own Python ignores SIGPIPE and SIGXFSZ), and tells the worker
  when the exec happened: keys (and resizes) that came before, typed while
  the job queued or the session started, are written to the terminal only
  then, so a ^C among them reaches the command instead of a terminal that
  has no foreground process group yet. The initial size comes with a
  session start, else from the client's first resize frame (one saying 0x0
  means 24x80; a client that sends none is waited for at most
  TTY_SIZE_WAIT_S). Later resize frames are applied as they come (a zero
  row or column count is ignored). No command means the login shell of the
  worker's user. After the process exits its output gets TTY_DRAIN_S to
  drain; what is left of its terminal session (background jobs) is hung
  up, then killed.
- pipe: stdin from the relay (through a pipe the worker owns), stdout to the
  relay byte for byte, stderr kept: a job's in its log (LogSink), a
  session's last STDERR_TAIL_BYTES in its final report.

Input ending never ends the process (a pipe sees end of file). The relay
ending the session (the client went away, nobody attached in time) hangs the
process up: a terminal is closed (SIGHUP), a pipe process is killed like a
cancelled job. Nothing of a terminal's output is stored.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pwd
import select
import signal
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable

from rc.proto.errors import RcError, TransportError
from rc.proto.model import JobState, Stdio
from rc.proto.relay import Download, FrameDecoder, FrameError, Upload
from rc.worker import procfs, supervise
from rc.worker.clock import SYSTEM, Clock
from rc.worker.launch import (
    READER_DRAIN_S,
    Result,
    cannot_start,
    cannot_start_line,
    job_env,
    label,
    working_dir,
)
from rc.worker.reporter import Report

__all__ = [
    "CTTY_SHIM",
    "STDERR_TAIL_BYTES",
    "TTY_DEFAULT_SIZE",
    "TTY_DRAIN_S",
    "TTY_SIZE_WAIT_S",
    "Halves",
    "Pipes",
    "Process",
    "Terminal",
    "end_terminal_session",
    "run_job",
]

log = logging.getLogger("rc.worker.attached")

TTY_DEFAULT_SIZE = (24, 80)
"""Rows and columns of a terminal whose client never said (inventory §10)."""
TTY_SIZE_WAIT_S = 3.0
"""How long a terminal job waits for its client's first resize frame (the
client sends one as soon as it attaches, so this is only a fallback)."""
EXEC_WAIT_S = 10.0
"""How long a terminal's input is held back waiting for its shim to exec."""
EXEC_FD_ENV = "RC_EXEC_FD"
"""The shim's environment variable naming its exec-notice descriptor."""
TTY_DRAIN_S = 2.0
"""After a terminal's process exits, how long its output may still drain."""
STDERR_TAIL_BYTES = 64 << 10
"""Stderr a pipe session inside a hold keeps for its final report."""
ATTACH_ATTEMPTS = 3
HOLD_WAIT_S = 30.0
"""How long a session waits for its hold to be running on this worker."""
REPORT_ATTEMPTS = 5
POLL_MS = 200
READ_BYTES = 1 << 20
PIPE_BYTES = 1 << 20
"""Kernel buffer asked for the process's pipes (throughput of rc cp)."""
FLUSH_S = 300.0

CTTY_SHIM = (
    "import fcntl,os,signal,sys,termios\n"
    "fcntl.ioctl(0,termios.TIOCSCTTY,0)\n"
    "for s in range(1,signal.NSIG):\n"
    " try:signal.signal(s,signal.SIG_DFL)\n"
    " except(OSError,ValueError):pass\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK,())\n"
    f"w=os.environ.pop({EXEC_FD_ENV!r},'')\n"
    "if w:os.set_inheritable(int(w),False)\n"
    "try:os.execvp(sys.argv[1],sys.argv[1:])\n"
    "except OSError as e:\n"
    " os.write(2,('rc: cannot start %r: %s\\n'%(sys.argv[1],e.strerror or e)).encode())\n"
    " os._exit(127 if isinstance(e,FileNotFoundError) else 126)\n"
)
"""Run as `python -I -S -c CTTY_SHIM argv...` with the terminal on fds 0-2 in a
new session: make it the controlling terminal, reset every signal to its
default and unblock them all (as a login does; Python itself ignores SIGPIPE
and SIGXFSZ), then exec argv. With RC_EXEC_FD=N in its environment (taken
out of the command's) it keeps descriptor N open until the exec, so whoever
holds the other end of that pipe sees end of file once argv runs (or the
shim failed)."""


# -- the relay's worker halves ------------------------------------------------------


class Halves:
    """The worker's two relay connections for one session, and the watch on
    the output half's response that tells when the relay ended the session."""

    def __init__(self, client, base: str, on_hangup: Callable[[str], None]) -> None:
        self.out = Upload(client, base + "/tty/out")
        try:
            self.inp = Download(client, base + "/tty/in")
        except RcError:
            self.out.close()
            raise
        self.hung_up = ""
        self.closing = False
        self._on_hangup = on_hangup
        threading.Thread(target=self._watch, daemon=True, name="rc-relay-watch").start()

    @classmethod
    def connect(
        cls,
        client,
        base: str,
        on_hangup: Callable[[str], None],
        cancelled: threading.Event,
        clock: Clock = SYSTEM,
    ) -> Halves:
        """Connect both halves, retrying transport failures (not refusals)
        after 0.5 s, then 1 s of `clock`."""
        delay = 0.5
        for attempt in range(ATTACH_ATTEMPTS):
            try:
                return cls(client, base, on_hangup)
            except TransportError:
                if attempt == ATTACH_ATTEMPTS - 1 or clock.wait(cancelled, delay):
                    raise
                delay *= 2
        raise AssertionError("unreachable")

    def _watch(self) -> None:
        outcome = self.out.outcome()
        if "ok" not in outcome and not self.closing:
            self.hung_up = str(outcome.get("ended") or "the relay ended the session")
            self._on_hangup(self.hung_up)

    def close(self) -> None:
        self.closing = True
        self.inp.close()
        self.out.close()


# -- file descriptor plumbing ---------------------------------------------------------


def _pump_reads(fd: int, stop: threading.Event, on_data: Callable[[bytes], None]) -> None:
    """Read `fd` until end of file (or EIO: a terminal with nobody left), or `stop`."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while not stop.is_set():
        if not poller.poll(POLL_MS):
            continue
        try:
            data = os.read(fd, READ_BYTES)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not data:
            return
        on_data(data)


def _write_all(fd: int, data: bytes, stop: threading.Event) -> bool:
    """Write all of `data` to a non-blocking `fd`, waiting while it is full;
    False when the reader is gone or `stop` was set."""
    view = memoryview(data)
    poller = select.poll()
    poller.register(fd, select.POLLOUT | select.POLLERR)
    while view:
        if stop.is_set():
            return False
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            poller.poll(POLL_MS)
            continue
        except OSError:
            return False
        view = view[n:]
    return True


def _wait_closed(fd: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for end of file on the pipe `fd` reads
    (every copy of its write end closed); False if it did not come."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not poller.poll(max(1, int(left * 1000))):
            continue
        try:
            if not os.read(fd, 512):
                return True
        except OSError:
            return True


def _join(t: threading.Thread, timeout: float) -> None:
    """Join a thread if it was ever started."""
    if t.ident is not None:
        t.join(timeout)


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):
        pass  # the kernel's default size works too, only slower


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def login_shell() -> list[str]:
    """The worker user's login shell as a login shell (`["/bin/bash", "-l"]`)."""
    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        shell = ""
    if not shell or not os.access(shell, os.X_OK) or shell.endswith(("/nologin", "/false")):
        shell = "/bin/sh"
    return [shell, "-l"]


def _session_members(sid: int) -> list[procfs.ProcStat]:
    me = os.getpid()
    return [p for p in procfs.processes() if p.session == sid and p.live and p.pid != me]


def _signal_session(sid: int, *signums: int) -> None:
    for pg in {p.pgrp for p in _session_members(sid)}:
        for signum in signums:
            supervise.killpg(pg, signum)


def end_terminal_session(sid: int, grace: float) -> list[int]:
    """End what is left of terminal session `sid` (every process group in it):
    SIGHUP and SIGCONT (a terminal hang-up) and SIGTERM, SIGKILL after `grace`
    s, then up to supervise.STRAGGLER_WAIT_S. Returns the pids still alive."""
    if not _session_members(sid):
        return []
    _signal_session(sid, signal.SIGHUP, signal.SIGCONT, signal.SIGTERM)
    left = supervise.wait_gone(lambda: _session_members(sid), time.monotonic() + grace)
    if left:
        _signal_session(sid, signal.SIGKILL)
        left = supervise.wait_gone(
            lambda: _session_members(sid), time.monotonic() + supervise.STRAGGLER_WAIT_S
        )
    return [p.pid for p in left]


# -- the two kinds of process ---------------------------------------------------------


class Process:
    """A process wired to the relay. `start()` spawns it (raises OSError) and
    starts the pumps; `stop_pumps()` and `close()` tear the plumbing down."""

    def __init__(self, halves: Halves, on_output: Callable[[bool], None]) -> None:
        self.halves = halves
        self.on_output = on_output  # on_output(True) before a send, (False) after
        self.stop = threading.Event()
        self.group: supervise.Group | None = None
        self.output_ended = False
        self.out_thread = threading.Thread(target=self._pump_out, daemon=True, name="rc-relay-out")
        self.in_thread = threading.Thread(target=self._pump_in, daemon=True, name="rc-relay-in")

    def _send(self, data: bytes) -> None:
        self.on_output(True)
        try:
            self.halves.out.send(data)
        except TransportError:
            self.stop.set()
        finally:
            self.on_output(False)

    def _pump_out(self) -> None:
        _pump_reads(self.out_fd, self.stop, self._send)
        if not self.stop.is_set():
            self.output_ended = True

    def _pump_in(self) -> None:
        try:
            for chunk in self.halves.inp:
                if self.stop.is_set() or not self._input(chunk):
                    break
            else:
                log.info("input ended: %s", self.halves.inp.path)
        except (TransportError, FrameError) as e:
            log.info("input stream ended: %s", e)
        self._input_ended()

    def drain(self, timeout: float) -> None:
        """Let the output reach end of file for up to `timeout` seconds."""
        _join(self.out_thread, timeout)

    def finish(self) -> None:
        """Stop every pump; end the output cleanly if all of it was sent."""
        self.stop.set()
        _join(self.out_thread, POLL_MS / 1000 * 3)
        if self.output_ended:
            try:
                self.halves.out.finish()
            except TransportError:
                pass
        self.halves.close()
        _join(self.in_thread, POLL_MS / 1000 * 3)
        self.close()


class Terminal(Process):
    """A process on a pseudo-terminal, fed from input frames."""

    def __init__(
        self, halves: Halves, on_output: Callable[[bool], None], size: tuple[int, int] | None
    ) -> None:
        super().__init__(halves, on_output)
        self.decoder = FrameDecoder()
        self.cond = threading.Condition()
        self.size = size if size and all(size) else None
        self.master: int | None = None
        self.input_done = False
        self.in_thread.start()  # reads the first resize frame while we wait

    def wait_size(self, timeout: float) -> tuple[int, int]:
        with self.cond:
            self.cond.wait_for(lambda: self.size is not None or self.input_done, timeout)
            return self.size or TTY_DEFAULT_SIZE

    def start(self, argv: list[str], env: dict[str, str], cwd: str | None, note: bytes) -> None:
        rows, cols = self.wait_size(TTY_SIZE_WAIT_S)
        master, slave = os.openpty()
        execd, execd_w = os.pipe()
        try:
            _set_size(master, rows, cols)
            if note:
                os.write(slave, note.replace(b"\n", b"\r\n"))
            shim = [sys.executable, "-I", "-S", "-c", CTTY_SHIM, *argv]
            self.group = supervise.spawn(
                shim,
                cwd=cwd,
                env={**env, EXEC_FD_ENV: str(execd_w)},
                stdin=slave,
                stdout=slave,
                stderr=slave,
                pass_fds=(execd_w,),
            )
        except BaseException:
            os.close(master)
            os.close(execd)
            raise
        finally:
            os.close(slave)
            os.close(execd_w)
        try:
            if not _wait_closed(execd, EXEC_WAIT_S):
                log.warning(
                    "%s: the terminal's command did not start within %gs; passing input on anyway",
                    self.halves.inp.path,
                    EXEC_WAIT_S,
                )
        finally:
            os.close(execd)
        os.set_blocking(master, False)
        self.out_fd = master
        with self.cond:
            self.master = master
            self.cond.notify_all()
        self.out_thread.start()

    def _input(self, chunk: bytes) -> bool:
        for ev in self.decoder.feed(chunk):
            with self.cond:
                if ev[0] == "r" and self.master is None and self.size is None:
                    # the client's answer, even 0x0 (it does not know): no more waiting
                    self.size = (ev[1], ev[2]) if ev[1] and ev[2] else TTY_DEFAULT_SIZE
                    self.cond.notify_all()
                    continue
                self.cond.wait_for(lambda: self.master is not None or self.stop.is_set())
                master = self.master
            if master is None:
                return False
            if ev[0] == "r":
                if ev[1] and ev[2]:
                    try:
                        _set_size(master, ev[1], ev[2])
                    except OSError:
                        return False
            elif not _write_all(master, ev[1], self.stop):
                return False
        return True

    def _input_ended(self) -> None:
        with self.cond:
            self.input_done = True
            self.cond.notify_all()

    def hangup(self) -> None:
        """What a terminal does when its other end goes: SIGHUP (and SIGCONT,
        for stopped jobs) to every process group of its session."""
        if self.group is not None:
            _signal_session(self.group.pgid, signal.SIGHUP, signal.SIGCONT)

    def leftovers(self, grace: float) -> tuple[int, list[int]]:
        """After the leader exited: let the output drain, then end the rest of
        its terminal session (background jobs of a shell are not stragglers:
        0, and the survivors)."""
        self.drain(TTY_DRAIN_S)
        if self.group is None:
            return 0, []
        return 0, end_terminal_session(self.group.pgid, grace)

    def close(self) -> None:
        with self.cond:
            master, self.master = self.master, None
            self.stop.set()
            self.cond.notify_all()
        if master is not None:
            _join(self.in_thread, POLL_MS / 1000 * 3)
            os.close(master)


class Pipes(Process):
    """A process on plain pipes: stdin from the relay, stdout to it, stderr to `err`."""

    def __init__(
        self, halves: Halves, on_output: Callable[[bool], None], err: Callable[[bytes], None]
    ) -> None:
        super().__init__(halves, on_output)
        self.err = err
        self.fds: list[int] = []
        self.in_w = -1
        self._in_lock = threading.Lock()
        self.err_thread = threading.Thread(target=self._pump_err, daemon=True, name="rc-relay-err")

    def start(self, argv: list[str], env: dict[str, str], cwd: str | None, note: bytes) -> None:
        in_r, self.in_w = os.pipe()
        self.out_fd, out_w = os.pipe()
        self.err_fd, err_w = os.pipe()
        self.fds = [self.in_w, self.out_fd, self.err_fd]
        for fd in (self.in_w, self.out_fd):
            _grow_pipe(fd)
        if note:
            self.err(note)
        try:
            self.group = supervise.spawn(
                argv, cwd=cwd, env=env, stdin=in_r, stdout=out_w, stderr=err_w
            )
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        for fd in self.fds:
            os.set_blocking(fd, False)
        self.out_thread.start()
        self.err_thread.start()
        self.in_thread.start()

    def _pump_err(self) -> None:
        _pump_reads(self.err_fd, self.stop, self.err)

    def _input(self, chunk: bytes) -> bool:
        return _write_all(self.in_w, chunk, self.stop)

    def _input_ended(self) -> None:
        with self._in_lock:
            fd, self.in_w = self.in_w, -1
        if fd >= 0:
            try:
                os.close(fd)  # end of file for the process
            except OSError:
                pass

    def hangup(self) -> None:
        pass  # a pipe process is killed like a cancelled job instead

    def leftovers(self, grace: float) -> tuple[int, list[int]]:
        """After the leader exited: SIGKILL what is left of its group (as for
        a logs job: the stragglers are counted, and noted in its reason), then
        let the output drain. Returns (stragglers, survivors' pids)."""
        if self.group is None:
            return 0, []
        stragglers, left = supervise.reap_stragglers(self.group)
        self.drain(READER_DRAIN_S)
        return stragglers, [p.pid for p in left]

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        _join(self.out_thread, timeout)
        _join(self.err_thread, max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.stop.set()
        for t in (self.err_thread, self.in_thread):
            _join(t, POLL_MS / 1000 * 3)
        self._input_ended()
        for fd in (self.out_fd, self.err_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


# -- a job's own terminal or pipe -----------------------------------------------------------


def run_job(run) -> Result:
    """Run `run`'s tty or pipe job (JobRun._execute hands it over); the
    Result, with the pids of its group that survived (for the teardown
    checks JobRun runs next)."""
    a = run.a
    ctx = run.ctx
    tty = a.stdio is Stdio.TTY
    env = job_env(dict(os.environ), a.env, a.job_id, a.device_id, run.cuda, ctx.markers)
    cwd, note = working_dir(a.cwd, ctx.cfg.host)
    procs: list[Process] = []

    def hung_up(reason: str) -> None:
        if procs:
            procs[0].hangup()
        run.cancel(f"{'terminal hung up' if tty else 'pipe closed'}: {reason}")

    try:
        halves = Halves.connect(
            ctx.client, f"/v1/jobs/{a.job_id}", hung_up, run.cancelled, run.clock
        )
    except RcError as e:
        return Result(JobState.FAILED, None, f"cannot attach to the relay: {e}")

    def on_output(sending: bool) -> None:
        run.last_output = run.clock.monotonic()
        run.in_write = sending

    sink = None
    if tty:
        proc: Process = Terminal(halves, on_output, None)
        env.setdefault("TERM", "xterm")
        argv = list(a.command) or login_shell()
    else:
        sink = ctx.open_log(a.job_id)
        proc = Pipes(halves, on_output, sink.write)
        argv = list(a.command)
    try:
        proc.start(argv, env, cwd, note)
    except OSError as e:
        proc.finish()
        if sink is not None:
            sink.write(cannot_start_line(argv[0], e))
            sink.close(FLUSH_S)
        return cannot_start(e)
    procs.append(proc)
    ctx.report(Report(a.job_id, "running", started_at=run.started_at))
    if tty:  # a cancelled terminal is hung up first: an interactive shell ignores SIGTERM
        threading.Thread(target=_hangup_on_cancel, args=(run, proc), daemon=True).start()
    outcome, why, survivors = run.watch(proc.group, False)
    stragglers, left = proc.leftovers(ctx.cfg.kill_grace) if why is None else (0, [])
    run.sweep_escapees()  # before draining: an escapee may hold the output open
    proc.drain(TTY_DRAIN_S if tty else READER_DRAIN_S)
    if tty:
        left += end_terminal_session(proc.group.pgid, ctx.cfg.kill_grace)
    proc.finish()
    if sink is not None and not sink.close(FLUSH_S):
        log.error("job %d: %d stderr bytes could not be stored", a.job_id, sink.lost)
    result = label(outcome, why, stragglers, False)
    if halves.hung_up and why is None and outcome is not None and outcome.signal:
        result = Result(JobState.KILLED, result.exit_code, run.cancel_reason or result.reason)
    result.survivors = [p.pid for p in survivors] + left
    return result


def _hangup_on_cancel(run, proc: Process) -> None:
    while not proc.stop.is_set():
        if run.cancelled.wait(0.1):
            proc.hangup()
            return
