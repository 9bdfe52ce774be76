"""The controller and worker processes that `rc up` starts, waits for and
stops: each is started with `--ready-fd N` and is up once it has written
its line there; stopping is SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rc.cli.context import stderr
from rc.proto.errors import RcError

__all__ = [
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "alive_pid",
    "spawn_ready",
    "stop_pid",
    "stop_process",
    "supervise",
]

START_TIMEOUT_S = 30.0
"""How long a started process has to write its ready line, in seconds."""
STOP_TIMEOUT_S = 60.0
"""How long a process has to exit after SIGTERM before it is killed, in seconds."""


def alive_pid(pid) -> bool:
    """Whether `pid` (an int from up.json, maybe missing) is a live process."""
    return isinstance(pid, int) and pid > 0 and _alive(pid)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.isdir("/proc")  # no /proc entry although /proc exists: gone


def spawn_ready(
    cmd: list[str], log, detach: bool, what: str, log_path: Path, extra_env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """Start `cmd` with `--ready-fd N` appended and wait (START_TIMEOUT_S) for
    the line it writes there once ready; returns the process and that line."""
    r, w = os.pipe()
    seen = log_path.stat().st_size if log_path.exists() else 0
    proc = subprocess.Popen(
        [*cmd, "--ready-fd", str(w)],
        pass_fds=(w,),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=detach,
    )
    os.close(w)
    deadline = time.monotonic() + START_TIMEOUT_S
    buf = b""
    os.set_blocking(r, False)
    try:
        while b"\n" not in buf:
            if proc.poll() is not None:
                raise RcError(f"the {what} did not start" + _tail(log_path, seen, detach))
            if time.monotonic() > deadline:
                proc.terminate()
                raise RcError(
                    f"the {what} did not start within {START_TIMEOUT_S:.0f}s"
                    + _tail(log_path, seen, detach)
                )
            try:
                buf += os.read(r, 4096)
            except BlockingIOError:
                time.sleep(0.05)
    finally:
        os.close(r)
    return proc, buf.decode().strip()


def _tail(path: Path, seen: int, detach: bool) -> str:
    """The last lines this start wrote to `path` (its own, not older runs')."""
    if not detach:
        return " (see the messages above)"
    try:
        with open(path, "rb") as f:
            f.seek(seen)
            lines = f.read().decode(errors="replace").strip().splitlines()[-5:]
    except OSError:
        return ""
    return (":\n  " + "\n  ".join(lines)) if lines else ""


def supervise(
    controller: subprocess.Popen, worker: subprocess.Popen, stopped: Callable[[], None]
) -> int:
    """The foreground `rc up`: wait until SIGINT or SIGTERM, or until either
    child exits, then stop both and call `stopped` (rc up's record of them
    is updated). Returns the exit code: 130 after SIGINT, 0 after SIGTERM,
    1 when a child exited by itself (said on stderr)."""
    asked: dict = {"now": False, "sig": None}

    def on_signal(signum, frame):
        asked["now"], asked["sig"] = True, signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not asked["now"] and controller.poll() is None and worker.poll() is None:
            try:
                worker.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        died = [
            what
            for what, p in (("worker", worker), ("controller", controller))
            if p.poll() is not None
        ]
        stop_process(worker, "worker")
        stop_process(controller, "controller")
        stopped()
    if not asked["now"]:
        stderr(f"the {' and the '.join(died)} exited; stopped everything")
        return 1
    return 130 if asked["sig"] == signal.SIGINT else 0


def stop_process(proc: subprocess.Popen, what: str) -> None:
    """Stop a child of ours (named `what` in messages): SIGTERM, then SIGKILL
    after STOP_TIMEOUT_S (said on stderr); waited for either way."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stderr(f"{what} did not stop within {STOP_TIMEOUT_S:.0f}s; killing it")
        proc.kill()
        proc.wait()


def stop_pid(pid: int, what: str) -> None:
    """Stop process `pid` (one an earlier `rc up -d` started; not necessarily
    our child): SIGTERM, then SIGKILL after STOP_TIMEOUT_S (said on stderr)."""
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _alive(pid):
        if time.monotonic() > deadline:
            stderr(f"{what} (pid {pid}) did not stop within {STOP_TIMEOUT_S:.0f}s; killing it")
            os.kill(pid, signal.SIGKILL)
            return
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
