"""A process on a pseudo-terminal, wired to the relay (docs/design.md#the-relay).

The terminal half of a tty job (rc.worker.job) or of an `rc shell` session
inside a hold (rc.worker.sessions); the relay's halves and the process base
are rc.worker.attached's.

The process leads a new session with the terminal as its controlling
terminal (a short shim, CTTY_SHIM, does TIOCSCTTY before exec, as subprocess
cannot do that without preexec_fn in a threaded worker), so job control
works and ^C/^Z reach the foreground process group. The shim also gives the
command default signal dispositions and an empty signal mask (its own Python
ignores SIGPIPE and SIGXFSZ), and tells the worker when the exec happened:
keys (and resizes) that came before, typed while the job queued or the
session started, are written to the terminal only then, so a ^C among them
reaches the command instead of a terminal that has no foreground process
group yet. The initial size comes with a session start, else from the
client's first resize frame (one saying 0x0 means 24x80; a client that sends
none is waited for at most TTY_SIZE_WAIT_S). Later resize frames are applied
as they come (a zero row or column count is ignored). No command means the
login shell of the worker's user. After the process exits its output gets
TTY_DRAIN_S to drain; what is left of its terminal session (background jobs)
is hung up, then killed. Nothing of a terminal's output is stored.
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

from rc.proto.relay import FrameDecoder
from rc.worker import procfs, supervise
from rc.worker.account import Account
from rc.worker.attached import POLL_MS, Halves, Process, join_started, write_all

__all__ = [
    "CTTY_SHIM",
    "EXEC_WAIT_S",
    "TTY_DEFAULT_SIZE",
    "TTY_DRAIN_S",
    "TTY_SIZE_WAIT_S",
    "Terminal",
    "end_terminal_session",
    "login_shell",
]

log = logging.getLogger("rc.worker.terminal")

TTY_DEFAULT_SIZE = (24, 80)
"""Rows and columns of a terminal whose client never sent its size."""
TTY_SIZE_WAIT_S = 3.0
"""How long a terminal job waits for its client's first resize frame (the
client sends one as soon as it attaches, so this is only a fallback)."""
EXEC_WAIT_S = 10.0
"""How long a terminal's input is held back waiting for its shim to exec."""
EXEC_FD_ENV = "RC_EXEC_FD"
"""The shim's environment variable naming its exec-notice descriptor."""
TTY_DRAIN_S = 2.0
"""After a terminal's process exits, how long its output may still drain."""

AS_ENV = "RC_AS"
"""The shim's environment variable naming the user to become: "uid:gid:g1,g2"."""
AS_CWD_ENV = "RC_AS_CWD"
"""The shim's environment variable naming the directory to enter as that user."""

CTTY_SHIM = (
    "import fcntl,os,signal,sys,termios,warnings\n"
    "fcntl.ioctl(0,termios.TIOCSCTTY,0)\n"
    "for s in range(1,signal.NSIG):\n"
    " try:signal.signal(s,signal.SIG_DFL)\n"
    " except(OSError,ValueError):pass\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK,())\n"
    f"w=os.environ.pop({EXEC_FD_ENV!r},'')\n"
    "if w:os.set_inheritable(int(w),False)\n"
    f"a=os.environ.pop({AS_ENV!r},'');d=os.environ.pop({AS_CWD_ENV!r},'')\n"
    "if a:\n"
    " u,g,gs=a.split(':');os.setgroups([int(x) for x in gs.split(',') if x])\n"
    " os.setgid(int(g));os.setuid(int(u));os.umask(0o22)\n"
    "if d:\n"
    " try:os.chdir(d)\n"
    " except OSError as e:\n"
    "  os.write(2,('rc: cannot enter %s: %s\\n'%(d,e.strerror or e)).encode());os._exit(126)\n"
    "try:os.execvp(sys.argv[1],sys.argv[1:])\n"
    "except OSError as e:\n"
    " os.write(2,('rc: cannot start %r: %s\\n'%(sys.argv[1],e.strerror or e)).encode())\n"
    " os._exit(127 if isinstance(e,FileNotFoundError) else 126)\n"
)
"""Run as `python -I -S -c CTTY_SHIM argv...` with the terminal on fds 0-2 in a
new session: make it the controlling terminal, reset every signal to its
default and unblock them all (as a login does; Python itself ignores SIGPIPE
and SIGXFSZ), become the job's user when RC_AS says so (groups, gid, uid, in
that order, and umask 022: the shim is started by a root worker, so its
interpreter need not be one the user may run: what the rest needs is
imported before, as execvp's `warnings`, since the user may not read its
standard library), enter RC_AS_CWD as that user, then exec argv. With RC_EXEC_FD=N in its environment (taken
out of the command's) it keeps descriptor N open until the exec, so whoever
holds the other end of that pipe sees end of file once argv runs (or the
shim failed)."""


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


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def login_shell(user: Account | None = None) -> list[str]:
    """The login shell of `user` (default: the worker's user) as a login
    shell (`["/bin/bash", "-l"]`); /bin/sh when it has none that runs."""
    if user is not None:
        shell = user.shell
    else:
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

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        note: bytes,
        user: Account | None = None,
        cgroup=None,
    ) -> None:
        """Start argv on a new terminal as `user` (None: the worker), in
        `cwd` (entered as that user), inside `cgroup` (None: none); raises
        OSError when it cannot start."""
        rows, cols = self.wait_size(TTY_SIZE_WAIT_S)
        master, slave = os.openpty()
        execd, execd_w = os.pipe()
        try:
            _set_size(master, rows, cols)
            if note:
                os.write(slave, note.replace(b"\n", b"\r\n"))
            shim = [sys.executable, "-I", "-S", "-c", CTTY_SHIM, *argv]
            extra = {EXEC_FD_ENV: str(execd_w)}
            if user is not None and user.switch:
                # the terminal is the user's, as a login makes it (/dev/tty opens)
                os.fchown(slave, user.uid, -1)
                os.fchmod(slave, 0o620)
                groups = ",".join(str(g) for g in user.groups)
                extra[AS_ENV] = f"{user.uid}:{user.gid}:{groups}"
                if cwd:
                    extra[AS_CWD_ENV] = cwd
                    cwd = None
            self.group = supervise.spawn(
                shim,
                cwd=cwd,
                env={**env, **extra},
                # the worker's own user: subprocess sets the umask (the shim
                # does it, and the rest, for another user)
                account=user if user is not None and not user.switch else None,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                pass_fds=(execd_w,),
                cgroup=cgroup,
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
            elif not write_all(master, ev[1], self.stop):
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
            join_started(self.in_thread, POLL_MS / 1000 * 3)
            os.close(master)
