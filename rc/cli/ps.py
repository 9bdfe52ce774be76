"""`rc ps`: running jobs and holds, then the queue in order (-w: watched).

A crowded queue is cut (README "Crowded queues"): --mine, -u USER and
--state choose what is listed, -n N lists at most N queued jobs (default
QUEUED_SHOWN in a table; 0: all), and a last line says what was left out, by
user ("... and 2,000 more queued: 2,000 by alice").
"""

from __future__ import annotations

import argparse
from collections import Counter

from rc.cli.context import UsageError, client
from rc.cli.jobs import PS_WATCH_S, QUEUED_SHOWN, named_table
from rc.cli.output import duration, job_target, job_what, job_who, print_json, print_line
from rc.proto import calls

__all__ = ["cmd_ps", "filtered", "more_line"]


def filtered(st: dict, me: str = "", user: str = "", states=None) -> tuple[list, list]:
    """(active, queued) of a GET /v1/state answer kept by the filters: `me`
    a principal (--mine: owner equal to it), `user` a Unix user (-u; its
    submitter label for a job that records none), `states` a set of states."""

    def keep(j: dict) -> bool:
        if me and j.get("owner") != me:
            return False
        if user and (j.get("unix_user") or j.get("submitter")) != user:
            return False
        return states is None or j["state"] in states

    return [j for j in st["jobs"] if keep(j)], [j for j in st["queued"] if keep(j)]


def more_line(left_out: list[dict]) -> str:
    """ "... and 2,000 more queued: 1,990 by alice, 10 by bob (-n 0 lists them all)"."""
    by = Counter(j.get("unix_user") or j.get("submitter") or "?" for j in left_out)
    who = ", ".join(f"{n:,} by {u}" for u, n in by.most_common(5))
    if len(by) > 5:
        who += f", {sum(n for _, n in by.most_common()[5:]):,} by {len(by) - 5} others"
    return f"... and {len(left_out):,} more queued: {who} (-n 0 lists them all)"


def cmd_ps(args: argparse.Namespace) -> int:
    """`rc ps`: running jobs and holds (time since they got their device), then
    the queue in scheduling order with positions and time waited. Times come
    from the controller's clock. With -w, the listing again every
    PS_WATCH_S until Ctrl-C (130)."""
    if args.watch and args.output == "json":
        raise UsageError("-w and -o json do not go together (-w redraws a table)")
    if args.mine and args.user:
        raise UsageError("--mine and -u do not go together")
    c = client(args)
    me = c.call(calls.WHOAMI)["principal"] if args.mine else ""

    def show(output: str) -> None:
        _print_ps(c.call(calls.STATE), output, args, me)

    if args.watch:
        from rc.cli.watch import watch

        return watch(lambda: show("text"), PS_WATCH_S, "rc ps")
    show(args.output)
    return 0


def _print_ps(st: dict, output: str, args: argparse.Namespace, me: str) -> None:
    """The `rc ps` listing of a GET /v1/state answer, as text or JSON."""
    active, queued = filtered(st, me, args.user, args.state)
    limit = args.limit if args.limit is not None else (0 if output == "json" else QUEUED_SHOWN)
    shown, left_out = (queued[:limit], queued[limit:]) if limit else (queued, [])
    if output == "json":
        keys = {str(j["id"]) for j in shown}
        print_json(
            {
                "jobs": active,
                "queued": shown,
                "queue_positions": {k: v for k, v in st["queue_positions"].items() if k in keys},
                "queued_waiting_seconds": {
                    k: v for k, v in st["queued_waiting_seconds"].items() if k in keys
                },
                "queued_left_out": len(left_out),
            }
        )
        return
    held_for = {v["job_id"]: v.get("elapsed_seconds") for v in st["devices"] if v.get("job_id")}
    rows = []
    for j in active:
        rows.append(
            (
                j["id"],
                j.get("name") or "-",
                job_target(j),
                j["state"],
                job_who(j),
                j["priority"],
                duration(held_for.get(j["id"])),
                job_what(j),
            )
        )
    for j in shown:
        key = str(j["id"])
        pos = st["queue_positions"].get(key, 0)
        state = "stashed" if j.get("stashed") else f"queued (#{pos})"
        rows.append(
            (
                j["id"],
                j.get("name") or "-",
                job_target(j),
                state,
                job_who(j),
                j["priority"],
                duration(st["queued_waiting_seconds"].get(key)),
                job_what(j),
            )
        )
    named_table(("JOB", "NAME", "DEVICE", "STATE", "SUBMITTER", "PRIO", "FOR", "COMMAND"), rows)
    if left_out:
        print_line(more_line(left_out))
