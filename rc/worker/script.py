"""Running an operator's script with bounds: lease hooks, verify scripts and
probe drop-ins.

A script runs with the same supervision as a job: its own session and process
group, SIGTERM → grace → SIGKILL when it must end, and whatever is left in its
group when it exits is killed. It gets no stdin. Its stdout is kept up to
`out_cap` bytes (the head; more marks `out_overflow`) and its stderr as the
last `err_tail` bytes; with `merge=True` both go to one pipe whose last
`err_tail` bytes are kept in `err` (a hook's output, for its failure reason). Every wait has a deadline: the script's
`timeout`, then the kill grace, then a short drain of the pipes.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rc.proto.duration import format_duration
from rc.worker import procfs, supervise
from rc.worker.clock import SYSTEM, Clock

__all__ = ["ERR_TAIL", "OUT_CAP", "PIPE_DRAIN_S", "ScriptResult", "run"]

OUT_CAP = 64 << 10
"""Bytes of stdout kept by default (the head)."""
ERR_TAIL = 4 << 10
"""Bytes of stderr kept by default (the tail)."""
PIPE_DRAIN_S = 1.0
"""How long output is still read after the script's group is gone."""
TICK_S = 0.05


@dataclass(slots=True)
class ScriptResult:
    """How a script ended.

    outcome: the leader's exit (None when it never started or was never
    reaped); error: why it could not start ("" when it did); timed_out /
    cancelled: we ended it; out / err: the kept output (see the module
    docstring); survivors: group members alive after everything.
    """

    outcome: supervise.Outcome | None = None
    error: str = ""
    timed_out: bool = False
    cancelled: bool = False
    timeout: float = 0.0
    out: bytes = b""
    out_overflow: bool = False
    err: bytes = b""
    survivors: list[procfs.ProcStat] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """It ran and exited 0 on its own."""
        return (
            not self.error
            and not self.timed_out
            and not self.cancelled
            and self.outcome is not None
            and self.outcome.exit_code == 0
            and not self.outcome.signal
        )

    def describe(self) -> str:
        """What happened, in words: "exited 3", "killed by SIGKILL",
        "timed out after 5s", "run: No such file or directory"."""
        if self.error:
            return f"run: {self.error}"
        if self.timed_out:
            return f"timed out after {format_duration(self.timeout)}"
        if self.cancelled:
            return "cancelled"
        if self.outcome is None:
            return "did not end"
        if self.outcome.signal:
            return f"killed by {supervise.signal_name(self.outcome.signal)}"
        return f"exited {self.outcome.exit_code}"


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    grace: float,
    cancel: threading.Event | None = None,
    merge: bool = False,
    out_cap: int = OUT_CAP,
    err_tail: int = ERR_TAIL,
    cwd: str | None = None,
    clock: Clock = SYSTEM,
) -> ScriptResult:
    """Run `argv` (never through a shell) for at most `timeout` seconds of
    `clock` (the kill `grace` and the final drain of its pipes are real
    seconds: rc.worker.clock says why).

    `cancel`, when set, ends it early (result.cancelled). Never raises for a
    script that cannot start: result.error says why.
    """
    res = ScriptResult(timeout=timeout)
    r_out, w_out = os.pipe()
    r_err, w_err = (None, None) if merge else os.pipe()
    try:
        try:
            group = supervise.spawn(
                argv, cwd=cwd, env=env, stdout=w_out, stderr=w_out if merge else w_err
            )
        except OSError as e:
            res.error = e.strerror or str(e)
            return res
        except ValueError as e:  # an argument with a NUL byte
            res.error = str(e)
            return res
    finally:
        os.close(w_out)
        if w_err is not None:
            os.close(w_err)
        if res.error:
            os.close(r_out)
            if r_err is not None:
                os.close(r_err)
    reader = _Reader(r_out, r_err, out_cap, err_tail)
    deadline = clock.monotonic() + max(0.0, timeout)
    try:
        while True:
            res.outcome = group.wait(0)
            if res.outcome is not None:
                _, res.survivors = supervise.reap_stragglers(group)
                break
            if cancel is not None and cancel.is_set():
                res.cancelled = True
            else:
                left = deadline - clock.monotonic()  # read once per turn
                res.timed_out = left <= 0
            if res.cancelled or res.timed_out:
                res.outcome, res.survivors = supervise.kill_group(group, grace)
                break
            reader.pump(min(TICK_S, left))
        reader.drain(time.monotonic() + PIPE_DRAIN_S)
    finally:
        group.close()
        reader.close()
    res.out, res.out_overflow = bytes(reader.out), reader.overflow
    res.err = bytes(reader.err)
    return res


class _Reader:
    """Reads a script's stdout (head kept) and stderr (tail kept) without
    ever holding more than the caps."""

    def __init__(self, out_fd: int, err_fd: int | None, out_cap: int, err_tail: int) -> None:
        # merged output is diagnostics: its tail is kept, like stderr's
        self.fds = {out_fd: "out" if err_fd is not None else "err"}
        if err_fd is not None:
            self.fds[err_fd] = "err"
        self.out_cap, self.err_tail = out_cap, err_tail
        self.out = bytearray()
        self.err = bytearray()
        self.overflow = False
        self.poller = select.poll()
        for fd in self.fds:
            self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def pump(self, timeout: float) -> None:
        """Read what arrives within `timeout` seconds."""
        if not self.fds:
            time.sleep(timeout)
            return
        for fd, _ in self.poller.poll(int(timeout * 1000)):
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                self.poller.unregister(fd)
                os.close(fd)
                del self.fds[fd]
            elif self.fds[fd] == "out":
                room = self.out_cap - len(self.out)
                if len(data) > room:
                    self.overflow = True
                self.out += data[: max(0, room)]
            else:
                self.err += data
                if len(self.err) > self.err_tail:
                    del self.err[: len(self.err) - self.err_tail]

    def drain(self, deadline: float) -> None:
        """Read until every pipe is closed or the monotonic `deadline`."""
        while self.fds and time.monotonic() < deadline:
            self.pump(min(TICK_S, deadline - time.monotonic()))

    def close(self) -> None:
        """Close the pipes still open."""
        for fd in list(self.fds):
            os.close(fd)
        self.fds.clear()
