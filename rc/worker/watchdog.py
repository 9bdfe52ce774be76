"""The watchdog of a running job: when time says it must end.

Two limits, in seconds (0: none):

- max runtime, counted from when the job's process started: the job's own,
  capped by its device's ceiling (the device's `max_runtime`), which also
  applies to a job that gave none. A hold's max runtime is its ttl.
- idle timeout: no output for that long since the process started (never
  for a hold). Output that is still being written (held up on its way to
  the log or the relay by us) is output now: backpressure is not the job
  being idle.

`due` is a pure function of the limits and three readings of one monotonic
clock: the job run reads its clock once per watchdog turn and asks
(rc.worker.job). Cancellation (a kill, the controller ending the job, worker
shutdown) is not the watchdog's: it is checked before it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rc.proto.duration import format_duration
from rc.proto.wire import Assignment

__all__ = ["Fired", "Limits", "due", "reason", "runtime_limit"]


class Fired(enum.Enum):
    """Which limit ended a job."""

    MAX_RUNTIME = "max_runtime"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class Limits:
    """A running job's limits, seconds (0: none); `hold`: it is a hold
    (its max runtime is a ttl, it has no idle timeout)."""

    max_runtime: float = 0.0
    idle_timeout: float = 0.0
    hold: bool = False

    @classmethod
    def of(cls, a: Assignment, ceiling: float, hold: bool) -> Limits:
        """The limits of assignment `a` on a device whose ceiling is `ceiling`
        seconds (0: none)."""
        return cls(
            max_runtime=runtime_limit(a.max_runtime_seconds, int(ceiling)),
            idle_timeout=0 if hold else a.idle_timeout_seconds,
            hold=hold,
        )


def runtime_limit(requested: int, ceiling: int) -> int:
    """The max runtime in seconds (0: none): `requested` (0: none), capped by
    the device's `ceiling` (0: none), which also applies when none was
    requested."""
    if ceiling and (not requested or requested > ceiling):
        return ceiling
    return requested


def due(limits: Limits, started: float, last_output: float, now: float) -> Fired | None:
    """Which limit has fired at monotonic time `now` for a job whose process
    started at `started` and last wrote output at `last_output` (pass `now`
    while a write is under way); None when none has. Silence is counted from
    the later of the two (output from before the start, or none yet, counts
    from the start). Max runtime is checked first."""
    if limits.max_runtime and now - started >= limits.max_runtime:
        return Fired.MAX_RUNTIME
    if limits.idle_timeout and now - max(started, last_output) >= limits.idle_timeout:
        return Fired.IDLE
    return None


def reason(fired: Fired, limits: Limits) -> str:
    """The job's kill reason for `fired`: "max_runtime exceeded (1h)",
    "idle: no output for 5m", and for a hold at its ttl "hold ended: its ttl
    of 30m was reached" (a hold's label makes that one a success)."""
    if fired is Fired.IDLE:
        return f"idle: no output for {format_duration(limits.idle_timeout)}"
    if limits.hold:
        return f"hold ended: its ttl of {format_duration(limits.max_runtime)} was reached"
    return f"max_runtime exceeded ({format_duration(limits.max_runtime)})"
