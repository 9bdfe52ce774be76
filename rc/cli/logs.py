"""`rc logs`: a job's stored output, its head or tail, or followed to the end."""

from __future__ import annotations

import argparse
import sys

from rc.cli.context import client, stderr
from rc.cli.follow import exit_status, follow_log
from rc.cli.jobs import TAIL_WINDOW_BYTES
from rc.proto import calls

__all__ = ["cmd_logs"]


class _HeadDone(Exception):
    """`rc logs --head N` has shown its N lines."""


class _Head:
    """A binary stream that passes on the first `lines` lines, then raises _HeadDone."""

    def __init__(self, out, lines: int) -> None:
        self.out, self.left = out, lines

    def write(self, data: bytes) -> int:
        at = 0
        while self.left and (nl := data.find(b"\n", at)) != -1:
            at, self.left = nl + 1, self.left - 1
        if not self.left:
            self.out.write(data[:at])
            self.out.flush()
            raise _HeadDone
        self.out.write(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def _tail(c, job_id: int, lines: int, size: int) -> tuple[bytes, int]:
    """The last `lines` lines of a job's stored log of `size` bytes, read
    backwards TAIL_WINDOW_BYTES at a time (doubling), and the offset after them."""
    window = TAIL_WINDOW_BYTES
    while True:
        start = max(0, size - window)
        data = c.call(calls.JOB_LOGS, job_id, params={"offset": start, "follow": "0"})
        body = data[:-1] if data.endswith(b"\n") else data
        if start == 0 or body.count(b"\n") >= lines:
            end = start + len(data)
            if lines == 0:
                return b"", end
            cut = len(body)
            for _ in range(lines):
                cut = body.rfind(b"\n", 0, cut)
                if cut == -1:
                    return data, end
            return data[cut + 1 :], end
        window *= 2


def cmd_logs(args: argparse.Namespace) -> int:
    """`rc logs JOB [-f] [--tail N | --head N]`. On a job still in the queue
    it says so (and its position) on stderr; with -f it then waits for it."""
    c = client(args)
    out = sys.stdout.buffer
    offset = 0
    view = None
    view = c.call(calls.JOB_GET, args.job, params={"detail": "1"})
    if view["job"]["state"] == "queued":
        pos = view.get("queue_position") or 0
        where = f" (position {pos} in the queue)" if pos else ""
        if not args.follow:
            stderr(
                f"job {args.job} is queued{where}: no output yet (rc logs -f {args.job} waits for it)"
            )
            return 0
        stderr(f"job {args.job} is queued{where}; waiting for it to start (Ctrl-C stops following)")
    try:
        if args.tail is not None:
            data, offset = _tail(c, args.job, args.tail, view["detail"]["log_bytes"])
            out.write(data)
            out.flush()
            if not args.follow:
                return 0
        if args.head is not None:
            out = _Head(out, args.head)
        follow_log(c, args.job, out, offset=offset, follow=args.follow)
    except _HeadDone:
        return 0
    except KeyboardInterrupt:
        return 130
    if args.follow:  # followed to the end: exit as the job did, like rc run
        return exit_status(c.call(calls.JOB_GET, args.job)["job"])
    return 0
