"""`rc run --tty`, `rc shell`, `rc exec`: the client side of the relay
(`rc cp` rides on it too, in rc.cli.copy).

- `rc run --tty [-d DEV | -s SEL] [-- CMD]`: a terminal job (a login shell
  on the device's host when no command is given). While it waits in the
  queue the local terminal only stops echoing (keys typed meanwhile wait in
  it and are sent once the job starts; Ctrl-C still cancels); once it runs
  the terminal is raw, so every key, Ctrl-C and Ctrl-Z included, reaches the
  remote foreground process, and window resizes follow (whenever stdout or
  stdin is a terminal, even after piped-in keys have ended). rc exits with
  the job's exit code.
- `rc shell HOLD [-- CMD]`: the same inside a hold you have, with no second
  lease (and no queue, so the terminal is raw from the start); its
  processes end with the hold.
- Keys typed before the far side is up are kept and delivered once its
  command runs (a Ctrl-C among them interrupts it). Keys from a pipe or a
  file: their end sends nothing more (no ^D), the session goes on until
  the command ends.
- `rc exec HOLD -- CMD`: CMD inside the hold with stdin and stdout wired
  through byte for byte (pipe mode, for scripts); its stderr is shown when
  it ends; rc exits with its code.

The local terminal is restored on every way out: the end of the session,
an error, the controller going away, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import select
import signal
import struct
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable
from typing import Self

from rc.cli.complete import attach, holds
from rc.cli.context import UsageError, add_client_flags, client, job_cwd, number_in, stderr
from rc.cli.follow import (
    add_env_flags,
    exit_status,
    job_env,
    submit_run,
    wait_running,
    wait_terminal,
)
from rc.cli.output import hold_end, on_devices
from rc.proto import calls
from rc.proto.client import Client
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.relay import Download, Upload, data_frame, resize_frame

__all__ = [
    "LocalTerminal",
    "add_parsers",
    "cmd_exec",
    "cmd_run_tty",
    "cmd_shell",
    "open_halves",
    "open_session",
    "wait_session",
]

TTY_CHUNK = 4096
"""Most bytes of keyboard input in one frame."""
DEFAULT_SIZE = (24, 80)
"""The window size announced when there is no terminal, or it reports none."""
PIPE_CHUNK = 1 << 20
OVER_GRACE_S = 5.0
"""After the job or session ended, how long its output may still arrive."""
REATTACH_S = 5.0
"""How long a terminal job's halves are retried while the relay still has the
ones rc closed when the job went back to the queue."""


def add_parsers(sub) -> None:
    _session_parser(
        sub,
        "shell",
        "a terminal on a device you hold (no second lease)",
        "Open a terminal inside hold HOLD: a login shell on the device's host with "
        "its CUDA_VISIBLE_DEVICES, or CMD. It ends when the hold ends.",
        "what to run instead of the login shell",
    )
    _session_parser(
        sub,
        "exec",
        "run a command inside a hold, stdin and stdout piped through",
        "Run CMD inside hold HOLD with this stdin and stdout wired through byte for "
        "byte; its stderr is shown when it ends. Exits with CMD's exit code.",
        "the command and its arguments",
    )


def _session_parser(sub, name: str, help: str, description: str, command_help: str) -> None:
    """`rc shell` and `rc exec`: HOLD, --cwd, -e, --env-file, -- CMD."""
    p = sub.add_parser(name, help=help, description=description)
    attach(
        p.add_argument("hold", type=number_in(1), metavar="HOLD", help="a running hold of yours"),
        holds,
    )
    p.add_argument(
        "--cwd",
        default=None,
        help="working directory on the device's host "
        "(default: the current directory, else the home directory there)",
    )
    add_env_flags(p, "the command")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD", help=command_help)
    add_client_flags(p)
    p.set_defaults(handler=f"relay:cmd_{name}", session_parser=p)


def _command(args: argparse.Namespace) -> list[str]:
    """The command of `rc shell`/`rc exec`, after reading the options written
    between HOLD and `--` (argparse's remainder takes everything after HOLD,
    so `rc exec 42 --cwd data -- ls` would otherwise run "--cwd")."""
    raw = list(args.command)
    if "--" in raw:
        head, raw = raw[: raw.index("--")], raw[raw.index("--") + 1 :]
    elif raw[:1] and raw[0].startswith("-"):
        head, raw = raw, []  # options and no command: a login shell
    else:
        head = []
    if head:
        args.session_parser.parse_args([*head, str(args.hold)], namespace=args)
    return raw


# -- the local terminal -------------------------------------------------------------


class LocalTerminal:
    """The modes of the terminal on `fd` (when it is one), restored on exit
    from the `with` block, and on SIGTERM and SIGHUP (turned into SystemExit
    so the restore runs)."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.saved = termios.tcgetattr(fd) if os.isatty(fd) else None
        self._handlers: dict[int, object] = {}

    @property
    def is_tty(self) -> bool:
        return self.saved is not None

    def size(self) -> tuple[int, int]:
        """(rows, cols) of the terminal on stdout or stdin; (0, 0) if none."""
        for fd in (1, self.fd, 2):
            try:
                rows, cols, _, _ = struct.unpack(
                    "HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
                )
                if rows and cols:
                    return rows, cols
            except OSError:
                continue
        return 0, 0

    def quiet(self) -> None:
        """No echo, no line editing, signals still on (waiting in the queue:
        typed keys wait in the terminal, Ctrl-C still cancels)."""
        if self.saved is not None:
            mode = termios.tcgetattr(self.fd)
            mode[3] &= ~(termios.ECHO | termios.ICANON)
            termios.tcsetattr(self.fd, termios.TCSANOW, mode)

    def raw(self) -> None:
        """Every byte straight through (pending input kept)."""
        if self.saved is not None:
            tty.setraw(self.fd, termios.TCSANOW)

    def restore(self) -> None:
        if self.saved is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def __enter__(self) -> Self:
        def leave(signum, frame):
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._handlers[sig] = signal.signal(sig, leave)
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
        for sig, old in self._handlers.items():
            signal.signal(sig, old)


# -- splicing stdin and stdout with a session -------------------------------------------


def open_halves(c: Client, paths: calls.RelayPaths) -> tuple[Upload, Download]:
    """The client's two halves of the session at `paths` (input, output).

    The input half connects first. The relay ends a session cleanly once the
    client has read all of its output, so with the output half first, a
    command that ended at once (one that cannot start) could end the session
    before the input half connected, which was then refused session_ended."""
    up = Upload(c, paths.client_in)
    try:
        down = Download(c, paths.client_out)
    except RcError:
        up.close()
        raise
    return up, down


def _first_size(term: LocalTerminal) -> tuple[int, int]:
    """The size announced first: the terminal's, else DEFAULT_SIZE (a 0x0
    answer would leave the far side waiting for a real one)."""
    rows, cols = term.size()
    return (rows, cols) if rows and cols else DEFAULT_SIZE


def _pump_stdin(up: Upload, fd: int, term: LocalTerminal | None, wake: int) -> None:
    """stdin → the session: frames in tty mode (the window size first and on
    every SIGWINCH, which writes to `wake`, whenever a terminal on stdout or
    stdin reports one), raw chunks in pipe mode. End of file adds nothing to
    the input (in tty mode the far side's process just gets no more keys;
    the session goes on). It ends the input, except in tty mode while a
    terminal reports a size: resizes are still forwarded until `wake` closes
    (`rc run --tty < script` in a terminal window)."""
    try:
        if term is not None:
            up.send(resize_frame(*_first_size(term)))
        try:
            os.fstat(fd)
        except OSError:  # no stdin at all: end of file at once
            fd = -1
        while fd >= 0:
            ready, _, _ = select.select([fd, wake], [], [])
            if wake in ready and not _forward_resize(up, term, wake):
                return
            if fd in ready:
                data = os.read(fd, TTY_CHUNK if term is not None else PIPE_CHUNK)
                if not data:
                    break
                up.send(data_frame(data) if term is not None else data)
        if term is None or term.size() == (0, 0):
            up.finish()
            return
        while _forward_resize(up, term, wake):
            pass
    except (TransportError, OSError):
        return  # the session ended


def _forward_resize(up: Upload, term: LocalTerminal | None, wake: int) -> bool:
    """Wait for a SIGWINCH on `wake` and send the new size (tty mode, when a
    terminal reports one); False once `wake` is closed."""
    if not os.read(wake, 512):
        return False
    if term is not None:
        rows, cols = term.size()
        if rows and cols:
            up.send(resize_frame(rows, cols))
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def splice(
    up: Upload, down: Download, term: LocalTerminal | None, over: Callable[[], None] | None = None
) -> bool:
    """Copy stdin into the session and its output to stdout until the output
    ends. `term` is the terminal for tty mode (None: pipe mode). `over` blocks
    until the job or session has ended; the output then gets OVER_GRACE_S
    more. True when the output ended cleanly, False when it broke."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    old = signal.signal(signal.SIGWINCH, lambda s, f: os.write(wake_w, b"w"))
    threading.Thread(target=_pump_stdin, args=(up, 0, term, wake_r), daemon=True).start()
    if over is not None:
        threading.Thread(target=_close_when_over, args=(over, down), daemon=True).start()
    try:
        while True:
            data = down.read()
            if not data:
                return True
            _write_all(1, data)
    except TransportError:
        return False
    finally:
        signal.signal(signal.SIGWINCH, old)
        up.close()
        down.close()
        os.close(wake_w)
        os.close(wake_r)  # the stdin thread's select fails and it ends


def _close_when_over(over: Callable[[], None], down: Download) -> None:
    with contextlib.suppress(RcError):
        over()
        time.sleep(OVER_GRACE_S)
        down.close()


def _job_over(c: Client, job_id: int) -> Callable[[], None]:
    return lambda: wait_terminal(c, job_id)


def _session_over(c: Client, hold: int, sid: int) -> Callable[[], None]:
    return lambda: wait_session(c, hold, sid)


def wait_session(c: Client, hold: int, sid: int, give_up_after: float = 300.0) -> dict:
    """The session once it ended (long poll; transport failures retried for
    up to `give_up_after` seconds in a row)."""
    state, failing_since = "", None
    while True:
        try:
            view = c.call(
                calls.SESSION_GET,
                hold,
                sid,
                params={"wait": "50s", "state": state},
                timeout=65,
            )
            failing_since = None
        except TransportError:
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > give_up_after:
                raise
            time.sleep(1.0)
            continue
        if view["state"] == "ended":
            return view
        state = view["state"]


def _final_job(c: Client, job_id: int, clean: bool) -> dict:
    """The job's terminal record after its session; after a broken session
    give the controller only a short while to answer."""
    try:
        return wait_terminal(c, job_id, give_up_after=None if clean else 5.0)
    except TransportError:
        raise RcError(
            "the controller went away (connection lost): the terminal session ended; "
            f"job {job_id} may still be running (rc ps, rc logs -f {job_id}, rc kill {job_id})"
        ) from None


def _session_code(c: Client, view: dict) -> int:
    """rc's exit code for an ended session (its own, 1 without one), saying
    why on stderr when it did not simply exit (the hold ending, above all)."""
    code = view.get("exit_code")
    name = f"session {view['session_id']} of hold {view['hold_id']}"
    why = view.get("reason") or "no exit code"
    if code is None or (code != 0 and not why.startswith("exited with code")):
        if (code is None or code >= 128) and not why.startswith(f"hold {view['hold_id']} expired"):
            with contextlib.suppress(RcError):
                hold = c.call(calls.JOB_GET, view["hold_id"], timeout=10)["job"]
                if hold["state"] not in ("assigned", "running") or hold.get("kill_reason"):
                    # its kill may be only requested yet (the hold still
                    # running): its reason says why, not its state
                    why = f"hold {hold['id']} ended: {hold_end(hold)}"
        stderr(f"{name}: {why}")
    if code is None:
        return 1
    return code if 0 <= code < 256 else 1


def _env(args: argparse.Namespace, tty_mode: bool) -> dict[str, str]:
    env = job_env(args.env, args.env_files)
    if tty_mode:
        env.setdefault("TERM", os.environ.get("TERM") or "xterm-256color")
    return env


# -- commands -------------------------------------------------------------------------


class _JobHalves:
    """The relay halves of a terminal job, opened as soon as its worker has
    it (assigned) with the window size sent first. The worker starts the
    command once it knows the size (rc.worker.terminal), so the command runs
    at this terminal's size from its first instruction; attaching only once
    the job ran started it at 24x80 and resized it a moment later."""

    def __init__(self, c: Client, term: LocalTerminal) -> None:
        self.c, self.term = c, term
        self.halves: tuple[Upload, Download] | None = None
        self.ended = False

    def open(self, job: dict) -> None:
        """Attach to `job` (again, after it went back to the queue: its old
        session ended with these halves; the relay gives a fresh one to a
        job whose worker never came). A job whose session already ended
        (it could not start) is noted in `ended`, for the caller to say how."""
        again = self.halves is not None
        self.close()
        paths = calls.JOB_RELAY.at(job["id"])
        deadline = time.monotonic() + REATTACH_S
        while True:
            try:
                up, down = open_halves(self.c, paths)
                break
            except ApiError as e:
                if e.code not in ("session_ended", "conflict"):
                    raise
                if not again or time.monotonic() > deadline:
                    if e.code == "conflict":
                        raise
                    self.ended = True  # it ended before its terminal was up
                    return
                time.sleep(0.1)  # the relay has not yet seen our old halves go
        self.halves = (up, down)
        self.ended = False
        try:
            up.send(resize_frame(*_first_size(self.term)))
        except TransportError:
            pass  # the session broke at once: splice, reading it, says so

    def close(self) -> None:
        if self.halves is not None:
            for half in self.halves:
                half.close()
            self.halves = None


def cmd_run_tty(args: argparse.Namespace, command: list[str]) -> int:
    """`rc run --tty`: submit a terminal job, wait in the queue, attach as
    soon as a worker has it (its size first), then splice once it runs."""
    if args.detach:
        raise UsageError("--tty and --detach do not go together (a terminal needs you there)")
    c = client(args)
    view, label = submit_run(c, args, command, _env(args, True), stdio="tty")
    with LocalTerminal(0) as term:
        term.quiet()
        early = _JobHalves(c, term)
        try:
            job = wait_running(
                c, view["job"], view.get("queue_position", 0), label, on_assigned=early.open
            )
            if job is None:
                return 130
            stderr(f"job {job['id']} on {on_devices(job)}")
            term.raw()  # from here every key, Ctrl-C included, is for the far side
            if early.halves is None and not early.ended:  # it ran before rc saw it assigned
                early.open(job)
        except BaseException:
            early.close()
            raise
        if early.halves is None:
            # it ended before its terminal was up (it could not start): say how
            term.restore()
            return exit_status(_final_job(c, job["id"], True))
        up, down = early.halves
        clean = splice(up, down, term, _job_over(c, job["id"]))
    return exit_status(_final_job(c, job["id"], clean))


def open_session(c: Client, hold: int, body: dict) -> dict:
    """POST /v1/jobs/{hold}/sessions: a tty or pipe session inside a hold of
    yours; returns its SessionView. A hold that does not exist is an RcError
    saying so."""
    try:
        return c.call(calls.SESSION_OPEN, hold, body=body)
    except ApiError as e:
        if e.status == 404:
            raise RcError(f"no hold {hold} (rc ps lists yours)") from None
        raise


def cmd_shell(args: argparse.Namespace) -> int:
    command = _command(args)
    c = client(args)
    with LocalTerminal(0) as term:
        term.raw()  # keys typed from now on, Ctrl-C included, are for the far side
        rows, cols = term.size()
        view = open_session(
            c,
            args.hold,
            {
                "stdio": "tty",
                "command": command,
                "cwd": job_cwd(args.cwd),
                "env": _env(args, True),
                "rows": rows,
                "cols": cols,
            },
        )
        sid, opened_by = view["session_id"], c.instance
        up, down = open_halves(c, calls.SESSION_RELAY.at(args.hold, sid))
        clean = splice(up, down, term, _session_over(c, args.hold, sid))
    return _session_code(c, _final_session(c, args.hold, sid, clean, opened_by))


def _final_session(c: Client, hold: int, sid: int, clean: bool, instance: str) -> dict:
    """The session's end as the controller recorded it. `instance` is the
    controller instance that opened it: a controller that went away, or
    another one answering since (a restart, a failover to a standby, which
    knows no session of the old one), ends it with an RcError saying so."""
    gone = (
        f"session {sid} of hold {hold} ended; the hold keeps running "
        f"(rc exec {hold} -- ... starts another)"
    )
    try:
        return wait_session(c, hold, sid, give_up_after=300.0 if clean else 5.0)
    except TransportError:
        raise RcError(f"the controller went away (connection lost): {gone}") from None
    except ApiError as e:
        if e.status == 404 and instance and c.instance != instance:
            raise RcError(
                f"the controller went away (another one answers now: a restart or a "
                f"failover): {gone}"
            ) from None
        raise


def cmd_exec(args: argparse.Namespace) -> int:
    command = _command(args)
    if not command:
        raise UsageError("give a command after --, e.g. rc exec 42 -- python3 train.py")
    c = client(args)
    view = open_session(
        c,
        args.hold,
        {
            "stdio": "pipe",
            "command": command,
            "cwd": job_cwd(args.cwd),
            "env": _env(args, False),
        },
    )
    sid, opened_by = view["session_id"], c.instance
    up, down = open_halves(c, calls.SESSION_RELAY.at(args.hold, sid))
    try:
        clean = splice(up, down, None, _session_over(c, args.hold, sid))
    except KeyboardInterrupt:
        return 130  # closing the halves ended the session: the command is hung up
    final = _final_session(c, args.hold, sid, clean, opened_by)
    if final.get("stderr"):
        if final.get("stderr_dropped"):
            sys.stderr.write(
                f"[rc: {final['stderr_dropped']} earlier bytes of stderr were not kept]\n"
            )
        sys.stderr.write(final["stderr"])
        sys.stderr.flush()
    return _session_code(c, final)
