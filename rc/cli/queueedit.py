"""`rc update`, `rc stash`, `rc unstash`: the queue, edited (README
"Editing the queue"), and the --begin time `rc run` and `rc update` take.

A stashed job keeps its id and the time it was queued, so unstashed it is
back in its place (pueue's stash; Slurm's scontrol hold/release). Each
command says what changed, one line per job, and exits 1 when any job was
refused (the others are still changed).
"""

from __future__ import annotations

import argparse
import re
import time

from rc.cli.complete import attach, live_jobs
from rc.cli.context import (
    UsageError,
    add_client_flags,
    client,
    count_arg,
    job_name_arg,
    number_in,
    stderr,
    whole_number,
    whole_seconds_arg,
)
from rc.cli.output import print_line, when
from rc.proto import calls
from rc.proto.duration import DurationError, whole_seconds
from rc.proto.errors import ApiError
from rc.proto.model import PRIORITY_MAX, PRIORITY_MIN
from rc.proto.wire import UpdateRequest

__all__ = ["add_parsers", "begin_arg", "begin_time", "cmd_stash", "cmd_update"]

_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[t ](\d{1,2}):(\d{2})(?::(\d{2}))?)?")


def begin_time(text: str, now: float | None = None) -> float:
    """The time (seconds since the epoch) a --begin names: `+D` or `now+D`
    (D an rc duration: +90m, +2h), `now`, `HH:MM[:SS]` (its next coming,
    local time: today, or tomorrow once passed) or `YYYY-MM-DD[THH:MM[:SS]]`
    (local time; midnight without a time), as sbatch --begin takes them.
    Raises ValueError naming the text."""
    now = time.time() if now is None else now
    t = text.strip().lower()
    rel = t.removeprefix("now")
    if rel == "":
        return now
    if rel.startswith("+"):
        try:
            return now + whole_seconds(rel[1:], "--begin")
        except DurationError as e:
            raise ValueError(f"--begin {text!r}: {e}") from None
    if m := _CLOCK.fullmatch(t):
        hh, mm, ss = int(m[1]), int(m[2]), int(m[3] or 0)
        if hh > 23 or mm > 59 or ss > 59:
            raise ValueError(f"--begin {text!r} is not a time of day")
        day = time.localtime(now)
        at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, hh, mm, ss, 0, 0, -1))
        if at <= now:
            at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday + 1, hh, mm, ss, 0, 0, -1))
        return at
    if m := _DATE.fullmatch(t):
        y, mo, d = int(m[1]), int(m[2]), int(m[3])
        hh, mm, ss = int(m[4] or 0), int(m[5] or 0), int(m[6] or 0)
        if not (1 <= mo <= 12 and 1 <= d <= 31 and hh <= 23 and mm <= 59 and ss <= 59):
            raise ValueError(f"--begin {text!r} is not a date and time")
        return time.mktime((y, mo, d, hh, mm, ss, 0, 0, -1))
    raise ValueError(
        f"--begin {text!r}: give +DURATION (+2h), HH:MM, YYYY-MM-DD or YYYY-MM-DDTHH:MM"
    )


def begin_arg(text: str) -> float:
    """argparse type of --begin: begin_time(text) now."""
    try:
        return begin_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "update",
        help="change a queued job: priority, name, max runtime, begin time",
        description="Change queued job(s) JOB: its priority (within your limit), name, "
        "max runtime (you may shorten it; lengthening is an admin's) or begin time. "
        'It keeps its place in the queue (README "Editing the queue").',
    )
    _jobs_arg(p)
    p.add_argument("--priority", type=_priority, default=None, help="-10..10")
    p.add_argument("--name", type=job_name_arg, default=None, help="its new name")
    p.add_argument(
        "-s",
        "--select",
        "--selector",
        dest="selector",
        default=None,
        metavar="SELECTOR",
        help="its new selector (a job that asked by selector)",
    )
    p.add_argument(
        "-n", "--count", type=count_arg, default=None, metavar="N", help="how many devices (1..64)"
    )
    p.add_argument(
        "--max-runtime", type=whole_seconds_arg, default=None, metavar="D", help="e.g. 30m"
    )
    p.add_argument(
        "--begin",
        type=begin_arg,
        default=None,
        metavar="TIME|+D",
        help="not before TIME (HH:MM, YYYY-MM-DD[THH:MM]) or +D from now; 'now' clears it",
    )
    add_client_flags(p)
    p.set_defaults(handler="queueedit:cmd_update")
    for verb, what in (("stash", "park"), ("unstash", "let go again")):
        p = sub.add_parser(
            verb,
            help=f"{what} queued jobs, keeping their place in the queue",
            description=f"{what.capitalize()} queued job(s) JOB: a stashed job keeps its "
            "place in the queue but takes no device until rc unstash.",
        )
        _jobs_arg(p)
        add_client_flags(p)
        p.set_defaults(handler="queueedit:cmd_stash", stashed=verb == "stash")


def _priority(text: str) -> int:
    value = whole_number(text)
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside {PRIORITY_MIN}..{PRIORITY_MAX}")
    return value


def _jobs_arg(p: argparse.ArgumentParser) -> None:
    attach(
        p.add_argument("jobs", type=number_in(1), nargs="+", metavar="JOB", help="queued job ids"),
        live_jobs,
    )


def _apply(args: argparse.Namespace, body: UpdateRequest) -> int:
    """POST the update to each job; prints one line each; 1 when any was refused."""
    c = client(args)
    failed = False
    for job_id in args.jobs:
        try:
            view = c.call(calls.JOB_UPDATE, job_id, body=body)
        except ApiError as e:
            stderr(f"job {job_id}: {e.code}: {e.message}")
            failed = True
            continue
        j = view["job"]
        said = [f"priority {j['priority']}"]
        if j.get("stashed"):
            said.append("stashed")
        if j.get("begin_at"):
            said.append(f"begins at {when(j['begin_at'])}")
        print_line(f"job {job_id}: {', '.join(said)}")
    return 1 if failed else 0


def cmd_update(args: argparse.Namespace) -> int:
    """`rc update JOB... [--priority P] [--name N] [--max-runtime D] [--begin T]`."""
    given = (args.priority, args.name, args.max_runtime, args.begin, args.selector, args.count)
    if all(v is None for v in given):
        raise UsageError("say what to change: --priority, --name, --max-runtime, --begin, -s or -n")
    begin = args.begin
    if begin is not None and begin <= time.time() + 0.5:
        begin = 0.0  # now: no begin time
    return _apply(
        args,
        UpdateRequest(
            priority=args.priority,
            name=args.name,
            max_runtime_seconds=args.max_runtime,
            begin_at=begin,
            selector=args.selector,
            count=args.count,
        ),
    )


def cmd_stash(args: argparse.Namespace) -> int:
    """`rc stash JOB...` / `rc unstash JOB...`."""
    return _apply(args, UpdateRequest(stashed=args.stashed))
