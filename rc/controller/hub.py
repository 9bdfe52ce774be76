"""In-memory change notification: keyed wake-ups for long polls and streams.

A waiter takes `hub.waiter(key)` *before* reading the state it waits on, then
awaits it with a deadline; `notify(keys)` (called after a commit) wakes every
waiter of those keys. Keys used: "worker:<id>" (assignment or kill for that
worker), "job:<id>" (the job changed), "log:<id>" (bytes appended), "jobs",
"devices", "events". Nothing here is durable: a lost wake-up costs at most one
poll interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["Hub"]


class Hub:
    """Keyed one-shot events."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self.listeners: list = []
        self.closing = False

    def close(self) -> None:
        """Shutting down: wake every waiter now and from now on (long polls and
        streams see `closing` and answer at once)."""
        self.closing = True
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()

    def waiter(self, key: str) -> asyncio.Event:
        """The event the next notify(key) sets."""
        ev = self._events.get(key)
        if ev is None:
            ev = asyncio.Event()
            if self.closing:
                ev.set()
            else:
                self._events[key] = ev
        return ev

    def notify(self, keys: Iterable[str]) -> None:
        """Wake every waiter of these keys."""
        keys = list(keys)
        for key in keys:
            ev = self._events.pop(key, None)
            if ev is not None:
                ev.set()
        for listener in self.listeners:
            listener(keys)

    async def wait(self, key: str, timeout: float) -> bool:
        """Wait up to `timeout` seconds for notify(key); True if it came."""
        ev = self.waiter(key)
        try:
            await asyncio.wait_for(ev.wait(), timeout)
            return True
        except TimeoutError:
            return False
