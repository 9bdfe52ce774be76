"""The worker as a child subreaper (docs/design.md#teardown-empty-or-out).

`become_subreaper()` sets PR_SET_CHILD_SUBREAPER (prctl through ctypes), so
an orphan of a job (a double fork, a daemon) re-parents to the worker
instead of to init: it stays within reach of the teardown checks, and it is
reaped here once it exits. When the worker is PID 1 (a container without an
init) it already receives every orphan; the reaper is then the zombie
reaper the container needs.

A generic `waitpid(-1)` would steal the exit status of a process the worker
waits for itself (a job's leader, a hook, nvidia-smi). So the worker's own
children are tracked: they are started inside `spawning()` and registered
with `track(pid)` before the lock is released, and handed back with
`untrack(pid)` once their owner reaped them. The reaper (`reap_orphans`)
reaps only zombie children that are not tracked, by pid, under the same
lock; it never touches a tracked child.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Iterator

from rc.worker import procfs

__all__ = [
    "PR_SET_CHILD_SUBREAPER",
    "REAP_INTERVAL_S",
    "Reaper",
    "become_subreaper",
    "reap_orphans",
    "spawning",
    "track",
    "untrack",
]

log = logging.getLogger("rc.worker.reaper")

PR_SET_CHILD_SUBREAPER = 36
REAP_INTERVAL_S = 1.0
"""How often the reaper looks for zombie orphans (s)."""

_lock = threading.Lock()
_tracked: set[int] = set()


def become_subreaper() -> bool:
    """Make this process a child subreaper; False (logged) where prctl is
    missing or refuses."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            log.warning("cannot become a child subreaper: %s", os.strerror(err))
            return False
    except (OSError, AttributeError) as e:
        log.warning("cannot become a child subreaper: %s", e)
        return False
    return True


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Hold while starting a child the caller will wait for itself, and
    `track` its pid inside: the reaper cannot run in between."""
    with _lock:
        yield


def track(pid: int) -> None:
    """Mark `pid` as a child whose status its owner collects (call inside
    `spawning()`)."""
    _tracked.add(pid)


def untrack(pid: int) -> None:
    """The owner reaped `pid`: it is no longer tracked."""
    with _lock:
        _tracked.discard(pid)


def _zombie_children() -> list[int]:
    me = os.getpid()
    return [p.pid for p in procfs.processes() if p.ppid == me and p.state == "Z"]


def reap_orphans() -> list[int]:
    """Reap every zombie child that is not tracked; the pids reaped."""
    try:  # cheap first look: is any child a zombie at all?
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return []
    except ChildProcessError:
        return []
    reaped = []
    with _lock:
        for pid in _zombie_children():
            if pid in _tracked:
                continue
            try:
                got, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if got == pid:
                reaped.append(pid)
    return reaped


class Reaper:
    """A thread that calls `reap_orphans` every `interval` seconds until
    `stop()`."""

    def __init__(self, interval: float = REAP_INTERVAL_S) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self.reaped = 0
        self.thread = threading.Thread(target=self._loop, name="rc-reaper", daemon=True)

    def start(self) -> Reaper:
        """Start the thread; returns self."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """End the loop (after its current turn)."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.reaped += len(reap_orphans())
            except Exception:  # a bug must not end the loop
                log.exception("reaping orphans failed")
