"""Starting a job's process: the pieces every way of running one shares.

A job with logs (rc.worker.job), a job on a terminal or on pipes (run by
rc.worker.job with rc.worker.attached and rc.worker.terminal) and a session
inside a hold (rc.worker.sessions) all start a process as the job's Unix
user (rc.worker.account) with the environment `job_env` builds on
`clean_env`, in the working directory `working_dir` picks, and end up
with a `Result` that `label` gives them: state, exit code
and reason. Pure functions, except `working_dir`, which looks at the disk.

A job's environment starts clean: nothing of the worker's own environment
goes along (the shell that ran `rc up` may have exported anything: a
virtualenv, a secret) except LANG, LC_ALL and TZ, and the variables the
worker config names in `pass_env`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rc.proto.model import JobState
from rc.worker import supervise
from rc.worker.account import Account, CannotRunAs

__all__ = [
    "HOLD_COMMAND",
    "KEPT_ENV",
    "READER_DRAIN_S",
    "STANDARD_PATH",
    "Result",
    "cannot_start",
    "cannot_start_line",
    "clean_env",
    "job_env",
    "label",
    "straggler_note",
    "working_dir",
]

HOLD_COMMAND = ("sleep", "2147483647")
"""What a hold runs: the worker's own sleeper, never a submitted command."""

STRIPPED_ENV_PREFIX = "RC_"
"""Worker settings (RC_TOKEN above all) never leak into a job's environment."""
UNBUFFERED = "PYTHONUNBUFFERED"
READER_DRAIN_S = 2.0
"""After a job's process exited, how long its output may still drain (s)."""
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""A job's PATH unless the worker config sets `job_path`."""
KEPT_ENV = ("LANG", "LC_ALL", "TZ")
"""What a job takes of the worker's own environment, when set there."""


def clean_env(
    account: Account,
    worker_env: Mapping[str, str],
    job_path: str = "",
    pass_env: tuple[str, ...] = (),
) -> dict[str, str]:
    """The base of a job's environment (job_env adds the rest): PATH
    (`job_path`, else STANDARD_PATH), HOME, USER, LOGNAME and SHELL of its
    user, KEPT_ENV and the `pass_env` names taken from `worker_env` where
    it has them. Nothing else of the worker's environment."""
    env = {"PATH": job_path or STANDARD_PATH, **account.env()}
    for name in (*KEPT_ENV, *pass_env):
        if name in worker_env:
            env[name] = worker_env[name]
    return env


def job_env(
    base: dict[str, str],
    requested: dict[str, str],
    job_id: int,
    devices: Sequence[str],
    cuda: str | None,
    markers: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A job's environment: the worker's own (minus RC_* settings), the job's
    entries, then RC_JOB_ID, RC_DEVICES (its device ids, comma-separated, in
    the order chosen), RC_DEVICE (the first), RC_COUNT (how many), the CUDA
    variables and the worker's `markers` (RC_HOST, RC_WORKER_INSTANCE), which
    always win over the job's. PYTHONUNBUFFERED=1 unless the job sets it
    itself (even to ""): a job's output goes to a pipe, where Python would
    hold it in a block buffer, and a healthy print() loop would look idle to
    --idle-timeout.

    `cuda` is the devices' GPU indices in the same order (JobRun.cuda, from
    probe.cuda_visible, "3,1"): set with CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA
    numbers GPUs as nvidia-smi does; "" for CPU devices (no GPU visible);
    None removes the variables.
    """
    env = {k: v for k, v in base.items() if not k.startswith(STRIPPED_ENV_PREFIX)}
    env.update(requested)
    if UNBUFFERED not in requested:
        env[UNBUFFERED] = "1"
    env.update(markers or {})
    env["RC_JOB_ID"] = str(job_id)
    env["RC_DEVICES"] = ",".join(devices)
    env["RC_DEVICE"] = devices[0] if devices else ""
    env["RC_COUNT"] = str(len(devices))
    env.pop("CUDA_DEVICE_ORDER", None)
    if cuda is None:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = cuda
        if cuda:  # number GPUs as nvidia-smi does
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


@dataclass(slots=True)
class Result:
    """How a job ended: its state, exit code (None: never started or never
    reaped), reason, and the pids of its process group still alive after
    SIGKILL (survivors, for the teardown checks)."""

    state: JobState
    exit_code: int | None
    reason: str
    survivors: list[int] = field(default_factory=list)


def working_dir(cwd: str, host: str, account: Account) -> tuple[str | None, bytes]:
    """Where a job of `account` runs: `cwd` when it exists on this host,
    else its user's home directory with a note for the log; with no cwd at
    all, that home (None: the worker's own, when the home does not exist).

    Raises CannotRunAs when the user may not enter `cwd` (checked as that
    user, rc.worker.account: nothing of the job runs then)."""
    home = account.home if os.path.isdir(account.home) else None
    if not cwd:
        return home, b""
    if os.path.isdir(cwd):
        if not account.may_enter(cwd):
            raise CannotRunAs(f"{account.name} may not enter {cwd} on {host} (permission denied)")
        return cwd, b""
    shown = home or "the worker's directory"
    return home, f"[rc: {cwd} does not exist on {host}; running in {shown}]\n".encode()


def label(
    outcome: supervise.Outcome | None, why: str | None, stragglers: int, hold: bool
) -> Result:
    """The state, exit code and reason of a job that ended.

    `why` is our reason for ending it (kill, watchdog) or None; a hold ended
    by its TTL succeeded. Otherwise the leader's own exit decides: death by
    signal → killed; an exit code other than exactly 0 (including a status
    whose low byte is 0) → failed; 0 → succeeded. `stragglers` (members of
    the group still alive after the leader exited, reaped with SIGKILL) only
    add a note to the reason, "N stragglers reaped after exit": the job did
    finish, as Slurm's COMPLETED says of a batch script that leaves children
    behind (the teardown checks still verify the device).
    """
    code = outcome.exit_code if outcome is not None else None
    if why is not None:
        if hold and why.startswith("hold ended"):
            return Result(JobState.SUCCEEDED, 0, why)
        return Result(JobState.KILLED, code, why)
    assert outcome is not None
    note = straggler_note(stragglers)
    if outcome.signal:
        reason = f"signal: {supervise.signal_name(outcome.signal)}"
        return Result(JobState.KILLED, code, f"{reason}; {note}" if note else reason)
    if code != 0:
        reason = f"exited with code {code}"
        return Result(JobState.FAILED, code, f"{reason}; {note}" if note else reason)
    return Result(JobState.SUCCEEDED, 0, note)


def straggler_note(n: int) -> str:
    """ "2 stragglers reaped after exit" ("" for none)."""
    if n <= 0:
        return ""
    return f"{n} straggler{'' if n == 1 else 's'} reaped after exit"


def cannot_start(e: OSError, program: str = "", path: str | None = None) -> Result:
    """The Result of a process that could not be started: failed, exit code
    127 for a missing program (as a shell says), else 126. A `program`
    looked up on `path` (no '/' in it) that was not found says the PATH
    the job had (a venv's python is on the submitter's PATH)."""
    code = 127 if isinstance(e, FileNotFoundError) else 126
    return Result(JobState.FAILED, code, f"cannot start: {_why(e, program, path)}")


def cannot_start_line(program: str, e: OSError, path: str | None = None) -> bytes:
    """The line a job's log gets when `program` could not be started (with
    the PATH it was looked up on when it was not found there)."""
    return f"rc: cannot start {program!r}: {_why(e, program, path)}\n".encode()


def _why(e: OSError, program: str, path: str | None) -> str:
    text = str(e.strerror or e)
    if isinstance(e, FileNotFoundError) and program and "/" not in program and path is not None:
        text += f" (not found on the job's PATH={path})"
    return text
