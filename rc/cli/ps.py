"""`rc ps`: running jobs and holds, then the queue in order (-w: watched)."""

from __future__ import annotations

import argparse

from rc.cli.context import UsageError, client
from rc.cli.jobs import PS_WATCH_S, named_table
from rc.cli.output import duration, job_target, job_what, job_who, print_json
from rc.proto import calls

__all__ = ["cmd_ps"]


def cmd_ps(args: argparse.Namespace) -> int:
    """`rc ps`: running jobs and holds (time since they got their device), then
    the queue in scheduling order with positions and time waited. Times come
    from the controller's clock. With -w, the listing again every
    PS_WATCH_S until Ctrl-C (130)."""
    if args.watch and args.output == "json":
        raise UsageError("-w and -o json do not go together (-w redraws a table)")
    c = client(args)
    if args.watch:
        from rc.cli.watch import watch

        return watch(lambda: _print_ps(c.call(calls.STATE), "text"), PS_WATCH_S, "rc ps")
    _print_ps(c.call(calls.STATE), args.output)
    return 0


def _print_ps(st: dict, output: str) -> None:
    """The `rc ps` listing of a GET /v1/state answer, as text or JSON."""
    if output == "json":
        print_json(
            {
                "jobs": st["jobs"],
                "queued": st["queued"],
                "queue_positions": st["queue_positions"],
                "queued_waiting_seconds": st["queued_waiting_seconds"],
            }
        )
        return
    held_for = {v["job_id"]: v.get("elapsed_seconds") for v in st["devices"] if v.get("job_id")}
    rows = []
    for j in st["jobs"]:
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
    for j in st["queued"]:
        key = str(j["id"])
        pos = st["queue_positions"].get(key, 0)
        rows.append(
            (
                j["id"],
                j.get("name") or "-",
                job_target(j),
                f"queued (#{pos})",
                job_who(j),
                j["priority"],
                duration(st["queued_waiting_seconds"].get(key)),
                job_what(j),
            )
        )
    named_table(("JOB", "NAME", "DEVICE", "STATE", "SUBMITTER", "PRIO", "FOR", "COMMAND"), rows)
