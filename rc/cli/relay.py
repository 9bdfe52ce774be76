"""`rc run --tty`, `rc shell`, `rc exec`, `rc cp`: the client side of the relay.

- `rc run --tty [-d DEV | -s SEL] [-- CMD]`: a terminal job (a login shell
  on the device's host when no command is given). While it waits in the
  queue the local terminal only stops echoing (keys typed meanwhile wait in
  it and are sent once the job starts; Ctrl-C still cancels); once it runs
  the terminal is raw, so every key, Ctrl-C and Ctrl-Z included, reaches the
  remote foreground process, and window resizes follow. rc exits with the
  job's exit code.
- `rc shell HOLD [-- CMD]`: the same inside a hold you have, with no second
  lease; its processes end with the hold.
- `rc exec HOLD -- CMD`: CMD inside the hold with stdin and stdout wired
  through byte for byte (pipe mode, for scripts); its stderr is shown when
  it ends; rc exits with its code.
- `rc cp SRC DST`: files and directories between here and a device,
  `host:name:path` naming the remote side (rc.cli.archive has the rules).

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
import tempfile
import termios
import threading
import time
import tty
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from rc.cli.context import UsageError, client, stderr
from rc.proto.client import Client
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.relay import Download, Upload, data_frame, resize_frame

__all__ = ["add_parsers", "cmd_run_tty", "cmd_shell", "cmd_exec", "cmd_cp", "parse_location",
           "Remote", "LocalTerminal"]

TTY_CHUNK = 4096
"""Bytes of keyboard input per frame (inventory §10)."""
PIPE_CHUNK = 1 << 20
OVER_GRACE_S = 5.0
"""After the job or session ended, how long its output may still arrive."""
COPY_WAIT_S = 1800.0
"""rc cp's overall bound on waiting for the copy to finish (inventory §10)."""
STDERR_SHOWN = 4096
"""Characters of a failed copy's stderr shown."""
PROGRESS_EVERY_S = 0.25


def add_parsers(sub) -> None:
    from rc.cli import add_client_flags

    _session_parser(sub, "shell", "a terminal on a device you hold (no second lease)",
                    "Open a terminal inside hold HOLD: a login shell on the device's host with "
                    "its CUDA_VISIBLE_DEVICES, or CMD. It ends when the hold ends.",
                    "what to run instead of the login shell")
    _session_parser(sub, "exec", "run a command inside a hold, stdin and stdout piped through",
                    "Run CMD inside hold HOLD with this stdin and stdout wired through byte for "
                    "byte; its stderr is shown when it ends. Exits with CMD's exit code.",
                    "the command and its arguments")

    p = sub.add_parser("cp", help="copy files or directories to or from a device",
                       description="Copy SRC to DST, one of them on a device written "
                       "host:name:path (a relative remote path is relative to the home "
                       "directory there). DST ending in '/' or naming an existing directory "
                       "means 'into it'. Uses your hold on the device if you have one.")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")
    p.add_argument("--hold", type=int, default=None, metavar="ID",
                   help="copy inside this hold of yours (default: your hold on that device, "
                   "if any; else a short job on the free device)")
    add_client_flags(p)
    p.set_defaults(handler="relay:cmd_cp")


def _session_parser(sub, name: str, help: str, description: str, command_help: str) -> None:
    """`rc shell` and `rc exec`: HOLD, --cwd, -e, -- CMD."""
    from rc.cli import add_client_flags

    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("hold", type=int, metavar="HOLD")
    p.add_argument("--cwd", default=None, help="working directory on the device's host "
                   "(default: the current directory, else the home directory there)")
    p.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable (repeatable)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD", help=command_help)
    add_client_flags(p)
    p.set_defaults(handler=f"relay:cmd_{name}")


def _command(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else list(raw)


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
                    "HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
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

    def __enter__(self) -> LocalTerminal:
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


def open_halves(c: Client, base: str) -> tuple[Upload, Download]:
    """The client's two halves of the session at `base` (input, output)."""
    down = Download(c, base + "/tty/out")
    try:
        up = Upload(c, base + "/tty/in")
    except RcError:
        down.close()
        raise
    return up, down


def _pump_stdin(up: Upload, fd: int, term: LocalTerminal | None, wake: int) -> None:
    """stdin → the session: frames in tty mode (resize first and on every
    SIGWINCH, which writes to `wake`), raw chunks in pipe mode; end of file
    ends the input."""
    try:
        if term is not None:
            up.send(resize_frame(*(term.size() if term.is_tty else (24, 80))))
        try:
            os.fstat(fd)
        except OSError:  # no stdin at all: end of file at once
            up.finish()
            return
        while True:
            ready, _, _ = select.select([fd, wake], [], [])
            if wake in ready:
                os.read(wake, 512)
                if term is not None and term.is_tty:
                    up.send(resize_frame(*term.size()))
            if fd in ready:
                data = os.read(fd, TTY_CHUNK if term is not None else PIPE_CHUNK)
                if not data:
                    if term is not None:  # piped into a terminal: end of file is ^D there
                        up.send(data_frame(b"\x04"))
                    up.finish()
                    return
                up.send(data_frame(data) if term is not None else data)
    except (TransportError, OSError):
        return  # the session ended


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def splice(up: Upload, down: Download, term: LocalTerminal | None,
           over: Callable[[], None] | None = None) -> bool:
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
    from rc.cli.run import wait_terminal

    return lambda: wait_terminal(c, job_id)


def _session_over(c: Client, hold: int, sid: int) -> Callable[[], None]:
    return lambda: wait_session(c, hold, sid)


def wait_session(c: Client, hold: int, sid: int, give_up_after: float = 300.0) -> dict:
    """The session once it ended (long poll; transport failures retried for
    up to `give_up_after` seconds in a row)."""
    state, failing_since = "", None
    while True:
        try:
            view = c.get(f"/v1/jobs/{hold}/sessions/{sid}",
                         params={"wait": "50s", "state": state}, timeout=65)
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
    from rc.cli.run import wait_terminal

    try:
        return wait_terminal(c, job_id, give_up_after=None if clean else 5.0)
    except TransportError:
        raise RcError(f"lost the connection to the controller; job {job_id} may still be "
                      f"running (rc ps, rc kill {job_id})") from None


def _session_code(c: Client, view: dict) -> int:
    """rc's exit code for an ended session (its own, 1 without one), saying
    why on stderr when it did not simply exit (the hold ending, above all)."""
    code = view.get("exit_code")
    name = f"session {view['session_id']} of hold {view['hold_id']}"
    why = view.get("reason") or "no exit code"
    if code is None or (code != 0 and not why.startswith("exited with code")):
        if code is None or code >= 128:
            with contextlib.suppress(RcError):
                hold = c.get(f"/v1/jobs/{view['hold_id']}", timeout=10)["job"]
                if hold["state"] not in ("assigned", "running") or hold.get("kill_reason"):
                    why = f"hold {hold['id']} ended ({hold.get('kill_reason') or hold['state']})"
        stderr(f"{name}: {why}")
    if code is None:
        return 1
    return code if 0 <= code < 256 else 1


def _env(items: list[str], tty_mode: bool) -> dict[str, str]:
    from rc.cli.run import _parse_env

    env = _parse_env(items)
    if tty_mode:
        env.setdefault("TERM", os.environ.get("TERM") or "xterm-256color")
    return env


# -- commands -------------------------------------------------------------------------


def cmd_run_tty(args: argparse.Namespace, command: list[str]) -> int:
    """`rc run --tty`: submit a terminal job, wait in the queue, attach."""
    from rc.cli.run import _target, exit_status, submit, wait_started

    if args.detach:
        raise UsageError("--tty and --detach do not go together (a terminal needs you there)")
    c = client(args)
    target, label = _target(args)
    body = {**target, "command": command, "stdio": "tty",
            "cwd": args.cwd if args.cwd is not None else os.getcwd(),
            "env": _env(args.env, True), "idempotency_key": uuid.uuid4().hex,
            "priority": args.priority, "max_runtime_seconds": args.max_runtime,
            "idle_timeout_seconds": args.idle_timeout, "no_wait": args.no_wait,
            "as_user": args.as_user}
    try:
        view = submit(c, body)
    except ApiError as e:
        if e.code == "no_device_available":
            raise RcError(f"{label} is busy and --no-wait was given: {e.message}") from None
        raise
    with LocalTerminal(0) as term:
        term.quiet()
        job = wait_started(c, view["job"], view.get("queue_position", 0), label)
        if job is None:
            return 130
        stderr(f"job {job['id']} on {job['device_id']}")
        up, down = open_halves(c, f"/v1/jobs/{job['id']}")
        term.raw()
        clean = splice(up, down, term, _job_over(c, job["id"]))
    return exit_status(_final_job(c, job["id"], clean))


def _open_session(c: Client, hold: int, body: dict) -> dict:
    try:
        return c.post(f"/v1/jobs/{hold}/sessions", body)
    except ApiError as e:
        if e.status == 404:
            raise RcError(f"no hold {hold} (rc ps lists yours)") from None
        raise


def cmd_shell(args: argparse.Namespace) -> int:
    c = client(args)
    with LocalTerminal(0) as term:
        rows, cols = term.size()
        view = _open_session(c, args.hold, {
            "stdio": "tty", "command": _command(args.command),
            "cwd": args.cwd if args.cwd is not None else os.getcwd(),
            "env": _env(args.env, True), "rows": rows, "cols": cols})
        sid = view["session_id"]
        up, down = open_halves(c, f"/v1/jobs/{args.hold}/sessions/{sid}")
        term.raw()
        clean = splice(up, down, term, _session_over(c, args.hold, sid))
    return _session_code(c, _final_session(c, args.hold, sid, clean))


def _final_session(c: Client, hold: int, sid: int, clean: bool) -> dict:
    try:
        return wait_session(c, hold, sid, give_up_after=300.0 if clean else 5.0)
    except TransportError:
        raise RcError(f"lost the connection to the controller during session {sid} of hold "
                      f"{hold}") from None


def cmd_exec(args: argparse.Namespace) -> int:
    command = _command(args.command)
    if not command:
        raise UsageError("give a command after --, e.g. rc exec 42 -- python3 train.py")
    c = client(args)
    view = _open_session(c, args.hold, {
        "stdio": "pipe", "command": command,
        "cwd": args.cwd if args.cwd is not None else os.getcwd(),
        "env": _env(args.env, False)})
    sid = view["session_id"]
    up, down = open_halves(c, f"/v1/jobs/{args.hold}/sessions/{sid}")
    try:
        clean = splice(up, down, None, _session_over(c, args.hold, sid))
    except KeyboardInterrupt:
        return 130  # closing the halves ended the session: the command is hung up
    final = _final_session(c, args.hold, sid, clean)
    if final.get("stderr"):
        if final.get("stderr_dropped"):
            sys.stderr.write(f"[rc: {final['stderr_dropped']} earlier bytes of stderr "
                             "were not kept]\n")
        sys.stderr.write(final["stderr"])
        sys.stderr.flush()
    return _session_code(c, final)


# -- rc cp ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Remote:
    """The remote side of a copy: device id host:name and a path there."""

    device: str
    path: str


def parse_location(text: str) -> str | Remote:
    """A Remote for `host:name:path` (split on the last colon, the head being
    exactly host:name), else the text as a local path. Raises UsageError for a
    device without a path and for `word:/abs` (a device with its name left out)."""
    head, sep, path = text.rpartition(":")
    if not sep:
        return text
    host, _, name = head.partition(":")
    if head.count(":") == 1 and host and name:
        if not path:
            raise UsageError(f"{text!r} has no path after the device; e.g. {head}:/tmp/")
        return Remote(head, path)
    if head and ":" not in head and "/" not in head and path.startswith("/"):
        raise UsageError(f"{text!r} names no device: write host:name:path, "
                         f"e.g. {head}:gpu0:{path}")
    return text


class _Progress:
    """A progress line on stderr when it is a terminal (else silent)."""

    def __init__(self, verb: str, total: int | None) -> None:
        self.verb = verb
        self.total = total
        self.bytes = 0
        self.on = sys.stderr.isatty()
        self.started = time.monotonic()
        self.shown = 0.0

    def add(self, n: int) -> None:
        self.bytes += n
        now = time.monotonic()
        if self.on and now - self.shown >= PROGRESS_EVERY_S:
            self.shown = now
            self._show(now)

    def _show(self, now: float, end: str = "") -> None:
        mb = self.bytes / 1e6
        rate = mb / max(now - self.started, 1e-6)
        text = f"{mb:,.1f} MB"
        if self.total:
            text += f" of {self.total / 1e6:,.1f} MB ({min(100, 100 * self.bytes // self.total)}%)"
        sys.stderr.write(f"\rrc: {self.verb} {text}, {rate:,.1f} MB/s\x1b[K{end}")
        sys.stderr.flush()

    def done(self) -> None:
        if self.on:
            self._show(time.monotonic(), "\n")


class _Sender:
    """A file-like sink for tarfile: chunks go to the session's input."""

    def __init__(self, up: Upload, progress: _Progress) -> None:
        self.up = up
        self.progress = progress

    def write(self, data) -> int:
        self.up.send(data if isinstance(data, bytes) else bytes(data))
        self.progress.add(len(data))
        return len(data)


class _Receiver:
    """A file-like source for tarfile: the session's output."""

    def __init__(self, down: Download, progress: _Progress) -> None:
        self.down = down
        self.progress = progress

    def read(self, n: int = -1) -> bytes:
        data = self.down.read(n if n and n > 0 else 1 << 20)
        self.progress.add(len(data))
        return data


@dataclass(slots=True)
class _Place:
    """Where the copy runs: a pipe job (`job_id`) or a session in `hold`."""

    device: str
    hold: int | None = None
    job_id: int | None = None
    sid: int | None = None

    @property
    def base(self) -> str:
        if self.job_id is not None:
            return f"/v1/jobs/{self.job_id}"
        return f"/v1/jobs/{self.hold}/sessions/{self.sid}"


def _choose(c: Client, device: str, hold: int | None) -> _Place:
    """Copy inside a hold (the one given, or the caller's on the device), else
    in a job on the free device; refuse a device someone else has."""
    if hold is not None:
        job = c.get(f"/v1/jobs/{hold}")["job"]
        if job["kind"] != "hold" or job["state"] not in ("assigned", "running"):
            raise RcError(f"job {hold} is not a running hold ({job['kind']}, {job['state']})")
        if job["device_id"] != device:
            raise RcError(f"hold {hold} is on {job['device_id']}, not {device}")
        return _Place(device, hold=hold)
    views = {v["device"]["id"]: v for v in c.get("/v1/devices")["devices"]}
    view = views.get(device)
    if view is None:
        raise RcError(f"no device {device!r} (rc devices lists them)")
    holder = view.get("holder") or ""
    if holder:
        me = c.get("/v1/whoami")["name"]
        what = "held" if view.get("kind") == "hold" else f"busy with job {view.get('job_id')}"
        if holder == me and view.get("kind") == "hold":
            stderr(f"copying inside your hold {view['job_id']} on {device}")
            return _Place(device, hold=view["job_id"])
        if holder == me:
            raise RcError(f"{device} is busy with your job {view.get('job_id')}; wait for it, "
                          "or copy inside a hold (rc hold, then rc cp --hold ID)")
        reason = f" ({view['reason']})" if view.get("reason") else ""
        raise RcError(f"{device} is {what} by {holder}{reason}; rc cp needs the device to "
                      "itself")
    return _Place(device)


def _start(c: Client, place: _Place, command: list[str]) -> None:
    if place.hold is not None:
        view = _open_session(c, place.hold, {"stdio": "pipe", "command": command})
        place.sid = view["session_id"]
        return
    body = {"device_id": place.device, "command": command, "stdio": "pipe", "no_wait": True,
            "idempotency_key": uuid.uuid4().hex}
    from rc.cli.run import submit

    try:
        place.job_id = submit(c, body)["job"]["id"]
    except ApiError as e:
        if e.code == "no_device_available":
            raise RcError(f"{place.device} is busy right now; try again, or copy inside a hold "
                          "of yours (rc cp --hold ID)") from None
        raise


def _remote_failure(c: Client, place: _Place) -> str | None:
    """None when the remote side succeeded, else what went wrong there
    (exit status and the end of its stderr)."""
    if place.job_id is not None:
        from rc.cli.run import wait_terminal

        job = wait_terminal(c, place.job_id, give_up_after=COPY_WAIT_S)
        if job["state"] == "succeeded":
            return None
        why = f"{job['state']}" + (f" ({job['kill_reason']})" if job.get("kill_reason") else "")
        with contextlib.suppress(RcError):
            log = c.request("GET", f"/v1/jobs/{place.job_id}/logs",
                            params={"follow": "0"}).body.decode("utf-8", "replace")
            if log.strip():
                why += ": " + log.strip()[-STDERR_SHOWN:]
        return why
    view = wait_session(c, place.hold, place.sid, give_up_after=COPY_WAIT_S)
    if view.get("exit_code") == 0:
        return None
    why = view.get("reason") or f"exit code {view.get('exit_code')}"
    if view.get("stderr", "").strip():
        why += ": " + view["stderr"].strip()[-STDERR_SHOWN:]
    return why


def cmd_cp(args: argparse.Namespace) -> int:
    src, dst = parse_location(args.src), parse_location(args.dst)
    if isinstance(src, Remote) and isinstance(dst, Remote):
        raise UsageError("copy between a device and here: only one side may be host:name:path")
    if not isinstance(src, Remote) and not isinstance(dst, Remote):
        raise UsageError("one side must be on a device, written host:name:path "
                         "(e.g. gpu-box:gpu0:/data/)")
    c = client(args)
    if isinstance(dst, Remote):
        return _upload(c, src, dst, args.hold)
    return _download(c, src, dst, args.hold)


def _upload(c: Client, src: str, dst: Remote, hold: int | None) -> int:
    from rc.cli import archive

    source = archive.scan(src)
    for name in source.skipped:
        stderr(f"skipping {name!r}: not a file, directory or symlink")
    place = _choose(c, dst.device, hold)
    _start(c, place, ["sh", "-c", archive.UPLOAD_SCRIPT, "sh", dst.path, source.name])
    up, down = open_halves(c, place.base)
    progress = _Progress("sent", source.total_bytes)
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            archive.send(source, _Sender(up, progress))
            up.finish()
        except TransportError:
            pass  # the remote side ended early: its status says why
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failed.append(e)
            up.close()

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        for _ in down:
            pass  # the remote tar prints nothing on stdout
    except TransportError:
        pass
    finally:
        t.join()
        down.close()
        up.close()
    progress.done()
    if failed:
        raise RcError(f"reading {src}: {failed[0]}")
    why = _remote_failure(c, place)
    if why:
        raise RcError(f"copy to {dst.device} failed: {why}")
    return 0


def _local_target(dst: str, name: str) -> tuple[str, str]:
    """(directory, final name) of a download to local path `dst`."""
    if os.path.isdir(dst) or dst.endswith(("/", os.sep)):
        os.makedirs(dst, exist_ok=True)
        return dst, name
    parent = os.path.dirname(dst) or "."
    if not os.path.isdir(parent):
        raise RcError(f"{parent}: no such directory")
    return parent, os.path.basename(dst)


def _download(c: Client, src: Remote, dst: str, hold: int | None) -> int:
    from rc.cli import archive

    path = src.path.rstrip("/") or "/"
    if path == "/":
        raise UsageError("rc cp will not copy a whole root directory")
    name = os.path.basename(path)
    parent, final = _local_target(dst, name)
    place = _choose(c, src.device, hold)
    _start(c, place, ["sh", "-c", archive.DOWNLOAD_SCRIPT, "sh", src.path])
    up, down = open_halves(c, place.base)
    progress = _Progress("received", None)
    tmp = tempfile.mkdtemp(prefix=".rc-cp-", dir=parent)
    try:
        with contextlib.suppress(TransportError):
            up.finish()  # the remote tar reads nothing
        local_error = None
        try:
            top = archive.receive(_Receiver(down, progress), tmp)
        except (archive.ArchiveError, TransportError, OSError) as e:
            local_error = e
        except Exception as e:  # tarfile's errors on a damaged or cut stream
            local_error = RcError(f"the archive is damaged or was cut short ({e})")
        if local_error is not None:
            down.close()  # ends the session: the remote side is stopped
            up.close()
        else:
            for _ in down:
                pass  # the end-of-archive padding
        progress.done()
        why = _remote_failure(c, place)
        if why:
            raise RcError(f"copy from {src.device} failed: {why}")
        if local_error is not None:
            raise RcError(f"copy from {src.device} refused: {local_error}")
        target = os.path.join(parent, final)
        try:
            os.rename(os.path.join(tmp, top), target)
        except OSError as e:
            raise RcError(f"cannot put the copy at {target}: {e.strerror}") from None
        return 0
    finally:
        down.close()
        up.close()
        _remove_tree(tmp)


def _remove_tree(path: str) -> None:
    import shutil

    def writable(func, p, exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=writable)

