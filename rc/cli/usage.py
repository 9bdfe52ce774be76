"""`rc usage` (the usage ledger) and `rc share` (fair-share weights)."""

from __future__ import annotations

import argparse
import csv
import sys

from rc.cli.context import UsageError, add_client_flags, client, whole_seconds_arg
from rc.cli.output import print_json, print_line, table
from rc.proto import calls

__all__ = ["add_parsers"]

BY = ("user", "host", "device", "day", "week")
STATES = ("succeeded", "failed", "killed", "lost", "running", "assigned")


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "usage",
        help="who used the devices: device-hours, jobs, waits, idle holds",
        description="The usage ledger over the last --since: device-hours (a job on 4 "
        "devices for an hour is 4), jobs and holds by state, queue wait p50/p95, and "
        'device-hours of holds in which no session was opened (README "Who used the devices").',
    )
    p.add_argument("--by", choices=BY, default="user", help="one row per (default user)")
    p.add_argument(
        "--since", default="30d", type=_window, metavar="D", help="the window (default 30d)"
    )
    p.add_argument("--user", default="", metavar="U", help="only this user's")
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "csv"),
        default="text",
        help="text (default), json (the report as GET /v1/usage gives it) or csv",
    )
    add_client_flags(p)
    p.set_defaults(handler="usage:cmd_usage")

    p = sub.add_parser(
        "share",
        help="fair-share weights, entitlements and adjustments (rc share set: admin)",
        description="Fair share's standing of every user: weight, entitlement, share of "
        "the decayed device-time and the resulting priority adjustment "
        '(README "Sharing fairly"). `rc share set USER W` sets a weight (admin).',
    )
    ssub = p.add_subparsers(dest="share_command", metavar="ACTION")
    s = ssub.add_parser(
        "set",
        help="set a user's weight (admin)",
        description="Set USER's fair-share weight: 0.01 to 1000 (everyone's default: 1).",
    )
    s.add_argument("user", metavar="USER", type=_user, help="the user (a token name) to weigh")
    s.add_argument("weight", metavar="W", type=_weight, help="the weight: 0.01 to 1000")
    add_client_flags(s)
    s.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text (default) or json"
    )
    s.set_defaults(handler="usage:cmd_share_set")
    p.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text (default) or json"
    )
    add_client_flags(p)
    p.set_defaults(handler="usage:cmd_share")


def _weight(text: str) -> float:
    """argparse type: a weight in ASCII digits ("2", "0.5"), model.SHARE_WEIGHT_MIN
    to SHARE_WEIGHT_MAX."""
    import re

    from rc.proto.model import SHARE_WEIGHT_MAX, SHARE_WEIGHT_MIN

    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (digits 0-9, e.g. 2 or 0.5)")
    w = float(text)
    if not SHARE_WEIGHT_MIN <= w <= SHARE_WEIGHT_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range: {SHARE_WEIGHT_MIN:g} to {SHARE_WEIGHT_MAX:g}"
        )
    return w


def _window(text: str) -> str:
    """argparse type: the ledger's window, a duration of 1s to 3660d, kept as
    given (the controller reads it again)."""
    seconds = whole_seconds_arg(text)
    if not 1 <= seconds <= 3660 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: 1s to 3660d")
    return text


def _user(text: str) -> str:
    """argparse type: a user, the Unix user jobs run as (valid_unix_user),
    or a token's name (TOKEN_NAME_RE: a weight set before accounts were
    Unix users)."""
    from rc.proto.model import TOKEN_NAME_RE, valid_unix_user

    if not (valid_unix_user(text) or TOKEN_NAME_RE.fullmatch(text)):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a user name (a Unix user's login name: no whitespace, "
            "'/', ':' or ','; at most 32 bytes)"
        )
    return text


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _states(counts: dict) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"


def _secs(seconds: float) -> str:
    from rc.proto.duration import format_duration

    return format_duration(round(seconds)) if seconds else "0s"


def cmd_usage(args: argparse.Namespace) -> int:
    params = {"by": args.by, "since": args.since}
    if args.user:
        params["user"] = args.user
    got = client(args).call(calls.USAGE, params=params)
    if args.output == "json":
        print_json(got)
        return 0
    rows = [*got["rows"], got["total"]]
    if args.output == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(
            [args.by, "device_hours", "idle_hold_hours", "waits", "wait_p50_s", "wait_p95_s",
             *(f"jobs_{s}" for s in STATES), *(f"holds_{s}" for s in STATES)]
        )  # fmt: skip
        for r in rows:
            w.writerow(
                [r["key"], _hours(r["device_seconds"]), _hours(r["idle_hold_seconds"]),
                 r["waits"], r["wait_p50_seconds"], r["wait_p95_seconds"],
                 *(r["jobs"].get(s, 0) for s in STATES), *(r["holds"].get(s, 0) for s in STATES)]
            )  # fmt: skip
        return 0
    table(
        (args.by.upper(), "DEVICE-H", "IDLE HOLD-H", "JOBS", "HOLDS", "WAIT P50", "WAIT P95"),
        [
            (
                r["key"],
                _hours(r["device_seconds"]),
                _hours(r["idle_hold_seconds"]),
                _states(r["jobs"]),
                _states(r["holds"]),
                _secs(r["wait_p50_seconds"]),
                _secs(r["wait_p95_seconds"]),
            )
            for r in rows
        ],
    )
    return 0


def _show_shares(got: dict, output: str) -> int:
    if output == "json":
        print_json(got)
        return 0
    if not got["half_life_seconds"]:
        print_line("fair share is off (rc serve --fair-share HALF_LIFE turns it on)")
    table(
        ("USER", "WEIGHT", "ENTITLED", "SHARE", "DECAYED DEVICE-H", "ADJUSTMENT"),
        [
            (
                s["user"],
                f"{s['weight']:g}",
                f"{round(s['entitled'] * 100)}%",
                f"{round(s['share'] * 100)}%",
                _hours(s["decayed_device_seconds"]),
                f"-{s['adjust']}" if s["adjust"] else "0",
            )
            for s in got["shares"]
        ],
    )
    return 0


def cmd_share(args: argparse.Namespace) -> int:
    if args.share_command not in (None, "set"):
        raise UsageError(f"unknown action {args.share_command!r}")
    return _show_shares(client(args).call(calls.SHARES), args.output)


def cmd_share_set(args: argparse.Namespace) -> int:
    got = client(args).call(calls.SHARE_SET, args.user, body={"weight": args.weight})
    return _show_shares(got, args.output)
