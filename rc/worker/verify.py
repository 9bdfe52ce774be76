"""The verify pass: the operator's checks that a device is fit
for the next job, run after every job (success, failure, watchdog, kill, hold
end) and before its terminal report.

Every executable in `verify_dir`, sorted by name, runs in its own process
group with `verify_timeout`; the whole pass is bounded by `verify_pass_budget`.
Fail-closed: a non-zero exit, a timeout, a script that cannot run, an entry
that cannot be stat'ed (a dangling symlink), an unreadable directory or the
budget running out fails the pass. A missing directory passes (the feature is
off); a non-executable file is skipped with a warning; subdirectories are
ignored. All scripts run even after a failure; the first failure's reason is
kept: "verify failed: <script>: <what happened>: <last 200 chars of stderr>".
The job's own state and exit code are never changed by the pass; a failure
quarantines the device (`fault`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

from rc.proto.duration import format_duration
from rc.worker import script
from rc.worker.clock import SYSTEM, Clock

__all__ = ["PREFIX", "STDERR_TAIL_CHARS", "run_pass"]

log = logging.getLogger("rc.worker.verify")

PREFIX = "verify failed: "
"""Every verify failure reason starts so (the controller records verify_failed)."""
STDERR_TAIL_CHARS = 200
STDOUT_CAP = 64 << 10
"""A verify script's stdout is read (so it never blocks) and ignored past this."""


def _stderr_tail(err: bytes) -> str:
    text = err.decode("utf-8", "replace").strip()
    if not text:
        return ""
    if len(text) > STDERR_TAIL_CHARS:
        return ": …(truncated) " + text[-STDERR_TAIL_CHARS:]
    return ": " + text


def run_pass(
    verify_dir: str,
    env: Mapping[str, str],
    *,
    timeout: float,
    budget: float,
    grace: float,
    cancel: threading.Event | None = None,
    clock: Clock = SYSTEM,
) -> str | None:
    """Run the pass; None when the device is clean, else the failure reason.

    `timeout` bounds each script and `budget` the pass (seconds of `clock`);
    `grace` is the SIGTERM → SIGKILL grace (real seconds) for a script that
    must be ended.
    """
    deadline = clock.monotonic() + budget
    try:
        entries = sorted(os.scandir(verify_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{PREFIX}cannot read {verify_dir}: {e.strerror or e}"
    first: str | None = None
    for entry in entries:
        try:
            st = os.stat(entry.path)  # follows symlinks: a dangling one fails here
        except OSError as e:
            first = first or f"{PREFIX}{entry.name}: cannot stat: {e.strerror or e}"
            continue
        if os.path.isdir(entry.path):
            continue
        if not (st.st_mode & 0o111) or not os.access(entry.path, os.X_OK):
            log.warning("verify script %s is not executable; skipped", entry.path)
            continue
        left = deadline - clock.monotonic()
        if left <= 0:
            first = first or f"{PREFIX}pass exceeded its {format_duration(budget)} budget"
            break
        limit = min(timeout, left)
        res = script.run(
            [entry.path],
            env=env,
            timeout=limit,
            grace=grace,
            cancel=cancel,
            out_cap=STDOUT_CAP,
            err_tail=STDERR_TAIL_CHARS * 4,
            clock=clock,
        )
        if res.ok:
            continue
        if res.timed_out and limit < timeout:
            why = f"{PREFIX}pass exceeded its {format_duration(budget)} budget"
        else:
            why = f"{PREFIX}{entry.name}: {res.describe()}{_stderr_tail(res.err)}"
        log.error("%s", why)
        first = first or why
    return first
