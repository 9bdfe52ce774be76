"""Processes wired to the relay's worker halves (docs/design.md#the-relay).

Two kinds of work run a process on the relay: a job whose stdio is tty or
pipe (rc.worker.job) and a session inside a hold (rc.worker.sessions). Both
dial the relay's two worker halves first (`Halves`: POST .../tty/out for
output, GET .../tty/in for input; rc.proto.relay) and only then start the
process, so nothing runs that nobody could reach. The process is a
`Terminal` (a pseudo-terminal: rc.worker.terminal) or `Pipes` (here):

- pipe: stdin from the relay (through a pipe the worker owns), stdout to the
  relay byte for byte, stderr kept: a job's in its log (LogSink), a
  session's last bytes in its final report (rc.worker.sessions).

Input ending never ends the process (a pipe sees end of file). The relay
ending the session (the client went away, nobody attached in time) hangs the
process up: a terminal is closed (SIGHUP), a pipe process is killed like a
cancelled job. Nothing of a terminal's output is stored.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import threading
import time
from collections.abc import Callable

from rc.proto.calls import RelayPaths
from rc.proto.errors import RcError, TransportError
from rc.proto.relay import Download, FrameError, Upload
from rc.worker import supervise
from rc.worker.account import Account
from rc.worker.clock import SYSTEM, Clock
from rc.worker.launch import READER_DRAIN_S

__all__ = [
    "POLL_MS",
    "Halves",
    "Pipes",
    "Process",
    "join_started",
    "pump_reads",
    "write_all",
]

log = logging.getLogger("rc.worker.attached")

ATTACH_ATTEMPTS = 3
POLL_MS = 200
"""How often a pump looks at its stop flag (ms)."""
READ_BYTES = 1 << 20
PIPE_BYTES = 1 << 20
"""Kernel buffer asked for the process's pipes (throughput of rc cp)."""


# -- the relay's worker halves ------------------------------------------------------


class Halves:
    """The worker's two relay connections for one session, and the watch on
    the output half's response that tells when the relay ended the session."""

    def __init__(self, client, paths: RelayPaths, on_hangup: Callable[[str], None]) -> None:
        self.out = Upload(client, paths.worker_out)
        try:
            self.inp = Download(client, paths.worker_in)
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
        paths: RelayPaths,
        on_hangup: Callable[[str], None],
        cancelled: threading.Event,
        clock: Clock = SYSTEM,
    ) -> Halves:
        """Connect both halves, retrying transport failures (not refusals)
        after 0.5 s, then 1 s of `clock`."""
        delay = 0.5
        for attempt in range(ATTACH_ATTEMPTS):
            try:
                return cls(client, paths, on_hangup)
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


def pump_reads(fd: int, stop: threading.Event, on_data: Callable[[bytes], None]) -> None:
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


def write_all(fd: int, data: bytes, stop: threading.Event) -> bool:
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


def join_started(t: threading.Thread, timeout: float) -> None:
    """Join a thread if it was ever started."""
    if t.ident is not None:
        t.join(timeout)


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):
        pass  # the kernel's default size works too, only slower


# -- a process on the relay, and its pipe variant --------------------------------------


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
        pump_reads(self.out_fd, self.stop, self._send)
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
        join_started(self.out_thread, timeout)

    def finish(self) -> None:
        """Stop every pump; end the output cleanly if all of it was sent."""
        self.stop.set()
        join_started(self.out_thread, POLL_MS / 1000 * 3)
        if self.output_ended:
            try:
                self.halves.out.finish()
            except TransportError:
                pass
        self.halves.close()
        join_started(self.in_thread, POLL_MS / 1000 * 3)
        self.close()


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

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        note: bytes,
        user: Account | None = None,
        cgroup=None,
    ) -> None:
        """Start argv on pipes as `user` (rc.worker.account; None: the
        worker), in `cwd`, inside `cgroup` (None: none); raises OSError
        when it cannot start."""
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
                argv,
                cwd=cwd,
                env=env,
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                account=user,
                cgroup=cgroup,
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
        pump_reads(self.err_fd, self.stop, self.err)

    def _input(self, chunk: bytes) -> bool:
        return write_all(self.in_w, chunk, self.stop)

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
        join_started(self.out_thread, timeout)
        join_started(self.err_thread, max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.stop.set()
        for t in (self.err_thread, self.in_thread):
            join_started(t, POLL_MS / 1000 * 3)
        self._input_ended()
        for fd in (self.out_fd, self.err_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
