"""`rc jobs`, and the parsers of the job verbs: `rc show`, `rc logs`,
`rc kill`, `rc ps`, `rc explain` (each verb's handler is its own module:
rc.cli.show, logs, kill, ps, explain)."""

from __future__ import annotations

import argparse
import time

from rc.cli.complete import attach, devices, label_keys, live_jobs, recent_jobs
from rc.cli.context import (
    SelectorTerms,
    UsageError,
    add_client_flags,
    client,
    device_arg,
    number_in,
    stderr,
    whole_number,
)
from rc.cli.output import (
    add_output_flag,
    duration,
    job_state,
    job_target,
    job_what,
    job_who,
    print_json,
    print_line,
    table,
    when,
)
from rc.cli.show import array_lines
from rc.proto import calls
from rc.proto.names import valid_unix_user

__all__ = [
    "PS_STATES",
    "PS_WATCH_S",
    "QUEUED_SHOWN",
    "TAIL_WINDOW_BYTES",
    "add_parsers",
    "add_ps_flags",
    "filter_params",
    "named_table",
]


PS_WATCH_S = 2.0
"""How often `rc ps -w` reads the listing again (s)."""


TAIL_MAX = 100_000
"""The most lines `rc logs --tail` shows."""


TAIL_WINDOW_BYTES = 64 << 10
"""`rc logs --tail` reads the log backwards this much at a time (doubling)."""


STATES = ("queued", "assigned", "running", "succeeded", "failed", "killed", "lost")


def named_table(headers: list[str] | tuple[str, ...], rows: list) -> None:
    """A listing whose second column is NAME: shown only when some job in it
    has a name (a listing of unnamed jobs reads as it always did)."""
    if not any(r[1] != "-" for r in rows):
        headers = headers[:1] + headers[2:]
        rows = [r[:1] + r[2:] for r in rows]
    table(headers, rows)


def states_arg(text: str) -> str:
    """argparse type: a comma list of job states ("queued,running")."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in parts if x not in STATES]
    if bad or not parts:
        raise argparse.ArgumentTypeError(
            f"{(bad or [text])[0]!r} is not a job state ({', '.join(STATES)})"
        )
    return ",".join(parts)


def since_arg(text: str) -> float:
    """argparse type: a time, as seconds since the epoch: a duration back
    from now ("2h", "7d"), or a local date and time ("2026-03-02",
    "2026-03-02 17:00", "2026-03-02T17:00:05")."""
    import datetime

    from rc.proto.duration import DurationError, parse_duration

    try:
        return time.time() - parse_duration(text)
    except DurationError:
        pass
    try:
        at = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (2h, 7d) nor a date and time (2026-03-02 17:00)"
        ) from None
    return at.timestamp()


def unix_user_arg(text: str) -> str:
    """--user's value: a Unix user name (rc.proto.names.valid_unix_user).
    Raises argparse.ArgumentTypeError naming the rule, so a principal or a
    typo is refused instead of listing nothing."""
    if not text or valid_unix_user(text):  # "": no filter (argparse types the default too)
        return text
    hint = "; for your own jobs use --mine" if text.startswith(("token:", "uid:")) else ""
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a Unix user name (the user the jobs run as){hint}"
    )


def add_filter_flags(p: argparse.ArgumentParser) -> None:
    """--mine, --user, --state, --name, --since: which jobs (rc jobs, rc kill)."""
    p.add_argument("--mine", action="store_true", help="only your own jobs (you own them)")
    p.add_argument(
        "--user",
        "--submitter",
        dest="submitter",
        type=unix_user_arg,
        default="",
        metavar="USER",
        help="only the jobs that run as Unix user USER (theirs, by any token or the socket)",
    )
    p.add_argument(
        "--state",
        type=states_arg,
        default=None,
        metavar="STATE[,STATE...]",
        help=f"only jobs in these states ({', '.join(STATES)})",
    )
    p.add_argument(
        "--name",
        default="",
        metavar="GLOB",
        help="only jobs whose name matches GLOB (* ? [..], e.g. 'sweep-*')",
    )
    p.add_argument(
        "--array",
        type=number_in(1),
        default=None,
        metavar="ID",
        help="only the elements of array ID",
    )
    p.add_argument(
        "--since",
        type=since_arg,
        default=None,
        metavar="D|TIME",
        help="only jobs submitted in the last D (2h, 7d) or since TIME (2026-03-02 17:00)",
    )


def filter_params(args: argparse.Namespace) -> dict:
    """The listing's query parameters for the filter flags (None: not given)."""
    return {
        "mine": "1" if args.mine else None,
        "user": args.submitter or None,
        "state": args.state or None,
        "name": args.name or None,
        "since": f"{args.since:.3f}" if args.since is not None else None,
        "array": args.array,
    }


QUEUED_SHOWN = 50
"""How many queued jobs a `rc ps` table lists unless -n says otherwise."""
PS_STATES = ("assigned", "running", "queued")
"""The states `rc ps` lists (finished jobs are `rc jobs`')."""


def _states_arg(text: str) -> frozenset[str]:
    """argparse type of --state: a comma list of PS_STATES."""
    got = frozenset(s.strip() for s in text.split(",") if s.strip())
    bad = sorted(got - set(PS_STATES))
    if not got or bad:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad) or repr(text)}: rc ps lists {', '.join(PS_STATES)} "
            "(ended jobs: rc jobs --state)"
        )
    return got


def _count_arg(text: str) -> int:
    n = whole_number(text)
    if n < 0:
        raise argparse.ArgumentTypeError("-n takes 0 (all) or more")
    return n


def add_ps_flags(p: argparse.ArgumentParser) -> None:
    """rc ps's --mine, -u USER, --state, -n N (rc.cli.ps; README "Crowded queues")."""
    p.add_argument("--mine", action="store_true", help="only your jobs and holds")
    p.add_argument("-u", "--user", default="", metavar="USER", help="only those of Unix user USER")
    p.add_argument(
        "--state",
        type=_states_arg,
        default=None,
        metavar="STATE[,STATE]",
        help=f"only jobs in these states ({', '.join(PS_STATES)})",
    )
    p.add_argument(
        "-n",
        type=_count_arg,
        default=None,
        metavar="N",
        dest="limit",
        help=f"list at most N queued jobs (default {QUEUED_SHOWN} in a table, all with -o json; "
        "0: all); a last line says how many more, by user",
    )


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "jobs",
        help="list jobs, newest first (history included; filters, paging)",
        description="List jobs and holds, newest first, finished ones included: "
        "name, device (or selector while queued), state and why it ended, submitter, "
        "start time (local time zone), duration, command. Filters combine; "
        "--before pages back through any history.",
    )
    p.add_argument(
        "-n",
        "--limit",
        type=number_in(1, 1000),
        default=20,
        metavar="N",
        help="how many (1..1000, default 20)",
    )
    add_filter_flags(p)
    attach(
        p.add_argument(
            "--device",
            type=device_arg,
            default=None,
            metavar="DEVICE",
            help="only jobs on this device (host:name)",
        ),
        devices,
    )
    p.add_argument(
        "--before",
        type=number_in(1),
        default=0,
        metavar="ID",
        help="only jobs with an id below ID (the next page: the footer names it)",
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="jobs:cmd_jobs")

    p = sub.add_parser(
        "show",
        help="everything about one job or hold",
        description="Everything about job (or hold) JOB: state, devices, submitter "
        "and Unix user, command, cwd, environment names (values only to its owner "
        "and admins), selector, count, priority, ceilings, times, exit code and "
        "reason, name, log size, and for a queued job why it waits.",
    )
    attach(p.add_argument("job", type=number_in(1), metavar="JOB", help="the job id"), recent_jobs)
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="show:cmd_show")

    p = sub.add_parser(
        "logs",
        help="print a job's output (-f to follow it to the end)",
        description="Print the stored output (stdout and stderr together) of "
        "job JOB. With -f, keep printing until the job ends, reconnecting "
        "without gaps or repeats, and exit with the job's exit code.",
    )
    attach(p.add_argument("job", type=number_in(1), metavar="JOB", help="the job id"), recent_jobs)
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing until the job ends, then exit with its code",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--tail",
        type=number_in(0, TAIL_MAX),
        default=None,
        metavar="N",
        help=f"only the last N lines (0..{TAIL_MAX}; with -f, then what follows)",
    )
    g.add_argument(
        "--head",
        type=number_in(1),
        default=None,
        metavar="N",
        help="only the first N lines (with -f, as they come)",
    )
    add_client_flags(p)
    p.set_defaults(handler="logs:cmd_logs")

    p = sub.add_parser(
        "kill",
        help="kill jobs or cancel queued ones, by id or by filter (yours, or any as admin)",
        description="Kill each job JOB (SIGTERM to its process group and cgroup, SIGKILL "
        "after the worker's grace), end a hold, or cancel a queued job; or every job "
        "the filters take (your own, still queued or active; an admin may name "
        "--user). For a lost job, its worker ends what is left of it (its cgroup, its "
        "RC_JOB_ID) and this says what it found. Only a job's submitter or an admin "
        "may. Prints each job it ended and a count.",
    )
    attach(
        p.add_argument("job", nargs="*", type=number_in(1), metavar="JOB", help="job or hold ids"),
        live_jobs,
    )
    add_filter_flags(p)
    p.add_argument(
        "--reason", default="", metavar="TEXT", help="why (recorded with the job, shown to all)"
    )
    add_client_flags(p)
    p.set_defaults(handler="kill:cmd_kill")

    p = sub.add_parser(
        "ps",
        help="running jobs and holds, then the queue in order",
        description="Running jobs and holds with how long they have had their "
        "device, then the queue in scheduling order with each job's position "
        "and how long it has waited. With -w, it stays on screen, redrawn every "
        f"{PS_WATCH_S:g} s until Ctrl-C, and waits out a controller restart.",
    )
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help=f"redraw the listing every {PS_WATCH_S:g} s until Ctrl-C (on a pipe: print it "
        "again each time it changes)",
    )
    add_ps_flags(p)
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="ps:cmd_ps")

    p = sub.add_parser(
        "explain",
        help="why is my job waiting? (or: what does a selector match?)",
        description="Why queued job JOB is not running, from the scheduler's own "
        "plan: each device it could use and why that one is not its now. With "
        "-s, which devices a selector matches, which are free, and the queue depth.",
    )
    g = p.add_mutually_exclusive_group(required=True)
    attach(
        g.add_argument("job", nargs="?", type=number_in(1), metavar="JOB", help="a queued job"),
        live_jobs,
    )
    attach(
        g.add_argument(
            "-s",
            "--select",
            "--selector",
            dest="selector",
            action=SelectorTerms,
            metavar="SELECTOR",
            help="which devices match, which are free, how deep the queue is "
            "(repeated: every one must match)",
        ),
        label_keys,
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="explain:cmd_explain")


def _started_and_duration(j: dict) -> tuple[str, str]:
    start = j.get("started_at")
    if not start:
        return "-", "-"
    end = j.get("finished_at") or time.time()
    return when(start), duration(end - start)


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.mine and args.submitter:
        raise UsageError("--mine and --user do not go together")
    c = client(args)
    params = {
        "limit": args.limit,
        "device": args.device or None,
        "before": args.before or None,
        **filter_params(args),
    }
    page = c.call(calls.JOBS, params=params)
    jobs = page["jobs"]
    if args.output == "json":
        print_json(jobs)
        return 0
    rows = []
    for j in jobs:
        started, took = _started_and_duration(j)
        row = [j["id"], j.get("name") or "-", job_target(j), job_state(j), job_who(j)]
        row += [started, took, job_what(j)]
        if args.array:  # an array's elements: which index each is
            row.insert(2, j.get("array_index", "-"))
        rows.append(row)
    heads = ["JOB", "NAME", "DEVICE", "STATE", "SUBMITTER", "STARTED", "DURATION", "COMMAND"]
    if args.array:
        heads.insert(2, "INDEX")
    named_table(heads, rows)
    if page.get("next_before"):
        stderr(f"more: rc jobs --before {page['next_before']} (with the same filters)")
    if args.array:
        for key, value in array_lines(c.call(calls.ARRAY_GET, args.array)):
            print_line(f"{key + ':':<13} {value}")
    return 0
