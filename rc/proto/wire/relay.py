"""Wire records of relayed sessions (rc run -i, rc cp through the controller)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rc.proto.model import Stdio


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """POST /v1/jobs/{hold_id}/sessions: start a process inside a hold you own.

    stdio is tty (a terminal; an empty command means the login shell of the
    worker's user) or pipe (raw stdin and stdout, stderr kept). rows and cols
    are the terminal's initial size (0: the default 24x80).

    port (1..65535) makes it one connection of a port forward (`rc forward`):
    no process; the worker connects to 127.0.0.1:port on the hold's host and
    relays its bytes both ways (stdio pipe, no command, cwd or env).
    """

    stdio: Stdio
    command: tuple[str, ...] = ()
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    rows: int = 0
    cols: int = 0
    port: int = 0


@dataclass(frozen=True, slots=True)
class SessionStart:
    """A session for a worker to start on a hold it runs (in Assignments).
    device_ids: every device of the hold, in order (device_id is the first);
    the session sees them all, as the hold's job would."""

    session_id: int
    hold_id: int
    device_id: str
    stdio: Stdio
    command: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    submitter: str
    rows: int = 0
    cols: int = 0
    device_ids: tuple[str, ...] = ()
    port: int = 0
    """A forward's loopback port on the hold's host (0: run `command`)."""

    @property
    def devices(self) -> tuple[str, ...]:
        """The hold's devices, in order (device_ids, else device_id alone)."""
        return self.device_ids or (self.device_id,)


@dataclass(frozen=True, slots=True)
class SessionReport:
    """POST /v1/jobs/{hold_id}/sessions/{id}/status from the hold's worker.

    state is "running" or "ended"; exit_code is the process's code (128+N for
    signal N; None when it never started); stderr is the tail of a pipe
    session's standard error (at most 64 KiB, decoded as UTF-8 with
    replacement), stderr_dropped how many bytes before it were not kept.
    """

    state: str
    exit_code: int | None = None
    reason: str = ""
    stderr: str = ""
    stderr_dropped: int = 0


@dataclass(frozen=True, slots=True)
class SessionView:
    """A session as the controller knows it (GET /v1/jobs/{hold}/sessions/{id}).

    state: starting (waiting for the worker), running, ended. The record is
    kept in memory for a while after it ended, then forgotten.
    """

    session_id: int
    hold_id: int
    device_id: str
    stdio: Stdio
    state: str
    exit_code: int | None = None
    reason: str = ""
    stderr: str = ""
    stderr_dropped: int = 0
