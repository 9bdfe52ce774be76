"""`rc show`: everything about one job or hold."""

from __future__ import annotations

import argparse

from rc.cli.context import client
from rc.cli.output import (
    command_text,
    duration,
    job_state,
    on_devices,
    print_json,
    print_line,
    when,
)
from rc.proto import calls

__all__ = ["array_lines", "cmd_show", "show_lines"]


def array_lines(a: dict) -> list[tuple[str, str]]:
    """An array's summary for rc show and rc jobs --array: (field, value)."""
    order = ("succeeded", "failed", "killed", "lost", "running", "assigned", "queued")
    counts = ", ".join(f"{a['counts'][s]} {s}" for s in order if a["counts"].get(s))
    failed = a.get("failed_indices") or []
    cap = f", at most {a['max_running']} at once" if a.get("max_running") else ""
    return [
        ("array", f"{a['array_id']}: {a['size']} elements ({a['spec']}){cap}"),
        ("elements", counts or "-"),
        ("not ok", ",".join(str(i) for i in failed) if failed else "-"),
        ("wall time", duration(a.get("wall_seconds")) + ("" if a.get("done") else " so far")),
    ]


def cmd_show(args: argparse.Namespace) -> int:
    """`rc show JOB`: everything about one job or hold (GET ?detail=1)."""
    c = client(args)
    view = c.call(calls.JOB_GET, args.job, params={"detail": "1"})
    if args.output == "json":
        print_json(view)
        return 0
    for key, value in show_lines(view):
        print_line(f"{key + ':':<13} {value}")
    return 0


def _parked(j: dict) -> list[tuple[str, str]]:
    """A queued job's stash and begin time (README "Editing the queue")."""
    out = []
    if j.get("stashed") and j["state"] == "queued":
        out.append(("stashed", f"yes: it keeps its place; rc unstash {j['id']} lets it go"))
    if j.get("begin_at") and j["state"] == "queued":
        out.append(("begins at", when(j["begin_at"])))
    return out


def _history(kind: str, d: dict) -> list[tuple[str, str]]:
    """The log's size (and the log quota), and how long the controller keeps
    the job (README "History that ends"; a controller without --retain says
    nothing of it)."""
    out = []
    if kind == "job":
        quota = d.get("log_quota_bytes") or 0
        per = f" (a quota of {quota:,} bytes per user: rc serve --log-quota)" if quota else ""
        out.append(("log", f"{d.get('log_bytes', 0)} bytes{per}"))
    if "retain_seconds" in d:
        out.append(("kept", _kept(d)))
    return out


def _kept(d: dict) -> str:
    """How long the controller keeps the job (rc serve --retain)."""
    retain = d.get("retain_seconds") or 0
    if not retain:
        return "for ever (rc serve --retain 0)"
    if d.get("removed_at"):
        return f"until {when(d['removed_at'])} (rc serve --retain {duration(retain)})"
    return f"{duration(retain)} after it ends (rc serve --retain)"


def show_lines(view: dict) -> list[tuple[str, str]]:
    """`rc show`'s lines, (field, value), in reading order."""
    j, d = view["job"], view.get("detail") or {}
    kind = j.get("kind", "job")
    state = job_state(j, None)
    if j["state"] == "queued" and view.get("queue_position"):
        state += f" (position {view['queue_position']} in the queue)"
    out = [(kind, str(j["id"]))]
    if j.get("name"):
        out.append(("name", j["name"]))
    if j.get("array_id") is not None:
        item = f" (item {j['array_item']!r})" if j.get("array_item") else ""
        out.append(("element", f"index {j['array_index']} of array {j['array_id']}{item}"))
    out.append(("state", state))
    out += _parked(j)
    if j["state"] == "queued" and d.get("explain"):
        out.append(("waiting", d["explain"]))
    out.append(("submitter", j["submitter"]))
    if j.get("owner"):  # the principal that owns it (who may act on it)
        out.append(("owner", j["owner"]))
    # The Unix user the job runs as, when the controller records it
    # (jobs.unix_user); a controller that does not says nothing here.
    if j.get("unix_user"):
        out.append(("unix user", j["unix_user"]))
    devices_now = on_devices(j)
    out.append(("devices", devices_now or "-"))
    if j.get("selector"):
        out.append(("selector", j["selector"]))
    out.append(("count", str(j.get("count") or 1)))
    if kind == "hold":
        out.append(("reason", j.get("reason") or "-"))
    else:
        out.append(("command", command_text(j.get("command") or (), 10_000)))
        out.append(("cwd", j.get("cwd") or "-"))
        env = j.get("env") or {}
        out.append(("env", ", ".join(sorted(env)) if env else "-"))
    out.append(("priority", str(j.get("priority", 0))))
    if j.get("restart_count"):  # requeued after a hardware failure (README "GPU health")
        away = ", ".join(j.get("excluded_device_ids") or ()) or "-"
        out.append(("restarts", f"{j['restart_count']} of 3 (never again on {away})"))
    if kind == "job" and j.get("requeue_on_hardware") is False:
        out.append(("requeue", "no (--no-requeue-on-hardware)"))
    runtime = j.get("max_runtime_seconds") or 0
    ceiling = d.get("ceiling_seconds") or 0
    limit = duration(runtime) if runtime else "none asked (the devices' ceiling)"
    out.append(("ttl" if kind == "hold" else "max runtime", limit))
    out.append(("ceiling", duration(ceiling) if ceiling else "none"))
    if j.get("idle_timeout_seconds"):
        out.append(("idle timeout", duration(j["idle_timeout_seconds"])))
    idle = d.get("idle")
    if kind == "hold" and idle:  # README "Holds: the idle rule"
        t = idle.get("timeout_seconds") or 0
        out.append(("idle timeout", f"{duration(t)} without use" if t else "off"))
        if t and idle.get("state"):
            warned = " (warned)" if idle.get("warned") else ""
            reclaim = idle.get("reclaim_at")
            bound = runtime or ceiling
            ends = j["started_at"] + bound if bound and j.get("started_at") else None
            if reclaim and ends is not None and ends <= reclaim:  # the ttl comes first
                said = f"its ttl ends first, at {when(ends)}"
            else:
                said = f"released at {when(reclaim)}{warned}"
            out.append(("idle", f"{idle['state']}; {said}"))
    out.append(("submitted", when(j.get("submitted_at"))))
    out.append(("queued", when(j.get("queued_at"))))
    out.append(("started", when(j.get("started_at"))))
    out.append(("finished", when(j.get("finished_at"))))
    out.append(("waited", duration(d.get("waited_seconds"))))
    out.append(("ran", duration(d.get("ran_seconds"))))
    if j.get("exit_code") is not None:
        out.append(("exit code", str(j["exit_code"])))
    if j.get("kill_reason"):
        out.append(("end reason", j["kill_reason"]))
    out += _history(kind, d)
    for dep in d.get("after") or []:
        code = f", exit {dep['exit_code']}" if dep.get("exit_code") is not None else ""
        met = "met" if dep["met"] else "not met"
        out.append(
            ("after", f"job {dep['job_id']}:{dep['condition']} ({dep['state']}{code}; {met})")
        )
    if d.get("array"):
        out += array_lines(d["array"])
    return out
