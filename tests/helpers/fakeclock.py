"""A fake rc.worker.clock.Clock for tests of the worker's timers.

Time stands still until the test calls `advance(seconds)`. Every wait the
worker makes through its clock then behaves as it would at that time:

- `sleep(s)` blocks until the clock has moved `s` seconds;
- `wait(event, t)` / `wait_on(cond, t)` return True as soon as the event is
  set / the condition notified, and False once the clock passed `t`; they
  look in slices of SLICE_S real seconds, releasing the condition's lock
  each time as a real wait does;
- `timer(delay, fn)` calls fn on the thread that calls `advance`, in due
  order, with the clock at its due time: after `advance` returns, every
  timer that came due has run (and a cancelled one never will).

`reads` counts monotonic() calls: a loop that reads the clock once per turn
(the job watchdog, the script runner) has taken a turn at the new time once
it grew by two after an `advance` (`turns`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

from rc.worker.clock import Clock
from tests.helpers.wait import wait_until

__all__ = ["FakeClock"]

SLICE_S = 0.005
START_MONOTONIC = 1000.0
START_WALL = 1_700_000_000.0


class _Timer:
    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock(Clock):
    """A clock that moves only when the test advances it. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._now = START_MONOTONIC
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self.reads = 0
        """How many times monotonic() was called."""

    # -- readings ---------------------------------------------------------------

    def _peek(self) -> float:
        with self._cond:
            return self._now

    def monotonic(self) -> float:
        with self._cond:
            self.reads += 1
            return self._now

    def time(self) -> float:
        return START_WALL + (self._peek() - START_MONOTONIC)

    # -- waits -----------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        with self._cond:
            deadline = self._now + seconds
            self._cond.wait_for(lambda: self._now >= deadline)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if timeout is None:
            return event.wait()
        deadline = self._peek() + timeout
        while not event.wait(SLICE_S):
            if self._peek() >= deadline:
                return event.is_set()
        return True

    def wait_on(self, cond: threading.Condition, timeout: float | None) -> bool:
        if timeout is None:
            return cond.wait()
        deadline = self._peek() + timeout
        seen = _notified(cond)
        while not cond.wait(SLICE_S):
            # A notify that lands as a slice times out is reported as a
            # timeout by Condition.wait: with time standing still the wait
            # would then never end. The count of notifies says it came.
            if _notified(cond) != seen:
                return True
            if self._peek() >= deadline:
                return False
        return True

    def timer(self, delay: float, fn: Callable[[], object], name: str) -> _Timer:
        t = _Timer(fn)
        with self._cond:
            heapq.heappush(self._timers, (self._now + max(0.0, delay), next(self._seq), t))
        return t

    # -- the test's side -------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, running every timer that comes due
        (on this thread, in order, the clock at each one's due time)."""
        with self._cond:
            target = self._now + seconds
        while True:
            with self._cond:
                if not self._timers or self._timers[0][0] > target:
                    self._now = target
                    self._cond.notify_all()
                    return
                due, _, t = heapq.heappop(self._timers)
                self._now = max(self._now, due)
                self._cond.notify_all()
            if not t.cancelled:
                t.fn()

    def wait_for_reads(self, n: int, timeout: float = 10.0) -> None:
        """Block (real time, at most `timeout` s) until monotonic() has been
        read `n` times in all."""
        wait_until(lambda: self.reads >= n, timeout, f"the clock to be read {n} times", SLICE_S)

    def turns(self, n: int = 2, timeout: float = 10.0) -> None:
        """Block until monotonic() has been read `n` more times: a loop that
        reads it once per turn has then finished a turn at this time."""
        self.wait_for_reads(self.reads + n, timeout)


def _notified(cond: threading.Condition) -> int:
    """How many times `cond` was notified since FakeClock first waited on it
    (its notify and notify_all are wrapped then, on that instance only)."""
    if not hasattr(cond, "_fake_notified"):
        cond._fake_notified = 0
        plain_one, plain_all = cond.notify, cond.notify_all

        def notify(n: int = 1) -> None:
            cond._fake_notified += 1
            plain_one(n)

        def notify_all() -> None:
            cond._fake_notified += 1
            plain_all()

        cond.notify, cond.notify_all = notify, notify_all
    return cond._fake_notified
