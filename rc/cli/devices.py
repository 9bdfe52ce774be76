"""`rc devices` and `rc describe`."""

from __future__ import annotations

import argparse
import time

from rc.cli.complete import attach, devices, label_keys
from rc.cli.context import SelectorTerms, UsageError, add_client_flags, client, device_arg
from rc.cli.output import (
    add_output_flag,
    age,
    duration,
    job_state,
    job_what,
    print_json,
    print_line,
    table,
)
from rc.proto import calls

__all__ = ["add_parsers", "state_words"]

NO_CONTACT_S = 30.0
WHAT_SHOWN = 40
"""Characters of rc devices' last column: a job's command, "hold: REASON"."""


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "devices",
        help="every device, its state and who holds it",
        description="Every device: its state (free, busy, draining, out of the "
        "pool and why, no contact), who holds it and why, how long against its "
        "max runtime, and what it runs.",
    )
    attach(
        p.add_argument(
            "-s",
            "--select",
            "--selector",
            dest="selector",
            action=SelectorTerms,
            metavar="SELECTOR",
            help="only devices matching this selector, e.g. 'vram>=40G' (repeated: "
            "every one must match)",
        ),
        label_keys,
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="devices:cmd_devices")

    p = sub.add_parser(
        "describe",
        help="everything about one device: labels, sheet, jobs",
        description="Everything about device DEVICE: state, holder, last "
        "heartbeat, why it is out of the pool or draining, its labels with "
        "their source and age, its usage sheet and its recent jobs.",
    )
    attach(
        p.add_argument("device", type=device_arg, metavar="DEVICE", help="a device id, host:name"),
        devices,
    )
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="devices:cmd_describe")


def state_words(view: dict) -> str:
    """A device's state for a table: draining shown, quarantine reason added,
    and "(no contact N)" when its worker has been quiet over 30 s."""
    d = view["device"]
    s = d["state"]
    if d.get("draining") and s in ("ready", "busy"):
        s = "draining" if s == "ready" else "busy, draining"
    if s == "unhealthy":
        s += f" ({d.get('quarantine_reason') or 'unknown cause'})"
    hb = view.get("heartbeat_age_seconds")
    if hb is not None and hb > NO_CONTACT_S:
        s += f" (no contact {duration(hb)})"
    return s


def cmd_devices(args: argparse.Namespace) -> int:
    if args.selector is not None and not args.selector.strip():
        raise UsageError("-s needs a selector, e.g. 'kind=gpu'")
    c = client(args)
    # the table shows no labels: leave them out of the reply (-o json keeps them)
    labels = "true" if args.output == "json" else "false"
    views = c.call(calls.DEVICES, params={"labels": labels})["devices"]
    if args.selector is not None:
        keep = set(c.call(calls.EXPLAIN, params={"selector": args.selector})["matching"])
        views = [v for v in views if v["device"]["id"] in keep]
    if args.output == "json":
        print_json(views)
        return 0
    rows = []
    for v in views:
        elapsed = duration(v["elapsed_seconds"]) if v.get("elapsed_seconds") is not None else ""
        if elapsed and v.get("max_runtime_seconds"):
            elapsed += f"/{duration(v['max_runtime_seconds'])}"
        # the holder whole; a hold's reason (free text, any length) goes in
        # the last column, cut: it once widened the HOLDER column of every row
        rows.append(
            (
                v["device"]["id"],
                state_words(v),
                v.get("holder") or "",
                elapsed,
                job_what(v, WHAT_SHOWN) if v.get("holder") else "",
            )
        )
    table(("DEVICE", "STATE", "HOLDER", "ELAPSED", "COMMAND"), rows)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    c = client(args)
    info = c.call(calls.DEVICE_DESCRIBE, args.device)
    if args.output == "json":
        print_json(info)
        return 0
    v = info["view"]
    d = v["device"]
    print_line(f"{d['id']}: {state_words(v)}")
    if v.get("holder"):
        what = "holds it" if v.get("kind") == "hold" else f"runs job {v['job_id']}"
        line = f"  {v['holder']} {what}, for {duration(v.get('elapsed_seconds'))}"
        if v.get("reason"):
            line += f" ({v['reason']})"
        print_line(line)
    else:
        print_line("  free" if d["state"] == "ready" and not d.get("draining") else "  no holder")
    print_line(f"  last heartbeat {age(v.get('heartbeat_age_seconds'))}")
    if d["state"] == "unhealthy":
        print_line(
            f"  out of the pool: {d.get('quarantine_detail') or d.get('quarantine_reason') or 'unknown cause'}"
        )
    if d.get("draining"):
        print_line(f"  draining: {d.get('drain_reason') or 'no reason given'}")
    if d.get("max_runtime_seconds"):
        print_line(f"  runtime ceiling: {duration(d['max_runtime_seconds'])}")
    print_line("LABELS")
    ages = info.get("label_age_seconds", {})
    for lb in sorted(info["labels"], key=lambda x: (x["key"], x["source"] != "detected")):
        print_line(
            f"  {lb['key']}={lb['value']}  {lb['source']}  "
            f"{age(ages.get(lb['key'] + '/' + lb['source']))}"
        )
    if not info["labels"]:
        print_line("  (none)")
    print_line("USAGE SHEET")
    if info.get("sheet"):
        scope = "host-wide note" if info.get("sheet_is_host_wide") else "device note"
        print_line(f"  ({scope}, updated {age(info.get('sheet_age_seconds'))})")
        for line in info["sheet"].splitlines():
            print(f"  {line}")
    else:
        print_line("  (none on file)")
    print_line("RECENT JOBS")
    for j in info.get("recent_jobs", []):
        took = ""
        if j.get("started_at"):
            took = duration((j.get("finished_at") or time.time()) - j["started_at"])
        state = job_state(j, limit=None)
        what = "hold" if j["kind"] == "hold" else job_what(j, 50)
        print_line(f"  {j['id']}  {state}  {took}  {what}")
    if not info.get("recent_jobs"):
        print_line("  (none)")
    history = info.get("health_history", [])
    if history or any(lb["key"] == "health" for lb in info["labels"]):
        print_line("HEALTH HISTORY")
        for ev in history:
            print_line(f"  {age(time.time() - ev['at'])}  {ev['kind']}  {ev['text']}")
        if not history:
            print_line("  (nothing since it registered)")
    return 0
