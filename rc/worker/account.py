"""Whose account a job runs in on this host (docs/design.md#identity-and-ownership).

A worker running as root runs every job, hold, session, `rc exec`, `rc cp`
and terminal as the job's Unix user (Assignment.unix_user), looked up in
this host's password database: its uid, primary gid and supplementary
groups (os.getgrouplist, what initgroups sets), and HOME, USER, LOGNAME and
SHELL. A user this host does not know fails the job at start, naming the
host; root (uid 0) only where the worker's config says `allow_root_jobs`.

A worker not running as root is a single-user worker: it runs everything
as itself and says so at registration (`run_as`), so the controller hands
it only its own user's jobs. `shared_account = true` makes any identity's
job run as the worker's own user (the old behaviour, on purpose).

Lease hooks, verify scripts and probes are operator code: they run as the
worker, not through here.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass

from rc.proto.errors import RcError
from rc.proto.model import ROOT

__all__ = [
    "CD_SHIM",
    "ENTER_CHECK_S",
    "Account",
    "CannotRunAs",
    "for_job",
    "own",
    "registration",
]

CD_SHIM = (
    'cd -- "$1" 2>/dev/null || { printf "rc: %s may not enter %s\\n" "$2" "$1" >&2; '
    'exit 126; }; unset OLDPWD; shift 2; exec "$@"'
)
"""Run as `/bin/sh -c CD_SHIM rc-cwd DIR USER argv...` already as the job's
user: enter DIR as that user (its permissions, not root's: a directory it
may not enter is never entered, and a root-squashed NFS home is), then exec
argv. subprocess changes the working directory before it changes the user,
so a job of another user never gets its `cwd=` from there."""
SH = "/bin/sh"
ENTER_CHECK_S = 10.0
"""The most the check that a user may enter a job's directory takes (s)."""


class CannotRunAs(RcError):
    """A job cannot run as its Unix user here: no such user on this host,
    root without allow_root_jobs, or another user on a single-user worker.
    The message says which, naming the host."""


@dataclass(frozen=True, slots=True)
class Account:
    """The Unix user a job runs as: `switch` says the worker must become it
    (the worker is root and this is another user); otherwise the job runs
    as the worker itself."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str
    switch: bool = False

    @classmethod
    def of(cls, entry: pwd.struct_passwd, switch: bool) -> Account:
        """The account of a password database entry (groups as initgroups
        would set them)."""
        try:
            groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except OSError:
            groups = (entry.pw_gid,)
        return cls(
            entry.pw_name,
            entry.pw_uid,
            entry.pw_gid,
            groups,
            entry.pw_dir or "/",
            entry.pw_shell or SH,
            switch,
        )

    def env(self) -> dict[str, str]:
        """HOME, USER, LOGNAME and SHELL of this user."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}

    def popen_args(self) -> dict:
        """subprocess.Popen's arguments that make the child this user (none
        when it runs as the worker): groups, then gid, then uid, in the child
        after fork, without a preexec_fn."""
        if not self.switch:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def wrap(self, argv: list[str], cwd: str | None) -> tuple[list[str], str | None]:
        """(argv, cwd) to give subprocess: unchanged for the worker's own
        account; for another user, argv behind CD_SHIM (which enters `cwd`
        as the user) and no cwd."""
        if not self.switch or not cwd:
            return argv, cwd
        return [SH, "-c", CD_SHIM, "rc-cwd", cwd, self.name, *argv], None

    def may_enter(self, path: str) -> bool:
        """Whether this user may make `path` its working directory, as the
        kernel answers for that user (a shell that only does `cd` runs as
        it: permissions, ACLs and root-squashed NFS all count). Always True
        for the worker's own account (subprocess itself reports a failure)."""
        if not self.switch:
            return True
        try:
            done = subprocess.run(
                [SH, "-c", 'cd -- "$1"', "rc-cwd", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=ENTER_CHECK_S,
                close_fds=True,
                check=False,
                **self.popen_args(),
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0


def own() -> Account:
    """The worker's own account (no switch)."""
    uid = os.geteuid()
    try:
        return Account.of(pwd.getpwuid(uid), False)
    except KeyError:
        home = os.environ.get("HOME", "/")
        return Account(str(uid), uid, os.getegid(), tuple(os.getgroups()), home, SH, False)


def registration(shared_account: bool, allow_root_jobs: bool) -> tuple[str, bool, bool]:
    """What the worker says at registration about whom it runs jobs as:
    (run_as, shared_account, allow_root_jobs), as wire.RegisterRequest has
    them. A root worker that does not share one account runs every job as
    its own user: run_as "". Anyone else runs jobs as itself."""
    if os.geteuid() == 0 and not shared_account:
        return "", False, allow_root_jobs
    return own().name, shared_account, allow_root_jobs


def for_job(unix_user: str, host: str, shared_account: bool, allow_root_jobs: bool) -> Account:
    """The account a job of `unix_user` runs as on `host`. Raises CannotRunAs
    (the job fails at start, nothing runs, the device stays ready)."""
    if shared_account:
        return own()
    if os.geteuid() != 0:
        me = own()
        if unix_user != me.name:
            raise CannotRunAs(f"{host} runs jobs as {me.name} only, not as {unix_user or 'nobody'}")
        return me
    if not unix_user:
        raise CannotRunAs(f"the job names no Unix user to run as on {host}")
    try:
        entry = pwd.getpwnam(unix_user)
    except KeyError:
        raise CannotRunAs(f"no user {unix_user} on {host}") from None
    if entry.pw_uid == 0 and not allow_root_jobs:
        who = "root" if unix_user == ROOT else f"{unix_user} (uid 0)"
        raise CannotRunAs(
            f"{host} does not run jobs as {who}: its worker config does not set allow_root_jobs"
        )
    return Account.of(entry, entry.pw_uid != os.geteuid())
