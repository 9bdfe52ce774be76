"""Slurm's listings and scancel over rc, for rc's Slurm shims (rc.cli.slurm):
squeue, sacct, sinfo and scancel, with the states, ids and fields they
print. The mapping is rc.cli.slurm's docstring's."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable, Iterable

from rc.cli.context import stderr
from rc.proto import calls
from rc.proto.errors import ApiError, RcError
from rc.proto.wire.jobs import KillManyRequest

__all__ = [
    "SlurmError",
    "parser",
    "refuse_unknown",
    "sacct",
    "scancel",
    "sinfo",
    "slurm_state",
    "squeue",
]

PARTITION = "rc"
LIST_LIMIT = 1000
"""Jobs one listing asks for (the controller's page size maximum)."""

_STATES = {
    "queued": ("PENDING", "PD"),
    "assigned": ("CONFIGURING", "CF"),
    "running": ("RUNNING", "R"),
    "succeeded": ("COMPLETED", "CD"),
    "failed": ("FAILED", "F"),
    "killed": ("CANCELLED", "CA"),
    "lost": ("NODE_FAIL", "NF"),
}
_SHORT = {short: long for long, short in _STATES.values()} | {"TO": "TIMEOUT"}
_RC_STATES = {
    "PENDING": ("queued",),
    "CONFIGURING": ("assigned",),
    "RUNNING": ("running",),
    "COMPLETED": ("succeeded",),
    "FAILED": ("failed",),
    "CANCELLED": ("killed",),
    "TIMEOUT": ("killed",),
    "NODE_FAIL": ("lost",),
}
ACTIVE = ("queued", "assigned", "running")


class SlurmError(RcError):
    """A shim's refusal, printed as Slurm prints its own: `squeue: error: ...`."""


def slurm_state(job: dict) -> tuple[str, str]:
    """(long, short) Slurm state of an rc job record, e.g. ("RUNNING", "R")."""
    long, short = _STATES.get(job["state"], ("UNKNOWN", "?"))
    if job["state"] == "killed" and "max runtime" in (job.get("kill_reason") or ""):
        return "TIMEOUT", "TO"
    return long, short


def slurm_id(job: dict) -> str:
    """A job's Slurm id: its own, or ARRAYID_INDEX for an array element."""
    if job.get("array_id") is not None and job.get("array_index") is not None:
        return f"{job['array_id']}_{job['array_index']}"
    return str(job["id"])


def _hosts(job: dict) -> list[str]:
    """The hosts a job runs (or ran) on; none while it waits (a pinned
    queued job names its devices but has none yet)."""
    if job["state"] == "queued":
        return []
    ids = job.get("device_ids") or ([job["device_id"]] if job.get("device_id") else [])
    return sorted({d.partition(":")[0] for d in ids})


def _clock(seconds: float | None) -> str:
    """Slurm's elapsed form: [D-]HH:MM:SS, or M:SS under an hour (squeue %M)."""
    if seconds is None:
        return "0:00"
    s = max(0, int(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h:02d}:{m:02d}:{s:02d}"


def _elapsed(job: dict, now: float) -> float | None:
    if job.get("started_at") is None:
        return None
    return (job.get("finished_at") or now) - job["started_at"]


def _stamp(ts: float | None) -> str:
    """Slurm's timestamp form (local time), or Unknown."""
    if ts is None:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def _reason(job: dict) -> str:
    """squeue %R: the host list of a started job, else (why it waits)."""
    if job["state"] == "queued":
        return "(Resources)"
    return ",".join(_hosts(job)) or "(None)"


# -- the fields of squeue -o and sacct --format ---------------------------------------------


def _squeue_fields(now: float) -> dict[str, Callable[[dict], str]]:
    return {
        "i": slurm_id,
        "A": lambda j: str(j["id"]),
        "F": lambda j: str(j.get("array_id") or j["id"]),
        "K": lambda j: "N/A" if j.get("array_index") is None else str(j["array_index"]),
        "j": lambda j: j.get("name") or "rc",
        "u": lambda j: j.get("unix_user") or "",
        "T": lambda j: slurm_state(j)[0],
        "t": lambda j: slurm_state(j)[1],
        "M": lambda j: _clock(_elapsed(j, now)),
        "l": lambda j: (
            _clock(j.get("max_runtime_seconds")) if j.get("max_runtime_seconds") else "UNLIMITED"
        ),
        "D": lambda j: str(max(1, len(_hosts(j)))),
        "R": _reason,
        "N": lambda j: ",".join(_hosts(j)),
        "B": lambda j: (_hosts(j) or ["n/a"])[0],
        "P": lambda j: PARTITION,
        "b": lambda j: f"gpu:{j.get('count') or 1}",
        "Q": lambda j: str(j.get("priority", 0)),
        "V": lambda j: _stamp(j.get("submitted_at")),
        "S": lambda j: _stamp(j.get("started_at")),
        "Z": lambda j: j.get("cwd") or "",
        "%": lambda j: "%",
    }


_SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
_SQUEUE_HEADERS = {
    "i": "JOBID", "A": "JOBID", "F": "ARRAY_JOB_ID", "K": "ARRAY_TASK_ID", "j": "NAME",
    "u": "USER", "T": "STATE", "t": "ST", "M": "TIME", "l": "TIME_LIMIT", "D": "NODES",
    "R": "NODELIST(REASON)", "N": "NODELIST", "B": "EXEC_HOST", "P": "PARTITION",
    "b": "TRES_PER_NODE", "Q": "PRIORITY", "V": "SUBMIT_TIME", "S": "START_TIME",
    "Z": "WORK_DIR", "%": "%",
}  # fmt: skip
_SPEC = re.compile(r"%(\.?)(\d*)([A-Za-z%])")


def _format_row(fmt: str, fields: dict[str, Callable[[dict], str]], job: dict | None) -> str:
    """One squeue -o line: each %[.][size]type becomes its field (or header
    with job None), left-justified to size ('.': right-justified) and cut to it."""

    def one(m: re.Match) -> str:
        right, size, kind = m.group(1), m.group(2), m.group(3)
        if kind not in fields:
            raise SlurmError(f"squeue: error: Invalid job format specification: %{kind}")
        text = _SQUEUE_HEADERS[kind] if job is None else fields[kind](job)
        if not size:
            return text
        n = int(size)
        text = text[:n]
        return text.rjust(n) if right else text.ljust(n)

    return _SPEC.sub(one, fmt)


def _sacct_fields(now: float) -> dict[str, Callable[[dict], str]]:
    def exit_code(j: dict) -> str:
        code = j.get("exit_code")
        if code is None:
            return "0:0"
        return f"{code}:0" if 0 <= code < 256 else f"0:{code - 128 if code > 128 else code}"

    return {
        "jobid": slurm_id,
        "jobidraw": lambda j: str(j["id"]),
        "jobname": lambda j: j.get("name") or "rc",
        "user": lambda j: j.get("unix_user") or "",
        "state": lambda j: slurm_state(j)[0],
        "exitcode": exit_code,
        "elapsed": lambda j: _clock(_elapsed(j, now)),
        "elapsedraw": lambda j: str(int(_elapsed(j, now) or 0)),
        "submit": lambda j: _stamp(j.get("submitted_at")),
        "start": lambda j: _stamp(j.get("started_at")),
        "end": lambda j: _stamp(j.get("finished_at")),
        "nodelist": lambda j: ",".join(_hosts(j)) or "None assigned",
        "nnodes": lambda j: str(max(1, len(_hosts(j)))),
        "allocnodes": lambda j: str(len(_hosts(j))),
        "partition": lambda j: PARTITION,
        "account": lambda j: j.get("unix_user") or "",
        "alloccpus": lambda j: "1",
        "ncpus": lambda j: "1",
        "alloctres": lambda j: f"gres/gpu={j.get('count') or 1}",
        "reqtres": lambda j: f"gres/gpu={j.get('count') or 1}",
        "timelimit": lambda j: (
            _clock(j.get("max_runtime_seconds")) if j.get("max_runtime_seconds") else "UNLIMITED"
        ),
        "reason": lambda j: j.get("kill_reason") or "None",
        "workdir": lambda j: j.get("cwd") or "",
        "priority": lambda j: str(j.get("priority", 0)),
    }


_SACCT_DEFAULT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"


# -- reading jobs ---------------------------------------------------------------------------


def _id_list(text: str, prog: str) -> list[str]:
    """A Slurm job id list: ID, ARRAYID_INDEX, comma separated."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not re.fullmatch(r"\d+(_\d+)?", part):
            raise SlurmError(f"{prog}: error: Invalid job id: {part or text!r}")
        out.append(part)
    return out


def _jobs_of(c, ids: Iterable[str]) -> list[dict]:
    """The rc jobs that Slurm ids name: an id, every element of an array id,
    or one element (ARRAYID_INDEX). Ids rc does not know are left out (as a
    purged job leaves Slurm's listings)."""
    out: dict[int, dict] = {}
    for sid in ids:
        main, _, index = sid.partition("_")
        elements = c.call(calls.JOBS, params={"array": main, "limit": LIST_LIMIT})["jobs"]
        if elements:
            for j in elements:
                if not index or str(j.get("array_index")) == index:
                    out[j["id"]] = j
            continue
        if index:
            continue
        try:
            j = c.call(calls.JOB_GET, int(main))["job"]
        except ApiError as e:
            if e.status == 404:
                continue
            raise
        out[j["id"]] = j
    return sorted(out.values(), key=lambda j: j["id"])


def _listing(c, params: dict) -> list[dict]:
    return c.call(calls.JOBS, params={"limit": LIST_LIMIT, **params})["jobs"]


def _rc_states(text: str, prog: str) -> list[str]:
    """Slurm state names or short forms (comma list, any case) as rc states."""
    out: list[str] = []
    for part in text.upper().split(","):
        part = part.strip()
        if part == "ALL":
            return list(_STATES)
        long = _SHORT.get(part, part)
        if long not in _RC_STATES:
            raise SlurmError(f"{prog}: error: Invalid job state specified: {part}")
        out.extend(s for s in _RC_STATES[long] if s not in out)
    return out


class _Parser(argparse.ArgumentParser):
    """A shim's parser: usage errors as Slurm words them, exit 1."""

    def error(self, message: str):
        self.exit(1, f"{self.prog}: error: {message}\n")


def parser(prog: str) -> _Parser:
    """A shim's parser; --help only (-h is squeue's and sinfo's --noheader)."""
    p = _Parser(prog=prog, add_help=False, allow_abbrev=False)
    p.add_argument("--help", action="help", help="show this help and exit")
    return p


def refuse_unknown(prog: str, extras: list[str]) -> None:
    if extras:
        raise SlurmError(
            f"{prog}: error: rc's {prog} does not support {' '.join(extras)} "
            "(see the README, 'Slurm's commands')"
        )


# -- squeue ---------------------------------------------------------------------------------


def squeue(c, argv: list[str]) -> int:
    """squeue -h -j ID -o '%T %B' (batchspawner), --me, -u, -t, -o."""
    p = parser("squeue")
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-j", "--jobs")
    p.add_argument("-u", "--user")
    p.add_argument("--me", action="store_true")
    p.add_argument("-t", "--states")
    p.add_argument("-o", "--format", default=_SQUEUE_DEFAULT)
    p.add_argument("-n", "--name")
    p.add_argument("-a", "--all", action="store_true")  # every partition: there is one
    p.add_argument("-r", "--array", action="store_true")  # elements are listed one by one
    p.add_argument("-p", "--partition")
    args, extras = p.parse_known_args(argv)
    refuse_unknown("squeue", extras)
    states = _rc_states(args.states, "squeue") if args.states else list(ACTIVE)
    fields = _squeue_fields(time.time())
    header = _format_row(args.format, fields, None)  # a bad format is refused before any call
    if args.jobs:
        jobs = _jobs_of(c, _id_list(args.jobs, "squeue"))
        if not args.states:  # squeue -j of a job that ended: not listed
            jobs = [j for j in jobs if j["state"] in ACTIVE]
    else:
        params: dict = {"state": ",".join(states)}
        if args.me:
            params["mine"] = "1"
        jobs = _listing(c, params)
        jobs.sort(key=lambda j: (j["state"] not in ("running", "assigned"), j["id"]))
    jobs = [j for j in jobs if j["state"] in states]
    if args.user:
        users = set(args.user.split(","))
        jobs = [j for j in jobs if j.get("unix_user") in users]
    if args.name:
        names = set(args.name.split(","))
        jobs = [j for j in jobs if (j.get("name") or "rc") in names]
    if args.partition and args.partition not in (PARTITION,):
        jobs = []
    if not args.noheader:
        print(header)
    for j in jobs:
        print(_format_row(args.format, fields, j))
    return 0


# -- sacct ----------------------------------------------------------------------------------


def sacct(c, argv: list[str]) -> int:
    """sacct -o JobID,State --parsable2 -j ID -j ID (submitit), -X, -S, -u, -n."""
    p = parser("sacct")
    p.add_argument("-j", "--jobs", action="append", default=[])
    p.add_argument("-o", "--format", action="append", default=[])
    p.add_argument("-P", "--parsable2", action="store_true")
    p.add_argument("-p", "--parsable", action="store_true")
    p.add_argument("-n", "--noheader", action="store_true")
    p.add_argument("-X", "--allocations", action="store_true")  # rc has no steps
    p.add_argument("-S", "--starttime")
    p.add_argument("-u", "--user")
    p.add_argument("-s", "--state")
    p.add_argument("-a", "--allusers", action="store_true")
    args, extras = p.parse_known_args(argv)
    refuse_unknown("sacct", extras)
    fields = _sacct_fields(time.time())
    names = [f.strip() for spec in (args.format or [_SACCT_DEFAULT]) for f in spec.split(",")]
    names = [n.partition("%")[0] for n in names if n.strip()]
    for n in names:
        if n.lower() not in fields:
            raise SlurmError(f'sacct: error: Invalid field requested: "{n}"')
    if args.jobs:
        jobs = _jobs_of(c, [i for spec in args.jobs for i in _id_list(spec, "sacct")])
    else:
        since = _since(args.starttime) if args.starttime else _midnight()
        params: dict = {"since": f"{since:.0f}"}
        if not args.allusers and not args.user:
            params["mine"] = "1"
        jobs = sorted(_listing(c, params), key=lambda j: j["id"])
    if args.user:
        users = set(args.user.split(","))
        jobs = [j for j in jobs if j.get("unix_user") in users]
    if args.state:
        wanted = _rc_states(args.state, "sacct")
        jobs = [j for j in jobs if j["state"] in wanted]
    rows = [[fields[n.lower()](j) for n in names] for j in jobs]
    _print_sacct(names, rows, args)
    return 0


def _print_sacct(names: list[str], rows: list[list[str]], args: argparse.Namespace) -> None:
    if args.parsable2 or args.parsable:
        end = "|" if args.parsable and not args.parsable2 else ""
        if not args.noheader:
            print("|".join(names) + end)
        for r in rows:
            print("|".join(r) + end)
        return
    widths = [max(10, len(n)) for n in names]
    if not args.noheader:
        print(" ".join(n[:w].rjust(w) for n, w in zip(names, widths)))
        print(" ".join("-" * w for w in widths))
    for r in rows:
        print(" ".join(v[:w].rjust(w) for v, w in zip(r, widths)))


def _midnight() -> float:
    t = time.localtime()
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


def _since(text: str) -> float:
    """sacct -S: YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], or now-N[days|hours|minutes]."""
    m = re.fullmatch(r"now(?:-(\d+)(days|hours|minutes|seconds)?)?", text)
    if m:
        n, unit = int(m.group(1) or 0), m.group(2) or "seconds"
        return time.time() - n * {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}[unit]
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%m/%d/%y", "%m/%d"):
        try:
            t = time.strptime(text, fmt)
        except ValueError:
            continue
        year = t.tm_year if "%y" in fmt.lower() else time.localtime().tm_year
        return time.mktime((year, *t[1:6], 0, 0, -1))
    raise SlurmError(f"sacct: error: Invalid time specification (pos=0): {text}")


# -- scancel --------------------------------------------------------------------------------


def scancel(c, argv: list[str]) -> int:
    """scancel ID... (submitit, batchspawner), -u USER, -t STATE, -n NAME."""
    p = parser("scancel")
    p.add_argument("ids", nargs="*")
    p.add_argument("-u", "--user")
    p.add_argument("-t", "--state")
    p.add_argument("-n", "--name", "--jobname")
    p.add_argument("--me", action="store_true")
    p.add_argument("-s", "--signal")
    p.add_argument("-b", "--batch", action="store_true")
    p.add_argument("-f", "--full", action="store_true")
    p.add_argument("-Q", "--quiet", action="store_true")
    args, extras = p.parse_known_args(argv)
    refuse_unknown("scancel", extras)
    if args.signal:
        raise SlurmError(
            "scancel: error: rc's scancel does not send signals (--signal): it ends the job "
            "as rc kill does"
        )
    if args.ids:
        jobs = _jobs_of(c, [i for spec in args.ids for i in _id_list(spec, "scancel")])
        missing = {i for i in args.ids} - {slurm_id(j) for j in jobs} - {str(j["id"]) for j in jobs}
        missing -= {str(j.get("array_id")) for j in jobs}
        for sid in sorted(missing):
            if not args.quiet:
                stderr(f"scancel: error: Kill job error on job id {sid}: Invalid job id specified")
    elif args.user or args.state or args.name or args.me:
        params = {"state": ",".join(_rc_states(args.state, "scancel") if args.state else ACTIVE)}
        if args.me or not args.user:
            params["mine"] = "1"
        jobs = _listing(c, params)
    else:
        raise SlurmError("scancel: error: No job identification provided")
    if args.user:
        jobs = [j for j in jobs if j.get("unix_user") in set(args.user.split(","))]
    if args.name:
        jobs = [j for j in jobs if (j.get("name") or "rc") in set(args.name.split(","))]
    live = [j["id"] for j in jobs if j["state"] in ACTIVE]
    if live:
        got = c.call(calls.JOBS_KILL, body=_kill_many(live))
        for o in got["results"]:
            if not o.get("ok") and o.get("code") != "not_cancellable" and not args.quiet:
                stderr(f"scancel: error: Kill job error on job id {o['job_id']}: {o['message']}")
    return 0


def _kill_many(ids: list[int]) -> KillManyRequest:
    return KillManyRequest(tuple(ids), "scancel (rc's Slurm shim)")


# -- sinfo ----------------------------------------------------------------------------------


def _host_state(devices: list[dict]) -> str:
    """A host's sinfo state from its devices: alloc (all busy), mix (some),
    idle, drain (every device draining), down (none usable: unknown or
    quarantined)."""
    states = [d["device"]["state"] for d in devices]
    if all(d["device"].get("draining") for d in devices):
        return "drain"
    if all(s in ("unknown", "unhealthy") for s in states):
        return "down"
    busy = sum(1 for s in states if s == "busy")
    if busy == len(states):
        return "alloc"
    return "mix" if busy else "idle"


def sinfo(c, argv: list[str]) -> int:
    """sinfo: one line per node state of the one partition "rc"; -N one per
    host; -h no header."""
    p = parser("sinfo")
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-N", "--Node", action="store_true")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("-p", "--partition")
    args, extras = p.parse_known_args(argv)
    refuse_unknown("sinfo", extras)
    by_host: dict[str, list[dict]] = {}
    for v in c.call(calls.DEVICES)["devices"]:
        by_host.setdefault(v["device"]["id"].partition(":")[0], []).append(v)
    states = {h: _host_state(vs) for h, vs in sorted(by_host.items())}
    if args.Node:
        if not args.noheader:
            print(f"{'NODELIST':<15} {'NODES':>5} {'PARTITION':<9} {'STATE':<6} {'GRES':<10}")
        for h, st in states.items():
            print(f"{h:<15} {1:>5} {PARTITION + '*':<9} {st:<6} gpu:{len(by_host[h])}")
        return 0
    if not args.noheader:
        print(f"{'PARTITION':<9} {'AVAIL':>5} {'TIMELIMIT':>10} {'NODES':>5} {'STATE':<6} NODELIST")
    grouped: dict[str, list[str]] = {}
    for h, st in states.items():
        grouped.setdefault(st, []).append(h)
    for st, hosts in grouped.items():
        print(
            f"{PARTITION + '*':<9} {'up':>5} {'infinite':>10} {len(hosts):>5} {st:<6} "
            + ",".join(hosts)
        )
    return 0
