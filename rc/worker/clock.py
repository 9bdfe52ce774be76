"""The worker's time: one object every timer of the worker reads and waits on.

A `Clock` is passed in (as huey's consumer takes `now`), never patched: the
agent, job runs, hooks, the reporter, the log sink, the script runner, the
verify pass and the probe pass take one, and tests pass a fake that only
moves when the test advances it (tests/helpers/fakeclock.py).

Two readings, never mixed:

- `time()`: wall time, seconds since the epoch, for what is stored or
  reported (a job's started_at);
- `monotonic()`: seconds on a clock that never goes backwards, for every
  deadline and interval.

And the waits a timer needs, so that a fake clock can drive them: `sleep`,
`wait` (an Event, or the deadline), `wait_on` (a Condition, or the
deadline) and `timer` (call a function after a delay unless cancelled).

What goes through the clock is policy: a job's max runtime and idle
timeout, a script's timeout, the verify and probe budgets, a hook's linger,
log batching and spilling, report deadlines and retry delays, heartbeats,
polls, re-registration, the mapping of a job's start onto the kernel log.
What does not: bounded waits for the kernel to finish something already
under way, and the short ticks that bound how soon a loop notices a change
(WATCHDOG_TICK_S). Those stay on the real clock: a fake clock cannot make a
process exit sooner, and their tests test real process behaviour.

Where the standard library's clock is used: the modules that wait for the
kernel read `time` themselves, and only they do:

- rc.worker.supervise: a signalled process group to empty (the kill
  grace, stragglers, sweeps);
- rc.worker.cgroups: a cgroup to freeze, thaw or empty;
- rc.worker.survivors: the survivors a scan's kill signalled to go;
- rc.worker.leftovers: a GPU dropping its contexts;
- rc.worker.terminal: a terminal's exec notice, a terminal session to empty;
- rc.worker.attached: pipes to drain once a process exited;
- rc.worker.script: a script's pipes to drain, and the tick of a script
  with none open.

Anywhere else in rc/worker a reading or wait that is meant to be real (a
short tick: the reporter's RUNNING_LINGER_S, a session's look for its hold)
goes through `SYSTEM`, the real clock, so that it reads as one.
tests/unit/test_layout.py holds this list and refuses time.time, time.monotonic,
time.sleep (and their kin) and asyncio.sleep anywhere else in rc/worker.
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable
from typing import Protocol

__all__ = ["SYSTEM", "Clock", "Timer"]


class Timer(Protocol):
    """A pending call made by `Clock.timer`."""

    def cancel(self) -> None:
        """Stop the call if it has not started (a call already running finishes)."""


class Clock:
    """The real clock (the standard library's). Thread-safe; holds no state."""

    def time(self) -> float:
        """Wall time, seconds since the epoch (what is stored or reported)."""
        return _time.time()

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (deadlines, intervals)."""
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block for `seconds` (nothing when not positive)."""
        if seconds > 0:
            _time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait up to `timeout` seconds (None: for ever) for `event`; True
        when it is set."""
        return event.wait(None if timeout is None else max(0.0, timeout))

    def wait_on(self, cond: threading.Condition, timeout: float | None) -> bool:
        """`cond.wait(timeout)` with `cond` held: True when notified (or woken
        spuriously), False once `timeout` seconds passed. Callers recheck
        what they wait for, as with any condition variable."""
        return cond.wait(None if timeout is None else max(0.0, timeout))

    def timer(self, delay: float, fn: Callable[[], object], name: str) -> Timer:
        """Call `fn()` on a daemon thread named `name` after `delay` seconds,
        unless the returned Timer is cancelled first."""
        t = threading.Timer(max(0.0, delay), fn)
        t.daemon = True
        t.name = name
        t.start()
        return t


SYSTEM = Clock()
"""The real clock: the default of everything that takes one."""
