"""A listing kept on screen: `rc ps -w`.

`watch(draw, every, title)` calls `draw()` (which prints a listing on
stdout) every `every` seconds until Ctrl-C (exit 130). On a terminal the
screen is cleared and redrawn each time under a title line, as watch(1)
does; on a pipe or file the listing is printed again, after a blank line,
only when it changed. A controller that cannot be reached, or answers 5xx,
is said once on stderr and waited for with the followers' backoff
(follow.Outage), without end: a controller restart ends a watch no more
than it ends `rc run`.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Callable

from rc.cli.context import stderr
from rc.cli.follow import Outage
from rc.proto.errors import ApiError, TransportError

__all__ = ["watch"]


def watch(draw: Callable[[], None], every: float, title: str) -> int:
    """Redraw `draw()`'s output every `every` s until Ctrl-C; returns 130.
    Raises what `draw` raises but a TransportError or a 5xx ApiError (a 401
    of a revoked token, a 403: the watch ends with it)."""
    tty = sys.stdout.isatty()
    raw = getattr(sys.stdout, "unescaped", sys.stdout)  # rc's own screen clear, not escaped
    outage = Outage(give_up_after=None)
    last = None
    try:
        while True:
            text = io.StringIO()
            try:
                with contextlib.redirect_stdout(text):
                    draw()
            except (TransportError, ApiError) as e:
                if isinstance(e, ApiError) and e.status < 500:
                    raise
                if outage.since is None:
                    stderr(f"cannot reach the controller ({e}); still trying")
                outage.wait()
                continue
            if outage.since is not None:
                stderr("the controller answers again")
                outage.over()
            shown = text.getvalue()
            if tty:
                raw.write("\x1b[H\x1b[2J")
                sys.stdout.write(
                    f"{title}, every {every:g} s, {time.strftime('%H:%M:%S')} (Ctrl-C stops)\n\n"
                    + shown
                )
            elif shown != last:
                sys.stdout.write(("\n" if last is not None else "") + shown)
            sys.stdout.flush()
            last = shown
            time.sleep(every)
    except KeyboardInterrupt:
        return 130
