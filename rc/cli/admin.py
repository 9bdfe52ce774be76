"""Admin verbs and the feed: `rc token`, `clear`, `retire`, `drain`,
`undrain`, `events`, `whoami`."""

from __future__ import annotations

import argparse
import sys
import time

from rc.cli.complete import attach, devices
from rc.cli.context import (
    UsageError,
    add_client_flags,
    client,
    device_arg,
    duration_seconds,
    number_in,
    whole_seconds_arg,
)
from rc.cli.output import add_output_flag, machine, one_line, print_json, print_line, table, when
from rc.proto import calls
from rc.proto.duration import format_duration

__all__ = ["add_parsers"]


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "token",
        help="create, list and revoke API tokens (admin)",
        description="Manage the controller's API tokens (admin only).",
    )
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser(
        "create",
        help="create a token; prints its secret once",
        description="Create token NAME and print its secret on stdout, the only time it is shown.",
    )
    c.add_argument("name", metavar="NAME", help="the token's name: the submitter of its jobs")
    c.add_argument(
        "--unix-user",
        default="",
        metavar="USER",
        help="the Unix user its jobs run as (default: NAME, which must then be a Unix user "
        "name; root only when given here; not for a worker token)",
    )
    c.add_argument(
        "--role",
        choices=("user", "worker", "admin"),
        default="user",
        help="what it may do (default user; a worker token is bound to its host)",
    )
    c.add_argument(
        "--expires",
        type=whole_seconds_arg,
        default=None,
        metavar="D",
        help="expire after D (e.g. 30d); without it the token never expires",
    )
    add_client_flags(c)
    c.set_defaults(handler="admin:cmd_token_create")
    ls = tsub.add_parser(
        "list",
        help="tokens without their secrets",
        description="Every token: name, role, the Unix user its jobs run as, status, bound "
        "host, dates, creator; never a secret.",
    )
    add_output_flag(ls)
    add_client_flags(ls)
    ls.set_defaults(handler="admin:cmd_token_list")
    ro = tsub.add_parser(
        "rotate",
        help="a new secret for a token, which keeps its jobs",
        description="Give token NAME a new secret and print it once; the old secret stops "
        "working at once. The token stays the same principal, so its jobs stay its own "
        "(a revoke and a new token of the same name would own none of them).",
    )
    ro.add_argument("name", metavar="NAME", help="the token's name (rc token list)")
    add_client_flags(ro)
    ro.set_defaults(handler="admin:cmd_token_rotate")
    rv = tsub.add_parser(
        "revoke",
        help="revoke a token by name",
        description="Revoke token NAME at once (never the last admin token).",
    )
    rv.add_argument("name", metavar="NAME", help="the token's name (rc token list)")
    rv.add_argument(
        "--keep-jobs",
        action="store_true",
        help="leave its queued jobs and holds queued (default: they are cancelled)",
    )
    add_client_flags(rv)
    rv.set_defaults(handler="admin:cmd_token_revoke")

    p = sub.add_parser(
        "whoami",
        help="which token you are using",
        description="The name and role of the token this rc uses, the Unix user its jobs "
        "run as (and, for a worker token, its host).",
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="admin:cmd_whoami")

    p = sub.add_parser(
        "clear",
        help="return a quarantined device to the pool (admin)",
        description="Return quarantined device DEVICE to the pool (admin only), once its "
        "worker's fresh survivor scan (cgroups, process groups, RC_JOB_ID, GPU compute "
        "processes) finds nothing of its jobs. Survivors are named and the device stays "
        "out (exit 1). Refused while a lease is live or when the device is not quarantined.",
    )
    attach(
        p.add_argument("device", type=device_arg, metavar="DEVICE", help="a device id, host:name"),
        devices,
    )
    p.add_argument(
        "--kill",
        action="store_true",
        help="end the survivors the scan finds (TERM, the kill grace, KILL), scan again, "
        "and clear only when that scan is clean",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="clear without a survivor scan (for a worker that cannot scan); the event "
        "says it was forced",
    )
    add_client_flags(p)
    p.set_defaults(handler="admin:cmd_clear")

    p = sub.add_parser(
        "retire",
        help="remove a device from the fleet (admin)",
        description="Remove device DEVICE from the fleet; its history stays and "
        "queued jobs pinned to it are cancelled (admin only).",
    )
    attach(
        p.add_argument("device", type=device_arg, metavar="DEVICE", help="a device id, host:name"),
        devices,
    )
    p.add_argument("--yes", action="store_true", help="really retire it")
    add_client_flags(p)
    p.set_defaults(handler="admin:cmd_retire")

    p = sub.add_parser(
        "drain",
        help="let the current job finish, start no new one (admin)",
        description="Drain device DEVICE: the job on it finishes, no new job "
        "starts there until rc undrain (admin only).",
    )
    attach(
        p.add_argument("device", type=device_arg, metavar="DEVICE", help="a device id, host:name"),
        devices,
    )
    p.add_argument("--reason", default="", metavar="TEXT", help="why (shown to everyone)")
    add_client_flags(p)
    p.set_defaults(handler="admin:cmd_drain")

    p = sub.add_parser(
        "undrain",
        help="put a drained device back in the pool (admin)",
        description="Undrain device DEVICE: new jobs may start on it again (admin only). "
        "A GPU a health rule drained is re-probed first and stays drained while "
        'the rule still applies or cannot be read (README "GPU health").',
    )
    attach(
        p.add_argument("device", type=device_arg, metavar="DEVICE", help="a device id, host:name"),
        devices,
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="undrain a GPU a health rule drained without re-probing it",
    )
    add_client_flags(p)
    p.set_defaults(handler="admin:cmd_undrain")

    p = sub.add_parser(
        "events",
        help="the activity feed (-f to follow it)",
        description="The activity feed, oldest first: quarantines, recoveries, "
        "watchdog trips, lost jobs, clears, drains, token changes (times in the "
        "local time zone). With -f, keep printing new events.",
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    p.add_argument(
        "--since",
        type=duration_seconds,
        default=0.0,
        metavar="D",
        help="only events from the last D (e.g. 1h)",
    )
    p.add_argument(
        "-n",
        "--limit",
        type=number_in(1, 1000),
        default=100,
        metavar="N",
        help="at most this many (1..1000, default 100)",
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="admin:cmd_events")


def cmd_token_create(args: argparse.Namespace) -> int:
    if args.expires is not None and args.expires <= 0:
        raise UsageError(
            f"--expires {format_duration(args.expires)} would make a token that never "
            "expires; leave --expires out for that, or give a lifetime (e.g. 30d)"
        )
    body = {"name": args.name, "role": args.role, "expires_in_seconds": args.expires or 0}
    if args.unix_user:
        body["unix_user"] = args.unix_user
    made = client(args).call(calls.TOKEN_CREATE, body=body)
    print(made["secret"])
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    tokens = client(args).call(calls.TOKENS)["tokens"]
    if args.output == "json":
        print_json(tokens)
        return 0
    rows = []
    for t in tokens:
        status = (
            "revoked"
            if t.get("revoked_at")
            else ("expired" if t.get("expires_at") and t["expires_at"] <= time.time() else "live")
        )
        rows.append(
            (
                t["name"],
                t["role"],
                t.get("unix_user"),
                status,
                t.get("host"),
                when(t["created_at"]),
                when(t.get("expires_at")),
                t.get("created_by"),
            )
        )
    table(("NAME", "ROLE", "UNIX USER", "STATUS", "HOST", "CREATED", "EXPIRES", "BY"), rows)
    return 0


def cmd_token_rotate(args: argparse.Namespace) -> int:
    print(client(args).call(calls.TOKEN_ROTATE, args.name)["secret"])
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    params = {"keep_jobs": "true"} if args.keep_jobs else None
    print_line(client(args).call(calls.TOKEN_REVOKE, args.name, params=params)["message"])
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    me = client(args).call(calls.WHOAMI)
    if args.output == "json":
        print_json(me)
        return 0
    extra = [me["role"]]
    if me.get("host"):
        extra.append(f"host {me['host']}")
    if me.get("unix_user"):
        extra.append(f"runs jobs as {me['unix_user']}")
    print_line(f"{me['name']} ({', '.join(extra)})")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    if args.kill and args.force:
        raise UsageError("give --kill or --force, not both")
    body = {"kill": args.kill, "force": args.force}
    print_line(client(args).call(calls.DEVICE_CLEAR, args.device, body=body)["message"])
    return 0


def cmd_retire(args: argparse.Namespace) -> int:
    if not args.yes:
        raise UsageError(
            f"retiring {args.device} removes it from the fleet; "
            f"run rc retire {args.device} --yes to do it"
        )
    print_line(client(args).call(calls.DEVICE_RETIRE, args.device)["message"])
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    body = {"reason": args.reason}
    print_line(client(args).call(calls.DEVICE_DRAIN, args.device, body=body)["message"])
    return 0


def cmd_undrain(args: argparse.Namespace) -> int:
    body = {"force": args.force}
    print_line(client(args).call(calls.DEVICE_UNDRAIN, args.device, body=body)["message"])
    return 0


def _event_line(e: dict) -> str:
    parts = [when(e["at"]), e["kind"]]
    if e.get("device_id"):
        parts.append(e["device_id"])
    if e.get("job_id"):
        parts.append(f"job {e['job_id']}")
    line = "  ".join(parts)
    if e.get("text"):
        line += f": {e['text']}"
    return one_line(line)


def cmd_events(args: argparse.Namespace) -> int:
    c = client(args, timeout=90)
    params = {"limit": args.limit}
    if args.since:
        params["since"] = f"{args.since:g}s"
    events = c.call(calls.EVENTS, params=params)["events"]
    if args.output == "json" and not args.follow:
        print_json(events)
        return 0
    after = 0
    for e in events:
        _emit(e, args.output)
        after = e["id"]
    if not args.follow:
        return 0
    try:
        while True:
            got = c.call(
                calls.EVENTS, params={"after": after, "wait": "50s", "limit": 1000}, timeout=70
            )["events"]
            for e in got:
                _emit(e, args.output)
                after = e["id"]
    except KeyboardInterrupt:
        return 130


def _emit(e: dict, output: str) -> None:
    if output == "json":
        import json

        print(json.dumps(machine(e)), flush=True)
    else:
        print(_event_line(e), flush=True)
    sys.stdout.flush()
