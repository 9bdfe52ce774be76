"""`rc doctor`: check this box the way an operator would, and say what to
fix. Each check prints one line, `ok`, `warn` or `FAIL`, with what it saw
and what to do; the exit code is 1 when any check failed, else 0. Checks
that do not apply here (no nvidia-smi, no socket) say so as ok.

The checks: the state directory (and the worker's spool) on persistent
storage with room to spare; cgroup v2 with the controllers a job's limits
need; nvidia-smi's answer time and persistence mode; the clock
synchronised; the open-file limit; the local socket's permissions; the
controller reachable (unless --local).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import dataclasses
import os
import resource
import shutil
import stat
import subprocess
import time
from collections.abc import Callable

from rc import __version__
from rc.cli.context import add_client_flags, client
from rc.cli.output import add_output_flag, print_json
from rc.proto import calls
from rc.proto.errors import RcError
from rc.proto.mounts import VOLATILE, filesystem_of

__all__ = ["Check", "cmd_doctor", "run_checks"]

FREE_WARN_BYTES = 1 << 30
"""Less free space than this (1 GiB) where the state lives: a warning."""
NVIDIA_SMI_TIMEOUT_S = 10.0
NVIDIA_SMI_SLOW_S = 2.0
"""An nvidia-smi query slower than this (seconds) slows every health check."""
NOFILE_WANT = 8192
"""rc serve asks for this many open files (README "Performance")."""
TIME_ERROR = 5
"""adjtimex(2)'s answer when the clock is not synchronised."""


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """One finding: `status` "ok", "warn" or "fail"; `what` the thing
    checked; `seen` what was found; `fix` what to do ("" when ok)."""

    status: str
    what: str
    seen: str
    fix: str = ""


def _storage(path: str, what: str, mounts: str) -> list[Check]:
    if not path:
        return []
    if not os.path.exists(path):
        return [Check("ok", what, f"{path} does not exist (yet): nothing to check")]
    point, fstype = filesystem_of(path, mounts)
    out = []
    if fstype in VOLATILE:
        out.append(
            Check(
                "fail",
                what,
                f"{path} is on {fstype} ({point})",
                "move it to a disk: a reboot empties it and every job and log in it is lost",
            )
        )
    else:
        out.append(Check("ok", what, f"{path} on {fstype or 'an unknown filesystem'}"))
    free = shutil.disk_usage(path).free
    if free < FREE_WARN_BYTES:
        out.append(
            Check("warn", f"{what} space", f"{free >> 20} MiB free", "free space: logs need room")
        )
    return out


def _cgroup_mounts(mounts: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, "cgroup" or "cgroup2", v1 controllers) of each cgroup mount."""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], set(parts[3].split(","))))
    return out


def _cgroups(mounts: str) -> list[Check]:
    """cgroup v2 with cpu, memory and pids delegated; or v1 with those
    hierarchies mounted (what the worker uses for a job's tracking and limits)."""
    want = {"cpu", "memory", "pids"}
    found = _cgroup_mounts(mounts)
    for point, kind, _ in found:
        if kind != "cgroup2":
            continue
        try:
            with open(os.path.join(point, "cgroup.controllers")) as f:
                have = set(f.read().split())
        except OSError:
            continue
        if want <= have:
            return [Check("ok", "cgroups", f"cgroup v2 at {point} with cpu, memory, pids")]
    v1 = set().union(*(opts for _, kind, opts in found if kind == "cgroup")) if found else set()
    if want <= v1:
        return [Check("ok", "cgroups", "cgroup v1 with cpu, memory, pids hierarchies")]
    missing = want - v1
    return [
        Check(
            "warn",
            "cgroups",
            f"no cgroup hierarchy with {', '.join(sorted(missing))}"
            if found
            else "no cgroup filesystem mounted",
            "mount cgroup v2 (systemd does by default) and delegate cpu, memory and pids to "
            "the worker (Delegate=yes in its unit): without them a job's processes are "
            "tracked by process group only",
        )
    ]


def _nvidia(smi: str) -> list[Check]:
    path = shutil.which(smi)
    if path is None:
        return [Check("ok", "nvidia-smi", "not on PATH: no NVIDIA GPUs to check")]
    t0 = time.monotonic()
    try:
        res = subprocess.run(
            [path, "--query-gpu=index,persistence_mode", "--format=csv,noheader"],
            capture_output=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [
            Check(
                "fail",
                "nvidia-smi",
                f"no answer in {NVIDIA_SMI_TIMEOUT_S:g} s",
                "the driver is hung: reset the GPU or reboot; the worker marks the devices unknown",
            )
        ]
    took = time.monotonic() - t0
    if res.returncode != 0:
        err = res.stderr.decode(errors="replace").strip().splitlines()[:1]
        return [Check("fail", "nvidia-smi", f"exit {res.returncode}: {' '.join(err)}")]
    out = [
        Check(
            "warn" if took > NVIDIA_SMI_SLOW_S else "ok",
            "nvidia-smi",
            f"answered in {took:.2f} s",
            "enable persistence mode (nvidia-smi -pm 1, or nvidia-persistenced)"
            if took > NVIDIA_SMI_SLOW_S
            else "",
        )
    ]
    off = [
        line.split(",")[0].strip()
        for line in res.stdout.decode(errors="replace").splitlines()
        if "disabled" in line.lower()
    ]
    if off:
        out.append(
            Check(
                "warn",
                "persistence mode",
                f"off on GPU {', '.join(off)}",
                "nvidia-smi -pm 1 (or run nvidia-persistenced): each query otherwise wakes "
                "the driver",
            )
        )
    return out


def _clock() -> list[Check]:
    libc_name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        buf = ctypes.create_string_buffer(512)  # struct timex, modes = 0: read only
        state = libc.adjtimex(buf)
    except (OSError, AttributeError):
        return [Check("ok", "clock", "adjtimex unavailable: not checked")]
    if state == TIME_ERROR:
        return [
            Check(
                "warn",
                "clock",
                "not synchronised (adjtimex)",
                "run an NTP client (chrony, systemd-timesyncd): listings and usage use "
                "wall-clock times",
            )
        ]
    return [Check("ok", "clock", "synchronised")]


def _nofile() -> list[Check]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < NOFILE_WANT:
        return [
            Check(
                "warn",
                "open files",
                f"hard limit {hard}",
                f"raise it to {NOFILE_WANT} or more (LimitNOFILE= in the unit): every "
                "follower and relay holds a connection",
            )
        ]
    return [Check("ok", "open files", f"soft {soft}, hard {hard}")]


def _socket(path: str) -> list[Check]:
    if not path or not os.path.exists(path):
        return [Check("ok", "local socket", f"{path or 'none'}: not here")]
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode):
        return [Check("fail", "local socket", f"{path} is not a socket", "remove it")]
    parent = os.stat(os.path.dirname(path) or ".")
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        return [
            Check(
                "fail",
                "local socket",
                f"{os.path.dirname(path)} is writable by everyone",
                "chmod o-w it: anyone could replace the socket",
            )
        ]
    return [Check("ok", "local socket", f"{path} (mode {stat.S_IMODE(st.st_mode):o})")]


def _controller(args: argparse.Namespace) -> list[Check]:
    try:
        c = client(args, timeout=10.0)
        c.call(calls.WHOAMI)
    except RcError as e:
        return [Check("warn", "controller", f"not reached: {e}", "see rc whoami")]
    return [Check("ok", "controller", f"reached at {c.url}")]


def run_checks(args: argparse.Namespace, mounts: str = "/proc/self/mounts") -> list[Check]:
    """Every check, in the order printed."""
    steps: list[Callable[[], list[Check]]] = [
        lambda: _storage(args.data, "state directory", mounts),
        lambda: _storage(args.spool, "worker spool", mounts),
        lambda: _cgroups(mounts),
        lambda: _nvidia(args.nvidia_smi),
        _clock,
        _nofile,
        lambda: _socket(args.socket),
    ]
    if not args.local:
        steps.append(lambda: _controller(args))
    out: list[Check] = []
    for step in steps:
        out.extend(step())
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = run_checks(args)
    if args.output == "json":
        print_json({"version": __version__, "checks": [dataclasses.asdict(c) for c in checks]})
    else:
        for c in checks:
            word = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}[c.status]
            fix = f": {c.fix}" if c.fix else ""
            print(f"{word} {c.what}: {c.seen}{fix}")
    return 1 if any(c.status == "fail" for c in checks) else 0


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this box (storage, cgroups, nvidia-smi, clock, limits) and say what to fix",
        description="Check this box the way an operator would: the state directory and the "
        "worker's spool on persistent storage, cgroup v2 and its controllers, nvidia-smi's "
        "answer time and persistence mode, clock synchronisation, the open-file limit, the "
        "local socket's permissions, and the controller. Exit 1 when a check failed.",
    )
    p.add_argument(
        "--data",
        default="/var/lib/rc",
        metavar="DIR",
        help="the controller's data directory (default %(default)s)",
    )
    p.add_argument(
        "--spool", default="", metavar="DIR", help="the worker's spool_dir, when it has one"
    )
    p.add_argument(
        "--socket",
        default=os.environ.get("RC_SOCKET", "/run/rc/rc.sock"),
        metavar="PATH",
        help="the local socket (default: RC_SOCKET or /run/rc/rc.sock)",
    )
    p.add_argument(
        "--nvidia-smi", default="nvidia-smi", metavar="PATH", help="the nvidia-smi to time"
    )
    p.add_argument("--local", action="store_true", help="do not contact the controller")
    add_output_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="doctor:cmd_doctor")
