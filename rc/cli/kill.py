"""`rc kill`: kill jobs or cancel queued ones, by id or by filter."""

from __future__ import annotations

import argparse

from rc.cli.context import UsageError, client, stderr
from rc.cli.jobs import filter_params
from rc.cli.output import print_line
from rc.proto import calls
from rc.proto.wire import KILL_MANY_MAX, KillManyRequest, KillRequest

__all__ = ["LIVE_STATES", "cmd_kill"]


LIVE_STATES = "queued,assigned,running"
"""What a kill by filter takes unless --state narrows it: jobs not yet ended."""


def _filtered_ids(c, args: argparse.Namespace) -> list[int]:
    """The ids of every job the filter flags take (all pages), newest first:
    the caller's own unless --user names someone (admins only: the
    controller refuses the kill otherwise), not ended unless --state says."""
    params = {**filter_params(args), "limit": 1000}
    if not args.submitter:
        params["mine"] = "1"
    if not args.state:
        params["state"] = LIVE_STATES
    ids: list[int] = []
    while True:
        page = c.call(calls.JOBS, params=params)
        ids += [j["id"] for j in page["jobs"]]
        if not page.get("next_before"):
            return ids
        params["before"] = page["next_before"]


def cmd_kill(args: argparse.Namespace) -> int:
    """`rc kill JOB... | FILTERS`: one line per job ended, then a count; exit
    1 when any of them could not be killed."""
    from rc.proto.errors import ApiError

    filtered = bool(
        args.mine
        or args.submitter
        or args.state
        or args.name
        or args.since is not None
        or args.array
    )
    if not args.job and not filtered:
        raise UsageError("name the jobs to kill (rc kill 12 13) or filter them (--mine ...)")
    if args.job and filtered:
        raise UsageError("give job ids or filters, not both")
    if args.mine and args.submitter:
        raise UsageError("--mine and --user do not go together")
    c = client(args)
    ids = list(dict.fromkeys(args.job)) if args.job else _filtered_ids(c, args)
    if args.array and not ids:
        c.call(calls.ARRAY_GET, args.array)  # no such array: its 404, not "0 jobs ended"
    ended = failed = 0
    if len(ids) == 1 and not filtered:
        try:
            resp = c.call(calls.JOB_KILL, ids[0], body=KillRequest(args.reason))
        except ApiError as e:
            stderr(f"job {ids[0]}: {e.code}: {e.message}")
            return 1
        print_line(resp.get("message") or f"kill requested for {ids[0]}")
        return 0
    for start in range(0, len(ids), KILL_MANY_MAX):  # one transaction per request
        chunk = sorted(ids[start : start + KILL_MANY_MAX])
        got = c.call(calls.JOBS_KILL, body=KillManyRequest(tuple(chunk), args.reason))
        for o in got["results"]:
            if o["ok"]:
                ended += 1
                print_line(o["message"])
            elif not (o["code"] == "not_cancellable" and filtered):  # ended since listed
                stderr(f"job {o['job_id']}: {o['code']}: {o['message']}")
                failed += 1
    if len(ids) != 1 or filtered:
        print(
            f"{ended} {'job' if ended == 1 else 'jobs'} ended"
            + (f", {failed} refused" if failed else "")
        )
    return 1 if failed else 0
