"""Reading /proc: process status, groups, job escapees.

The parsers are pure functions over captured text so tests can feed them
anything; the scanners walk /proc and tolerate processes vanishing mid-read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "ProcStat",
    "ScanResult",
    "ancestors",
    "cmdline",
    "find_job_processes",
    "group_members",
    "last_pid",
    "live_group_members",
    "parse_environ_value",
    "parse_last_pid",
    "parse_stat",
    "processes",
]

PROC = "/proc"


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/PID/stat rc uses. state "Z" is a zombie."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int

    @property
    def live(self) -> bool:
        """Not a zombie (and not dead)."""
        return self.state not in ("Z", "X", "x")


def parse_stat(text: str) -> ProcStat | None:
    """Parse one /proc/PID/stat line; None if it does not parse.

    comm may hold spaces and parentheses, so the fields after it are read
    after the *last* ")".
    """
    try:
        open_ = text.index("(")
        close = text.rindex(")")
        pid = int(text[:open_].strip())
        comm = text[open_ + 1 : close]
        rest = text[close + 1 :].split()
        return ProcStat(pid, comm, rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
    except (ValueError, IndexError):
        return None


def parse_environ_value(data: bytes, name: bytes) -> bytes | None:
    """The value of variable `name` in a NUL-separated environ block, or None."""
    prefix = name + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :]
    return None


def _pids() -> Iterator[int]:
    for name in os.listdir(PROC):
        if name.isdigit():
            yield int(name)


def read_file(path: str) -> bytes:
    """The whole of a /proc file, read with plain system calls (a scan reads
    hundreds: buffered file objects cost twice as much). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_stat(pid: int) -> ProcStat | None:
    """The stat of one process, or None if it is gone."""
    try:
        return parse_stat(read_file(f"{PROC}/{pid}/stat").decode("utf-8", "replace"))
    except OSError:
        return None


def processes() -> Iterator[ProcStat]:
    """Every process's stat (processes that vanish mid-scan are skipped)."""
    for pid in _pids():
        st = read_stat(pid)
        if st is not None:
            yield st


def group_members(pgid: int) -> list[ProcStat]:
    """Every process (zombies included) whose process group is `pgid`."""
    return [p for p in processes() if p.pgrp == pgid]


def live_group_members(pgid: int) -> list[ProcStat]:
    """Non-zombie members of process group `pgid`."""
    return [p for p in group_members(pgid) if p.live]


def ancestors(pid: int | None = None) -> set[int]:
    """`pid` (default: this process) and all its ancestors."""
    out = set()
    cur = os.getpid() if pid is None else pid
    while cur > 0 and cur not in out:
        out.add(cur)
        st = read_stat(cur)
        if st is None:
            break
        cur = st.ppid
    return out


def cmdline(pid: int, limit: int = 200) -> str:
    """A process's command line, space-joined and shortened ("" if unreadable)."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    if not text:
        st = read_stat(pid)
        text = f"[{st.comm}]" if st else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class ScanResult:
    """Processes found carrying an RC_JOB_ID, and whether the scan saw everything.

    complete is False when /proc could not be listed or some live process's
    environ could not be read: then "none found" proves nothing.
    """

    pids: tuple[int, ...]
    complete: bool


def parse_last_pid(text: str) -> int | None:
    """The last allocated pid from /proc/loadavg text ("0.1 0.2 0.3 1/99 4242")."""
    try:
        return int(text.split()[4])
    except (IndexError, ValueError):
        return None


def last_pid() -> int | None:
    """The pid the kernel allocated last in this PID namespace (None if unknown)."""
    try:
        return parse_last_pid(read_file(f"{PROC}/loadavg").decode("ascii", "replace"))
    except OSError:
        return None


def find_job_processes(
    job_id: str | None = None,
    exclude: set[int] | None = None,
    require: dict[bytes, bytes] | None = None,
    min_pid: int = 0,
) -> ScanResult:
    """Live processes whose environment has RC_JOB_ID (equal to `job_id` when
    given, any non-empty value otherwise) and every variable in `require` with
    exactly that value, excluding `exclude` (default: this process and its
    ancestors). `require` scopes the scan to one worker's jobs (RC_HOST,
    RC_WORKER_INSTANCE), so two workers on one machine never touch each
    other's jobs, whose ids come from different controllers. `min_pid` skips
    lower pids unread: a caller that knows the pid counter has not wrapped
    since a job's leader started passes the leader's pid (every descendant
    is newer)."""
    skip = ancestors() if exclude is None else exclude
    want = job_id.encode() if job_id is not None else None
    found = []
    complete = True
    try:
        pids = list(_pids())
    except OSError:
        return ScanResult((), False)
    for pid in pids:
        if pid < min_pid or pid in skip:
            continue
        try:  # the environment first: most processes end the look there
            env = read_file(f"{PROC}/{pid}/environ")
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            st = read_stat(pid)
            if st is not None and st.live:
                complete = False
            continue
        if b"RC_JOB_ID=" not in env:
            continue
        value = parse_environ_value(env, b"RC_JOB_ID")
        if value is None or value == b"":
            continue
        if require and any(parse_environ_value(env, k) != v for k, v in require.items()):
            continue
        if want is None or value == want:
            st = read_stat(pid)  # a zombie has ended: nothing to sweep
            if st is not None and st.live:
                found.append(pid)
    return ScanResult(tuple(found), complete)
