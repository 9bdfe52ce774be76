"""Running a process in its own session and making sure it is gone.

A job (or hook, or verify script) is spawned with `setsid` so it leads a new
session and process group. Ending it:

1. SIGTERM to the whole group;
2. up to `grace` seconds for the group to empty;
3. SIGKILL to the group, then up to 2 s for the last members;
4. whoever is still alive is a survivor, reported by pid and command.

Given a cgroup (rc.worker.cgroups), the child is a member before the job's
own program runs (placed by the worker behind a gate, or joining in the
child before exec: `spawn`), and the group's members are the cgroup's too: signals reach both, and SIGKILL is the
cgroup's own kill, so a member that left the group (setsid, a double fork,
`env -i`) is ended with it. Zombies are never counted as alive. After a
job, processes that left the group but still carry the job's RC_JOB_ID are
found in /proc and ended the same way (`sweep_job`). Every spawned process
is tracked for the orphan reaper (rc.worker.reaper) until it is reaped
here. Every wait has a deadline.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rc.worker import cgroups, procfs, reaper
from rc.worker.account import Account

__all__ = [
    "JOB_UMASK",
    "STRAGGLER_WAIT_S",
    "Group",
    "Outcome",
    "kill_group",
    "signal_name",
    "spawn",
    "sweep_job",
]

log = logging.getLogger("rc.worker.supervise")

STRAGGLER_WAIT_S = 2.0
SWEEP_GRACE_S = 2.0
SWEEP_RESCAN_S = 0.02


def signal_name(signum: int) -> str:
    """ "SIGKILL" for 9, "signal 64" for an unnamed one."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a process ended: exit_code (128+N for signal N) and the signal, if any."""

    exit_code: int
    signal: int = 0


class Group:
    """A spawned process leading its own session and process group, and,
    where the host allows, its cgroup (`cgroup`: every process it started
    stays a member, whatever session, group or environment it moved to)."""

    def __init__(
        self, proc: subprocess.Popen, cgroup: cgroups.Cgroup | None = None, joined: bool = False
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.pgid = proc.pid
        self.cgroup = cgroup
        self.joined = joined
        """Whether the leader was seen in `cgroup` (or placed there) before it ran."""
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def wait(self, timeout: float, wake_fd: int | None = None) -> Outcome | None:
        """Wait up to `timeout` seconds for the leader; its Outcome once it exited.

        `wake_fd` (readable when someone wants the caller back early, e.g. a
        kill request) ends the wait at once with None; without a pidfd the
        wait only polls, so a wake-up then waits for the timeout.
        """
        if self.proc.returncode is None:
            if self._pidfd is not None:
                fds = [self._pidfd] if wake_fd is None else [self._pidfd, wake_fd]
                ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
                if self._pidfd not in ready:
                    return None
                self.proc.wait()
            else:
                try:
                    self.proc.wait(timeout=max(0.0, timeout))
                except subprocess.TimeoutExpired:
                    return None
        reaper.untrack(self.pid)
        self.close()
        rc = self.proc.returncode
        if rc < 0:
            return Outcome(128 - rc, -rc)
        return Outcome(rc, 0)

    def close(self) -> None:
        """Release the pidfd (the process itself is untouched)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def signal(self, signum: int) -> bool:
        """Send a signal to the whole group and every member of its cgroup
        (SIGKILL: the cgroup kill, rc.worker.cgroups.Cgroup.kill); False
        if both are gone."""
        there = killpg(self.pgid, signum)
        if self.cgroup is not None:
            try:
                if signum == signal.SIGKILL:
                    there = bool(self.cgroup.kill()) or there
                else:
                    there = bool(self.cgroup.signal(signum)) or there
            except OSError as e:
                log.warning("cgroup %s: cannot signal: %s", self.cgroup.path, e)
        return there

    def live_members(self) -> list[procfs.ProcStat]:
        """Members of the group or the cgroup that are not zombies (kill(-pgid, 0)
        first, which is cheap; only a group that exists is looked for in /proc)."""
        found: dict[int, procfs.ProcStat] = {}
        if self.cgroup is not None:
            try:
                for pid in self.cgroup.pids():
                    st = procfs.read_stat(pid)
                    if st is not None and st.live:
                        found[pid] = st
            except OSError as e:
                log.warning("cgroup %s: cannot list: %s", self.cgroup.path, e)
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return list(found.values())
        except PermissionError:
            pass
        for p in procfs.live_group_members(self.pgid):
            found.setdefault(p.pid, p)
        return list(found.values())


def killpg(pgid: int, signum: int) -> bool:
    """Signal a whole process group; False once the group is gone (EPERM counts as
    still there)."""
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


JOB_UMASK = 0o022
"""The umask every job, session and terminal starts with (a login's)."""


def spawn(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    stdin=subprocess.DEVNULL,
    stdout=None,
    stderr=None,
    pass_fds: Sequence[int] = (),
    account: Account | None = None,
    cgroup: cgroups.Cgroup | None = None,
) -> Group:
    """Start `argv` as the leader of a new session, inside `cgroup` when
    given: with stdin /dev/null and no user switch, placed there by the
    worker while it waits behind a gate (`_spawn_gated`), else joined in
    the child right after fork (rc.worker.cgroups.enter).
    Raises OSError when it cannot be started (missing program, bad cwd, not
    executable, a cgroup it cannot join).

    `account` (a job's: rc.worker.account) makes it that user's process,
    umask JOB_UMASK, entering `cwd` as that user; None (operator code:
    hooks, verify scripts) runs it as the worker with the worker's umask.
    (subprocess drops the privileges before the cgroup join runs; the join
    writes through an fd the worker opened, which the kernel checks against
    the opener's credentials.)"""
    args = list(argv)
    extra: dict = {}
    if account is not None:
        if account.switch and cwd:
            _check_program(args[0], env, cwd)  # what the shim's exec would fail on
        args, cwd = account.wrap(args, cwd)
        extra = {**account.popen_args(), "umask": JOB_UMASK}
    if cgroup is not None and _gateable(stdin, account):
        return _spawn_gated(args, cwd, env, stdout, stderr, pass_fds, cgroup, extra)
    join = cgroup.join_fd() if cgroup is not None else -1
    try:
        with reaper.spawning():  # its status is ours: the orphan reaper never takes it
            proc = _popen(args, cwd, env, stdin, stdout, stderr, pass_fds, join, extra)
            reaper.track(proc.pid)
    finally:
        if join >= 0:
            os.close(join)
    joined = cgroup is not None and (proc.poll() is not None or proc.pid in _members(cgroup))
    if cgroup is not None and not joined:
        _not_placed(proc.pid, cgroup, "")
    return Group(proc, cgroup, joined)


GATE = 'read _ || exit 125; exec "$@" </dev/null'
"""The gate a job behind `_spawn_gated` waits in: /bin/sh, its stdin the
read end of a pipe, reads one line (the worker's word that it placed the
process in its cgroup; end of file, the worker gave up: exit 125, nothing
of the job ran), then execs the job's argv with stdin /dev/null."""
GATE_NO_PWD = "unset PWD; " + GATE
"""The same, for an environment without PWD (sh would export its own)."""
SH = "/bin/sh"


def _gateable(stdin, account: Account | None) -> bool:
    """Whether a job with this stdin and account can start behind GATE:
    its stdin is /dev/null (the gate's own stdin is the pipe) and it runs
    as the worker (subprocess can then vfork; a user switch forks anyway)."""
    return (
        stdin == subprocess.DEVNULL
        and (account is None or not account.switch)
        and os.access(SH, os.X_OK)
    )


def _spawn_gated(args, cwd, env, stdout, stderr, pass_fds, cgroup, extra) -> Group:
    """Start `args` behind GATE: no preexec_fn, so subprocess vforks (a
    fork of the threaded worker, which a preexec_fn forces, took ~18 ms
    more per job here); the worker writes the gate's pid into the cgroup's
    cgroup.procs, then opens the gate, so nothing of the job runs outside
    its cgroup (a child forked by the job is born inside). What exec
    would refuse (a missing or non-executable program) is raised here,
    before the gate starts, as a direct exec raises it."""
    if cwd is None or os.path.isdir(cwd):
        _check_startable(args[0], env, cwd)
    script = GATE if "PWD" in env else GATE_NO_PWD
    gate_r, gate_w = os.pipe()
    try:
        try:
            with reaper.spawning():
                proc = _popen(
                    [SH, "-c", script, "rc-gate", *args],
                    cwd, env, gate_r, stdout, stderr, pass_fds, -1, extra,
                )  # fmt: skip
                reaper.track(proc.pid)
        finally:
            os.close(gate_r)
        joined = True
        try:
            cgroups.place(cgroup, proc.pid)
        except OSError as e:
            joined = False
            _not_placed(proc.pid, cgroup, f": {e.strerror or e}")
        os.write(gate_w, b"\n")
    finally:
        os.close(gate_w)  # on any error before the write: EOF, the gate exits 125
    return Group(proc, cgroup, joined)


def _not_placed(pid: int, cgroup: cgroups.Cgroup, why: str) -> None:
    log.warning(
        "pid %d could not join cgroup %s%s: tracked by its process group and RC_JOB_ID only",
        pid,
        cgroup.path,
        why,
    )


def _check_startable(program: str, env: Mapping[str, str], cwd: str | None) -> None:
    """Raise the OSError execvpe would for `program` (FileNotFoundError:
    nowhere on the job's PATH, or no such path relative to `cwd`;
    PermissionError: there but a directory or not executable)."""
    if "/" in program:
        candidates = [os.path.join(cwd or os.getcwd(), program)]
    else:
        candidates = [os.path.join(d, program) for d in os.get_exec_path(dict(env))]
    denied = False
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return
        denied = denied or os.path.exists(path)
    if denied:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _members(cgroup: cgroups.Cgroup) -> list[int]:
    try:
        return cgroup.pids()
    except OSError:
        return []


def _popen(
    argv, cwd, env, stdin, stdout, stderr, pass_fds, join: int, extra: dict
) -> subprocess.Popen:
    return subprocess.Popen(
        list(argv),
        cwd=cwd or None,
        env=dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
        **extra,
        # Safe with threads here: enter() is one write(2) on an fd opened
        # in the parent, no lock, no import, no libc allocation.
        preexec_fn=(lambda: cgroups.enter(join)) if join >= 0 else None,  # noqa: PLW1509
    )


def _check_program(program: str, env: Mapping[str, str], cwd: str) -> None:
    """Raise FileNotFoundError as exec would for a `program` that cannot be
    found (on the job's PATH, or relative to `cwd`), so a job behind the
    account's cd shim fails to start as any other job does."""
    if "/" in program:
        found = os.path.exists(os.path.join(cwd, program))
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def wait_gone(check: Callable[[], list], deadline: float, step: float = 0.02) -> list:
    """Poll `check()` every `step` seconds until it returns an empty list or the
    monotonic `deadline` passes; returns its last answer."""
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(step)
        left = check()
    return left


def kill_group(group: Group, grace: float) -> tuple[Outcome | None, list[procfs.ProcStat]]:
    """SIGTERM the group, SIGKILL after `grace` s, then the stragglers.

    Returns the leader's Outcome (None if it could not be reaped) and the
    members still alive after everything (survivors).
    """
    deadline = time.monotonic() + grace
    group.signal(signal.SIGTERM)
    outcome = group.wait(grace)
    if outcome is not None:
        wait_gone(group.live_members, deadline)
    if group.live_members() or outcome is None:
        group.signal(signal.SIGKILL)
        if outcome is None:
            outcome = group.wait(STRAGGLER_WAIT_S)
    survivors = wait_gone(group.live_members, time.monotonic() + STRAGGLER_WAIT_S)
    if survivors:
        group.signal(signal.SIGKILL)
        survivors = wait_gone(group.live_members, time.monotonic() + STRAGGLER_WAIT_S)
    return outcome, survivors


def reap_stragglers(group: Group) -> tuple[int, list[procfs.ProcStat]]:
    """After the leader exited: SIGKILL live group members. Returns (how many
    members were alive: the stragglers, the survivors of the SIGKILL)."""
    live = group.live_members()
    if not live:
        return 0, []
    group.signal(signal.SIGKILL)
    return len(live), wait_gone(group.live_members, time.monotonic() + STRAGGLER_WAIT_S)


def _signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError as e:
        if e.errno not in (errno.ESRCH, errno.EPERM):
            raise


def sweep_job(
    job_id: str, require: dict[bytes, bytes] | None = None, min_pid: int = 0
) -> tuple[list[int], bool]:
    """End every process that carries RC_JOB_ID=job_id (setsid and double-fork
    escapees) and the `require` variables (this worker instance's marker),
    excluding this worker and its ancestors.

    SIGTERM, up to 2 s (rescanning every 20 ms and signalling newcomers),
    SIGKILL, up to 2 s. Returns (pids still alive, whether the scan could read
    every process). An empty job id never sweeps. `min_pid`: see
    procfs.find_job_processes.
    """
    if not job_id:
        return [], True
    exclude = procfs.ancestors()
    signalled: set[int] = set()
    deadline = time.monotonic() + SWEEP_GRACE_S
    scan = procfs.find_job_processes(job_id, exclude, require, min_pid)
    while scan.pids and time.monotonic() < deadline:
        for pid in scan.pids:
            if pid not in signalled:
                _signal_pid(pid, signal.SIGTERM)
                signalled.add(pid)
        time.sleep(SWEEP_RESCAN_S)
        scan = procfs.find_job_processes(job_id, exclude, require, min_pid)
    if scan.pids:
        deadline = time.monotonic() + SWEEP_GRACE_S
        while scan.pids and time.monotonic() < deadline:
            for pid in scan.pids:
                _signal_pid(pid, signal.SIGKILL)
            time.sleep(SWEEP_RESCAN_S)
            scan = procfs.find_job_processes(job_id, exclude, require, min_pid)
    return list(scan.pids), scan.complete
