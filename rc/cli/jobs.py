"""`rc jobs`, `rc logs`, `rc kill`, `rc ps`, `rc explain`."""

from __future__ import annotations

import argparse
import sys
import time

from rc.cli.complete import attach, devices, label_keys, live_jobs, recent_jobs
from rc.cli.context import (
    SelectorTerms,
    UsageError,
    add_client_flags,
    client,
    device_arg,
    number_in,
)
from rc.cli.devices import state_words
from rc.cli.follow import exit_status, follow_log
from rc.cli.output import (
    add_output_flag,
    duration,
    job_state,
    job_target,
    job_what,
    print_json,
    print_line,
    table,
    when,
)
from rc.proto.model import device_list

__all__ = ["add_parsers"]

STATES = ("queued", "assigned", "running", "succeeded", "failed", "killed", "lost")


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "jobs",
        help="list jobs, newest first (history included)",
        description="List jobs and holds, newest first, finished ones included: "
        "device (or selector while queued), state and why it ended, submitter, "
        "start time (local time zone), duration, command.",
    )
    p.add_argument(
        "-n",
        "--limit",
        type=number_in(1, 1000),
        default=20,
        metavar="N",
        help="how many (1..1000, default 20)",
    )
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
    p.add_argument("--submitter", default="", metavar="NAME", help="only this submitter's jobs")
    p.add_argument(
        "--state",
        default="",
        choices=("",) + STATES,
        metavar="STATE",
        help=f"only jobs in this state ({', '.join(STATES)})",
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="jobs:cmd_jobs")

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
    add_client_flags(p)
    p.set_defaults(handler="jobs:cmd_logs")

    p = sub.add_parser(
        "kill",
        help="kill a job or cancel a queued one (yours, or any as admin)",
        description="Kill job JOB (SIGTERM to its process group and cgroup, SIGKILL after "
        "the worker's grace), end a hold, or cancel a queued job. For a lost job, its "
        "worker ends what is left of it (its cgroup, its RC_JOB_ID) and this says what "
        "it found. Only its submitter or an admin may.",
    )
    attach(
        p.add_argument("job", type=number_in(1), metavar="JOB", help="the job or hold id"),
        live_jobs,
    )
    p.add_argument(
        "--reason", default="", metavar="TEXT", help="why (recorded with the job, shown to all)"
    )
    add_client_flags(p)
    p.set_defaults(handler="jobs:cmd_kill")

    p = sub.add_parser(
        "ps",
        help="running jobs and holds, then the queue in order",
        description="Running jobs and holds with how long they have had their "
        "device, then the queue in scheduling order with each job's position "
        "and how long it has waited.",
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="jobs:cmd_ps")

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
    p.set_defaults(handler="jobs:cmd_explain")


def _started_and_duration(j: dict) -> tuple[str, str]:
    start = j.get("started_at")
    if not start:
        return "-", "-"
    end = j.get("finished_at") or time.time()
    return when(start), duration(end - start)


def cmd_jobs(args: argparse.Namespace) -> int:
    c = client(args)
    params = {
        "limit": args.limit,
        "device": args.device or None,
        "submitter": args.submitter or None,
        "state": args.state or None,
    }
    jobs = c.get("/v1/jobs", params=params)["jobs"]
    if args.output == "json":
        print_json(jobs)
        return 0
    rows = []
    for j in jobs:
        started, took = _started_and_duration(j)
        rows.append(
            (
                j["id"],
                job_target(j),
                job_state(j),
                j["submitter"],
                started,
                took,
                job_what(j),
            )
        )
    table(("JOB", "DEVICE", "STATE", "SUBMITTER", "STARTED", "DURATION", "COMMAND"), rows)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    c = client(args)
    try:
        follow_log(c, args.job, sys.stdout.buffer, follow=args.follow)
    except KeyboardInterrupt:
        return 130
    if args.follow:  # followed to the end: exit as the job did, like rc run
        return exit_status(c.get(f"/v1/jobs/{args.job}")["job"])
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    c = client(args)
    resp = c.post(f"/v1/jobs/{args.job}/kill", {"reason": args.reason})
    print_line(resp.get("message") or f"kill requested for {args.job}")
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    """`rc ps`: running jobs and holds (time since they got their device), then
    the queue in scheduling order with positions and time waited. Times come
    from the controller's clock."""
    c = client(args)
    st = c.get("/v1/state")
    if args.output == "json":
        print_json(
            {
                "jobs": st["jobs"],
                "queued": st["queued"],
                "queue_positions": st["queue_positions"],
                "queued_waiting_seconds": st["queued_waiting_seconds"],
            }
        )
        return 0
    held_for = {v["job_id"]: v.get("elapsed_seconds") for v in st["devices"] if v.get("job_id")}
    rows = []
    for j in st["jobs"]:
        rows.append(
            (
                j["id"],
                job_target(j),
                j["state"],
                j["submitter"],
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
                job_target(j),
                f"queued (#{pos})",
                j["submitter"],
                j["priority"],
                duration(st["queued_waiting_seconds"].get(key)),
                job_what(j),
            )
        )
    table(("JOB", "DEVICE", "STATE", "SUBMITTER", "PRIO", "FOR", "COMMAND"), rows)
    return 0


def _not_free(view: dict | None) -> str:
    """Why a matching device is not free, in a few words (rc explain -s)."""
    if view is None:
        return "not free"
    words = f"not free: {state_words(view)}"
    if view.get("holder"):
        words += f", held by {view['holder']}"
    d = view["device"]
    if d.get("quarantine_detail"):
        words += f": {d['quarantine_detail']}"
    elif d.get("draining") and d.get("drain_reason"):
        words += f": {d['drain_reason']}"
    return words


def cmd_explain(args: argparse.Namespace) -> int:
    """`rc explain JOB`: why a queued job is not running, in sentences, then
    each device it could use and why that one is not its now. `rc explain -s
    SELECTOR`: the devices it matches, which are free, the queue depth."""
    if args.selector is not None and not args.selector.strip():
        raise UsageError("-s needs a selector, e.g. 'kind=gpu'")
    c = client(args)
    if args.selector is not None:
        ex = c.get("/v1/explain", params={"selector": args.selector})
        if args.output == "json":
            print_json(ex)
            return 0
        print(f"selector: {ex['selector']}")
        if not ex["matching"]:
            print(
                "no device matches it (rc devices lists the fleet, "
                "rc describe DEVICE a device's labels)"
            )
            return 0
        views = {
            v["device"]["id"]: v
            for v in c.get("/v1/devices", params={"labels": "false"})["devices"]
        }
        for d in ex["matching"]:
            why = "free" if d in ex["free"] else _not_free(views.get(d))
            print_line(f"  {d}  {why}")  # stdout escapes the other control characters
        print(f"free: {len(ex['free'])}/{len(ex['matching'])}")
        print(f"queue depth: {ex['queue_depth']}")
        return 0
    ex = c.get(f"/v1/jobs/{args.job}/explain")
    if args.output == "json":
        print_json(ex)
        return 0
    head = f"job {ex['job_id']}: {ex['state']}"
    if ex.get("queue_position"):
        head += f", position {ex['queue_position']} in the queue"
    print(head)
    for r in ex["reasons"]:
        print_line(f"  - {r}")
    hosts = ex.get("hosts") or []
    if any(h["count"] > 1 for h in hosts):
        print("hosts it could run on:")
        for h in hosts:
            print_line(f"  {_host_fit(h)}")
        res = ex.get("reservation")
        if res:
            start = (
                f"from ~{when(res['start_at'])}"
                if res.get("start_at")
                else ("from when a holder with no time limit ends")
            )
            print_line(f"reserved {device_list(res['device_ids'])} for this job {start}")
    elif ex.get("blockers"):
        print("devices it could use:")
        for d, why in sorted(ex["blockers"].items()):
            print_line(f"  {d}: {why}")
    return 0


def _host_fit(h: dict) -> str:
    """ "gpu-box-1: 3 of 4 free; gpu2 held by job 42 (bob) until 13:05 at most" """
    words = f"{h['host']}: {h['free']} of {h['matching']} free"
    for x in h.get("held") or []:
        name = x["device_id"].rpartition(":")[2]
        what = "hold" if x["kind"] == "hold" else "job"
        words += f"; {name} held by {what} {x['job_id']} ({x['holder']})"
        words += f" until {when(x['until'])} at most" if x.get("until") else " with no time limit"
    return words
