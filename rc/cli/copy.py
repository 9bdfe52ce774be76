"""`rc cp SRC DST`: files and directories between here and a device.

`host:name:path` names the remote side (split on the last colon; see
parse_location). The copy rides on the relay in pipe mode: inside your hold
on the device (`--hold ID`, or the one you have there), else as a short job
on the free device; a device someone else holds is refused by name. A tar
stream goes through (rc.cli.archive: modes and symlinks kept, nothing written
outside the destination, a partial copy never left under its final name),
and the remote tar's own error text is shown on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

from rc.cli import archive
from rc.cli.context import UsageError, add_client_flags, client, number_in, stderr
from rc.cli.follow import submit, wait_terminal
from rc.cli.output import on_devices, one_line
from rc.cli.relay import open_halves, open_session, wait_session
from rc.proto import calls, copyjob
from rc.proto.client import Client
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.relay import Download, Upload

__all__ = ["Remote", "add_parsers", "cmd_cp", "parse_location"]

COPY_WAIT_S = 1800.0
"""Seconds in a row rc cp retries an unreachable controller while it waits for
the far side's result."""
STDERR_SHOWN = 4096
"""Characters of a failed copy's stderr shown."""
PROGRESS_EVERY_S = 0.25


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "cp",
        help="copy files or directories to or from a device",
        description="Copy SRC to DST, one of them on a device written "
        "host:name:path (a relative remote path is relative to the home "
        "directory there). DST ending in '/' or naming an existing directory "
        "means 'into it'. Uses your hold on the device if you have one.",
    )
    p.add_argument("src", metavar="SRC", help="what to copy: a local path, or host:name:path")
    p.add_argument("dst", metavar="DST", help="where to: host:name:path, or a local path")
    p.add_argument(
        "--hold",
        type=number_in(1),
        default=None,
        metavar="ID",
        help="copy inside this hold of yours (default: your hold on that device, "
        "if any; else a short job on the free device)",
    )
    add_client_flags(p)
    p.set_defaults(handler="copy:cmd_cp")


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
        raise UsageError(f"{text!r} names no device: write host:name:path, e.g. {head}:gpu0:{path}")
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
        # rc's own erase-to-end-of-line: past the escaping of sys.stderr
        out = getattr(sys.stderr, "unescaped", sys.stderr)
        out.write(f"\rrc: {self.verb} {text}, {rate:,.1f} MB/s\x1b[K{end}")
        out.flush()

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
    def relay(self) -> calls.RelayPaths:
        """The relay's paths: the pipe job's, else the session's."""
        if self.job_id is not None:
            return calls.JOB_RELAY.at(self.job_id)
        return calls.SESSION_RELAY.at(self.hold, self.sid)


def _choose(c: Client, device: str, hold: int | None) -> _Place:
    """Copy inside a hold (the one given, or the caller's on the device), else
    in a job on the free device; refuse a device someone else has."""
    if hold is not None:
        job = c.call(calls.JOB_GET, hold)["job"]
        if job["kind"] != "hold" or job["state"] not in ("assigned", "running"):
            raise RcError(f"job {hold} is not a running hold ({job['kind']}, {job['state']})")
        if device not in (job.get("device_ids") or [job["device_id"]]):
            raise RcError(f"hold {hold} is on {on_devices(job)}, not {device}")
        return _Place(device, hold=hold)
    views = {v["device"]["id"]: v for v in c.call(calls.DEVICES)["devices"]}
    view = views.get(device)
    if view is None:
        raise RcError(f"no device {device!r} (rc devices lists them)")
    holder = view.get("holder") or ""
    if holder:
        who = c.call(calls.WHOAMI)
        me = who.get("label") or who["name"]  # the holder is a label too
        what = "held" if view.get("kind") == "hold" else f"busy with job {view.get('job_id')}"
        if holder == me and view.get("kind") == "hold":
            stderr(f"copying inside your hold {view['job_id']} on {device}")
            return _Place(device, hold=view["job_id"])
        if holder == me:
            raise RcError(
                f"{device} is busy with your job {view.get('job_id')}; wait for it, "
                "or copy inside a hold (rc hold, then rc cp --hold ID)"
            )
        reason = f" ({view['reason']})" if view.get("reason") else ""
        raise RcError(
            one_line(f"{device} is {what} by {holder}{reason}; rc cp needs the device to itself")
        )
    return _Place(device)


def _start(c: Client, place: _Place, command: list[str]) -> None:
    """Start the remote side: a session in the hold, else a pipe job (the
    controller recognises its command and lists it as "rc cp SRC DST":
    rc.proto.copyjob)."""
    if place.hold is not None:
        view = open_session(c, place.hold, {"stdio": "pipe", "command": command})
        place.sid = view["session_id"]
        return
    body = {
        "device_id": place.device,
        "command": command,
        "stdio": "pipe",
        "no_wait": True,
        "idempotency_key": uuid.uuid4().hex,
    }
    try:
        place.job_id = submit(c, body)["job"]["id"]
    except ApiError as e:
        if e.code == "no_device_available":
            raise RcError(
                f"{place.device} is busy right now; try again, or copy inside a hold "
                "of yours (rc cp --hold ID)"
            ) from None
        raise


def _remote_failure(c: Client, place: _Place) -> str | None:
    """None when the remote side succeeded, else what went wrong there
    (exit status and the end of its stderr)."""
    if place.job_id is not None:
        job = wait_terminal(c, place.job_id, give_up_after=COPY_WAIT_S)
        if job["state"] == "succeeded":
            return None
        why = f"{job['state']}" + (f" ({job['kill_reason']})" if job.get("kill_reason") else "")
        with contextlib.suppress(RcError):
            log = c.call(calls.JOB_LOGS, place.job_id, params={"follow": "0"}).decode(
                "utf-8", "replace"
            )
            if log.strip() and job["state"] == "failed":
                return log.strip()[-STDERR_SHOWN:]  # the remote side's own words
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
        raise UsageError(
            "one side must be on a device, written host:name:path (e.g. gpu-box:gpu0:/data/)"
        )
    c = client(args)
    if isinstance(dst, Remote):
        return _upload(c, src, dst, args.hold)
    return _download(c, src, dst, args.hold)


def _upload(c: Client, src: str, dst: Remote, hold: int | None) -> int:
    source = archive.scan(src)
    for name in source.skipped:
        stderr(f"skipping {name!r}: not a file, directory or symlink")
    place = _choose(c, dst.device, hold)
    _start(c, place, copyjob.upload_command(dst.path, source.name, src))
    up, down = open_halves(c, place.relay)
    progress = _Progress("sent", source.total_bytes)
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            archive.send(source, _Sender(up, progress))
            up.finish()
        except TransportError:
            pass  # the remote side ended early: its status says why
        except OSError as e:  # a file that changed since the scan
            failed.append(e)
            # the stream ends broken (archive.send): the remote tar fails on
            # it and its script removes what it extracted
            with contextlib.suppress(TransportError):
                up.finish()
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
    why = _remote_failure(c, place)  # waits for the remote side to end (and clean up)
    if failed:
        e = failed[0]
        if isinstance(e, OSError) and e.filename:
            raise RcError(f"cannot read {e.filename}: {e.strerror}; nothing was copied")
        raise RcError(f"reading {src}: {e}")
    if why:
        raise RcError(f"copy to {dst.device} failed: {why}")
    return 0


def _local_target(dst: str, name: str) -> tuple[str, str]:
    """(directory, final name) of a download to local path `dst`: into `dst`
    when it is a directory or ends with '/', else at `dst` itself. The
    directory must exist (as with scp, rc cp creates none): RcError naming it."""
    if dst.endswith(("/", os.sep)) or os.path.isdir(dst):
        parent, final = dst, name
    else:
        parent, final = os.path.dirname(dst) or ".", os.path.basename(dst)
    if not os.path.isdir(parent):
        shown = os.path.abspath(parent)
        if os.path.exists(parent):
            raise RcError(f"{shown} is not a directory")
        raise RcError(f"no such directory: {shown} ({archive.NO_PARENT})")
    return parent, final


def _local_scratch(parent: str) -> str:
    """The hidden directory under `parent` a download is received into
    (renamed into place once whole). RcError in one line, before anything is
    started on the device, when it cannot be made: a current directory that
    was removed, a directory the caller may not write."""
    try:
        shown = os.path.abspath(parent)
        return tempfile.mkdtemp(prefix=".rc-cp-", dir=parent)
    except FileNotFoundError:
        if not os.path.isabs(parent):
            try:
                os.getcwd()
            except FileNotFoundError:
                raise RcError(
                    "the current directory no longer exists; cd somewhere and copy again"
                ) from None
        raise RcError(f"no such directory: {shown}") from None
    except OSError as e:
        raise RcError(f"cannot write to {shown}: {e.strerror}") from None


def _download(c: Client, src: Remote, dst: str, hold: int | None) -> int:
    path = src.path.rstrip("/") or "/"
    if path == "/":
        raise UsageError("rc cp will not copy a whole root directory")
    name = os.path.basename(path)
    parent, final = _local_target(dst, name)
    tmp = _local_scratch(parent)  # before anything is asked of the far side
    try:
        place = _choose(c, src.device, hold)
        _start(c, place, copyjob.download_command(src.path, dst))
    except BaseException:
        _remove_tree(tmp)
        raise
    up, down = open_halves(c, place.relay)
    progress = _Progress("received", None)
    try:
        with contextlib.suppress(TransportError):
            up.finish()  # the remote tar reads nothing
        local_error = None
        try:
            top = archive.receive(_Receiver(down, progress), tmp)
        except (archive.ArchiveError, TransportError, OSError) as e:
            local_error = e
        except Exception as e:  # noqa: BLE001 - tarfile's errors on a damaged or cut stream
            local_error = RcError(f"the archive is damaged or was cut short ({e})")
        if local_error is not None and not isinstance(local_error, archive.EmptyArchive):
            down.close()  # ends the session: the remote side is stopped
            up.close()
        else:
            for _ in down:
                pass  # the end-of-archive padding
        progress.done()
        why = _remote_failure(c, place)  # waits for the remote side to end
        if isinstance(local_error, archive.EmptyArchive) and why:
            # nothing came because the remote tar failed first: its words
            raise RcError(f"copy from {src.device} failed: {why}")
        if isinstance(local_error, (archive.ArchiveError, OSError)):
            # refused (or not writable) here: the remote side was stopped for
            # it, so its "pipe closed" is no reason
            raise RcError(f"copy from {src.device} refused: {local_error}")
        if why:
            raise RcError(f"copy from {src.device} failed: {why}")
        if local_error is not None:
            raise RcError(f"copy from {src.device} failed: {local_error}")
        target = os.path.join(parent, final)
        if os.path.isdir(target) and not os.path.islink(target) and os.listdir(target):
            raise RcError(
                f"{target} is a directory that is not empty; rc cp never merges "
                "into one (remove it, or copy to another name)"
            )
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
    def writable(func, p, exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=writable)
