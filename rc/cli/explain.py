"""`rc explain`: why a queued job waits, or what a selector matches."""

from __future__ import annotations

import argparse

from rc.cli.context import UsageError, client
from rc.cli.devices import state_words
from rc.cli.output import print_json, print_line, when
from rc.proto import calls
from rc.proto.model import device_list

__all__ = ["cmd_explain"]


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
        ex = c.call(calls.EXPLAIN, params={"selector": args.selector})
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
            for v in c.call(calls.DEVICES, params={"labels": "false"})["devices"]
        }
        for d in ex["matching"]:
            why = "free" if d in ex["free"] else _not_free(views.get(d))
            print_line(f"  {d}  {why}")  # stdout escapes the other control characters
        print(f"free: {len(ex['free'])}/{len(ex['matching'])}")
        print(f"queue depth: {ex['queue_depth']}")
        return 0
    ex = c.call(calls.JOB_EXPLAIN, args.job)
    if args.output == "json":
        print_json(ex)
        return 0
    head = f"job {ex['job_id']}: {ex['state']}"
    if ex.get("queue_position"):
        head += f", position {ex['queue_position']} in the queue"
    print(head)
    for r in ex["reasons"]:
        print_line(f"  - {r}")
    if ex.get("priority"):  # every term of its effective priority (README "Sharing fairly")
        print_line(f"  effective priority: {ex['priority']}")
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
