"""The idle rule of holds: the clock of each running hold, kept in memory
(README "Holds: the idle rule").

A hold with an idle timeout D is idle while none of these happens: input on
any of its sessions (bytes from a client into a terminal, exec or copy
session of the hold), bytes either way through a `rc forward` connection
into it, or its worker reporting it busy (a GPU of the hold above
`GPU_BUSY_PCT` utilisation, or on CPU devices the hold's processes above
`CPU_BUSY_PCT` of one core, between two heartbeats). Each of these resets
its clock (`touch`, `report`).

`due(rows, now)` is the pure rule: a hold idle for D - lead (lead =
`warn_lead(D)`: 10 minutes, or half of D when D is shorter than 20 minutes)
is warned once; one idle for D, warned on an earlier pass, and reported
unused by its worker since that warning, is reclaimed. Use is read only at
heartbeats, so without such a report (a timeout shorter than the heartbeat
interval, a report still to come) the hold waits for the next one; a
report that read nothing (nvidia-smi failing, a CPU hold's first sample)
says nothing. A worker that stopped reporting is the sweeper's business.
Activity after a warning re-arms it. Nothing here touches the database: the
clock is memory only, so a controller restart starts every clock again at
its start (an idle hold is then released late, never early).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rc.proto.duration import format_duration

__all__ = [
    "CPU_BUSY_PCT",
    "GPU_BUSY_PCT",
    "WARN_LEAD_S",
    "HoldClock",
    "IdleWatch",
    "Watched",
    "warn_lead",
]

WARN_LEAD_S = 600.0
"""How long before the limit a hold is warned, at most (seconds)."""
GPU_BUSY_PCT = 5
"""utilization.gpu (percent) above which a GPU of a hold counts as in use
(the worker's threshold, rc.worker.usage; here for the words)."""
CPU_BUSY_PCT = 10
"""CPU use of a hold's processes, percent of one core, above which a hold
on CPU devices counts as in use (rc.worker.usage)."""


def warn_lead(timeout: float) -> float:
    """Seconds before the limit a hold with idle timeout `timeout` is warned:
    min(10 minutes, timeout / 2)."""
    return min(WARN_LEAD_S, timeout / 2)


@dataclass(frozen=True, slots=True)
class Watched:
    """A running hold with an idle rule, as the store lists it."""

    hold_id: int
    owner: str
    device_id: str
    started_at: float
    timeout: int  # seconds, > 0


@dataclass(slots=True)
class HoldClock:
    """One hold's idle clock: `last` is the wall time of its last activity
    (or of when watching began); `warned` once the warning went out since;
    `reported` once its worker has reported it unused (with a reading) since
    that warning; the last use each source saw (wall time, None: never) and
    the last utilisation its worker reported (percent; None: not reported)."""

    last: float
    warned: bool = False
    reported: bool = False
    input_at: float | None = None
    forward_at: float | None = None
    busy_at: float | None = None
    gpu_pct: int | None = None
    cpu_pct: int | None = None

    def words(self, now: float) -> str:
        """The state in words: "idle 1h42m: no input, GPU 0 %, no forward"."""
        parts = [
            "no input" if self.input_at is None else f"input {_ago(now, self.input_at)}",
        ]
        if self.gpu_pct is not None:
            parts.append(f"GPU {self.gpu_pct} %")
        elif self.cpu_pct is not None:
            parts.append(f"CPU {self.cpu_pct} %")
        else:
            parts.append("use not reported yet")
        parts.append(
            "no forward" if self.forward_at is None else f"forward {_ago(now, self.forward_at)}"
        )
        return f"idle {format_duration(max(0, int(now - self.last)))}: {', '.join(parts)}"


def _ago(now: float, at: float) -> str:
    return f"{format_duration(max(0, int(now - at)))} ago"


class IdleWatch:
    """The idle clocks of this controller process's running holds.

    `floor` (wall seconds) is when watching began: no clock starts before it.
    `touch` and `report` are cheap (a dict lookup): the relay calls `touch`
    for every chunk of input or forwarded bytes.
    """

    def __init__(self, floor: float = 0.0) -> None:
        self.floor = floor
        self.clocks: dict[int, HoldClock] = {}

    def clock(self, hold_id: int, started_at: float) -> HoldClock:
        """The hold's clock, started at max(its start, `floor`) if new."""
        c = self.clocks.get(hold_id)
        if c is None:
            c = self.clocks[hold_id] = HoldClock(max(started_at, self.floor))
        return c

    def touch(self, hold_id: int, now: float, what: str) -> None:
        """Activity on a hold: `what` is "input" or "forward". Unknown holds
        (not yet watched) are started here at `now`."""
        c = self.clocks.get(hold_id)
        if c is None:
            c = self.clocks[hold_id] = HoldClock(now)
        c.last = max(c.last, now)
        c.warned = False
        if what == "forward":
            c.forward_at = now
        else:
            c.input_at = now

    def report(
        self, hold_id: int, now: float, busy: bool, gpu_pct: int | None, cpu_pct: int | None
    ) -> None:
        """What a heartbeat says of a hold's use since the previous one
        (percentages: None, not read). Not busy, with a reading, after the
        warning: the hold may be released once its idle time is over."""
        c = self.clocks.get(hold_id)
        if c is None:
            c = self.clocks[hold_id] = HoldClock(now)
        c.gpu_pct, c.cpu_pct = gpu_pct, cpu_pct
        if busy:
            c.last = max(c.last, now)
            c.warned = c.reported = False
            c.busy_at = now
        elif c.warned and (gpu_pct is not None or cpu_pct is not None):
            c.reported = True

    def due(self, watched: Iterable[Watched], now: float) -> tuple[list[Watched], list[Watched]]:
        """(to warn, to reclaim) at `now`; forgets holds no longer watched.
        Marks the warned ones: each warning goes out once per idle spell. A
        hold is reclaimed only once its worker reported it unused after the
        warning (`report`); until then it waits, however long it is idle."""
        warn, reclaim = [], []
        alive = set()
        for w in watched:
            alive.add(w.hold_id)
            c = self.clock(w.hold_id, w.started_at)
            idle = now - c.last
            if c.warned:
                if c.reported and idle >= w.timeout:
                    reclaim.append(w)
            elif idle >= w.timeout - warn_lead(w.timeout):
                c.warned, c.reported = True, False
                warn.append(w)
        for gone in set(self.clocks) - alive:
            del self.clocks[gone]
        return warn, reclaim

    def reclaim_at(self, hold_id: int, started_at: float, timeout: int) -> float:
        """When the hold will be released if nothing happens (wall seconds)."""
        return self.clock(hold_id, started_at).last + timeout
