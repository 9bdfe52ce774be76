"""Process tracking by cgroup (docs/design.md#teardown-empty-or-out).

Where the host lets the worker write a cgroup hierarchy, every job, hold
session, `rc exec` and `rc cp` runs in a cgroup of its own, under a subtree
the worker owns (`rc-worker-<host>-<tag>/job-<id>`, `.../session-<hold>-<sid>`;
the tag names its host lock: subtree_name).
The child joins it right after fork, before anything else (and before any
privilege drop), so nothing of the job ever runs outside it: a process that
calls setsid, double-forks or clears its environment (`env -i`) stays a
member. Modes, detected once at start (`Tracker.detect`):

- `cgroup2`: a writable cgroup v2 hierarchy (the unified mount, or
  /sys/fs/cgroup on a pure-v2 host; under the worker's own cgroup when it
  may write there, as with systemd's `Delegate=yes`). Kill: `cgroup.kill`
  where the kernel has it, else freeze (`cgroup.freeze`) → SIGKILL every
  member → thaw.
- `cgroup1`: the cgroup v1 freezer hierarchy. Kill: `freezer.state` FROZEN →
  SIGKILL every member → THAWED.
- `scan`: no writable hierarchy; the process group and the RC_JOB_ID scan
  (rc.worker.supervise) are all there is.

Every kill repeats until the cgroup is empty or its deadline passes;
verified empty (`cgroup.procs` empty), the cgroup is removed. The
`cgroup_root` worker setting names the hierarchy to use instead of the
detected one (a directory that is not a writable cgroup hierarchy gives
`scan`). Standard library only: files under /sys/fs/cgroup.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass

from rc.worker import hostlock, procfs

__all__ = [
    "CGROUP1",
    "CGROUP2",
    "KILL_WAIT_S",
    "SCAN",
    "Cgroup",
    "Mount",
    "Tracker",
    "enter",
    "parse_mounts",
    "parse_pids",
    "parse_self_cgroup",
    "place",
    "subtree_name",
]

log = logging.getLogger("rc.worker.cgroups")

CGROUP2 = "cgroup2"
CGROUP1 = "cgroup1"
SCAN = "scan"
KILL_WAIT_S = 5.0
"""How long a cgroup kill may take to empty the cgroup (s)."""
POLL_S = 0.01
MOUNTS = "/proc/self/mounts"
SELF_CGROUP = "/proc/self/cgroup"
DEFAULT_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of /proc/self/mounts: where, which filesystem, its options."""

    path: str
    fstype: str
    options: tuple[str, ...]


def _unescape(field: str) -> str:
    """Octal escapes of /proc/self/mounts ("\\040" is a space)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts in /proc/self/mounts text, in order."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append(Mount(_unescape(parts[1]), parts[2], tuple(parts[3].split(","))))
    return out


def parse_self_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup text → {controller: path}; "" is the v2 hierarchy
    ("0::/x"), a v1 line names each of its controllers ("6:freezer:/")."""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out[""] = parts[2]
        else:
            for c in parts[1].split(","):
                out[c] = parts[2]
    return out


def parse_pids(text: str) -> list[int]:
    """cgroup.procs text → its pids (lines that are not numbers are skipped)."""
    return [int(x) for x in text.split() if x.isdigit()]


def subtree_name(host: str, lock: str = "") -> str:
    """The worker's own subtree under a hierarchy: "rc-worker-<host>-<tag>",
    the tag a digest of the host lock file the worker holds (`lock`:
    rc.worker.hostlock.lock_path). The host lock keeps one worker per host
    name and lock directory, so the subtree is that worker's alone, and the
    same for its next process (which finds the cgroups of the jobs of the
    one before). Two workers that share a host name but not a lock directory
    (another TMPDIR, as each test has its own) no longer sweep each other's
    new, still empty cgroups: a job then failed to start with "No such file
    or directory"."""
    tag = hashlib.sha256(lock.encode()).hexdigest()[:8]
    return f"rc-worker-{host}-{tag}"


def enter(fd: int) -> None:
    """In the child, right after fork: join the cgroup whose cgroup.procs is
    open on `fd` ("0" is the writer itself), before exec. The fd was opened
    by the worker, and the kernel checks a write against the opener's
    credentials (Linux 5.16 and later; cgroup v1 always lets a process move
    itself), so the join works before or after a privilege drop. A join
    the kernel refuses leaves the child where it is: the parent sees it is
    not a member and says so (rc.worker.supervise.spawn); the job still
    runs, tracked by its group and RC_JOB_ID."""
    try:
        os.write(fd, b"0")
    except OSError:
        pass


def place(cgroup: Cgroup, pid: int) -> None:
    """From the worker: move process `pid` into `cgroup` (write it into its
    cgroup.procs). Raises OSError when the kernel refuses."""
    fd = cgroup.join_fd()
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


class Cgroup:
    """One cgroup of the worker's subtree (`v2`: of a cgroup v2 hierarchy)."""

    def __init__(self, path: str, v2: bool) -> None:
        self.path = path
        self.v2 = v2
        self.name = os.path.basename(path)

    def __repr__(self) -> str:
        return f"Cgroup({self.path!r})"

    def join_fd(self) -> int:
        """An fd on its cgroup.procs for `enter` (close-on-exec; the caller
        closes it once the child started). Raises OSError."""
        return os.open(os.path.join(self.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def pids(self) -> list[int]:
        """Its member processes (zombies included; [] once it is gone)."""
        try:
            return parse_pids(_read(os.path.join(self.path, "cgroup.procs")))
        except FileNotFoundError:
            return []
        except OSError as e:
            if e.errno == errno.ENODEV:
                return []
            raise

    def live_pids(self) -> list[int]:
        """Its members that are not zombies."""
        out = []
        for pid in self.pids():
            st = procfs.read_stat(pid)
            if st is not None and st.live:
                out.append(pid)
        return out

    def exists(self) -> bool:
        """Whether the cgroup directory is still there."""
        return os.path.isdir(self.path)

    def signal(self, signum: int) -> int:
        """Send `signum` to every member; how many there were."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signum)
            except OSError:  # gone (ESRCH), or not ours to signal (EPERM)
                pass
        return len(pids)

    def _freeze(self, on: bool, deadline: float) -> None:
        if self.v2:
            _write(os.path.join(self.path, "cgroup.freeze"), "1" if on else "0")
            want = "frozen 1" if on else "frozen 0"
            events = os.path.join(self.path, "cgroup.events")
            while want not in _read(events) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        else:
            state = os.path.join(self.path, "freezer.state")
            _write(state, "FROZEN" if on else "THAWED")
            want = "FROZEN" if on else "THAWED"
            while _read(state).strip() != want and time.monotonic() < deadline:
                time.sleep(POLL_S)

    def kill(self, timeout: float = KILL_WAIT_S) -> list[int]:
        """SIGKILL every member, so that none can fork meanwhile: cgroup.kill
        (v2), else freeze → SIGKILL each → thaw; repeated until the cgroup is
        empty of live processes or `timeout` seconds passed. Returns the
        live pids still in it."""
        deadline = time.monotonic() + timeout
        kill_file = os.path.join(self.path, "cgroup.kill")
        while True:
            left = self.live_pids()
            if not left or time.monotonic() >= deadline:
                return left
            try:
                if self.v2 and os.path.exists(kill_file):
                    _write(kill_file, "1")
                else:
                    self._freeze(True, min(deadline, time.monotonic() + 1.0))
                    try:
                        self.signal(signal.SIGKILL)
                    finally:
                        self._freeze(False, min(deadline, time.monotonic() + 1.0))
            except FileNotFoundError:
                return []
            time.sleep(POLL_S)

    def remove(self) -> bool:
        """rmdir it when it is empty; True once it is gone."""
        try:
            os.rmdir(self.path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            log.warning("cannot remove cgroup %s: %s", self.path, e.strerror or e)
            return False


class Tracker:
    """How this worker tracks processes: `mode` (CGROUP2, CGROUP1 or SCAN),
    its subtree `base` ("" in scan mode) and `why` (in words, for the log)."""

    def __init__(self, mode: str, base: str = "", why: str = "") -> None:
        self.mode = mode
        self.base = base
        self.why = why

    @property
    def v2(self) -> bool:
        """Whether the hierarchy is cgroup v2."""
        return self.mode == CGROUP2

    @classmethod
    def detect(cls, host: str, root: str = "", mounts: str = MOUNTS) -> Tracker:
        """The mode this host allows: `root` (the cgroup_root setting) when
        given, else a v2 hierarchy, else the v1 freezer; SCAN when the worker
        may create its subtree in none of them."""
        try:
            table = parse_mounts(_read(mounts))
        except OSError:
            table = []
        try:
            own = parse_self_cgroup(_read(SELF_CGROUP))
        except OSError:
            own = {}
        if root:
            root = os.path.realpath(root)
            m = next((m for m in table if m.path == root), None)
            if m is None:
                return cls(SCAN, why=f"cgroup_root {root} is not a cgroup hierarchy")
            candidates = [m]
        else:
            v2 = sorted(
                (m for m in table if m.fstype == "cgroup2"),
                key=lambda m: DEFAULT_ROOTS.index(m.path) if m.path in DEFAULT_ROOTS else 9,
            )
            v1 = [m for m in table if m.fstype == "cgroup" and "freezer" in m.options]
            candidates = v2 + v1
        tried = []
        for m in candidates:
            is_v2 = m.fstype == "cgroup2"
            if not is_v2 and "freezer" not in m.options:
                tried.append(f"{m.path} has no freezer")
                continue
            mine = own.get("" if is_v2 else "freezer", "/")
            for parent in dict.fromkeys([os.path.join(m.path, mine.lstrip("/")), m.path]):
                base = os.path.join(parent, subtree_name(host, hostlock.lock_path(host)))
                try:
                    os.makedirs(base, exist_ok=True)
                    probe = Cgroup(os.path.join(base, "probe"), is_v2)
                    os.makedirs(probe.path, exist_ok=True)
                    ok = os.access(os.path.join(probe.path, "cgroup.procs"), os.W_OK)
                    probe.remove()
                except OSError as e:
                    tried.append(f"{base}: {e.strerror or e}")
                    continue
                if ok:
                    return cls(CGROUP2 if is_v2 else CGROUP1, base, f"cgroups under {base}")
                tried.append(f"{base}: cgroup.procs is not writable")
        why = "; ".join(tried) or "no cgroup hierarchy is mounted"
        return cls(SCAN, why=f"no writable cgroup hierarchy ({why})")

    def cgroup(self, name: str) -> Cgroup | None:
        """The cgroup `name` of the subtree, whether or not it exists (None in
        scan mode)."""
        if self.mode == SCAN:
            return None
        return Cgroup(os.path.join(self.base, name), self.v2)

    def create(self, name: str) -> Cgroup | None:
        """Make cgroup `name` (job-17, session-17-2) in the subtree; None in
        scan mode or when it cannot be made (logged: the process then runs
        tracked by its group and RC_JOB_ID only)."""
        cg = self.cgroup(name)
        if cg is None:
            return None
        try:
            os.makedirs(cg.path, exist_ok=True)
        except OSError as e:
            log.warning("cannot create cgroup %s: %s", cg.path, e.strerror or e)
            return None
        return cg

    def close(self) -> None:
        """Remove the subtree if nothing is left in it (a worker that stops)."""
        if self.mode != SCAN and not self.children():
            Cgroup(self.base, self.v2).remove()

    def children(self, prefix: str = "") -> list[Cgroup]:
        """The cgroups of the subtree whose names start with `prefix`."""
        if self.mode == SCAN:
            return []
        try:
            names = sorted(os.listdir(self.base))
        except OSError:
            return []
        return [
            Cgroup(os.path.join(self.base, n), self.v2)
            for n in names
            if n.startswith(prefix) and os.path.isdir(os.path.join(self.base, n))
        ]
