"""`rc jobs`, `rc show`, `rc logs`, `rc kill`, `rc ps`, `rc explain`."""

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
    stderr,
)
from rc.cli.devices import state_words
from rc.cli.follow import exit_status, follow_log
from rc.cli.output import (
    add_output_flag,
    command_text,
    duration,
    job_state,
    job_target,
    job_what,
    job_who,
    on_devices,
    print_json,
    print_line,
    table,
    when,
)
from rc.proto import calls
from rc.proto.model import device_list
from rc.proto.wire import KILL_MANY_MAX, KillManyRequest, KillRequest

__all__ = ["add_parsers"]

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


def add_filter_flags(p: argparse.ArgumentParser) -> None:
    """--mine, --user, --state, --name, --since: which jobs (rc jobs, rc kill)."""
    p.add_argument("--mine", action="store_true", help="only your own jobs (you own them)")
    p.add_argument(
        "--user",
        "--submitter",
        dest="submitter",
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
    p.set_defaults(handler="jobs:cmd_show")

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
    p.set_defaults(handler="jobs:cmd_logs")

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
    p.set_defaults(handler="jobs:cmd_kill")

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
    if kind == "job":
        out.append(("log", f"{d.get('log_bytes', 0)} bytes"))
    for dep in d.get("after") or []:
        code = f", exit {dep['exit_code']}" if dep.get("exit_code") is not None else ""
        met = "met" if dep["met"] else "not met"
        out.append(
            ("after", f"job {dep['job_id']}:{dep['condition']} ({dep['state']}{code}; {met})")
        )
    if d.get("array"):
        out += array_lines(d["array"])
    return out


class _HeadDone(Exception):
    """`rc logs --head N` has shown its N lines."""


class _Head:
    """A binary stream that passes on the first `lines` lines, then raises _HeadDone."""

    def __init__(self, out, lines: int) -> None:
        self.out, self.left = out, lines

    def write(self, data: bytes) -> int:
        at = 0
        while self.left and (nl := data.find(b"\n", at)) != -1:
            at, self.left = nl + 1, self.left - 1
        if not self.left:
            self.out.write(data[:at])
            self.out.flush()
            raise _HeadDone
        self.out.write(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def _tail(c, job_id: int, lines: int, size: int) -> tuple[bytes, int]:
    """The last `lines` lines of a job's stored log of `size` bytes, read
    backwards TAIL_WINDOW_BYTES at a time (doubling), and the offset after them."""
    window = TAIL_WINDOW_BYTES
    while True:
        start = max(0, size - window)
        data = c.call(calls.JOB_LOGS, job_id, params={"offset": start, "follow": "0"})
        body = data[:-1] if data.endswith(b"\n") else data
        if start == 0 or body.count(b"\n") >= lines:
            end = start + len(data)
            if lines == 0:
                return b"", end
            cut = len(body)
            for _ in range(lines):
                cut = body.rfind(b"\n", 0, cut)
                if cut == -1:
                    return data, end
            return data[cut + 1 :], end
        window *= 2


def cmd_logs(args: argparse.Namespace) -> int:
    """`rc logs JOB [-f] [--tail N | --head N]`. On a job still in the queue
    it says so (and its position) on stderr; with -f it then waits for it."""
    c = client(args)
    out = sys.stdout.buffer
    offset = 0
    view = None
    view = c.call(calls.JOB_GET, args.job, params={"detail": "1"})
    if view["job"]["state"] == "queued":
        pos = view.get("queue_position") or 0
        where = f" (position {pos} in the queue)" if pos else ""
        if not args.follow:
            stderr(
                f"job {args.job} is queued{where}: no output yet (rc logs -f {args.job} waits for it)"
            )
            return 0
        stderr(f"job {args.job} is queued{where}; waiting for it to start (Ctrl-C stops following)")
    try:
        if args.tail is not None:
            data, offset = _tail(c, args.job, args.tail, view["detail"]["log_bytes"])
            out.write(data)
            out.flush()
            if not args.follow:
                return 0
        if args.head is not None:
            out = _Head(out, args.head)
        follow_log(c, args.job, out, offset=offset, follow=args.follow)
    except _HeadDone:
        return 0
    except KeyboardInterrupt:
        return 130
    if args.follow:  # followed to the end: exit as the job did, like rc run
        return exit_status(c.call(calls.JOB_GET, args.job)["job"])
    return 0


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
